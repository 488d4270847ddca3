#!/usr/bin/env python3
"""DRA prepare latency per claim: the kubelet's ``NodePrepareResources`` for one claim over
the plugin's real socket (gRPC client, as the kubelet calls it), against a real
kube-apiserver and the simulated 8-GPU host, then ``NodeUnprepareResources``.

Cases, interleaved round by round: the claim GET alone (the API round trip every prepare
pays, the floor), a 1-GPU claim, a 4-GPU claim, and a 1-GPU MPS claim (its daemon, the
fake ``nvidia-cuda-mps-control``, started at prepare and stopped at unprepare). Figures:
medians in ms and each case's median ratio to the GET of the same round.

Run as root: `.venv/bin/python3 bench/dra_prepare.py [--runs N]`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO, os.path.join(REPO, "bench")]

from paired import median_ratio  # noqa: E402

from nvshim.config import load_config  # noqa: E402
from nvshim.dra.prepare import Driver  # noqa: E402
from nvshim.dra.server import Plugin  # noqa: E402
from nvshim.host.discover import discover_host  # noqa: E402
from tests.dra_api import ApiServer  # noqa: E402
from tests.sim import fake_mps_control  # noqa: E402
from tests.sim.simhost import build_host  # noqa: E402
from tests.test_dra import CLAIMS, NODE, _allocated_claim, _prepare, _unprepare  # noqa: E402

MPS = {
    "apiVersion": "gpu.nvshim.io/v1alpha1",
    "kind": "GpuConfig",
    "sharing": {"strategy": "MPS", "mps": {"activeThreadPercentage": 50}},
}
CASES = {
    "1 GPU": ([("gpu", "gpu-0")], None),
    "4 GPUs": ([("gpu", f"gpu-{i}") for i in range(1, 5)], None),
    "1 GPU, MPS": ([("gpu", "gpu-5")], MPS),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="dra-b-", dir="/tmp"))
    # a private mount namespace: the MPS daemons' shm tmpfs never reach the host
    if os.environ.get("DRA_BENCH_INNER") != "1":
        env = {**os.environ, "DRA_BENCH_INNER": "1"}
        argv = ["unshare", "--mount", "--propagation", "private", sys.executable, *sys.argv]
        return subprocess.run(argv, env=env, check=False).returncode
    api = ApiServer(tmp / "api")
    try:
        sim = build_host(
            "h100x8-mig", str(tmp / "host"), extra_files=fake_mps_control.extra_files()
        )
        config = tmp / "config.toml"
        config.write_text(
            f'[host]\ndriver-root = "{sim.driver_root}"\ndev-root = "{sim.dev_root}"\n'
        )
        os.environ["NVSHIM_CONFIG"] = str(config)
        host = discover_host(sim.driver_root, sim.dev_root)
        driver = Driver(api.kube, NODE, host, load_config(), str(tmp / "cdi"),
                        str(tmp / "k/plugins/gpu.nvshim.io"), str(tmp / "mps"))  # fmt: skip
        plugin = Plugin(driver, str(tmp / "k"))
        plugin.start()
        times: dict[str, list[float]] = {"GET": [], **{c: [] for c in CASES}}
        undo: dict[str, list[float]] = {c: [] for c in CASES}
        for i in range(args.runs):
            for n, (case, (devices, params)) in enumerate(CASES.items()):
                claim = _allocated_claim(api, f"b{i}-{n}", devices, params)
                name = claim["name"]
                if case == "1 GPU":
                    t = time.perf_counter()
                    api.kube.get(f"{CLAIMS}/{name}")
                    times["GET"].append(time.perf_counter() - t)
                t = time.perf_counter()
                answer = _prepare(plugin, [claim])[claim["uid"]]
                times[case].append(time.perf_counter() - t)
                assert answer["error"] == "", answer["error"]
                t = time.perf_counter()
                assert _unprepare(plugin, [claim])[claim["uid"]]["error"] == ""
                undo[case].append(time.perf_counter() - t)
                api.kube.delete(f"{CLAIMS}/{name}")
        plugin.stop()
    finally:
        api.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    ms = 1000
    print(f"DRA prepare per claim, {args.runs} rounds (simulated h100x8-mig, real kube-apiserver)")
    print(f"  claim GET alone (floor)  {statistics.median(times['GET']) * ms:7.2f} ms")
    for case in CASES:
        print(
            f"  prepare {case:<16} {statistics.median(times[case]) * ms:7.2f} ms"
            f"  ({median_ratio(times[case], times['GET']):.1f}x the GET)"
            f"   unprepare {statistics.median(undo[case]) * ms:6.2f} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
