"""The DRA driver on the real one-node cluster (tests/k8s: kube-apiserver, scheduler,
controller-manager, kubelet, containerd 1.7 with CDI) over the simulated h100x8-mig host.

`nvshim dra run` runs inside the cluster's namespaces as the DaemonSet's container would
(the kubelet's plugin dirs, /var/run/cdi, the driver root at /run/nvidia/driver); the
DeviceClasses come from packaging/kubernetes/dra. Pods are busybox: what they print is what
containerd gave them through the claim's CDI spec."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time

import pytest
import yaml

from tests.conftest import NVSHIM, REPO
from tests.k8s.artifacts import BUSYBOX
from tests.k8s.cluster import NODE_NAME, Cluster
from tests.sim import fake_mps_control

DRIVER_ROOT = "/run/nvidia/driver"
CDI_DIR = "/var/run/cdi"
KUBELET = "/var/lib/kubelet"
REG_SOCK = f"{KUBELET}/plugins_registry/gpu.nvshim.io-reg.sock"
PLUGIN_DIR = f"{KUBELET}/plugins/gpu.nvshim.io"
SHOW = (
    "ls /dev | grep -E '^nvidia[0-9]+$' | sed 's/^/node=/'; "
    "ls /dev/nvidia-caps 2>/dev/null | sed 's/^/cap=/'; "
    'echo "cvd=$CUDA_VISIBLE_DEVICES"; env | grep ^CUDA_MPS_ | sed "s/^/mps:/"; '
    "ls /run/nvidia-mps 2>/dev/null | sed 's/^/pipe=/'; true"
)
# a container that runs until its pod is deleted: as a well-behaved workload, it ends on the
# kubelet's SIGTERM (a shell as PID 1 ignores it, and its pod's deletion would wait out the
# 30 s grace period)
HOLD = "trap 'exit 0' TERM; sleep 3600 & wait"


FAKE_CONTROL_LAUNCHER = """#!/bin/sh
for py in /usr/bin/python3 /opt/nvshim/bin/python3; do
    [ -x "$py" ] && exec "$py" -IS "$0.py" "$@"
done
echo "no python3 for $0" >&2
exit 127
"""


class Plugin:
    """``nvshim dra run`` inside the cluster's namespaces, its stderr in a file."""

    def __init__(self, k8s: Cluster, config: str, log: str):
        self.k8s, self.config, self.log_path = k8s, config, log
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        argv = [
            "nsenter", f"--target={self.k8s.pid}", "--mount", "--net", "--pid", "--",
            NVSHIM, "dra", "run", f"--kubeconfig={self.k8s.kubeconfig}",
            f"--driver-root={DRIVER_ROOT}", f"--dev-root={DRIVER_ROOT}",
            f"--cdi-dir={CDI_DIR}", f"--kubelet-dir={KUBELET}",
            "--mps-root=/run/nvshim/dra-mps", "--interval=1",
        ]  # fmt: skip
        env = {**os.environ, "NVSHIM_CONFIG": self.config, "NODE_NAME": NODE_NAME}
        before = self.registrations()
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen(argv, env=env, stderr=log, stdout=log)
        _wait(lambda: self.registrations() > before, 60, self.log)

    def log(self) -> str:
        try:
            with open(self.log_path) as fh:
                return fh.read()
        except FileNotFoundError:
            return ""

    def registrations(self) -> int:
        """How often the kubelet has confirmed a registration so far."""
        return self.log().count("registered with the kubelet")

    def pid(self) -> int:
        """Host PID of the plugin (nsenter's child: it forks to enter the PID namespace)."""
        with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children") as fh:
            return int(fh.read().split()[0])

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.kill(self.pid(), signal.SIGTERM)
        self.proc.wait(timeout=30)
        assert self.proc.returncode == 0, self.log()[-2000:]


