"""The documented Kubernetes steps, run literally on a real one-node cluster
(tests/k8s/cluster.py: kubelet, API server, containerd 1.6 and 1.7, CRI-O 1.36) whose
driver root is the simulated 8 x H100 host (GPUs 6 and 7 in MIG mode), issues 23 and 31:

apply the engine's overlay (containerd, crio) plus only a test overlay for the environment
(the simulated driver root, the image tag), ``rollout status``, the documented smoke pod; the device
plugin's request forms (tests/fake_device_plugin.py answers Allocate as NVIDIA's plugin
does: volume-mounts, envvar; the cdi forms with the real plugin in
tests/test_k8s_nvidia_plugin.py), each getting exactly its GPU or MIG device,
or refused with the reason in the pod's events; a GPU init container and two GPU
containers in one pod; ``kubectl exec``; a read-only root; the exporter scraped at its
pod IP; a rolling update to a second image tag with a GPU pod running; kill -9 of the
installer; ``kubectl delete -k`` (the engine config byte for byte, the uninstall's lines
in ``kubectl logs``, a running GPU pod still exec-able and deletable, then nothing left).
On CRI-O: the drop-in and nothing else in ``crio.conf.d``, CRI-O restarted (a SIGHUP does
not apply handler changes) and the log saying why, and an uninstall that leaves CRI-O
running while containers of nvshim's handler remain (they stay manageable through the
pass-through, which goes with the last of them).

One cluster per engine, one install, many assertions per pod: the tests of this module run
in order and share the install.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import yaml

from tests.conftest import REPO
from tests.fake_device_plugin import Plugin
from tests.k8s import artifacts
from tests.k8s.cluster import CONTAINERD_CONFIG, CRIO_DROP_INS, DRIVER_ROOT, NODE_NAME
from tests.test_node_lifecycle import SHARING

KUBE = os.path.join(REPO, "packaging", "kubernetes")
UBUNTU = "docker.io/library/ubuntu:24.04"  # the examples' image: busybox, retagged
TAG, TAG2 = "localhost/nvshim-node:test", "localhost/nvshim-node:test2"
SHOW = "ls /dev /dev/nvidia-caps 2>/dev/null; echo CVD=$CUDA_VISIBLE_DEVICES"
GPU_LABEL = "nvidia.com/gpu.present"
PLUGINS = {  # resource -> strategy, which devices (whole GPUs 0-5, or the 1g.10gb MIGs)
    "nvidia.com/gpu": ("volume-mounts", "gpus"),
    "nvshim.test/gpu-env": ("envvar", "gpus"),
    "nvidia.com/mig-1g.10gb": ("volume-mounts", "migs"),
}

# the environment, and nothing else: the simulated host is the driver root, the image is
# the one built from this checkout
TEST_OVERLAY = """\
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- {base}
images:
- name: localhost/nvshim-node
  newTag: test
patches:
- path: environment.yaml
"""
ENVIRONMENT = f"""\
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: nvshim-node
  namespace: nvshim
spec:
  template:
    spec:
      containers:
      - name: nvshim-node
        env:
        - name: NVIDIA_DRIVER_ROOT
          value: {DRIVER_ROOT}
        - name: NVIDIA_DEV_ROOT
          value: {DRIVER_ROOT}
"""


CRIO_DROP_IN = f"{CRIO_DROP_INS}/99-nvshim.toml"  # the crio overlay's RUNTIME_CONFIG


@pytest.fixture(scope="session", params=artifacts.ENGINES,
                ids=lambda v: v if v == "crio" else f"ctd{v}")  # fmt: skip
def k8s(request, k8s_clusters):
    """The shared cluster of each engine (containerd 1.6, 1.7, CRI-O)."""
    return k8s_clusters(request.param)


def wanted(item) -> bool:
    """Engine-shaped tests run on their engine only (tests/conftest.py deselects the rest):
    the AKS node shape on containerd, the ``test_crio_*`` ones on CRI-O."""
    engine = item.callspec.params.get("k8s")
    if item.originalname.startswith("test_aks"):
        return engine != "crio"
    if item.originalname.startswith("test_crio"):
        return engine == "crio"
    return True


def engine_files(k8s) -> dict[str, bytes]:
    """The engine's configuration as the installer may change it: containerd's config
    file; every file under CRI-O's /etc/crio (crio.conf, crio.conf.d, the sidecars)."""
    if k8s.engine == "containerd":
        return {CONTAINERD_CONFIG: open(k8s.path(CONTAINERD_CONFIG), "rb").read()}
    top = k8s.path("/etc/crio")
    found = {}
    for path, _dirs, files in os.walk(top):
        for name in files:
            with open(os.path.join(path, name), "rb") as fh:
                found[os.path.relpath(os.path.join(path, name), top)] = fh.read()
    return found


