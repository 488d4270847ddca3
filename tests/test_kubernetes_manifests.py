"""packaging/kubernetes: every overlay renders with `kubectl kustomize`, passes
kubernetes-validate (strict) for 1.29 and the newest version it bundles, and the
DaemonSet's environment and mounts are exactly what `nvshim node` reads."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import kubernetes_validate
import pytest
import yaml

from nvshim.engines.settings import ENV as ENGINE_ENV
from nvshim.node.env import UNHONOURED, VARS, resolve_node
from tests.conftest import REPO

KUBE = os.path.join(REPO, "packaging", "kubernetes")
OVERLAYS = sorted(os.listdir(os.path.join(KUBE, "overlays")))
OLDEST = "1.29.0"

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs kubectl")


def newest_bundled() -> str:
    schemas = os.path.join(os.path.dirname(kubernetes_validate.__file__), "kubernetes-json-schema")
    versions = []
    for name in os.listdir(schemas):
        found = re.fullmatch(r"v(\d+)\.(\d+)\.(\d+)-local-strict", name)
        if found:
            versions.append(tuple(int(x) for x in found.groups()))
    return ".".join(map(str, max(versions)))


def kustomize(directory: str) -> list[dict]:
    """The documents `kubectl kustomize DIRECTORY` renders."""
    out = subprocess.run(
        ["kubectl", "kustomize", directory], capture_output=True, text=True, check=True
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def render(overlay: str) -> list[dict]:
    return kustomize(os.path.join(KUBE, "overlays", overlay))


def by_kind(docs: list[dict], kind: str) -> dict:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, kind
    return found[0]


def test_overlays_exist():
    assert {"containerd", "crio", "k3s", "rke2", "aks", "eks", "gke", "openshift"} <= set(OVERLAYS)


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("version", [OLDEST, newest_bundled()])
def test_overlay_renders_and_validates(overlay, version):
    docs = render(overlay)
    kinds = sorted(d["kind"] for d in docs)
    # OpenShift: the installer's service account may use the privileged SCC
    scc = ["RoleBinding"] if overlay == "openshift" else []
    assert kinds == sorted([
        "ConfigMap",
        "ConfigMap",
        "DaemonSet",
        "Namespace",
        "RuntimeClass",
        "ServiceAccount",
        *scc,
    ])  # fmt: skip
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def _container(docs: list[dict]) -> tuple[dict, dict]:
    pod = by_kind(docs, "DaemonSet")["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == "nvshim-node"]
    return pod, container


def mount_for(path: str, pod: dict, container: dict) -> tuple[dict, dict]:
    """The volume mount holding ``path`` and its volume."""
    mounts = [
        m
        for m in container["volumeMounts"]
        if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")
    ]
    assert mounts, f"{path} is on no volume"
    mount = max(mounts, key=lambda m: len(m["mountPath"]))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    return mount, volume


def _known_names() -> set[str]:
    names = {n for names in VARS.values() for n in names}
    names |= {n for table in ENGINE_ENV.values() for names in table.values() for n in names}
    names |= {n for names, _ in UNHONOURED for n in names}
    return names


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_daemonset_matches_what_nvshim_node_reads(overlay, tmp_path):
    docs = render(overlay)
    pod, container = _container(docs)
    env = {e["name"]: e["value"] for e in container["env"]}
    assert set(env) <= _known_names(), set(env) - _known_names()
    s = resolve_node({}, env)
    assert s.warnings == []
    assert s.engine is not None and s.engine_name == env["RUNTIME"]

    # the host root is the node's / (the engine config, socket, CDI dir live under it)
    mount, volume = mount_for(s.host_root, pod, container)
    assert mount["mountPath"] == s.host_root and volume["hostPath"]["path"] == "/"
    assert mount.get("mountPropagation") == "Bidirectional"  # MPS shm mounts reach the host

    # the mounted configs are the ConfigMaps' keys
    maps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    for path in (s.node_config, s.sharing_config):
        mount, volume = mount_for(path, pod, container)
        data = maps[volume["configMap"]["name"]]["data"]
        assert os.path.relpath(path, mount["mountPath"]) in data
    # the installer accepts the ConfigMaps' files as they are
    from nvshim.node.steps import check_inputs

    given = {}
    for path in (s.node_config, s.sharing_config):
        volume = mount_for(path, pod, container)[1]
        copy = tmp_path / os.path.basename(path)
        copy.write_text(maps[volume["configMap"]["name"]]["data"][os.path.basename(path)])
        given[path] = str(copy)
    env_here = {
        **env,
        "NVSHIM_NODE_CONFIG": given[s.node_config],
        "NVSHIM_SHARING_CONFIG": given[s.sharing_config],
    }
    check_inputs(resolve_node({}, env_here))

    # the readiness probe looks at the file the installer writes, on a writable volume
    assert container["readinessProbe"]["exec"]["command"] == ["test", "-e", s.ready_file]
    assert container["startupProbe"]["exec"]["command"] == ["test", "-e", s.ready_file]
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 360  # a systemd restart
    mount, volume = mount_for(s.ready_file, pod, container)
    assert "emptyDir" in volume
    assert container["securityContext"]["readOnlyRootFilesystem"] is True

    # the RuntimeClass names the runtime the installer registers and lands on its nodes
    runtime_class = by_kind(docs, "RuntimeClass")
    assert runtime_class["handler"] == s.engine.runtime_name
    if "nodeSelector" in pod:
        assert runtime_class["scheduling"]["nodeSelector"] == pod["nodeSelector"]
    else:  # a label whose value is the GPU type: an Exists affinity, no RuntimeClass selector
        assert "nodeSelector" not in runtime_class["scheduling"]
        terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert terms["nodeSelectorTerms"][0]["matchExpressions"][0]["operator"] == "Exists"
    for toleration in runtime_class["scheduling"]["tolerations"]:
        assert toleration in pod["tolerations"]
    # engine restarts: host PID to signal the socket's owner, time to uninstall
    assert pod["hostPID"] is True
    assert pod["terminationGracePeriodSeconds"] >= 300
    assert pod["automountServiceAccountToken"] is False


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_exporter_sidecar_serves_the_installed_bundle_on_the_scraped_port(overlay):
    """The sidecar runs the nvshim the installer puts at TOOLKIT_INSTALL_DIR, in the host
    root, on the port the scrape annotations name."""
    docs = render(overlay)
    daemonset = by_kind(docs, "DaemonSet")
    pod, installer = _container(docs)
    (sidecar,) = [c for c in pod["containers"] if c["name"] == "exporter"]
    s = resolve_node({}, {e["name"]: e["value"] for e in installer["env"]})
    nvshim = os.path.join(s.prefix, "bin", "nvshim")
    script = " ".join(sidecar["args"])
    assert f"-x {s.host_root}{nvshim} " in script
    assert f"exec chroot {s.host_root} {nvshim} exporter --listen :9400" in script
    annotations = daemonset["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert [p["containerPort"] for p in sidecar["ports"]] == [
        int(annotations["prometheus.io/port"])
    ]
    mount, volume = mount_for(s.host_root, pod, sidecar)
    assert volume["hostPath"]["path"] == "/" and mount["readOnly"] is True


# The managed node shapes (issue 23): the labels and taints of a GPU node each service
# gives, and what its device plugin does (envvar: NVIDIA_VISIBLE_DEVICES, NVIDIA's runtime
# the default).
SHAPES = {
    "aks": (
        {"kubernetes.azure.com/accelerator": "nvidia", "accelerator": "nvidia"},
        [{"key": "sku", "value": "gpu", "effect": "NoSchedule"}],
    ),
    "eks": (
        {"k8s.amazonaws.com/accelerator": "nvidia-tesla-h100"},
        [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}],
    ),
    "gke": (
        {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"},
        [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
    ),
}


def _selects(pod: dict, labels: dict[str, str]) -> bool:
    """The scheduler's node selector and required node affinity (In/Exists) on ``labels``."""
    if any(labels.get(k) != v for k, v in pod.get("nodeSelector", {}).items()):
        return False
    required = pod.get("affinity", {}).get("nodeAffinity", {})
    required = required.get("requiredDuringSchedulingIgnoredDuringExecution")
    if not required:
        return True

    def matches(expr: dict) -> bool:
        if expr["operator"] == "Exists":
            return expr["key"] in labels
        if expr["operator"] == "In":
            return labels.get(expr["key"]) in expr["values"]
        raise AssertionError(expr)

    return any(all(map(matches, t["matchExpressions"])) for t in required["nodeSelectorTerms"])