def _wait(predicate, timeout: float, detail=lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out; {str(detail())[-3000:]}")
        time.sleep(0.3)


@pytest.fixture(scope="module")
def cluster(launchers):
    from tests.k8s.artifacts import k8s_archive

    if k8s_archive() is None:  # as the harness's own fixtures: only without the archive
        pytest.skip("no Kubernetes archive (../shared/k8s, $NVSHIM_K8S_ARCHIVE)")
    # the plugin's config and log, the hook's log: removed on teardown, a failed test's too
    tmp = tempfile.mkdtemp(prefix="k8s-dra-")
    config = os.path.join(tmp, "config.toml")
    with open(config, "w") as fh:
        fh.write(f'[runtime]\nhook-path = "{launchers}/nvshim-hook"\nlog-file = "{tmp}/hook.log"\n')
    try:
        c = Cluster(containerd="1.7").start()
        plugin = Plugin(c, config, os.path.join(tmp, "plugin.log"))
        try:
            # the claims' MPS daemons: the fake control binary in the simulated driver root,
            # run by whichever Python the mount namespace has (the node's, or the plugin
            # image's own: the DaemonSet's pod has no /usr/bin/python3)
            for rel, text in fake_mps_control.extra_files().items():
                path = c.sim.host_path("/" + rel)
                for name, body in ((path + ".py", text), (path, FAKE_CONTROL_LAUNCHER)):
                    with open(name, "w") as fh:
                        fh.write(body)
                    os.chmod(name, 0o755)
            kustomization = os.path.join(REPO, "packaging/kubernetes/dra")
            rendered = subprocess.run(
                [f"{c.k8s_bin}/kubectl", "kustomize", kustomization],
                capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip
            docs = yaml.safe_load_all(rendered)
            c.apply([d for d in docs if d and d["kind"] == "DeviceClass"])
            plugin.start()
            yield c, plugin
        finally:
            plugin.stop()
            left = c.stop()
            assert left == [], left
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def ns(cluster):
    k8s, _ = cluster
    name = f"dra{os.getpid() % 10000}-{time.monotonic_ns() % 100000}"
    k8s.kubectl("create", "namespace", name)
    k8s.wait_service_account(name)
    yield name
    # what the next test must not meet: this one's pods, its claims (allocated devices) and
    # their CDI specs (prepared claims). The namespace itself goes without waiting: its
    # controller starts on a deleted namespace only 5 s later.
    k8s.kubectl("delete", "pods,resourceclaims", "--all", "-n", name, "--wait=true",
                "--timeout=60s", check=False)  # fmt: skip
    deadline = time.monotonic() + 60
    while _cdi_specs(k8s) and time.monotonic() < deadline:
        time.sleep(0.3)
    k8s.kubectl("delete", "namespace", name, "--wait=false", check=False)


def _template(name: str, request: dict) -> dict:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}}},
    }


def _pod(name: str, claim: dict, command: str = SHOW) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "c",
                    "image": BUSYBOX,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", command],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
            "resourceClaims": [{"name": "gpu", **claim}],
        },
    }


def _apply(k8s, ns: str, *docs: dict) -> None:
    for doc in docs:
        doc["metadata"]["namespace"] = ns
    k8s.apply(list(docs))


def _output(k8s, ns: str, pod: str) -> dict[str, list[str]]:
    phase = k8s.wait_pod_done(pod, ns, timeout=240)
    logs = k8s.kubectl("logs", "-n", ns, pod).stdout
    assert phase == "Succeeded", logs + k8s.kubectl("describe", "pod", "-n", ns, pod).stdout
    out: dict[str, list[str]] = {}
    for line in logs.splitlines():
        key, _, value = (
            line.partition("=") if not line.startswith("mps:") else ("mps", "", line[4:])
        )
        out.setdefault(key, []).append(value)
    return out


def _prepared(log: str, ns: str) -> list[str]:
    """The devices the plugin's ``log`` says it prepared for the claims of namespace ``ns``
    (a claim made from a template is gone once its pod has ended); the kubelet may ask
    again (prepare is idempotent): each device once."""
    devices: list[str] = []
    for line in log.splitlines():
        if f"prepare {ns}/" in line and "[" in line:
            for device in line.split("): ", 1)[1].rsplit(" [", 1)[0].split(", "):
                if device not in devices:
                    devices.append(device)
    return devices


def _host(k8s):
    from nvshim.host.discover import discover_host

    return discover_host(k8s.sim.driver_root, k8s.sim.dev_root)


def test_slices_published_for_the_node(cluster):
    k8s, _ = cluster
    _wait(lambda: k8s.get("resourceslices")["items"], 30)
    (one,) = k8s.get("resourceslices")["items"]
    assert one["spec"]["nodeName"] == NODE_NAME and one["spec"]["driver"] == "gpu.nvshim.io"
    host = _host(k8s)
    names = {d["name"] for d in one["spec"]["devices"]}
    assert names == {f"gpu-{g.index}" for g in host.gpus if not g.mig_enabled} | {
        f"mig-{m.parent_index}-{m.index}" for m in host.mig_devices()
    }


def test_claim_template_gives_the_pod_exactly_its_gpu(cluster, ns):
    k8s, plugin = cluster
    _apply(k8s, ns, _template("one", {"deviceClassName": "gpu.nvshim.io"}),
           _pod("p", {"resourceClaimTemplateName": "one"}))  # fmt: skip
    out = _output(k8s, ns, "p")
    (device,) = _prepared(plugin.log(), ns)
    gpu = _host(k8s).gpu(int(device.split("-")[1]))
    assert out["node"] == [f"nvidia{gpu.minor}"]
    assert out["cvd"] == [gpu.uuid]
    assert "mps" not in out