def assert_registered(k8s) -> None:
    """nvshim's runtime is in the engine's config (CRI-O: its drop-in, alone there)."""
    if k8s.engine == "containerd":
        config = open(k8s.path(CONTAINERD_CONFIG)).read()
        assert 'BinaryName = "/usr/local/nvshim/bin/nvshim-runtime"' in config
        assert "cdi.k8s.io/*" in config
        return
    import tomllib

    # CRI-O parses every file in crio.conf.d: no backup or record may sit there
    assert os.listdir(k8s.path(CRIO_DROP_INS)) == ["99-nvshim.toml"]
    table = tomllib.loads(open(k8s.path(CRIO_DROP_IN)).read())["crio"]["runtime"]
    handler = table["runtimes"]["nvshim"]
    # a drop-in table replaces the whole handler: every key of runc's is there
    assert handler["runtime_path"] == "/usr/local/nvshim/bin/nvshim-runtime"
    assert handler["runtime_type"] == "oci"
    assert handler["monitor_path"] == "/usr/bin/conmon"
    assert handler["runtime_root"] == "/run/nvshim-runc"  # nvshim's containers, apart
    assert "default_runtime" not in table


class Node:
    """The cluster with nvshim installed by the test overlay, and what the tests share."""

    def __init__(self, k8s, overlay: str, original: dict, ready_after: float) -> None:
        self.k8s = k8s
        self.overlay = overlay
        self.original = original
        self.ready_after = ready_after
        self.plugins: dict[str, Plugin] = {}
        self.gpus = {g["uuid"]: g for g in k8s.sim.topology["gpus"]}
        self.migs = {
            m["uuid"]: (g, m) for g in k8s.sim.topology["gpus"] for m in g.get("mig_devices", [])
        }
        self.ns = "e2e"

    def kubectl(self, *args, **kw):
        return self.k8s.kubectl(*args, **kw)

    def pod(self, name: str, containers: list[dict], **spec) -> dict:
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": self.ns},
            "spec": {
                "runtimeClassName": "nvshim",
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 0,
                "containers": containers,
                **spec,
            },
        }
        self.k8s.apply(body)
        return body

    def logs(self, pod: str, container: str | None = None) -> str:
        args = ["logs", "-n", self.ns, pod] + (["-c", container] if container else [])
        return self.kubectl(*args).stdout

    def done(self, pod: str, timeout: float = 90) -> str:
        return self.k8s.wait_pod_done(pod, self.ns, timeout)

    def events(self, pod: str) -> str:
        out = self.kubectl(
            "get", "events", "-n", self.ns, "--field-selector", f"involvedObject.name={pod}",
            "-o", "json",
        )  # fmt: skip
        return "\n".join(e.get("message", "") for e in json.loads(out.stdout)["items"])

    def installer_pod(self) -> dict:
        pods = self.k8s.get("pods", "-n", "nvshim", "-l", "app.kubernetes.io/name=nvshim-node")
        live = [p for p in pods["items"] if not p["metadata"].get("deletionTimestamp")]
        assert len(live) == 1, [p["metadata"]["name"] for p in pods["items"]]
        return live[0]

    def view(self, text: str) -> tuple[set[str], str]:
        """The GPU device nodes a container listed and its CUDA_VISIBLE_DEVICES."""
        nodes = set(re.findall(r"^(nvidia\d+)$", text, re.M))
        nodes |= {f"nvidia-caps/{n}" for n in re.findall(r"^(nvidia-cap\d+)$", text, re.M)}
        cvd = re.search(r"^CVD=(.*)$", text, re.M)
        return nodes, cvd.group(1) if cvd else ""

    def gpu_node(self, uuid: str) -> str:
        if uuid in self.gpus:
            return f"nvidia{self.gpus[uuid]['minor']}"
        return f"nvidia{self.migs[uuid][0]['minor']}"


def container(name: str, command: str = SHOW, resource: str | None = None, **extra) -> dict:
    body = {"name": name, "image": artifacts.BUSYBOX, "command": ["sh", "-c", command]}
    if resource:
        body["resources"] = {"limits": {resource: 1}}
    body.update(extra)
    return body


