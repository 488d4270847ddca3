#!/usr/bin/env python3
"""Wall time of `nvshim cdi generate` on simulated hosts of 1, 8 and 64 GPUs, with and
without MIG, and of `nvshim --help`. Prints a table; cost per device shows linearity.

Run as root (the simulated host needs mknod): `.venv/bin/python3 bench/cdi_generate.py`.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from tests.sim.simhost import build_host  # noqa: E402
from tests.sim.topology import generate_topology  # noqa: E402

RUNS = 7


def timed(argv: list[str], env: dict[str, str] | None = None) -> float:
    """Median wall seconds of ``argv`` over RUNS runs (after one warm-up)."""
    subprocess.run(argv, check=True, capture_output=True, env=env)
    samples = []
    for _ in range(RUNS):
        start = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True, env=env)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    nvshim = os.path.join(os.path.dirname(sys.executable), "nvshim")
    env = {**os.environ, "NVSHIM_CONFIG": os.devnull}
    help_s = timed([nvshim, "--help"], env)
    print(f"nvshim --help: {help_s * 1000:.1f} ms (target < 100 ms)")
    print(f"{'GPUs':>5} {'MIG':>4} {'devices':>8} {'wall ms':>9} {'ms/device':>10}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for gpus in (1, 8, 64):
            for mig in (False, True):
                root = os.path.join(tmp, f"h{gpus}{'m' if mig else ''}")
                host = build_host(generate_topology(gpus, mig), root)
                out = os.path.join(tmp, "spec.yaml")
                argv = [
                    nvshim,
                    "cdi",
                    "generate",
                    "--driver-root",
                    host.driver_root,
                    "--dev-root",
                    host.dev_root,
                    "-o",
                    out,
                ]
                wall = timed(argv, env)
                import yaml

                with open(out) as fh:
                    devices = len(yaml.safe_load(fh)["devices"]) - 1  # minus "all"
                rows.append((gpus, mig, devices, wall))
                print(
                    f"{gpus:>5} {'yes' if mig else 'no':>4} {devices:>8} {wall * 1000:>9.1f} "
                    f"{wall * 1000 / max(devices, 1):>10.2f}"
                )
    base = rows[0][3]
    big = rows[-1]
    print(f"64-GPU MIG / 1-GPU cost ratio: {big[3] / base:.2f} for {big[2]}x the devices")
    eight_mig = next(r for r in rows if r[0] == 8 and r[1])
    print(f"8-GPU MIG host: {eight_mig[3] * 1000:.1f} ms (target < 150 ms)")


if __name__ == "__main__":
    main()