def test_cel_selector_picks_a_mig_device_by_profile(cluster, ns):
    k8s, plugin = cluster
    host = _host(k8s)
    profiles = sorted({m.profile for m in host.mig_devices()})
    profile = profiles[-1]
    selector = f'device.attributes["gpu.nvshim.io"].profile == "{profile}"'
    request = {"deviceClassName": "mig.nvshim.io", "selectors": [{"cel": {"expression": selector}}]}
    _apply(k8s, ns, _template("mig", request), _pod("p", {"resourceClaimTemplateName": "mig"}))
    out = _output(k8s, ns, "p")
    (device,) = _prepared(plugin.log(), ns)
    mig = next(m for m in host.mig_devices() if device == f"mig-{m.parent_index}-{m.index}")
    assert mig.profile == profile
    assert out["cvd"] == [mig.uuid]
    assert out["node"] == [f"nvidia{host.gpu(mig.parent_index).minor}"]
    assert sorted(out["cap"]) == sorted(os.path.basename(n.path) for n in (mig.gi_cap, mig.ci_cap))


def test_two_pods_share_one_claim(cluster, ns):
    k8s, _ = cluster
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "shared"},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvshim.io"}}]}},
    }  # fmt: skip
    hold = SHOW + "; sleep 2"
    _apply(k8s, ns, claim, _pod("a", {"resourceClaimName": "shared"}, hold),
           _pod("b", {"resourceClaimName": "shared"}, hold))  # fmt: skip
    a, b = _output(k8s, ns, "a"), _output(k8s, ns, "b")
    assert a["cvd"] == b["cvd"] and len(a["cvd"][0].split(",")) == 1
    assert a["node"] == b["node"]


def test_mps_claim_gets_its_daemon_and_limits(cluster, ns):
    k8s, plugin = cluster
    params = {
        "apiVersion": "gpu.nvshim.io/v1alpha1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "MPS",
                    "mps": {"activeThreadPercentage": 40, "pinnedMemoryLimit": "8Gi"}},
    }  # fmt: skip
    template = _template("mps", {"deviceClassName": "gpu.nvshim.io"})
    template["spec"]["spec"]["devices"]["config"] = [
        {"opaque": {"driver": "gpu.nvshim.io", "parameters": params}}
    ]
    _apply(k8s, ns, template, _pod("p", {"resourceClaimTemplateName": "mps"}))
    out = _output(k8s, ns, "p")
    (device,) = _prepared(plugin.log(), ns)
    gpu = _host(k8s).gpu(int(device.split("-")[1]))
    mps = dict(line.split("=", 1) for line in out["mps"])
    assert mps == {
        "CUDA_MPS_PIPE_DIRECTORY": "/run/nvidia-mps",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "40",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"{gpu.uuid}=8192M",
    }
    assert "nvidia-cuda-mps-control.pid" in out["pipe"]  # the claim's daemon's pipe dir


def test_more_gpus_than_free_stays_pending_with_the_schedulers_reason(cluster, ns):
    k8s, _ = cluster
    whole = sum(1 for g in _host(k8s).gpus if not g.mig_enabled)
    request = {"deviceClassName": "gpu.nvshim.io", "allocationMode": "ExactCount",
               "count": whole + 1}  # fmt: skip
    _apply(k8s, ns, _template("many", request), _pod("p", {"resourceClaimTemplateName": "many"}))

    def condition() -> dict | None:
        conds = k8s.get("pod", "-n", ns, "p").get("status", {}).get("conditions") or []
        return next((c for c in conds if c["type"] == "PodScheduled"), None)

    _wait(lambda: condition() is not None, 60)
    cond = condition()
    assert cond["status"] == "False" and cond["reason"] == "Unschedulable", cond
    assert "claim" in cond["message"], cond["message"]
    assert k8s.get("pod", "-n", ns, "p")["status"]["phase"] == "Pending"


def _cdi_specs(k8s) -> list[str]:
    path = k8s.path(CDI_DIR)
    return sorted(n for n in os.listdir(path) if n.startswith("k8s.gpu.nvshim.io")) if (
        os.path.isdir(path)) else []  # fmt: skip