# node paths the installer writes (or that hold what it writes); compared before and after
HOST_PATHS = ("/usr/local/nvshim", "/usr/local/nvshim-versions", "/etc/nvshim", "/run/nvshim",
              "/run/cdi/nvshim.yaml", "/run/nvshim-runc", "/usr/local/bin",
              "/etc/containers/oci/hooks.d")  # fmt: skip


def host_state(k8s) -> dict[str, object]:
    """What the node has at each of HOST_PATHS: a directory's names, "file", or None."""
    state: dict[str, object] = {}
    for path in HOST_PATHS:
        full = k8s.path(path)
        if os.path.isdir(full) and not os.path.islink(full):
            state[path] = sorted(os.listdir(full))
        else:
            state[path] = "file" if os.path.lexists(full) else None
    return state


def install(k8s, overlay, node_class: type) -> Node:
    """Install nvshim the documented way (the node labelled, the engine's overlay applied
    through a test overlay in the directory ``overlay`` that sets only the environment,
    rollout status); a ``node_class`` for it, with its namespace made."""
    k8s.import_node_image(TAG)
    base = os.path.join(KUBE, "overlays", "crio" if k8s.engine == "crio" else "containerd")
    relative = os.path.relpath(base, overlay)  # kustomize takes no absolute base
    (overlay / "kustomization.yaml").write_text(TEST_OVERLAY.format(base=relative))
    (overlay / "environment.yaml").write_text(ENVIRONMENT)
    original = engine_files(k8s)
    # a host with an empty /etc/nvshim already (an earlier package's): it stays
    os.makedirs(k8s.path("/etc/nvshim"), exist_ok=True)
    host_before = host_state(k8s)
    k8s.kubectl("label", "node", NODE_NAME, f"{GPU_LABEL}=true", "--overwrite")
    started = time.monotonic()
    k8s.kubectl("apply", "-k", str(overlay))
    k8s.kubectl("-n", "nvshim", "rollout", "status", "daemonset/nvshim-node", "--timeout=180s",
                timeout=240)  # fmt: skip
    state = node_class(k8s, str(overlay), original, time.monotonic() - started)
    state.host_before = host_before
    k8s.kubectl("create", "namespace", state.ns)
    k8s.wait_service_account(state.ns)
    return state


def uninstall(state: Node) -> None:
    """Take back what ``install`` did (the namespace without waiting)."""
    k8s = state.k8s
    k8s.kubectl("delete", "namespace", state.ns, "--wait=false", check=False)
    k8s.kubectl("delete", "-k", state.overlay, "--ignore-not-found", "--wait=true",
                check=False, timeout=400)  # fmt: skip
    k8s.kubectl("label", "node", NODE_NAME, f"{GPU_LABEL}-", check=False)


@pytest.fixture(scope="module")
def node(k8s, tmp_path_factory):
    """nvshim installed the documented way: label the node, apply the engine's overlay
    through the test overlay, rollout status. The device plugin stand-ins registered."""
    k8s.tag_image(artifacts.BUSYBOX, UBUNTU)
    state = install(k8s, tmp_path_factory.mktemp("overlay"), Node)
    plugin_dir = os.path.join(str(k8s.workdir), "kubelet", "device-plugins")
    sim = k8s.sim.topology["gpus"]
    ids = {
        "gpus": [g["uuid"] for g in sim if g.get("mig_mode") != "enabled"],
        "migs": [
            m["uuid"] for g in sim for m in g.get("mig_devices", []) if m["profile"] == "1g.10gb"
        ],
    }
    try:
        for resource, (strategy, kind) in PLUGINS.items():
            state.plugins[resource] = Plugin(plugin_dir, resource, strategy, ids[kind]).start()
        deadline = time.monotonic() + 60
        while True:
            allocatable = k8s.get("node", NODE_NAME)["status"].get("allocatable", {})
            if all(allocatable.get(r, "0") != "0" for r in PLUGINS):
                break
            assert time.monotonic() < deadline, allocatable
            time.sleep(0.3)
        yield state
    finally:
        for plugin in state.plugins.values():
            plugin.stop()
        uninstall(state)