def _tolerates(tolerations: list[dict], taint: dict) -> bool:
    for t in tolerations:
        if t.get("effect") not in (None, taint["effect"]) or t.get("key") != taint["key"]:
            continue
        if t.get("operator") == "Exists" or t.get("value") == taint["value"]:
            return True
    return False


@pytest.mark.parametrize("overlay", sorted(SHAPES))
def test_managed_shape_lands_on_its_gpu_nodes_and_honours_its_device_plugin(overlay):
    labels, taints = SHAPES[overlay]
    docs = render(overlay)
    pod, container = _container(docs)
    assert _selects(pod, labels)
    assert all(_tolerates(pod["tolerations"], taint) for taint in taints)
    assert not _selects(pod, {"kubernetes.io/os": "linux"})  # a node without a GPU: no
    # a GPU pod on the runtime class lands there too (its own GPU request picks the node)
    scheduling = by_kind(docs, "RuntimeClass")["scheduling"]
    assert all(labels.get(k) == v for k, v in scheduling.get("nodeSelector", {}).items())
    assert all(_tolerates(scheduling["tolerations"], taint) for taint in taints)
    # NVIDIA's runtime is the default there and the device plugin asks by env: nvshim takes
    # the default (pods name no runtime class) and honours those requests
    s = resolve_node({}, {e["name"]: e["value"] for e in container["env"]})
    assert s.engine.set_as_default is True
    assert s.policy["accept-env-unprivileged"] is True
    assert s.warnings == []


