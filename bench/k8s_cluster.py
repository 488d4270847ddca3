#!/usr/bin/env python3
"""Start and stop times of the suite's one-node cluster (tests/k8s/cluster.py) on
containerd 1.6 and 1.7, rounds interleaved so the machine's drift hits both alike.

Start: from ``Cluster.start()`` to node Ready (not-ready taint lifted, default service
account there, base images imported); stop: ``Cluster.stop()`` until nothing is left.
Run as root: ``.venv/bin/python3 bench/k8s_cluster.py [--rounds N]``. Target: well under
a minute to start (FACTS §15 measured 3-5 s from binaries present to node Ready).
The binaries are unpacked (and 1.7 fetched) before the first timed round.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from tests.k8s import artifacts  # noqa: E402
from tests.k8s.cluster import Cluster  # noqa: E402


def one(version: str) -> tuple[float, float]:
    """(start seconds, stop seconds) of one cluster without a simulated host."""
    cluster = Cluster(containerd=version, sim=None)
    t0 = time.monotonic()
    cluster.start()
    t1 = time.monotonic()
    left = cluster.stop()
    t2 = time.monotonic()
    if left:
        raise SystemExit(f"containerd {version}: left behind {left}")
    return t1 - t0, t2 - t1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    artifacts.k8s_bin()
    artifacts.base_images()
    for version in artifacts.CONTAINERD_VERSIONS:
        artifacts.containerd_bin(version)
    times: dict[str, list[tuple[float, float]]] = {v: [] for v in artifacts.CONTAINERD_VERSIONS}
    for _ in range(args.rounds):
        for version in artifacts.CONTAINERD_VERSIONS:
            times[version].append(one(version))
    print(f"one-node cluster, {args.rounds} rounds (median, min-max seconds)")
    for version, runs in times.items():
        starts, stops = [r[0] for r in runs], [r[1] for r in runs]
        print(
            f"  containerd {version}: start {statistics.median(starts):.1f} "
            f"({min(starts):.1f}-{max(starts):.1f}), stop {statistics.median(stops):.1f} "
            f"({min(stops):.1f}-{max(stops):.1f})"
        )


if __name__ == "__main__":
    main()