def test_installed_on_the_node(node):
    k8s = node.k8s
    assert_registered(k8s)
    # the CDI spec went to the node's /var/run/cdi (a link to /run there)
    spec = yaml.safe_load(open(k8s.path("/run/cdi/nvshim.yaml")))
    whole = {u for u, g in node.gpus.items() if g.get("mig_mode") != "enabled"}
    assert {d["name"] for d in spec["devices"]} >= whole | set(node.migs) | {"all"}
    prefix = k8s.path("/usr/local/nvshim")
    assert os.readlink(prefix).startswith("nvshim-versions/")
    pod = node.installer_pod()
    assert all(c["ready"] for c in pod["status"]["containerStatuses"])
    print(f"apply -> ready: {node.ready_after:.1f} s")


def test_the_documented_smoke_pod(node):
    with open(os.path.join(KUBE, "examples", "gpu-smoke.yaml")) as fh:
        text = fh.read()
    node.kubectl("apply", "-n", node.ns, "-f", "-", input=text)
    assert node.done("gpu-smoke") == "Succeeded", node.events("gpu-smoke")
    out = node.logs("gpu-smoke")
    gpu0 = node.k8s.sim.topology["gpus"][0]
    assert "/dev/nvidia0\n" in out and "/dev/nvidia1\n" not in out, out
    assert "/dev/nvidiactl" in out and "NVIDIA-SMI" in out
    assert f"CUDA_VISIBLE_DEVICES={gpu0['uuid']}" in out


