#!/usr/bin/env python3
"""The CUDA probe (bench/cuda_probe.c) and the glibc image it runs in.

The image is the tests' busybox rootfs (static busybox, the glibc loader) plus the shared
libraries of this machine's Debian ``libc6`` package (libc, libm, libdl, libpthread,
librt: all a driver's libcuda needs), its ``ld.so.conf.d`` entry, an ``ld.so.cache`` made
by ``ldconfig -r``, and the probe at ``/usr/local/bin/cuda-probe``. No registry is used.
Builds are cached under ``/tmp/nvshim-test-cache/probe-image-<key>`` (tests/debroot.py),
keyed by the probe source, this file, gcc's version, libc6's version and the busybox binary.

CLI (root not needed): ``python3 bench/probe_image.py [--tar FILE]`` builds
(or reuses) the image and prints its directory; ``--tar`` also writes a tarball to carry
to a GPU host that cannot build it (``bench/real_gpu.py --image FILE``).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from tests.debroot import cached  # noqa: E402
from tests.podman_util import GLIBC_LOADERS, make_busybox_rootfs  # noqa: E402

PROBE_SOURCE = os.path.join(REPO, "bench", "cuda_probe.c")
PROBE_PATH = "/usr/local/bin/cuda-probe"  # inside the image
LIBC_PACKAGE = "libc6"
LIB_DIR = f"/lib/{os.uname().machine}-linux-gnu"


class ImageError(Exception):
    """The probe or its image cannot be built here (the message says what is missing)."""


def _run(argv: list[str]) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise ImageError(f"{argv[0]} not found (the image needs gcc, dpkg and ldconfig)") from None
    if proc.returncode != 0:
        raise ImageError(f"{' '.join(argv[:2])} failed: {' '.join(proc.stderr.split())[:300]}")
    return proc.stdout


def build_probe(dest: str) -> str:
    """Compile the probe to ``dest`` with gcc; return ``dest``."""
    os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
    _run(["gcc", "-O2", "-Wall", "-Wextra", "-Werror", "-o", dest, PROBE_SOURCE, "-ldl"])
    return dest


def libc_files() -> list[str]:
    """Host paths of the libc6 package's shared libraries and ld.so.conf.d entries."""
    out = []
    for path in _run(["dpkg", "-L", LIBC_PACKAGE]).splitlines():
        in_lib = os.path.dirname(path) == LIB_DIR and ".so" in os.path.basename(path)
        if (in_lib or path.startswith("/etc/ld.so.conf.d/")) and os.path.isfile(path):
            out.append(path)
    if not any(os.path.basename(p) == "libc.so.6" for p in out):
        raise ImageError(f"dpkg -L {LIBC_PACKAGE} lists no libc.so.6 in {LIB_DIR}")
    return out


def _inputs() -> list[str]:
    """What the image is built from: gcc, libc6, the probe source, this file, busybox."""
    busybox = os.path.realpath(shutil.which("busybox") or "/bin/busybox")
    parts = [_run(["gcc", "-dumpfullversion", "-dumpmachine"])]
    parts.append(_run(["dpkg-query", "-W", "-f", "${Version}", LIBC_PACKAGE]))
    for path in (PROBE_SOURCE, os.path.abspath(__file__), busybox):
        try:
            with open(path, "rb") as fh:
                parts.append(hashlib.sha256(fh.read()).hexdigest())
        except OSError as err:
            raise ImageError(f"{path}: {err.strerror} (apt-get install busybox-static)") from None
    return parts


def _populate(root: str) -> None:
    make_busybox_rootfs(root)
    for path in libc_files():
        target = root + path
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy2(path, target)
    with open(os.path.join(root, "etc", "ld.so.conf"), "w") as fh:
        fh.write("include /etc/ld.so.conf.d/*.conf\n")
    build_probe(root + PROBE_PATH)
    os.makedirs(os.path.join(root, "var/cache/ldconfig"), exist_ok=True)
    _run([shutil.which("ldconfig") or "/sbin/ldconfig", "-r", root])
    os.chmod(root, 0o755)


def probe_image() -> str:
    """The image directory, built on first use and cached (tests/debroot.py) by its
    inputs. ImageError when it cannot be built here."""
    return cached("probe-image", _inputs(), _populate)


def write_tar(image: str, dest: str) -> str:
    """Pack ``image`` into the tarball ``dest`` (paths relative to the image root)."""
    with tarfile.open(dest, "w:gz") as tar:
        tar.add(image, arcname=".")
    return dest


def unpack_image(source: str, dest: str) -> str:
    """``source`` (an image directory or a tarball from ``write_tar``) as a directory:
    the directory itself, or the tarball unpacked into ``dest``."""
    if os.path.isdir(source):
        return source
    os.makedirs(dest, exist_ok=True)
    with tarfile.open(source) as tar:
        # our own tarball; the "tar" filter where this Python has extraction filters
        options = {"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}
        tar.extractall(dest, **options)
    return dest


def host_probe_argv(image: str, library: str | None) -> list[str]:
    """Run the image's probe on the host itself, with the image's own glibc (so a host
    with an older glibc runs it too): ``loader --library-path IMAGE_LIBS probe [LIB]``."""
    loader = image + GLIBC_LOADERS[os.uname().machine]
    argv = [loader, "--library-path", image + LIB_DIR, image + PROBE_PATH]
    return argv + ([library] if library else [])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tar", metavar="FILE", help="also write the image as a tarball")
    opts = parser.parse_args()
    try:
        image = probe_image()
    except ImageError as err:
        print(f"probe_image: {err}", file=sys.stderr)
        return 1
    if opts.tar:
        write_tar(image, opts.tar)
    print(image)
    return 0


if __name__ == "__main__":
    sys.exit(main())