def test_plugin_restart_keeps_prepared_claims(cluster, ns):
    k8s, plugin = cluster
    _apply(k8s, ns, _template("one", {"deviceClassName": "gpu.nvshim.io"}),
           _pod("p", {"resourceClaimTemplateName": "one"}, SHOW + "; " + HOLD))  # fmt: skip
    k8s.wait("pod/p", "-n", ns, "--for=condition=Ready", timeout=90)
    (spec,) = _cdi_specs(k8s)
    plugin.stop()
    assert _cdi_specs(k8s) == [spec]  # the prepared claim survives the plugin
    assert not os.path.exists(k8s.path(REG_SOCK))
    plugin.start()  # waits for the kubelet to register it
    k8s.kubectl("delete", "pod", "-n", ns, "p", "--wait=true", "--timeout=60s")
    _wait(lambda: _cdi_specs(k8s) == [], 60, plugin.log)  # unprepared by the new plugin


def _kubelet_pids(k8s) -> list[int]:
    override = f"--hostname-override={NODE_NAME}".encode()
    return k8s.pids(lambda argv: argv[0].endswith(b"/kubelet") and override in argv)


def test_kubelet_restart_registers_the_plugin_again(cluster, ns):
    k8s, plugin = cluster
    (old,) = _kubelet_pids(k8s)
    registered = plugin.registrations()
    os.kill(old, signal.SIGTERM)
    _wait(lambda: not os.path.exists(f"/proc/{old}"), 30)
    # the cluster's supervisor starts it again, as systemd's Restart=always would (a second
    # kubelet started here would fight it for the node)
    _wait(lambda: _kubelet_pids(k8s) not in ([], [old]), 30, lambda: k8s.log("nsinit"))
    _wait(lambda: plugin.registrations() > registered, 90, plugin.log)
    k8s.wait("node", NODE_NAME, "--for=condition=Ready", timeout=90)
    _apply(k8s, ns, _template("one", {"deviceClassName": "gpu.nvshim.io"}),
           _pod("p", {"resourceClaimTemplateName": "one"}))  # fmt: skip
    assert len(_output(k8s, ns, "p")["cvd"]) == 1


def _every_form(device: dict) -> str:
    """A CEL expression naming each attribute and capacity of a published ``device`` the
    way CEL reaches it (domain-qualified names under their domain, nvshim's own under
    ``gpu.nvshim.io``), all true for that device alone."""
    clauses = []
    for name, value in sorted(device["attributes"].items()):
        domain, _, short = name.rpartition("/")
        ref = f'device.attributes["{domain or "gpu.nvshim.io"}"].{short}'
        if "string" in value:
            clauses.append(f'{ref} == "{value["string"]}"')
        elif "int" in value:
            clauses.append(f"{ref} == {value['int']}")
        elif "bool" in value:
            clauses.append(f"{ref} == {str(value['bool']).lower()}")
        else:
            clauses.append(f'{ref}.compareTo(semver("{value["version"]}")) == 0')
    for name, value in sorted(device["capacity"].items()):
        clauses.append(
            f'device.capacity["gpu.nvshim.io"].{name}.compareTo(quantity("{value["value"]}")) == 0'
        )
    return " && ".join(clauses)


def _logs(k8s, ns: str, pod: str, container: str) -> dict[str, list[str]]:
    text = k8s.kubectl("logs", "-n", ns, pod, "-c", container).stdout
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, _, value = line.partition("=") if not line.startswith("mps:") else (
            "mps", "", line[4:])  # fmt: skip
        out.setdefault(key, []).append(value)
    return out


def _events(k8s, ns: str, pod: str) -> str:
    out = k8s.get("events", "-n", ns, "--field-selector", f"involvedObject.name={pod}")
    return "\n".join(e.get("message", "") for e in out["items"])


