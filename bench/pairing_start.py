#!/usr/bin/env python3
"""What GPU-NIC pairing adds to a container start: GPU 2 of the simulated HGX host
(`hgx-h100x8-rdma`) through nvshim-runtime, without pairing, paired, and paired with an
exclusive claim (one more hook process at createRuntime). In each phase the two cases
are interleaved round by round; the added time is the median of each round's difference
to the unpaired start.

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
            f'inventory-dir = "{tmp}/state"\n[policy]\naccept-env-unprivileged = true\n'
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
        # one configuration per phase: the runtime caches the parsed config by its text,
        # so switching files between cases would charge a TOML parse to some of them
        phases = [
            ("paired", _config(tmp, sim, bin_dir, "on", "enabled = true")),
            (
                "paired, exclusive",
                _config(tmp, sim, bin_dir, "x", "enabled = true\nexclusive = true"),
            ),
        ]
        print(f"nvshim-runtime run of busybox /bin/true with GPU 2, median of {opts.runs} rounds:")
        for label, env in phases:
            cases = [("no pairing", GPU), (label, PAIRED)]
            times: dict[str, list[float]] = {name: [] for name, _ in cases}
            for i in range(opts.runs + 1):
                for n, (name, request) in enumerate(cases):
                    work = os.path.join(tmp, "runs")
                    elapsed = _start_once(work, rootfs, runtime, request, env, f"{n}-{i}")
                    if i:  # the first round warms the inventory and config caches
                        times[name].append(elapsed)
            base, values = times["no pairing"], times[label]
            added = statistics.median([v - b for v, b in zip(values, base, strict=True)]) * 1000
            print(
                f"  {label:<18} {statistics.median(values) * 1000:6.1f} ms against "
                f"{statistics.median(base) * 1000:6.1f} ms unpaired: added {added:+5.1f} ms"
                f"  ratio {statistics.median(values) / statistics.median(base):4.2f}"
            )


if __name__ == "__main__":
    main()
