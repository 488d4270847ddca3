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
- docs/gpu-operator.md's shapes, read from the page (containerd);
- on CRI-O (OpenShift's engine): every list strategy under MIG mixed, and the OpenShift
  GPU-sharing guide's ``time-slicing-config`` ConfigMap with replicas as the plugin's
  config: each pod gets the GPU its replica belongs to.

One cluster per containerd version (shared with the other cluster tests), one nvshim
install per version, one plugin restart and one pod per matrix cell.
"""

from __future__ import annotations

import os
import re
import time

import pytest
import yaml

from tests.k8s.artifacts import ENGINES
from tests.k8s.cluster import NODE_NAME
from tests.k8s.nvidia_plugin import (
    NvidiaPlugin,
    allocate_response,
    allocated,
    change_host,
    layout,
)
from tests.sim import fake_mps_control
from tests.test_k8s_node_e2e import (
    KUBE,
    SHOW,
    Node,
    _set_sharing,
    _sharing_configmap,
    assert_refused,
    container,
    install,
    uninstall,
)

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
STAND_IN = ("volume-mounts", "cdi-annotations", "envvar")  # tests/fake_device_plugin.py's
CRIO_CELLS = [("mixed", lst, "uuid") for lst in LISTS]  # OpenShift's MIG mixed


def _engine_id(name: str) -> str:
    return name if name == "crio" else f"ctd{name}"


@pytest.fixture(scope="session", params=ENGINES, ids=_engine_id)
def k8s(request, k8s_clusters):
    """The shared cluster of each engine (containerd 1.6, 1.7, CRI-O)."""
    return k8s_clusters(request.param)


def wanted(item) -> bool:
    """The matrix on both containerd versions and its MIG-mixed row on CRI-O; the
    OpenShift shapes on CRI-O; the host changes and the GPU Operator page on containerd
    (tests/conftest.py drops the rest)."""
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
        # the simulated host's MPS control: the fake daemon, run by the installer image's
        # interpreter (tests/sim/fake_mps_control), kept across host changes
        ((path, text),) = fake_mps_control.extra_files().items()
        self.extra_files = {
            path: text.replace("#!/usr/bin/python3", "#!/opt/nvshim/bin/python3", 1)
        }

    def set_host(self, topology: dict, name: str, timeout: float = 30.0) -> float:
        """Change the simulated host; wait until nvshim's CDI spec names exactly its
        devices; the seconds that took."""
        started = time.monotonic()
        change_host(self.k8s, topology, self.extra_files)
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

    def use_layout(self, name: str) -> None:
        """The host in layout ``name`` (``tests/k8s/nvidia_plugin.layout``)."""
        if self.layout != name:
            seconds = self.set_host(layout(name), name)
            print(f"nvshim's CDI spec followed the host to {name} in {seconds:.1f} s")

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
    """nvshim installed the documented way (overlays/containerd through the test overlay
    that sets only the environment), the host in the plugin's mixed layout."""
    state = install(k8s, tmp_path_factory.mktemp("overlay"), PluginNode)
    try:
        yield state
    finally:
        state.plugin.clean()
        uninstall(state)
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


def check_pod(node: PluginNode, name: str, resources, list_strategy: str, show: str = SHOW):
    """Run a pod with one container per resource; check what each container got against
    the checkpoint (or the refusal, or containerd 1.6's lack of CDI); the UUIDs seen."""
    containers = [container(f"c{i}", show, resource=r) for i, r in enumerate(resources)]
    node.pod(name, containers)
    uuids: list[str] = []
    if list_strategy == "envvar":
        assert_refused(node, name)  # (CRI-O retries the create: the pod stays Pending)
        events = node.events(name)
        assert "NVIDIA_VISIBLE_DEVICES=" in events and "not honoured" in events, events
        return uuids
    phase = node.done(name)
    if list_strategy == "cdi-cri" and node.k8s.name == "1.6":
        # containerd 1.6 has no CDI: the kubelet's CDIDevices never reach the runtime
        assert phase == "Succeeded", node.events(name)
        for i, _resource in enumerate(resources):
            nodes, cvd = node.view(node.logs(name, f"c{i}"))
            assert not nodes and not cvd, nodes
    else:
        assert phase == "Succeeded", node.events(name) + node.plugin.log(2000)
        uuids = [expect_exact(node, name, f"c{i}", r) for i, r in enumerate(resources)]
    return uuids


@pytest.mark.parametrize("mig_strategy,list_strategy,id_strategy", CELLS,
                         ids=["-".join(c) for c in CELLS])  # fmt: skip
def test_strategy_matrix(node, mig_strategy, list_strategy, id_strategy):
    host, resources = MIG[mig_strategy]
    node.use_layout(host)
    node.plugin.start(plugin_flags(list_strategy, id_strategy, mig_strategy), resources=resources)
    name = f"{mig_strategy}-{list_strategy}-{id_strategy}"
    uuids = check_pod(node, name, resources, list_strategy)
    assert len(set(uuids)) == len(uuids)
    # the stand-in names UUIDs; the plugin's answers are the engine's to apply, so the
    # containerd cells hold it (on CRI-O a refused pod is deleted once its events say why)
    if list_strategy in STAND_IN and id_strategy == "uuid" and node.k8s.engine != "crio":
        hold_stand_in(node, name, list_strategy)
    node.kubectl("delete", "pod", "-n", node.ns, name, "--wait=false", "--ignore-not-found")


def hold_stand_in(node: PluginNode, pod: str, list_strategy: str) -> None:
    """tests/fake_device_plugin.py answers Allocate as the real plugin did here."""
    from tests.fake_device_plugin import CDI_ANNOTATION, M, allocation

    def shape(response) -> tuple:
        keys = {k[: len(CDI_ANNOTATION)] if k.startswith(CDI_ANNOTATION) else k
                for k in response.annotations}  # fmt: skip
        mounts = [(m.container_path, m.host_path, m.read_only) for m in response.mounts]
        return dict(response.envs), mounts, keys, sorted(response.annotations.values())

    ids = next(iter(allocated(node.k8s, node.ns, pod, "c0").values()))
    real = M["ContainerAllocateResponse"].FromString(
        allocate_response(node.k8s, node.ns, pod, "c0")
    )
    assert shape(allocation(list_strategy, ids, 0)) == shape(real)


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
    show = "ls /usr/lib/x86_64-linux-gnu; " + SHOW
    node.pod("upgraded", [container("c0", show, resource="nvidia.com/gpu")])
    assert node.done("upgraded") == "Succeeded", node.events("upgraded")
    out = node.logs("upgraded")
    assert "libcuda.so.550.127.05" in out and "libcuda.so.550.90.12" not in out, out
    expect_exact(node, "upgraded", "c0", "nvidia.com/gpu")
    assert re.search(r"^CVD=GPU-", out, re.M)


# -- the GPU Operator page's shapes (docs/gpu-operator.md), read from the page --------------

PAGE = os.path.join(os.path.dirname(KUBE), "..", "docs", "gpu-operator.md")
GFD_PRODUCT = "nvidia.com/device-plugin.config"  # the label the plugin's config-manager reads


def page_shapes() -> dict[str, list[dict]]:
    """``{shape: [helm values, other objects...]}``: each ``<!-- shape: NAME -->`` block."""
    with open(PAGE, encoding="utf-8") as fh:
        text = fh.read()
    found = re.findall(r"<!-- shape: ([\w-]+) -->\n```yaml\n(.*?)```", text, re.S)
    return {name: list(yaml.safe_load_all(body)) for name, body in found}


SHAPES = page_shapes()


def shape_settings(node: PluginNode, docs: list[dict]) -> tuple[dict, str | None, str]:
    """The device plugin's environment, config file text and MIG strategy the GPU
    Operator gives it for these values (``devicePlugin.env``, ``mig.strategy`` as
    ``MIG_STRATEGY``, the ``devicePlugin.config`` ConfigMap key its config-manager picks:
    the node's ``nvidia.com/device-plugin.config`` label, else ``default``)."""
    values, *objects = docs
    assert values["toolkit"]["enabled"] is False  # nvshim replaces the toolkit
    plugin = values.get("devicePlugin", {})
    env = {e["name"]: e["value"] for e in plugin.get("env", [])}
    if "mig" in values:
        env["MIG_STRATEGY"] = values["mig"]["strategy"]
    config = None
    if "config" in plugin:
        maps = {o["metadata"]["name"]: o for o in objects if o.get("kind") == "ConfigMap"}
        data = maps[plugin["config"]["name"]]["data"]
        labels = node.k8s.get("node", NODE_NAME)["metadata"].get("labels", {})
        key = labels.get(GFD_PRODUCT) or plugin["config"]["default"]
        config = data[key]
    flags = (yaml.safe_load(config) or {}).get("flags", {}) if config else {}
    mig = env.get("MIG_STRATEGY") or flags.get("migStrategy") or "none"
    return env, config, mig


def mps_running(node: PluginNode, uuid: str) -> int | None:
    path = node.k8s.path(f"/run/nvshim/mps/{uuid}/pipe/nvidia-cuda-mps-control.pid")
    try:
        with open(path) as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_gpu_operator_shape(node, shape):
    """Each shape of docs/gpu-operator.md, its values applied to the real plugin as the
    GPU Operator applies them; sharing shapes put two pods' containers on replicas."""
    docs = SHAPES[shape]
    sharing = next((o for o in docs[1:] if o["metadata"]["name"] == "nvshim-sharing"), None)
    labelled = shape == "time-slicing-openshift"
    if labelled:  # the node's GPU model, as GPU feature discovery spells it
        model = node.k8s.sim.topology["gpus"][0]["name"].replace(" ", "-")
        node.kubectl("label", "node", NODE_NAME, f"{GFD_PRODUCT}={model}", "--overwrite")
    original = None
    try:
        env, config, mig = shape_settings(node, docs)
        host, resources = MIG[mig]
        node.use_layout(host)
        if sharing is not None:
            name = _sharing_configmap(node)  # the overlay's generated name
            original = node.k8s.get("configmap", "-n", "nvshim", name)["data"]["sharing.yaml"]
            _set_sharing(node, sharing["data"]["sharing.yaml"])
        node.plugin.start(env=env, config=config, resources=resources)
        replicas = config is not None and "timeSlicing" in config
        wanted = list(resources) + (["nvidia.com/gpu"] if replicas else [])
        show = SHOW + "; env | grep ^CUDA_MPS_ | sort"
        lst = env.get("DEVICE_LIST_STRATEGY", "envvar")
        uuids = check_pod(node, f"shape-{shape}", wanted, lst, show)
        if replicas:
            for c in (0, len(wanted) - 1):
                ids = allocated(node.k8s, node.ns, f"shape-{shape}", f"c{c}")["nvidia.com/gpu"]
                assert all("::" in i for i in ids), ids
        if sharing is not None:
            out = node.logs(f"shape-{shape}", "c0")
            assert mps_running(node, uuids[0]), out
            assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in out, out
            assert "CUDA_MPS_PIPE_DIRECTORY=" in out, out
            # a driver upgrade restarts the daemons within seconds (the installer's loop)
            before = mps_running(node, uuids[0])
            node.set_host(layout(host, driver_version="550.127.05"), "upgraded")
            deadline = time.monotonic() + 15
            while mps_running(node, uuids[0]) in (None, before):
                assert time.monotonic() < deadline, node.kubectl(
                    "-n", "nvshim", "logs", "daemonset/nvshim-node", "-c", "nvshim-node"
                ).stdout[-3000:]
                time.sleep(0.2)
    finally:
        node.kubectl("delete", "pod", "-n", node.ns, f"shape-{shape}", "--wait=false", check=False)
        if labelled:
            node.kubectl("label", "node", NODE_NAME, f"{GFD_PRODUCT}-", check=False)
        if original is not None:
            _set_sharing(node, original)


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
    node.use_layout("mixed")
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