@pytest.mark.parametrize("resource", ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb"])
def test_device_plugin_forms_get_exactly_their_device(node, resource):
    plugin = node.plugins[resource]
    name = "dp-" + re.sub(r"[^a-z0-9]+", "-", resource.lower())
    node.pod(name, [container("main", resource=resource)])
    assert node.done(name) == "Succeeded", node.events(name)
    (got,) = plugin.allocated[-1:]
    assert len(got) == 1
    nodes, cvd = node.view(node.logs(name))
    assert cvd == got[0]
    assert {n for n in nodes if not n.startswith("nvidia-caps")} == {node.gpu_node(got[0])}
    if got[0] in node.migs:  # a MIG device: its capability nodes come with it
        assert any(n.startswith("nvidia-caps/") for n in nodes), nodes


def assert_refused(node, name: str) -> None:
    """Pod ``name``'s container never started: containerd fails the pod; CRI-O's failed
    create is CreateContainerError, retried, the pod stays Pending (deleted here once its
    events say why)."""
    if node.k8s.engine != "crio":
        assert node.done(name) == "Failed"
        return
    deadline = time.monotonic() + 60
    while True:
        pod = node.k8s.get("pod", "-n", node.ns, name)
        reasons = [c["state"].get("waiting", {}).get("reason")
                   for c in pod["status"].get("containerStatuses", [])]  # fmt: skip
        if "CreateContainerError" in reasons and "not honoured" in node.events(name):
            break
        assert time.monotonic() < deadline, (reasons, node.events(name))
        time.sleep(0.5)
    assert pod["status"]["phase"] == "Pending"
    # (the kubelet creates a pod's containers in turn: those after the refused one wait)
    assert set(reasons) <= {"CreateContainerError", "ContainerCreating"}, reasons
    node.kubectl("delete", "pod", "-n", node.ns, name)


def test_env_request_is_refused_with_the_reason_at_the_pod(node):
    """The device plugin's default envvar strategy from an unprivileged pod: the pod
    fails to start and says why, never runs without its GPU."""
    node.pod("dp-env", [container("main", resource="nvshim.test/gpu-env")])
    assert_refused(node, "dp-env")
    events = node.events("dp-env")
    assert "NVIDIA_VISIBLE_DEVICES=" in events and "not honoured" in events, events
    assert "volume-mounts" in events


def test_init_container_and_two_gpu_containers(node):
    node.pod(
        "multi",
        [
            container("a", resource="nvidia.com/gpu"),
            container("b", resource="nvidia.com/gpu"),
        ],
        initContainers=[container("init", resource="nvidia.com/gpu")],
    )
    assert node.done("multi") == "Succeeded", node.events("multi")
    seen = {}
    for name in ("init", "a", "b"):
        nodes, cvd = node.view(node.logs("multi", name))
        assert cvd in node.gpus and nodes == {node.gpu_node(cvd)}, (name, nodes, cvd)
        seen[name] = cvd
    assert seen["a"] != seen["b"]  # two containers, two GPUs


def test_read_only_root_gpu_pod(node):
    ro = {"securityContext": {"readOnlyRootFilesystem": True}}
    node.pod("ro", [container("main", resource="nvidia.com/gpu", **ro)])
    assert node.done("ro") == "Succeeded", node.events("ro")
    nodes, cvd = node.view(node.logs("ro"))
    assert cvd in node.gpus and nodes == {node.gpu_node(cvd)}


def running_gpu_pod(node, name: str) -> str:
    node.pod(name, [container("main", "exec sleep 3600", resource="nvidia.com/gpu")])
    node.k8s.wait("-n", node.ns, f"pod/{name}", "--for=condition=Ready", timeout=90)
    return node.plugins["nvidia.com/gpu"].allocated[-1][0]


def exec_view(node, pod: str) -> tuple[set[str], str]:
    out = node.kubectl("exec", "-n", node.ns, pod, "--", "sh", "-c", SHOW)
    return node.view(out.stdout)


def test_kubectl_exec_sees_the_gpu(node):
    uuid = running_gpu_pod(node, "long-1")
    nodes, cvd = exec_view(node, "long-1")
    assert cvd == uuid and nodes == {node.gpu_node(uuid)}


HOOKS_D = "/usr/share/containers/oci/hooks.d"  # CRI-O's hooks_dir (the test cluster's too)


def test_crio_oci_hook_beside_the_runtime_class(node):
    """A CRI-O node whose hooks.d also holds nvshim's OCI hook (as the Debian package puts
    it there): a pod on the runtime class gets its GPU once (the hook finds the runtime's
    work done), a pod without one gets the GPU it mounts from the hook alone."""
    from nvshim.install import HOOK_FILE, hook_file_text

    k8s = node.k8s
    hook = k8s.path(f"{HOOKS_D}/{HOOK_FILE}")
    os.makedirs(os.path.dirname(hook), exist_ok=True)
    with open(hook, "w") as fh:
        fh.write(hook_file_text("/usr/local/nvshim/bin/nvshim-hook"))
    try:
        time.sleep(1)  # CRI-O watches hooks.d
        node.pod("hook-rc", [container("main", resource="nvidia.com/gpu")])
        gpu2 = k8s.sim.topology["gpus"][2]
        mount = {"name": "gpu", "mountPath": f"/var/run/nvidia-container-devices/{gpu2['uuid']}",
                 "readOnly": True}  # fmt: skip
        volumes = [{"name": "gpu", "hostPath": {"path": "/dev/null", "type": "CharDevice"}}]
        node.pod("hook-plain", [container("main", volumeMounts=[mount])], volumes=volumes,
                 runtimeClassName=None)  # fmt: skip
        for name in ("hook-rc", "hook-plain"):
            assert node.done(name) == "Succeeded", node.events(name)
        uuid = node.plugins["nvidia.com/gpu"].allocated[-1][0]
        nodes, cvd = node.view(node.logs("hook-rc"))
        assert cvd == uuid and nodes == {node.gpu_node(uuid)}
        nodes, cvd = node.view(node.logs("hook-plain"))
        assert nodes == {f"nvidia{gpu2['minor']}"} and cvd == ""  # (a hook sets no env)
    finally:
        os.unlink(hook)


def test_exporter_scraped_at_its_pod_ip(node):
    ip = node.installer_pod()["status"]["podIP"]
    code = (
        "import sys, urllib.request;"
        f"sys.stdout.write(urllib.request.urlopen('http://{ip}:9400/metrics', timeout=10)"
        ".read().decode())"
    )
    out = node.k8s.nsenter([sys.executable, "-I", "-c", code], net_only=True)
    assert out.returncode == 0, out.stderr
    metrics = out.stdout
    assert "nvshim_containers" in metrics
    decided = re.findall(r"^nvshim_containers_total\{(.*)\} (\d+)", metrics, re.M)
    assert any('decision="' in labels and int(n) > 0 for labels, n in decided), metrics[-2000:]


def _sharing_configmap(node) -> str:
    ds = node.k8s.get("daemonset", "-n", "nvshim", "nvshim-node")
    volumes = ds["spec"]["template"]["spec"]["volumes"]
    return next(v["configMap"]["name"] for v in volumes if v["name"] == "sharing-config")


def _set_sharing(node, text: str) -> None:
    name = _sharing_configmap(node)
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "nvshim"},
        "data": {"sharing.yaml": text},
    }
    node.k8s.apply(body)
    node.kubectl("-n", "nvshim", "rollout", "restart", "daemonset/nvshim-node")
    node.kubectl("-n", "nvshim", "rollout", "status", "daemonset/nvshim-node",
                 "--timeout=240s", timeout=300)  # fmt: skip


