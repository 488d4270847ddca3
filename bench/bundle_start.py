#!/usr/bin/env python3
"""Per-call start time of the self-contained host bundle against today's launchers.

Both run the same nvshim code: the bundle through its own interpreter, loader and glibc
(``packaging/bundle/build.py``), the virtualenv launchers through the system Python.
Cases are interleaved round by round and the ratio is taken pair by pair, so the
machine's drift cancels out. Run as root: `.venv/bin/python3 bench/bundle_start.py`.
Target: the bundle is not slower (ratio <= 1.0 within noise).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.paired import median_ratio  # noqa: E402
from nvshim.install import install_host  # noqa: E402
from tests.debroot import bundle_dir  # noqa: E402


def once(cmd: list[str]) -> float:
    """Wall seconds of one run of ``cmd`` (output discarded, exit code ignored)."""
    start = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=30)
    opts = parser.parse_args()
    bundle = bundle_dir()
    with tempfile.TemporaryDirectory() as tmp:
        venv_bin = os.path.join(tmp, "venv-bin")
        install_host("/", None, venv_bin, None, source="")
        venv_python = os.path.realpath(sys.executable)
        cases = {
            "interpreter (-IS -c pass)": (
                [os.path.join(bundle, "bin", "python3"), "-IS", "-c", "pass"],
                [venv_python, "-IS", "-c", "pass"],
            ),
            "nvshim-hook (start, import, usage exit)": (
                [os.path.join(bundle, "bin", "nvshim-hook")],
                [os.path.join(venv_bin, "nvshim-hook")],
            ),
            "nvshim --version (click CLI)": (
                [os.path.join(bundle, "bin", "nvshim"), "--version"],
                [os.path.join(os.path.dirname(sys.executable), "nvshim"), "--version"],
            ),
        }
        for cmd_pair in cases.values():  # warm the page cache
            once(cmd_pair[0])
            once(cmd_pair[1])
        times = {name: ([], []) for name in cases}
        for _ in range(opts.rounds):
            for name, (bundled, launcher) in cases.items():
                times[name][0].append(once(bundled))
                times[name][1].append(once(launcher))
    print(f"host bundle vs today's launchers, {opts.rounds} interleaved rounds (median ms)")
    print(f"{'case':42} {'bundle':>8} {'venv':>8} {'ratio':>7}")
    for name, (bundled, launcher) in times.items():
        ratio = median_ratio(bundled, launcher)
        print(
            f"{name:42} {statistics.median(bundled) * 1e3:8.1f} "
            f"{statistics.median(launcher) * 1e3:8.1f} {ratio:7.2f}"
        )


if __name__ == "__main__":
    main()
