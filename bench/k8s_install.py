#!/usr/bin/env python3
"""nvshim on a real one-node Kubernetes (tests/k8s/cluster.py, the simulated 8 x H100
host as driver root): ``kubectl apply -k`` of the containerd overlay (through the tests'
environment overlay) to ``rollout status`` done, the installer's own start-to-ready from
its log, and a 1-GPU pod's creation to Ready on the nvshim runtime class against a pod
on runc (no GPU), interleaved, the ratio taken pair by pair.

The reference installer's figure the issue gives (~1.2 s from start to ready on the same
simulated host) is a yardstick measured elsewhere, not here. Run as root:
`.venv/bin/python3 bench/k8s_install.py [--containerd 1.6|1.7] [--rounds 5]`.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.paired import median_added, median_ratio  # noqa: E402
from tests.k8s import artifacts  # noqa: E402
from tests.k8s.cluster import NODE_NAME, Cluster  # noqa: E402
from tests.test_k8s_node_e2e import ENVIRONMENT, GPU_LABEL, KUBE, TAG, TEST_OVERLAY  # noqa: E402


def pod(name: str, gpu: bool) -> dict:
    spec: dict = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "main", "image": artifacts.BUSYBOX, "command": ["sleep", "3600"]}],
    }
    if gpu:
        spec["runtimeClassName"] = "nvshim"
        spec["containers"][0]["volumeMounts"] = [
            {"name": "gpu", "mountPath": "/var/run/nvidia-container-devices/0", "readOnly": True}
        ]
        spec["volumes"] = [{"name": "gpu", "hostPath": {"path": "/dev/null", "type": "CharDevice"}}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def to_ready(k8s: Cluster, name: str, gpu: bool) -> float:
    """Seconds from ``kubectl apply`` of the pod to ``kubectl wait`` seeing it Ready."""
    started = time.monotonic()
    k8s.apply(pod(name, gpu))
    k8s.wait(f"pod/{name}", "--for=condition=Ready", timeout=120)
    took = time.monotonic() - started
    k8s.kubectl("delete", "pod", name, "--wait=true", timeout=120)
    return took


def log_span(text: str) -> float:
    """Seconds between the installer's first log line and its "ready" line."""
    times = []
    for line in text.splitlines():
        stamp, _, rest = line.partition(" nvshim node: ")
        if rest and (not times or rest.startswith("ready")):
            when = datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()
            times.append(when)
    return times[-1] - times[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--containerd", choices=artifacts.CONTAINERD_VERSIONS, default="1.6")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with Cluster(containerd=args.containerd) as k8s, tempfile.TemporaryDirectory() as overlay:
        k8s.import_node_image(TAG)
        base = os.path.join(KUBE, "overlays", "containerd")
        with open(os.path.join(overlay, "kustomization.yaml"), "w") as fh:
            fh.write(TEST_OVERLAY.format(base=os.path.relpath(base, overlay)))
        with open(os.path.join(overlay, "environment.yaml"), "w") as fh:
            fh.write(ENVIRONMENT)
        k8s.kubectl("label", "node", NODE_NAME, f"{GPU_LABEL}=true")
        started = time.monotonic()
        k8s.kubectl("apply", "-k", overlay)
        k8s.kubectl("-n", "nvshim", "rollout", "status", "daemonset/nvshim-node",
                    "--timeout=180s", timeout=240)  # fmt: skip
        ready = time.monotonic() - started
        logs = k8s.kubectl("-n", "nvshim", "logs", "daemonset/nvshim-node", "-c", "nvshim-node")
        installer = log_span(logs.stdout)
        k8s.wait_containerd()  # the installer's restart: let the kubelet reconnect first
        to_ready(k8s, "warm-gpu", True)
        to_ready(k8s, "warm-runc", False)
        gpu, runc = [], []
        for n in range(args.rounds):
            gpu.append(to_ready(k8s, f"gpu-{n}", True))
            runc.append(to_ready(k8s, f"runc-{n}", False))
        k8s.kubectl("delete", "-k", overlay, "--wait=true", timeout=400)
    print(f"containerd {k8s.containerd_version}, {args.rounds} rounds")
    print(f"apply -k -> rollout status done: {ready:.2f} s")
    print(f"installer start -> ready (its log): {installer:.2f} s")
    print(f"1-GPU pod apply -> Ready: median {statistics.median(gpu):.2f} s")
    print(f"runc pod apply -> Ready:  median {statistics.median(runc):.2f} s")
    print(
        f"ratio GPU/runc (paired median): {median_ratio(gpu, runc):.2f}x"
        f" (+{median_added(gpu, runc) * 1000:.0f} ms)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
