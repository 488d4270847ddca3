#!/usr/bin/env python3
"""Everything the real-GPU kit needs on a GPU host that reaches no registry, in one
directory (default ``build/real-gpu-kit``, ignored by git; about 40 MiB):

- ``probe-image.tar.gz``: the CUDA probe and its glibc image (bench/probe_image.py);
- ``site/``: nvshim's runtime dependencies, copied from this interpreter's installation
  (nothing is downloaded), for a ``python3`` of the same minor version on the GPU host;
  with ``--python-version X.Y`` pip fetches binary wheels for that version instead;
- ``bin/runc`` and ``lib/``: this machine's runc with its libseccomp (RPATH ``$ORIGIN/../lib``),
  used only where the GPU host has no runc of its own;
- ``bin/busybox`` (static) and ``sim-cache/``: the simulated host's compiled fake NVML and
  driver-library stubs (tests/sim/compile.py), for the create benchmarks on a host without
  busybox or gcc (``NVSHIM_SIM_CACHE=<kit>/sim-cache``, ``<kit>/bin`` on ``PATH``).

``bash bench/real_gpu.sh`` in a checkout without ``.venv`` uses them when they are there.
CLI: ``.venv/bin/python3 bench/real_gpu_carry.py [OUT] [--python-version X.Y]``; prints
OUT and its size.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from bench import probe_image as pimg  # noqa: E402
from tests.podman_util import static_busybox  # noqa: E402

DEFAULT_OUT = os.path.join(REPO, "build", "real-gpu-kit")


def runtime_distributions(root: str = "nvshim") -> list[importlib.metadata.Distribution]:
    """``root``'s installed dependencies, recursively, without extras (tests, docs)."""
    seen: dict[str, importlib.metadata.Distribution] = {}
    todo = [root]
    while todo:
        dist = importlib.metadata.distribution(todo.pop())
        for req in dist.requires or []:
            if "extra ==" in req:
                continue
            name = re.split(r"[\s<>=!~;\[(]", req, maxsplit=1)[0].lower().replace("_", "-")
            if name not in seen:
                try:
                    seen[name] = importlib.metadata.distribution(name)
                except importlib.metadata.PackageNotFoundError:
                    continue  # a marker-excluded dependency (other platform or Python)
                todo.append(name)
    return list(seen.values())


def copy_site(dest: str) -> list[str]:
    """Copy each runtime distribution's files (those inside site-packages) into ``dest``."""
    names = []
    for dist in runtime_distributions():
        base = str(dist.locate_file(""))
        for rel in dist.files or []:
            source = os.path.normpath(os.path.join(base, str(rel)))
            if not source.startswith(base + os.sep) or "__pycache__" in source:
                continue
            target = os.path.join(dest, os.path.relpath(source, base))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copy2(source, target)
        names.append(f"{dist.metadata['Name']} {dist.version}")
    return sorted(names)


def fetch_site(dest: str, python_version: str) -> list[str]:
    """pip-install nvshim's runtime requirements into ``dest`` as binary wheels built for
    CPython ``python_version`` on x86_64 Linux (from the package index)."""
    wanted = [
        r for r in importlib.metadata.distribution("nvshim").requires or [] if "extra ==" not in r
    ]
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "--target", dest, "--python-version", python_version, "--only-binary=:all:",
         "--platform", "manylinux2014_x86_64", *wanted],
        check=True,
    )  # fmt: skip
    return wanted


def copy_runc(dest: str) -> None:
    """This machine's runc and its libseccomp, the binary's RPATH set to ``$ORIGIN/../lib``."""
    runc = shutil.which("runc") or "/usr/sbin/runc"
    os.makedirs(os.path.join(dest, "bin"), exist_ok=True)
    os.makedirs(os.path.join(dest, "lib"), exist_ok=True)
    target = os.path.join(dest, "bin", "runc")
    shutil.copy2(runc, target)
    subprocess.run(["patchelf", "--set-rpath", "$ORIGIN/../lib", target], check=True)
    ldd = subprocess.run(["ldd", runc], capture_output=True, text=True, check=True).stdout
    for line in ldd.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0].startswith("libseccomp"):
            shutil.copy2(parts[2], os.path.join(dest, "lib", parts[0]))


def copy_sim(dest: str) -> None:
    """A static busybox into ``dest/bin`` and the simulated hosts' compiled libraries
    into ``dest/sim-cache``."""
    os.makedirs(os.path.join(dest, "bin"), exist_ok=True)
    shutil.copy2(static_busybox(), os.path.join(dest, "bin", "busybox"))
    os.environ["NVSHIM_SIM_CACHE"] = os.path.join(dest, "sim-cache")
    from tests.sim.simhost import prebuild

    prebuild("single")  # the shipped hosts share its driver version


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", default=DEFAULT_OUT)
    parser.add_argument("--python-version", help="the GPU host's python3 (X.Y), if not ours")
    opts = parser.parse_args()
    out = os.path.abspath(opts.out)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    try:
        pimg.write_tar(pimg.probe_image(), os.path.join(out, "probe-image.tar.gz"))
    except pimg.ImageError as err:
        print(f"real_gpu_carry: {err}", file=sys.stderr)
        return 1
    site = os.path.join(out, "site")
    version = opts.python_version or f"{sys.version_info.major}.{sys.version_info.minor}"
    names = fetch_site(site, version) if opts.python_version else copy_site(site)
    copy_runc(out)
    copy_sim(out)
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(out) for f in fs)
    print(f"{out} ({size / 2**20:.1f} MiB; for python{version}: {', '.join(names)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