def test_every_claim_form_reaches_the_container(cluster, ns):
    """firstAvailable (the first subrequest cannot be met), per-container request names,
    a CEL selector naming every published attribute and capacity, allocationMode All,
    device class config, adminAccess; and an allocation nvshim cannot serve (MPS on a MIG
    device) fails the pod with the reason in its events."""
    k8s, plugin = cluster
    host = _host(k8s)
    k8s.kubectl("label", "namespace", ns, "resource.kubernetes.io/admin-access=true")
    (published,) = k8s.get("resourceslices")["items"]
    devices = {d["name"]: d for d in published["spec"]["devices"]}
    groups: dict[tuple[int, str], list] = {}
    for m in host.mig_devices():
        groups.setdefault((m.parent_index, m.profile), []).append(m)
    (parent, profile), every = max(groups.items(), key=lambda kv: len(kv[1]))
    assert len(every) >= 2
    mig = next(m for m in host.mig_devices() if (m.parent_index, m.profile) != (parent, profile))
    expression = _every_form(devices[f"mig-{mig.parent_index}-{mig.index}"])
    assert 'device.attributes["resource.kubernetes.io"].pciBusID' in expression
    assert 'device.capacity["gpu.nvshim.io"].memorySlice' in expression
    gpu_class = {"deviceClassName": "gpu.nvshim.io"}
    forms = _template("forms", gpu_class)
    forms["spec"]["spec"]["devices"]["requests"] = [
        {"name": "gpu", "firstAvailable": [
            {"name": "many", **gpu_class, "allocationMode": "ExactCount", "count": 99},
            {"name": "one", **gpu_class}]},
        {"name": "mig", "exactly": {"deviceClassName": "mig.nvshim.io",
                                    "selectors": [{"cel": {"expression": expression}}]}},
    ]  # fmt: skip
    two = _pod("forms", {"resourceClaimTemplateName": "forms"})
    (first,) = two["spec"]["containers"]
    first["resources"] = {"claims": [{"name": "gpu", "request": "gpu"}]}
    second = {**first, "name": "m", "resources": {"claims": [{"name": "gpu", "request": "mig"}]}}
    two["spec"]["containers"] = [first, second]
    select = (f'device.attributes["gpu.nvshim.io"].parentIndex == {parent} && '
              f'device.attributes["gpu.nvshim.io"].profile == "{profile}"')  # fmt: skip
    all_of = _template("all", {"deviceClassName": "mig.nvshim.io", "allocationMode": "All",
                               "selectors": [{"cel": {"expression": select}}]})  # fmt: skip
    params = {"apiVersion": "gpu.nvshim.io/v1alpha1", "kind": "GpuConfig",
              "sharing": {"strategy": "MPS", "mps": {"activeThreadPercentage": 35}}}  # fmt: skip
    mps_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": f"mps35-{ns}.nvshim.io"},
        "spec": {
            "selectors": [{"cel": {"expression":
                'device.driver == "gpu.nvshim.io" && '
                'device.attributes["gpu.nvshim.io"].type == "gpu"'}}],
            "config": [{"opaque": {"driver": "gpu.nvshim.io", "parameters": params}}],
        },
    }  # fmt: skip
    k8s.apply(mps_class)
    unservable = _template("mig-mps", {"deviceClassName": "mig.nvshim.io"})
    unservable["spec"]["spec"]["devices"]["config"] = [
        {"opaque": {"driver": "gpu.nvshim.io", "parameters": params}}
    ]
    try:
        _apply(k8s, ns, forms, two, all_of, _pod("all", {"resourceClaimTemplateName": "all"}),
               _template("cls", {"deviceClassName": mps_class["metadata"]["name"]}),
               _pod("cls", {"resourceClaimTemplateName": "cls"}),
               _template("admin", {**gpu_class, "adminAccess": True}),
               _pod("admin", {"resourceClaimTemplateName": "admin"}),
               unservable, _pod("refused", {"resourceClaimTemplateName": "mig-mps"}))  # fmt: skip
        assert k8s.wait_pod_done("forms", ns, timeout=240) == "Succeeded", _events(k8s, ns, "forms")
        whole, part = _logs(k8s, ns, "forms", "c"), _logs(k8s, ns, "forms", "m")
        (uuid,) = whole["cvd"]
        gpu = next(g for g in host.gpus if g.uuid == uuid)  # one GPU: the second choice
        assert whole["node"] == [f"nvidia{gpu.minor}"] and "cap" not in whole
        assert part["cvd"] == [mig.uuid]  # the MIG request's container: that device only
        assert part["node"] == [f"nvidia{host.gpu(mig.parent_index).minor}"]
        out = _output(k8s, ns, "all")
        assert sorted(out["cvd"][0].split(",")) == sorted(m.uuid for m in every)
        out = _output(k8s, ns, "cls")
        assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=35" in out["mps"]  # the class's config
        out = _output(k8s, ns, "admin")
        assert len(out["cvd"]) == 1 and len(out["node"]) == 1
        _wait(lambda: "not supported for MIG devices" in _events(k8s, ns, "refused"), 120,
              lambda: _events(k8s, ns, "refused") + plugin.log()[-2000:])  # fmt: skip
        assert k8s.get("pod", "-n", ns, "refused")["status"]["phase"] == "Pending"
    finally:
        k8s.kubectl("delete", "pods", "--all", "-n", ns, "--wait=true", "--timeout=90s",
                    check=False)  # fmt: skip
        k8s.kubectl("delete", "deviceclass", mps_class["metadata"]["name"], check=False)


def _mps_log_starts(k8s, uuid: str) -> int:
    with open(k8s.path(f"/run/nvshim/dra-mps/{uuid}/log/control.log")) as fh:
        return sum(1 for line in fh if line.startswith("start "))


