"""NVIDIA's real device plugin (v0.20.0, ../shared/nvidia) beside nvshim on the real
one-node cluster (containerd 1.6 and 1.7, CRI-O 1.36), nvshim installed by the node
DaemonSet (``overlays/containerd``, ``overlays/crio``), issues 27 and 31:

- every ``deviceListStrategy`` x ``deviceIDStrategy`` x ``migStrategy``: each container
  sees exactly what the kubelet's checkpoint says the plugin allocated (its GPU's node,
  a MIG device's capability nodes) and ``CUDA_VISIBLE_DEVICES`` names it by UUID; the
  plugin's default ``envvar`` is refused with the reason at the pod; ``cdi-cri`` on
  containerd 1.6, which drops the CRI's CDI field before any runtime sees it, is the one
  shape that cannot work and is shown as such;
- the simulated host's MIG layout changes under the running cluster between the
  strategies (whole GPUs, mixed, single): nvshim's CDI spec follows within seconds
  (the installer's loop), and a pod asking the restarted plugin for a new MIG device gets
  it; a driver upgrade likewise;
- on CRI-O (OpenShift's engine): every list strategy under MIG mixed, and the OpenShift
  GPU-sharing guide's ``time-slicing-config`` ConfigMap with replicas as the plugin's
  config: each pod gets the GPU its replica belongs to.

One cluster per containerd version (shared with the other cluster tests), one nvshim
install per version, one plugin restart and one pod per matrix cell.
"""

from __future__ import annotations

import re
import time

import pytest
import yaml

from tests.k8s.artifacts import ENGINES
from tests.k8s.cluster import NODE_NAME
from tests.k8s.nvidia_plugin import NvidiaPlugin, allocated, change_host, layout
from tests.test_k8s_node_e2e import GPU_LABEL, Node, assert_refused, container, install

HOOK = "/usr/local/nvshim/bin/nvshim-hook"
NVSHIM_SPEC = "/run/cdi/nvshim.yaml"
LISTS = ("volume-mounts", "cdi-annotations", "cdi-cri", "envvar")
IDS = ("uuid", "index")
# migStrategy -> the host layout it is meant for (tests/k8s/nvidia_plugin.layout) and the
# resources a pod asks for, one container each
MIG = {
    "none": ("whole", ("nvidia.com/gpu",)),
    "mixed": ("mixed", ("nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb")),
    "single": ("single", ("nvidia.com/gpu",)),
}
CELLS = [(m, lst, ids) for m in MIG for lst in LISTS for ids in IDS]
CRIO_CELLS = [("mixed", lst, "uuid") for lst in LISTS]  # OpenShift's MIG mixed


def _engine_id(name: str) -> str:
    return name if name == "crio" else f"ctd{name}"


@pytest.fixture(scope="session", params=ENGINES, ids=_engine_id)
def k8s(request, k8s_clusters):
    """The shared cluster of each engine (containerd 1.6, 1.7, CRI-O)."""
    return k8s_clusters(request.param)


def wanted(item) -> bool:
    """The matrix on both containerd versions and its MIG-mixed row on CRI-O; the
    OpenShift shapes on CRI-O; the host changes on containerd (tests/conftest.py drops
    the rest)."""
    engine = item.callspec.params["k8s"]
    name = item.originalname
    if name == "test_strategy_matrix":
        cell = tuple(item.callspec.params[k] for k in ("mig_strategy", "list_strategy",
                                                        "id_strategy"))  # fmt: skip
        return engine != "crio" or cell in CRIO_CELLS
    return (engine == "crio") == name.startswith("test_openshift")