def test_default_overlays_keep_the_safe_env_policy():
    for overlay in ("containerd", "crio", "k3s", "rke2"):
        _, container = _container(render(overlay))
        s = resolve_node({}, {e["name"]: e["value"] for e in container["env"]})
        assert "accept-env-unprivileged" not in s.policy
        assert s.engine.set_as_default is False


EXAMPLES = sorted(os.listdir(os.path.join(KUBE, "examples")))


@pytest.mark.parametrize("example", EXAMPLES)
def test_examples_validate_and_ask_through_a_form_nvshim_honours(example):
    """The documented pods: valid, on the nvshim runtime class, and asking in a form the
    default policy honours for an unprivileged container (device mounts or a device
    plugin resource), never NVIDIA_VISIBLE_DEVICES alone."""
    with open(os.path.join(KUBE, "examples", example), encoding="utf-8") as fh:
        (pod,) = [d for d in yaml.safe_load_all(fh) if d]
    for version in (OLDEST, newest_bundled()):
        kubernetes_validate.validate(pod, version, strict=True)
    spec = pod["spec"]
    assert spec["runtimeClassName"] == "nvshim"
    (container,) = spec["containers"]
    assert "NVIDIA_VISIBLE_DEVICES" not in {e["name"] for e in container.get("env", [])}
    mounts = container.get("volumeMounts", [])
    limits = container.get("resources", {}).get("limits", {})
    assert limits.get("nvidia.com/gpu") or any(
        m["mountPath"].startswith("/var/run/nvidia-container-devices/") for m in mounts
    )
    for mount in mounts:
        volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
        assert volume["hostPath"] == {"path": "/dev/null", "type": "CharDevice"}
