#!/usr/bin/env python3
"""What GPU-NIC pairing adds to a container start: GPU 2 of the simulated HGX host
(`hgx-h100x8-rdma`) through nvshim-runtime, without pairing, paired, and paired with an
exclusive claim (one more hook process at createRuntime). Cases are interleaved round by
round; the added time is the median of each round's difference to the unpaired start.

Run as root: `.venv/bin/python3 bench/pairing_start.py [--runs N]`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO, os.path.join(REPO, "bench")]

from runtime_start import _start_once  # noqa: E402

from nvshim.launch import write_launchers  # noqa: E402
from tests.podman_util import make_busybox_rootfs  # noqa: E402
from tests.sim.simhost import build_host  # noqa: E402

GPU = {"NVIDIA_VISIBLE_DEVICES": "2"}
PAIRED = {**GPU, "NVSHIM_RDMA": "paired"}


def _config(tmp: str, sim, bin_dir: str, name: str, pairing: str) -> dict[str, str]:
    path = os.path.join(tmp, f"{name}.toml")
    with open(path, "w") as fh:
        fh.write(
            f'[host]\ndriver-root = "{sim.driver_root}"\ndev-root = "{sim.dev_root}"\n'
            f'[runtime]\nhook-path = "{bin_dir}/nvshim-hook"\nlog-file = "{tmp}/log"\n'
            f'state-dir = "{tmp}/state"\n[policy]\naccept-env-unprivileged = true\n'
            f"[pairing]\n{pairing}\n"
        )
    return {"PATH": os.environ["PATH"], "NVSHIM_CONFIG": path}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    opts = parser.parse_args()
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(dir=shm) as tmp:
        sim = build_host("hgx-h100x8-rdma", os.path.join(tmp, "host"))
        bin_dir = os.path.join(tmp, "bin")
        write_launchers(bin_dir)
        runtime = os.path.join(bin_dir, "nvshim-runtime")
        rootfs = make_busybox_rootfs(os.path.join(tmp, "static"), glibc_loader=False)
        on = _config(tmp, sim, bin_dir, "on", "enabled = true")
        cases = [
            ("1 GPU, no pairing", GPU, on),
            ("1 GPU, paired", PAIRED, on),
            (
                "paired, exclusive",
                PAIRED,
                _config(tmp, sim, bin_dir, "x", "enabled = true\nexclusive = true"),
            ),
        ]
        times: dict[str, list[float]] = {label: [] for label, *_ in cases}
        for i in range(opts.runs + 1):
            for n, (label, request, env) in enumerate(cases):
                work = os.path.join(tmp, "runs")
                elapsed = _start_once(work, rootfs, runtime, request, env, f"{n}-{i}")
                if i:  # the first round warms the inventory cache
                    times[label].append(elapsed)
        base = times["1 GPU, no pairing"]
        print(f"nvshim-runtime run of busybox /bin/true with GPU 2, median of {opts.runs} rounds:")
        for label, values in times.items():
            added = statistics.median([v - b for v, b in zip(values, base, strict=True)]) * 1000
            median = statistics.median(values)
            print(
                f"  {label:<20} {median * 1000:7.1f} ms  added {added:+6.1f} ms"
                f"  ratio {median / statistics.median(base):5.2f}"
            )


if __name__ == "__main__":
    main()
