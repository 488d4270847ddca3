#!/usr/bin/env python3
"""What the ``enable-cuda-compat`` step adds to a GPU container's finishing steps, in the
process that runs them (nvshim-runtime's create, the hook): ``update-ldcache`` alone
against ``enable-cuda-compat`` + ``update-ldcache``, paired round by round, on a busybox
image with a glibc loader and the driver's libcuda (cache already current: the steady
state), without and with a CUDA compat library in the image.

Run as root: `.venv/bin/python3 bench/cuda_compat_step.py [--rounds N]`.
Target: the step adds under 0.5 ms per container.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.paired import median_added  # noqa: E402
from nvshim.config import load_config  # noqa: E402
from nvshim.hook.args import parse_step  # noqa: E402
from nvshim.hook.steps import Context, run_steps  # noqa: E402
from tests.compat_util import build_compat_library  # noqa: E402
from tests.podman_util import make_busybox_rootfs  # noqa: E402
from tests.runc_util import build_stub_library  # noqa: E402

LIB = "/usr/lib/x86_64-linux-gnu"
LDCACHE = ["update-ldcache", "--folder", LIB]
COMPAT = ["enable-cuda-compat", "--host-driver-version=550.90.12"]


def _time(rootfs: str, lines: list[list[str]], config) -> float:
    steps = [parse_step(line) for line in lines]
    ctx = Context(config)
    try:
        started = time.perf_counter()
        run_steps(os.getpid(), rootfs, steps, ctx)
        return time.perf_counter() - started
    finally:
        ctx.close()


def measure(rootfs: str, rounds: int, config) -> tuple[float, float]:
    """(median ms of update-ldcache alone, median ms the compat step adds)."""
    _time(rootfs, [COMPAT, LDCACHE], config)  # the first run writes the cache
    base, both = [], []
    for _ in range(rounds):
        base.append(_time(rootfs, [LDCACHE], config))
        both.append(_time(rootfs, [COMPAT, LDCACHE], config))
    return statistics.median(base) * 1000, median_added(both, base) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    rounds = parser.parse_args().rounds
    with tempfile.TemporaryDirectory(prefix="nvshim-bench-compat-") as tmp:
        config_file = os.path.join(tmp, "config.toml")
        with open(config_file, "w") as fh:
            fh.write(f'[runtime]\nlog-file = "{tmp}/log"\ninventory-dir = "{tmp}/state"\n')
        config = load_config(config_file)
        for label, compat in (("no compat library", False), ("a newer compat library", True)):
            rootfs = make_busybox_rootfs(os.path.join(tmp, label.replace(" ", "-")))
            build_stub_library(f"{rootfs}{LIB}/libcuda.so.550.90.12", "libcuda.so.1")
            if compat:
                build_compat_library(rootfs, "570.86.10", "12.8", [550])
            alone, added = measure(rootfs, rounds, config)
            print(
                f"{label}: update-ldcache alone {alone:.3f} ms median; "
                f"enable-cuda-compat adds {added:.3f} ms (paired median, {rounds} rounds)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