def _running_mps_pod(k8s, ns: str, name: str) -> None:
    """A pod ``name`` holding an MPS-shared GPU (claim template ``mps``), Ready."""
    params = {"apiVersion": "gpu.nvshim.io/v1alpha1", "kind": "GpuConfig",
              "sharing": {"strategy": "MPS"}}  # fmt: skip
    template = _template("mps", {"deviceClassName": "gpu.nvshim.io"})
    template["spec"]["spec"]["devices"]["config"] = [
        {"opaque": {"driver": "gpu.nvshim.io", "parameters": params}}
    ]
    _apply(k8s, ns, template, _pod(name, {"resourceClaimTemplateName": "mps"}, HOLD))
    _wait(lambda: _ready(k8s, ns, name), 120, lambda: _events(k8s, ns, name))


def _ready(k8s, ns: str, name: str) -> bool:
    conditions = k8s.get("pod", "-n", ns, name).get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def test_mps_daemon_outlives_a_plugin_restart(cluster, ns):
    """kill -9 of the plugin with an MPS claim's pod running: the claim's daemon runs on,
    the new plugin adopts it (same process, one start in its log), the pod's deletion
    stops it."""
    k8s, plugin = cluster
    _running_mps_pod(k8s, ns, "p")
    (device,) = _prepared(plugin.log(), ns)
    uuid = _host(k8s).gpu(int(device.split("-")[1])).uuid
    pid_file = k8s.path(f"/run/nvshim/dra-mps/{uuid}/pipe/nvidia-cuda-mps-control.pid")
    pid = open(pid_file).read().strip()
    os.kill(plugin.pid(), signal.SIGKILL)
    plugin.proc.wait(timeout=30)
    plugin.start()
    _wait(lambda: f"adopted its MPS daemon (pid {pid})" in plugin.log(), 30, plugin.log)
    assert open(pid_file).read().strip() == pid and _mps_log_starts(k8s, uuid) == 1
    k8s.kubectl("delete", "pod", "-n", ns, "p", "--wait=true", "--timeout=60s")
    _wait(lambda: not os.path.exists(k8s.path(f"/run/nvshim/dra-mps/{uuid}")), 60, plugin.log)


def test_uninstall_leaves_nothing(cluster):
    """Last in the module: stop the plugin, withdraw the slices; nothing of the driver is
    left on the node."""
    k8s, plugin = cluster
    _wait(lambda: _cdi_specs(k8s) == [], 60)  # every claim unprepared (namespaces gone)
    plugin.stop()
    proc = k8s.nsenter(
        [NVSHIM, "dra", "withdraw", f"--kubeconfig={k8s.kubeconfig}", f"--node-name={NODE_NAME}"],
        env={"NVSHIM_CONFIG": plugin.config},
    )
    assert proc.returncode == 0, proc.stderr
    assert k8s.get("resourceslices")["items"] == []
    assert not os.path.exists(k8s.path(REG_SOCK))
    assert not os.path.exists(k8s.path(PLUGIN_DIR))
    mps = k8s.path("/run/nvshim/dra-mps")
    assert not os.path.isdir(mps) or os.listdir(mps) == []  # claim daemons' dirs removed
    with open(f"/proc/{k8s.pid}/mountinfo") as fh:
        assert "dra-mps" not in fh.read()  # and their shm mounts