class PluginNode(Node):
    """The e2e test's node, with NVIDIA's plugin as its device plugin and the host's
    layout tracked across changes."""

    def __init__(self, k8s, overlay: str, original: dict, ready_after: float) -> None:
        super().__init__(k8s, overlay, original, ready_after)
        self.plugin = NvidiaPlugin(k8s)
        self.layout = ""
        self.ns = "nvp"

    def set_host(self, topology: dict, name: str, timeout: float = 30.0) -> float:
        """Change the simulated host; wait until nvshim's CDI spec names exactly its
        devices; the seconds that took."""
        started = time.monotonic()
        change_host(self.k8s, topology)
        topo = self.k8s.sim.topology
        self.gpus = {g["uuid"]: g for g in topo["gpus"]}
        self.migs = {m["uuid"]: (g, m) for g in topo["gpus"] for m in g.get("mig_devices", [])}
        whole = {u for u, g in self.gpus.items() if g.get("mig_mode") != "enabled"}
        want = whole | set(self.migs)
        path = self.k8s.path(NVSHIM_SPEC)
        while True:
            try:
                with open(path) as fh:
                    spec = yaml.safe_load(fh)
                names = {d["name"] for d in spec["devices"]}
                names = {n for n in names if n.startswith(("GPU-", "MIG-"))}
                driver = topo["driver_version"]
                if names == want and f"libcuda.so.{driver}" in yaml.safe_dump(spec):
                    break
            except (OSError, yaml.YAMLError, KeyError, TypeError):
                pass
            if time.monotonic() - started > timeout:
                raise AssertionError(
                    f"{NVSHIM_SPEC} did not follow the host change to {name}:\n"
                    + self.kubectl("-n", "nvshim", "logs", "daemonset/nvshim-node",
                                   "-c", "nvshim-node", check=False).stdout[-3000:]
                )  # fmt: skip
            time.sleep(0.2)
        self.layout = name
        return time.monotonic() - started

    def device(self, device_id: str) -> str:
        """The UUID of a device id the plugin handed out (a UUID, ``<gpu>``, or
        ``<gpu>:<mig>``; a time-slicing replica's ``::<n>`` dropped)."""
        device_id = device_id.split("::")[0]
        if device_id.startswith(("GPU-", "MIG-")):
            return device_id
        topo = self.k8s.sim.topology["gpus"]
        gpu, _, mig = device_id.partition(":")
        parent = next(g for g in topo if g["index"] == int(gpu))
        if not mig:
            return parent["uuid"]
        return next(m for m in parent["mig_devices"] if m["slot"] == int(mig))["uuid"]


@pytest.fixture(scope="module")
def node(k8s, tmp_path_factory):
    """nvshim installed the documented way (the engine's overlay through the test overlay
    that sets only the environment), the host in the plugin's mixed layout."""
    state = install(k8s, tmp_path_factory.mktemp("overlay"), PluginNode)
    try:
        yield state
    finally:
        state.plugin.stop()
        k8s.kubectl("delete", "namespace", state.ns, "--wait=false", check=False)
        k8s.kubectl("delete", "-k", state.overlay, "--ignore-not-found", "--wait=true",
                    check=False, timeout=400)  # fmt: skip
        k8s.kubectl("label", "node", NODE_NAME, f"{GPU_LABEL}-", check=False)
        change_host(k8s, k8s.sim_name)  # the shipped host back for the other tests


def plugin_flags(list_strategy: str, id_strategy: str, mig_strategy: str) -> dict[str, str]:
    """The plugin's flags for a cell: hooks of its CDI spec through nvshim-hook."""
    return {
        "device-list-strategy": list_strategy,
        "device-id-strategy": id_strategy,
        "mig-strategy": mig_strategy,
        "nvidia-cdi-hook-path": HOOK,
    }


def expect_exact(node: PluginNode, pod: str, cname: str, resource: str) -> str:
    """Container ``cname`` of ``pod`` saw exactly the device the checkpoint names; its UUID."""
    got = allocated(node.k8s, node.ns, pod, cname)
    assert list(got) == [resource], got
    (device_id,) = got[resource]
    uuid = node.device(device_id)
    nodes, cvd = node.view(node.logs(pod, cname))
    assert cvd == uuid, (cname, device_id, cvd)
    assert {n for n in nodes if not n.startswith("nvidia-caps")} == {node.gpu_node(uuid)}, nodes
    caps = {n for n in nodes if n.startswith("nvidia-caps")}
    assert bool(caps) == (uuid in node.migs), (cname, nodes)
    return uuid


@pytest.mark.parametrize("mig_strategy,list_strategy,id_strategy", CELLS,
                         ids=["-".join(c) for c in CELLS])  # fmt: skip
