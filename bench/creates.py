"""Creates as the benches take them: an nvshim package made runnable, one timed create."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

from bench.runtime_start import write_bench_config
from nvshim.launch import write_launchers

RUNC = shutil.which("runc") or "/usr/sbin/runc"


def timed_create(runtime: str, state: str, bundle: str, cid: str, env: dict[str, str]) -> float:
    """Wall time of ``runtime create`` of ``bundle`` with a pid file, as engines call it.
    The container is then deleted with runc and the bundle removed (not timed)."""
    errors = os.path.join(os.path.dirname(bundle), f"{cid}.err")
    with open(errors, "w") as err:  # a file: the created process keeps its stdio open
        start = time.perf_counter()
        proc = subprocess.run(
            [runtime, "--root", state, "create", "--pid-file", os.path.join(bundle, "pid"),
             "--bundle", bundle, cid],
            env=env, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
        )  # fmt: skip
        elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{runtime} create: {open(errors).read().strip()}")
    os.unlink(errors)
    subprocess.run([RUNC, "--root", state, "delete", "--force", cid], check=True)
    shutil.rmtree(bundle)
    return elapsed


def installed(work: str, name: str, root: str, sim) -> tuple[str, dict[str, str]]:
    """Launchers and a config for the nvshim package under ``root``: (runtime, env)."""
    directory = os.path.join(work, name)
    bin_dir = os.path.join(directory, "bin")
    os.makedirs(directory, exist_ok=True)
    site = [p for p in sys.path if p.endswith("site-packages")]
    write_launchers(bin_dir, roots=[root, *site], cache_dir=os.path.join(directory, "cache"))
    config = write_bench_config(directory, sim, bin_dir)
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "NVSHIM_CONFIG": config}
    return os.path.join(bin_dir, "nvshim-runtime"), env