def test_mps_from_the_sharing_configmap(node):
    """An MPS sharing config in the nvshim-sharing ConfigMap: the installer runs a daemon
    per shared GPU (the simulated host's control binary: tests/sim/fake_mps_control, run
    by the image's own interpreter) and two pods on one GPU each get its daemon and their
    share."""
    from tests.sim import fake_mps_control

    k8s = node.k8s
    control = os.path.join(k8s.sim.driver_root, "usr/bin/nvidia-cuda-mps-control")
    stand_in = open(control, "rb").read()
    (text,) = fake_mps_control.extra_files().values()
    with open(control, "w") as fh:  # the installer image's interpreter runs it
        fh.write(text.replace("#!/usr/bin/python3", "#!/opt/nvshim/bin/python3", 1))
    original = k8s.get("configmap", "-n", "nvshim", _sharing_configmap(node))["data"]
    try:
        # 4 replicas of every whole GPU (MPS on MIG devices is refused: those are
        # nvidia.com/mig-* under the mixed strategy)
        _set_sharing(
            node, SHARING.replace("version: v1\n", "version: v1\nflags:\n  migStrategy: mixed\n")
        )
        gpu0 = k8s.sim.topology["gpus"][0]["uuid"]
        pid_file = k8s.path(f"/run/nvshim/mps/{gpu0}/pipe/nvidia-cuda-mps-control.pid")
        deadline = time.monotonic() + 30
        while not os.path.exists(pid_file):
            assert time.monotonic() < deadline, node.kubectl(
                "-n", "nvshim", "logs", "daemonset/nvshim-node", "-c", "nvshim-node"
            ).stdout
            time.sleep(0.3)
        show = "env | grep ^CUDA_ | sort; ls /dev"
        mounts = []
        for n in range(2):
            mount = {"name": "gpu", "mountPath": f"/var/run/nvidia-container-devices/{gpu0}::{n}",
                     "readOnly": True}  # fmt: skip
            volumes = [{"name": "gpu", "hostPath": {"path": "/dev/null", "type": "CharDevice"}}]
            node.pod(f"mps-{n}", [container("main", show, volumeMounts=[mount])],
                     volumes=volumes)  # fmt: skip
            mounts.append(mount)
        for n in range(2):
            assert node.done(f"mps-{n}") == "Succeeded", node.events(f"mps-{n}")
            out = node.logs(f"mps-{n}")
            assert f"CUDA_VISIBLE_DEVICES={gpu0}" in out, out
            assert "CUDA_MPS_PIPE_DIRECTORY=" in out, out
            assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in out, out
    finally:
        _set_sharing(node, original["sharing.yaml"])
        with open(control, "wb") as fh:
            fh.write(stand_in)
    assert not os.path.exists(pid_file)  # the daemons went with the MPS config


def _exec_state(node, pod: dict) -> dict:
    """What decides a pod's exec enforcement on the node (for a failure's message): its
    exec marker, runc's state of it holding nvshim's label, the prefix link."""
    from nvshim.oci.modify import EXEC_ENV_ANNOTATION

    k8s = node.k8s
    cid = pod["status"]["containerStatuses"][0]["containerID"].split("//", 1)[1]
    roots = ["/run/nvshim-runc", "/run/containerd/runc/k8s.io"]
    states = [k8s.path(f"{r}/{cid}/state.json") for r in roots]
    state = next((open(p, "rb").read() for p in states if os.path.exists(p)), b"")
    link = k8s.path("/usr/local/nvshim")
    return {
        "marker": os.path.exists(k8s.path(f"/run/nvshim/exec/{cid}")),
        "labelled": EXEC_ENV_ANNOTATION.encode() in state,
        "prefix": os.path.islink(link) and os.readlink(link),
    }


