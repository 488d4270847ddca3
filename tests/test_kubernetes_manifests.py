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
    assert {"containerd", "crio", "k3s", "rke2"} <= set(OVERLAYS)


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("version", [OLDEST, newest_bundled()])
def test_overlay_renders_and_validates(overlay, version):
    docs = render(overlay)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == [
        "ConfigMap",
        "ConfigMap",
        "DaemonSet",
        "Namespace",
        "RuntimeClass",
        "ServiceAccount",
    ]
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
    mount, volume = mount_for(s.ready_file, pod, container)
    assert "emptyDir" in volume
    assert container["securityContext"]["readOnlyRootFilesystem"] is True

    # the RuntimeClass names the runtime the installer registers and lands on its nodes
    runtime_class = by_kind(docs, "RuntimeClass")
    assert runtime_class["handler"] == s.engine.runtime_name
    assert runtime_class["scheduling"]["nodeSelector"] == pod["nodeSelector"]
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
