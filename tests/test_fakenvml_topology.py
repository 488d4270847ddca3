"""The fake NVML answers what NVIDIA's device plugin asks beyond discovery (issue 27):
``nvmlDeviceGetTopologyCommonAncestor`` for every GPU pair (go-gpuallocator scores
preferred allocations with it; a missing symbol kills the plugin at the first GPU pod).
Asked through the real pynvml; the plugin itself runs on the cluster in
tests/test_k8s_nvidia_plugin.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

SCRIPT = """
import json, pynvml
pynvml.nvmlInit()
n = pynvml.nvmlDeviceGetCount()
h = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
out = {f"{a}-{b}": pynvml.nvmlDeviceGetTopologyCommonAncestor(h[a], h[b])
       for a in range(n) for b in range(n)}
mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h[6], 0)
try:
    pynvml.nvmlDeviceGetTopologyCommonAncestor(mig, h[0])
except pynvml.NVMLError as err:
    out["mig"] = err.value
print(json.dumps(out))
"""


def test_common_ancestor_of_every_gpu_pair(sim_hosts):
    host = sim_hosts("h100x8-mig")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_NVML", "LD_"))}
    env.update(host.nvml_env())
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         env=env, check=True, timeout=60)  # fmt: skip
    got = json.loads(out.stdout)
    numa = {g["index"]: g["numa_node"] for g in host.topology["gpus"]}
    for a in numa:
        for b in numa:
            # INTERNAL (0) for one board, NODE (40) across one NUMA node, else SYSTEM (50)
            want = 0 if a == b else 40 if numa[a] == numa[b] else 50
            assert got[f"{a}-{b}"] == want, (a, b)
    assert got["mig"] == 3  # NVML_ERROR_NOT_SUPPORTED, as on real boards