def test_rolling_update_to_a_second_tag_with_a_gpu_pod_running(node):
    k8s = node.k8s
    k8s.tag_image(TAG, TAG2)  # as an import of the archive tagged TAG2 would: the same image
    before = node.installer_pod()["metadata"]["name"]
    node.kubectl("-n", "nvshim", "set", "image", "daemonset/nvshim-node",
                 f"nvshim-node={TAG2}", f"exporter={TAG2}")  # fmt: skip
    node.kubectl("-n", "nvshim", "rollout", "status", "daemonset/nvshim-node",
                 "--timeout=240s", timeout=300)  # fmt: skip
    after = node.installer_pod()
    assert after["metadata"]["name"] != before
    assert {c["image"] for c in after["spec"]["containers"]} == {TAG2}
    # the GPU pod that ran through it all still runs, exec works, and new ones start
    pod = k8s.get("pod", "-n", node.ns, "long-1")
    assert pod["status"]["phase"] == "Running"
    assert pod["status"]["containerStatuses"][0]["restartCount"] == 0
    out = node.kubectl("exec", "-n", node.ns, "long-1", "--", "sh", "-c", SHOW).stdout
    nodes, cvd = node.view(out)
    assert cvd in node.gpus, (out, _exec_state(node, pod))
    node.pod("after-update", [container("main", resource="nvidia.com/gpu")])
    assert node.done("after-update") == "Succeeded", node.events("after-update")
    assert node.view(node.logs("after-update"))[1] in node.gpus


def _installer_pids(k8s) -> list[int]:
    """The installer's interpreter (``nvshim node run``) in the cluster's PID namespace
    (the DaemonSet runs with hostPID)."""
    return k8s.pids(
        lambda argv: b"node" in argv and b"run" in argv and any(b"nvshim" in a for a in argv)
    )


def test_kill_9_of_the_installer_converges(node):
    before = node.installer_pod()
    restarts = before["status"]["containerStatuses"]
    restarts = {c["name"]: c["restartCount"] for c in restarts}["nvshim-node"]
    pids = _installer_pids(node.k8s)
    assert len(pids) == 1, pids
    os.kill(pids[0], signal.SIGKILL)
    deadline = time.monotonic() + 120
    while True:
        pod = node.installer_pod()
        status = {c["name"]: c for c in pod["status"].get("containerStatuses", [])}
        mine = status.get("nvshim-node", {})
        if mine.get("restartCount", 0) > restarts and mine.get("ready"):
            break
        assert time.monotonic() < deadline, pod["status"]
        time.sleep(0.5)
    assert_registered(node.k8s)
    node.pod("after-kill", [container("main", resource="nvidia.com/gpu")])
    assert node.done("after-kill") == "Succeeded", node.events("after-kill")