def _dra_manifest(k8s, launchers: str, driver_root: bool = True) -> str:
    """packaging/kubernetes/dra as shipped, set for a driver container's layout the way a
    user would (NVIDIA_DRIVER_ROOT=/run/nvidia/driver, the node installer's variable), the
    image built from this checkout and this checkout's hook launcher."""
    tag = k8s.import_node_image()
    rendered = subprocess.run(
        [f"{k8s.k8s_bin}/kubectl", "kustomize", os.path.join(REPO, "packaging/kubernetes/dra")],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    for doc in docs:
        if doc["kind"] == "DaemonSet":
            (container,) = doc["spec"]["template"]["spec"]["containers"]
            container["image"], container["imagePullPolicy"] = tag, "Never"
            for env in container["env"] if driver_root else ():
                if env["name"] == "NVIDIA_DRIVER_ROOT":
                    env["value"] = DRIVER_ROOT
        if doc["kind"] == "ConfigMap":  # the node's hook: this checkout's launcher
            doc["data"]["config.toml"] = f'[runtime]\nhook-path = "{launchers}/nvshim-hook"\n'
    return yaml.safe_dump_all(docs)


def test_daemonset_deploys_the_driver(cluster, ns, launchers):
    """After the uninstall above: packaging/kubernetes/dra as shipped (the node image, its
    service account token, RBAC, the admission policy), the driver root given as the
    GPU Operator's driver container puts it (/run/nvidia/driver, through
    NVIDIA_DRIVER_ROOT); a pod gets its GPU through it; deleting it removes the plugin's
    sockets."""
    k8s, _ = cluster
    manifest = _dra_manifest(k8s, launchers, driver_root=False)
    try:
        k8s.apply(manifest)  # no GPU node labelled yet: no pod
        # docs/dra.md, word for word
        k8s.kubectl(*"-n nvshim-dra set env daemonset/nvshim-dra "
                    "NVIDIA_DRIVER_ROOT=/run/nvidia/driver".split())  # fmt: skip
        k8s.kubectl("label", "node", NODE_NAME, "nvidia.com/gpu.present=true")
        _wait(lambda: k8s.get("pods", "-n", "nvshim-dra")["items"], 60)
        k8s.wait("pod", "-n", "nvshim-dra", "-l", "app.kubernetes.io/name=nvshim-dra",
                 "--for=condition=Ready", timeout=180)  # fmt: skip
        _wait(
            lambda: k8s.get("resourceslices")["items"],
            60,
            lambda: k8s.kubectl("logs", "-n", "nvshim-dra", "ds/nvshim-dra", check=False).stdout,
        )
        (one,) = k8s.get("resourceslices")["items"]
        assert one["spec"]["nodeName"] == NODE_NAME  # written under the admission policy
        _apply(k8s, ns, _template("one", {"deviceClassName": "gpu.nvshim.io"}),
               _pod("p", {"resourceClaimTemplateName": "one"}))  # fmt: skip
        out = _output(k8s, ns, "p")
        logs = k8s.kubectl("logs", "-n", "nvshim-dra", "ds/nvshim-dra").stdout
        (device,) = _prepared(logs, ns)
        gpu = _host(k8s).gpu(int(device.split("-")[1]))
        assert out["cvd"] == [gpu.uuid] and out["node"] == [f"nvidia{gpu.minor}"]
        k8s.kubectl("delete", "pod", "-n", ns, "p", "--wait=true", "--timeout=60s")
        _wait(lambda: _cdi_specs(k8s) == [], 60)
        # a rolling update (the plugin pod deleted) with an MPS claim's pod running: its
        # daemon, moved out of the plugin pod, outlives it and the new pod adopts it
        _running_mps_pod(k8s, ns, "m")
        logs = k8s.kubectl("logs", "-n", "nvshim-dra", "ds/nvshim-dra").stdout
        (device,) = {line.split("): ", 1)[1].split(" [")[0] for line in logs.splitlines()
                     if f"prepare {ns}/m-" in line}  # fmt: skip
        assert "stays in this pod" not in logs, logs
        uuid = _host(k8s).gpu(int(device.split("-")[1])).uuid
        pid_file = k8s.path(f"/run/nvshim/dra-mps/{uuid}/pipe/nvidia-cuda-mps-control.pid")
        pid = open(pid_file).read().strip()
        k8s.kubectl("delete", "pod", "-n", "nvshim-dra", "-l",
                    "app.kubernetes.io/name=nvshim-dra", "--wait=true", timeout=120)  # fmt: skip
        _wait(lambda: f"adopted its MPS daemon (pid {pid})" in k8s.kubectl(
            "logs", "-n", "nvshim-dra", "ds/nvshim-dra", check=False).stdout, 180)  # fmt: skip
        assert open(pid_file).read().strip() == pid and _mps_log_starts(k8s, uuid) == 1
        k8s.kubectl("delete", "pod", "-n", ns, "m", "--wait=true", "--timeout=60s")
        _wait(lambda: not os.path.exists(k8s.path(f"/run/nvshim/dra-mps/{uuid}")), 60)
    finally:
        k8s.kubectl("delete", "-f", "-", "--wait=true", "--timeout=120s", "--ignore-not-found",
                    input=manifest, check=False)  # fmt: skip
        k8s.kubectl("label", "node", NODE_NAME, "nvidia.com/gpu.present-", check=False)
    _wait(lambda: not os.path.exists(k8s.path(REG_SOCK)), 60)
    assert not os.path.exists(k8s.path(PLUGIN_DIR))
    proc = k8s.nsenter([NVSHIM, "dra", "withdraw", f"--kubeconfig={k8s.kubeconfig}",
                        f"--node-name={NODE_NAME}"])  # fmt: skip
    assert proc.returncode == 0, proc.stderr


def test_dra_and_the_node_installer_come_and_go_independently(cluster, launchers, tmp_path):
    """Both installed (node first, then DRA first), each removed while the other runs,
    both removed: `kubectl delete` of one leaves the other's pod, namespace and work as
    they were."""
    from tests.test_k8s_node_e2e import ENVIRONMENT, KUBE, TEST_OVERLAY

    k8s, _ = cluster
    dra = _dra_manifest(k8s, launchers)  # also imports the node image (tag "test")
    overlay = tmp_path / "node"
    overlay.mkdir()
    base = os.path.relpath(os.path.join(KUBE, "overlays", "containerd"), overlay)
    (overlay / "kustomization.yaml").write_text(TEST_OVERLAY.format(base=base))
    (overlay / "environment.yaml").write_text(ENVIRONMENT)

    def running(namespace: str, name: str) -> str:
        """The UID of the one Ready pod of ``name`` (it must not change; an engine restart
        may make it unready for a moment)."""
        k8s.wait("pod", "-n", namespace, "-l", f"app.kubernetes.io/name={name}",
                 "--for=condition=Ready", timeout=120)  # fmt: skip
        pods = k8s.get("pods", "-n", namespace, "-l", f"app.kubernetes.io/name={name}")
        (pod,) = [p for p in pods["items"] if not p["metadata"].get("deletionTimestamp")]
        ready = {c["type"]: c["status"] for c in pod["status"].get("conditions") or []}
        assert ready.get("Ready") == "True", pod["status"]
        assert all(c["restartCount"] == 0 for c in pod["status"]["containerStatuses"])
        return pod["metadata"]["uid"]

    def node_up() -> str:
        k8s.kubectl("apply", "-k", str(overlay))
        k8s.kubectl("-n", "nvshim", "rollout", "status", "daemonset/nvshim-node",
                    "--timeout=180s", timeout=240)  # fmt: skip
        return running("nvshim", "nvshim-node")

    def node_down() -> None:
        k8s.kubectl("delete", "-k", str(overlay), "--wait=true", timeout=400)
        assert "nvshim" not in _namespaces()

    def dra_up() -> str:
        k8s.apply(dra)
        _wait(lambda: k8s.get("pods", "-n", "nvshim-dra")["items"], 60)
        k8s.wait("pod", "-n", "nvshim-dra", "-l", "app.kubernetes.io/name=nvshim-dra",
                 "--for=condition=Ready", timeout=180)  # fmt: skip
        _wait(lambda: k8s.get("resourceslices")["items"], 60)
        return running("nvshim-dra", "nvshim-dra")

    def dra_down() -> None:
        k8s.kubectl("delete", "-f", "-", "--wait=true", "--timeout=120s", input=dra)
        _wait(lambda: not os.path.exists(k8s.path(REG_SOCK)), 60)
        assert "nvshim-dra" not in _namespaces()

    def _namespaces() -> set[str]:
        return {n["metadata"]["name"] for n in k8s.get("namespaces")["items"]}

    def node_installed(uid: str) -> None:
        assert running("nvshim", "nvshim-node") == uid
        assert k8s.get("runtimeclass", "nvshim")["handler"] == "nvshim"
        assert "nvshim" in open(k8s.path("/etc/containerd/config.toml")).read()

    def dra_installed(uid: str) -> None:
        assert running("nvshim-dra", "nvshim-dra") == uid
        assert k8s.get("resourceslices")["items"]
        assert os.path.exists(k8s.path(REG_SOCK))

    k8s.kubectl("label", "node", NODE_NAME, "nvidia.com/gpu.present=true", "--overwrite")
    try:
        node = node_up()
        driver = dra_up()  # node first
        dra_down()  # DRA removed while the node installer runs
        node_installed(node)
        driver = dra_up()
        # what a claim's MPS daemon keeps in the DRA driver's MPS root (in /run/nvshim,
        # which the node installer's uninstall empties of its own caches)
        kept = k8s.path("/run/nvshim/dra-mps/GPU-kept/log/control.log")
        os.makedirs(os.path.dirname(kept), exist_ok=True)
        with open(kept, "w") as fh:
            fh.write("a claim's daemon log\n")
        node_down()  # the node installer removed while DRA runs
        dra_installed(driver)
        assert open(kept).read() == "a claim's daemon log\n"
        shutil.rmtree(k8s.path("/run/nvshim/dra-mps/GPU-kept"))
        node = node_up()  # DRA first
        dra_installed(driver)
        dra_down()
        node_installed(node)
        node_down()  # both removed
    finally:
        k8s.kubectl("delete", "-f", "-", "--ignore-not-found", "--wait=true", "--timeout=120s",
                    input=dra, check=False)  # fmt: skip
        k8s.kubectl("delete", "-k", str(overlay), "--ignore-not-found", "--wait=true",
                    check=False, timeout=400)  # fmt: skip
        k8s.kubectl("label", "node", NODE_NAME, "nvidia.com/gpu.present-", check=False)
    proc = k8s.nsenter([NVSHIM, "dra", "withdraw", f"--kubeconfig={k8s.kubeconfig}",
                        f"--node-name={NODE_NAME}"])  # fmt: skip
    assert proc.returncode == 0, proc.stderr