def test_strategy_matrix(node, mig_strategy, list_strategy, id_strategy):
    host, resources = MIG[mig_strategy]
    if node.layout != host:
        seconds = node.set_host(layout(host), host)
        print(f"nvshim's CDI spec followed the host to {host} in {seconds:.1f} s")
    node.plugin.start(plugin_flags(list_strategy, id_strategy, mig_strategy), resources=resources)
    name = f"{mig_strategy}-{list_strategy}-{id_strategy}"
    containers = [container(f"c{i}", resource=r) for i, r in enumerate(resources)]
    node.pod(name, containers)
    if list_strategy == "envvar":
        assert_refused(node, name)
        events = node.events(name)
        assert "NVIDIA_VISIBLE_DEVICES=" in events and "not honoured" in events, events
        return
    phase = node.done(name)
    if list_strategy == "cdi-cri" and node.k8s.name == "1.6":
        # containerd 1.6 has no CDI: the kubelet's CDIDevices never reach the runtime
        assert phase == "Succeeded", node.events(name)
        for i, _resource in enumerate(resources):
            nodes, cvd = node.view(node.logs(name, f"c{i}"))
            assert not nodes and not cvd, nodes
        return
    assert phase == "Succeeded", node.events(name) + node.plugin.log(2000)
    uuids = [expect_exact(node, name, f"c{i}", r) for i, r in enumerate(resources)]
    assert len(set(uuids)) == len(uuids)
    node.kubectl("delete", "pod", "-n", node.ns, name, "--wait=false")


def test_new_mig_device_after_a_relayout(node):
    """mig-manager makes GPU 0 one 7g.80gb under the running cluster: nvshim's spec
    follows within seconds, and the restarted plugin's new resource reaches a pod."""
    seconds = node.set_host(layout("mixed-7g"), "mixed-7g")
    print(f"nvshim's CDI spec followed the MIG change in {seconds:.1f} s")
    assert seconds < 15
    node.plugin.start(plugin_flags("volume-mounts", "uuid", "mixed"),
                      resources=("nvidia.com/mig-7g.80gb",))  # fmt: skip
    node.pod("mig-7g", [container("c0", resource="nvidia.com/mig-7g.80gb")])
    assert node.done("mig-7g") == "Succeeded", node.events("mig-7g")
    uuid = expect_exact(node, "mig-7g", "c0", "nvidia.com/mig-7g.80gb")
    assert node.migs[uuid][0]["index"] == 0


def test_driver_upgrade_is_followed(node):
    """The driver container upgrades the driver: the spec names the new libraries
    within seconds and a new GPU pod gets them."""
    seconds = node.set_host(layout("mixed", driver_version="550.127.05"), "upgraded")
    print(f"nvshim's CDI spec followed the driver upgrade in {seconds:.1f} s")
    assert seconds < 15
    node.plugin.start(plugin_flags("volume-mounts", "uuid", "mixed"))
    show = "ls /usr/lib/x86_64-linux-gnu; " + container("x")["command"][2]
    node.pod("upgraded", [container("c0", show, resource="nvidia.com/gpu")])
    assert node.done("upgraded") == "Succeeded", node.events("upgraded")
    out = node.logs("upgraded")
    assert "libcuda.so.550.127.05" in out and "libcuda.so.550.90.12" not in out, out
    expect_exact(node, "upgraded", "c0", "nvidia.com/gpu")
    assert re.search(r"^CVD=GPU-", out, re.M)


# OpenShift's GPU-sharing guide: the time-slicing config as a ConfigMap (its key names the
# node's config), handed to the device plugin as its config file (the GPU Operator's
# ClusterPolicy devicePlugin.config)
TIME_SLICING = """\
version: v1
flags:
  migStrategy: mixed
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""


def test_openshift_time_slicing_config_with_replicas(node):
    k8s = node.k8s
    if node.layout != "mixed":
        node.set_host(layout("mixed"), "mixed")
    k8s.apply({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "time-slicing-config", "namespace": node.ns},
               "data": {"any": TIME_SLICING}})  # fmt: skip
    config = k8s.get("configmap", "-n", node.ns, "time-slicing-config")["data"]["any"]
    node.plugin.start(plugin_flags("volume-mounts", "uuid", "mixed"), config=config)
    whole = [u for u, g in node.gpus.items() if g.get("mig_mode") != "enabled"]
    deadline = time.monotonic() + 30  # the kubelet's node status catches up
    while True:
        offered = k8s.get("node", NODE_NAME)["status"]["allocatable"].get("nvidia.com/gpu")
        if offered == str(4 * len(whole)) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert offered == str(4 * len(whole))  # four replicas of each whole GPU
    names = [f"ts-{n}" for n in range(3)]
    for name in names:
        node.pod(name, [container("c0", resource="nvidia.com/gpu")])
    for name in names:
        assert node.done(name) == "Succeeded", node.events(name)
        (replica,) = allocated(k8s, node.ns, name, "c0")["nvidia.com/gpu"]
        assert "::" in replica, replica  # a time-slicing replica of one GPU
        expect_exact(node, name, "c0", "nvidia.com/gpu")
    k8s.kubectl("delete", "pod", "-n", node.ns, *names, "--wait=false")