def test_delete_k_restores_and_leaves_running_pods_manageable(node):
    k8s = node.k8s
    uuid = running_gpu_pod(node, "long-2")
    follow = subprocess.Popen(
        ["nsenter", f"--target={k8s.pid}", "--net", "--", f"{k8s.k8s_bin}/kubectl",
         f"--kubeconfig={k8s.kubeconfig}", "-n", "nvshim", "logs", "-f",
         "daemonset/nvshim-node", "-c", "nvshim-node", "--since=1s"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    time.sleep(1)
    node.kubectl("delete", "-k", node.overlay, "--wait=true", timeout=400)
    try:
        streamed, _ = follow.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        follow.kill()
        streamed, _ = follow.communicate()
    # the engine config, byte for byte (CRI-O: /etc/crio, every file)
    assert engine_files(k8s) == node.original
    # the uninstall's lines reached kubectl logs (the engine restart comes last)
    assert "SIGTERM received: uninstalling" in streamed, streamed
    if k8s.engine == "crio":
        assert "removed" in streamed and CRIO_DROP_IN in streamed, streamed
        # GPU pods remain: a restart would leave CRI-O unable to manage them
        assert "not restarting crio: " in streamed, streamed
        assert "failed to find runtime handler" in streamed, streamed
    else:
        assert "restored the original" in streamed, streamed
        assert "restarting containerd" in streamed, streamed
    # running GPU pods stay manageable: exec, then delete
    assert os.readlink(k8s.path("/usr/local/nvshim")) == "nvshim-versions/pass-through"
    # (through the pass-through: the devices are there; nvshim's exec additions are not)
    nodes, _ = exec_view(node, "long-2")
    assert nodes == {node.gpu_node(uuid)}
    started = time.monotonic()
    node.kubectl("delete", "pod", "-n", node.ns, "long-2", "--ignore-not-found", timeout=90)
    assert time.monotonic() - started < 60
    # every other pod that ran through nvshim (a finished one keeps its sandbox) goes too
    node.kubectl("delete", "pods", "--all", "-n", node.ns, timeout=120)
    # the node as it was before the install (what the host had stays, an empty /etc/nvshim
    # too), once the kubelet has stopped the last sandbox (after the API object) and the
    # ended sandboxes are removed (CRI-O keeps them until the kubelet's container GC, once
    # a minute, removes them: that CRI call made here)
    deadline = time.monotonic() + 120
    while host_state(k8s) != node.host_before and time.monotonic() < deadline:
        k8s.remove_ended_sandboxes(node.ns)
        time.sleep(0.5)
    assert host_state(k8s) == node.host_before


NVIDIA_RUNTIME = """\
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
          runtime_type = "io.containerd.runc.v2"
          [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
            BinaryName = "/usr/local/nvidia/toolkit/nvidia-container-runtime"
            SystemdCgroup = false

"""
AKS_LABELS = {"kubernetes.azure.com/accelerator": "nvidia", "accelerator": "nvidia"}


def test_aks_node_shape_takes_the_default_and_gives_it_back(node, tmp_path):
    """An AKS GPU node: its labels and sku=gpu taint, NVIDIA's runtime the containerd
    default, the managed device plugin asking by env in pods that name no runtime class.
    The aks overlay lands there, nvshim takes the default (NVIDIA's entry stays), such a
    pod gets exactly its GPU, and delete -k gives the node's config back byte for byte."""
    k8s = node.k8s
    config = k8s.path(CONTAINERD_CONFIG)
    first = open(config).read()
    marker = '      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes]\n'
    assert marker in first and 'default_runtime_name = "runc"' in first
    shaped = first.replace(marker, marker + "\n" + NVIDIA_RUNTIME, 1)
    shaped = shaped.replace('default_runtime_name = "runc"', 'default_runtime_name = "nvidia"')
    toolkit = k8s.path("/usr/local/nvidia/toolkit")
    os.makedirs(toolkit)
    with open(os.path.join(toolkit, "nvidia-container-runtime"), "w") as fh:
        fh.write('#!/bin/sh\nexec runc "$@"\n')  # stands in for NVIDIA's runtime
    os.chmod(os.path.join(toolkit, "nvidia-container-runtime"), 0o755)
    overlay = tmp_path / "aks-test"
    overlay.mkdir()
    base = os.path.relpath(os.path.join(KUBE, "overlays", "aks"), overlay)
    (overlay / "kustomization.yaml").write_text(TEST_OVERLAY.format(base=base))
    (overlay / "environment.yaml").write_text(ENVIRONMENT)
    labels = [f"{k}={v}" for k, v in AKS_LABELS.items()]
    try:
        with open(config, "w") as fh:
            fh.write(shaped)
        k8s.restart_containerd()
        k8s.kubectl("label", "node", NODE_NAME, *labels, "--overwrite")
        k8s.kubectl("taint", "node", NODE_NAME, "sku=gpu:NoSchedule", "--overwrite")
        k8s.kubectl("apply", "-k", str(overlay))
        k8s.kubectl("-n", "nvshim", "rollout", "status", "daemonset/nvshim-node",
                    "--timeout=180s", timeout=240)  # fmt: skip
        now = open(config).read()
        assert 'default_runtime_name = "nvshim"' in now
        assert 'BinaryName = "/usr/local/nvidia/toolkit/nvidia-container-runtime"' in now
        # the managed plugin's form: NVIDIA_VISIBLE_DEVICES, no runtime class
        k8s.wait_containerd()
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "aks-gpu", "namespace": node.ns},
            "spec": {
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 0,
                "tolerations": [
                    {"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}
                ],
                "containers": [container("main", resource="nvshim.test/gpu-env")],
            },
        }
        k8s.apply(body)
        assert node.done("aks-gpu") == "Succeeded", node.events("aks-gpu")
        (got,) = node.plugins["nvshim.test/gpu-env"].allocated[-1:]
        nodes, cvd = node.view(node.logs("aks-gpu"))
        assert cvd == got[0] and nodes == {node.gpu_node(got[0])}
        k8s.kubectl("delete", "pod", "-n", node.ns, "aks-gpu", "--wait=true")
        k8s.kubectl("delete", "-k", str(overlay), "--wait=true", timeout=400)
        assert open(config).read() == shaped
    finally:
        k8s.kubectl("delete", "-k", str(overlay), "--ignore-not-found", "--wait=true",
                    check=False, timeout=400)  # fmt: skip
        k8s.kubectl("taint", "node", NODE_NAME, "sku=gpu:NoSchedule-", check=False)
        k8s.kubectl("label", "node", NODE_NAME, *[f"{k}-" for k in AKS_LABELS], check=False)
        with open(config, "w") as fh:
            fh.write(first)
        k8s.restart_containerd()
        shutil.rmtree(k8s.path("/usr/local/nvidia"), ignore_errors=True)
