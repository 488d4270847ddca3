"""packaging/kubernetes/dra: renders with `kubectl kustomize`, passes kubernetes-validate
(strict) for 1.34 (resource.k8s.io/v1 GA) and the newest bundled version, and the DaemonSet,
RBAC and DeviceClasses agree with what `nvshim dra` does."""

from __future__ import annotations

import json
import os
import shutil

import kubernetes_validate
import pytest

from nvshim.dra import DRIVER_NAME
from nvshim.dra.server import socket_paths
from tests.conftest import REPO, run_nvshim
from tests.test_kubernetes_manifests import (
    OVERLAYS,
    by_kind,
    kustomize,
    mount_for,
    newest_bundled,
    render,
)

DRA = os.path.join(REPO, "packaging", "kubernetes", "dra")

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs kubectl")


@pytest.fixture(scope="module")
def docs() -> list[dict]:
    return kustomize(DRA)


@pytest.mark.parametrize("version", ["1.34.0", newest_bundled()])
def test_renders_and_validates(docs, version):
    assert sorted(d["kind"] for d in docs) == [
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "DaemonSet",
        "DeviceClass",
        "DeviceClass",
        "Namespace",
        "ServiceAccount",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def test_daemonset_runs_nvshim_dra_with_the_kubelets_paths(docs):
    pod = by_kind(docs, "DaemonSet")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    command = container["command"]
    assert command[:3] == ["/opt/nvshim/bin/nvshim", "dra", "run"]
    given = dict(arg[2:].split("=", 1) for arg in command[3:])
    help_text = run_nvshim("dra", "run", "--help").stdout
    for option in given:
        assert f"--{option}" in help_text, option
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}

    def host_path_of(path: str) -> str:
        """The node path behind ``path`` in the pod (the longest mount holding it)."""
        mount, volume = mount_for(path, pod, container)
        return os.path.normpath(volume["hostPath"]["path"] + path[len(mount["mountPath"]) :])

    # the sockets the kubelet must find are at the same paths on the node
    for sock in socket_paths(given["kubelet-dir"]):
        assert host_path_of(sock) == sock
    assert host_path_of(given["cdi-dir"]) == given["cdi-dir"]
    assert host_path_of(given["mps-root"]) == given["mps-root"]
    assert host_path_of(given["host-root"]) == "/"
    assert "driver-root" not in given and "dev-root" not in given  # settings, not hard-coded
    # the readiness probe checks the DRA socket; the startup probe, the same check, gives
    # a slow start (discovery) minutes before the kubelet restarts the plugin
    dra_sock = socket_paths(given["kubelet-dir"])[1]
    assert container["readinessProbe"]["exec"]["command"] == ["test", "-S", dra_sock]
    startup = container["startupProbe"]
    assert startup["exec"] == container["readinessProbe"]["exec"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300
    assert pod["hostPID"] is True  # the claims' MPS daemons outlive the pod
    mps_mount = max((m for m in mounts if given["mps-root"].startswith(m)), key=len)
    assert mounts[mps_mount]["mountPropagation"] == "Bidirectional"  # daemon shm for the node
    env = {e["name"]: e for e in container["env"]}
    assert env["NVIDIA_DRIVER_ROOT"]["value"] == "/"  # the node installer's variable
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    config = by_kind(docs, "ConfigMap")
    assert env["NVSHIM_CONFIG"]["value"].startswith(mounts["/etc/nvshim-dra"]["mountPath"])
    assert "nvshim-hook" in config["data"]["config.toml"]
    assert pod["serviceAccountName"] == by_kind(docs, "ServiceAccount")["metadata"]["name"]


def test_rbac_grants_exactly_what_the_driver_calls(docs):
    rules = by_kind(docs, "ClusterRole")["rules"]
    granted = {(g, r, v) for rule in rules for g in rule["apiGroups"]
               for r in rule["resources"] for v in rule["verbs"]}  # fmt: skip
    for verb in ("list", "create", "update", "delete"):
        assert ("resource.k8s.io", "resourceslices", verb) in granted
    assert ("resource.k8s.io", "resourceclaims", "get") in granted
    assert ("", "nodes", "get") in granted
    assert not any(v in ("*", "patch", "escalate") for _, _, v in granted)
    binding = by_kind(docs, "ClusterRoleBinding")
    sa = by_kind(docs, "ServiceAccount")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": "nvshim-dra"}
    ]
    policy = by_kind(docs, "ValidatingAdmissionPolicy")
    (condition,) = policy["spec"]["matchConditions"]
    assert f"system:serviceaccount:nvshim-dra:{sa['metadata']['name']}" in condition["expression"]


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_dra_and_the_node_installer_own_nothing_in_common(docs, overlay):
    """Either kustomization can be deleted while the other runs: no object of one (the
    namespace above all: deleting it deletes everything in it) is in the other."""

    def owned(rendered: list[dict]) -> set[tuple[str, str, str]]:
        return {(d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"])
                for d in rendered}  # fmt: skip

    node = render(overlay)
    assert owned(docs) & owned(node) == set()
    namespaces = {d["metadata"].get("namespace") for d in docs} - {None}
    assert namespaces == {"nvshim-dra"}
    assert namespaces.isdisjoint({d["metadata"].get("namespace") for d in node})


def test_device_classes_select_what_the_slices_publish(docs, sim_hosts, tmp_path):
    host = sim_hosts("h100x8-mig")
    config = tmp_path / "config.toml"
    config.write_text(f'[host]\ndriver-root = "{host.driver_root}"\ndev-root = "{host.dev_root}"\n')
    out = run_nvshim("dra", "slices", "--node-name", "n", env={"NVSHIM_CONFIG": str(config)})
    assert out.returncode == 0, out.stderr
    types = {
        d["attributes"]["type"]["string"] for d in json.loads(out.stdout)[0]["spec"]["devices"]
    }
    assert types == {"gpu", "mig"}
    classes = {d["metadata"]["name"]: d for d in docs if d["kind"] == "DeviceClass"}
    assert set(classes) == {DRIVER_NAME, "mig.nvshim.io"}
    for name, kind in ((DRIVER_NAME, "gpu"), ("mig.nvshim.io", "mig")):
        (selector,) = classes[name]["spec"]["selectors"]
        expression = " ".join(selector["cel"]["expression"].split())
        assert f'device.driver == "{DRIVER_NAME}"' in expression
        assert f'device.attributes["{DRIVER_NAME}"].type == "{kind}"' in expression


def test_documented_driver_root_patch_mounts_where_the_variable_says(tmp_path):
    """docs/dra.md's patch for a driver root mounted at a path of its own, applied as the
    page says: the rendered DaemonSet validates, its DRIVER_ROOT_CTR_PATH is the mount of
    the node's NVIDIA_DRIVER_ROOT, and the plugin's roots (the installer's resolution)
    discover there and name the node's path."""
    import re

    import yaml

    from nvshim.node.env import driver_roots

    with open(os.path.join(REPO, "docs", "dra.md")) as fh:
        (patch,) = re.findall(r"```yaml\n(# driver-root\.yaml\n.*?)```", fh.read(), re.S)
    (tmp_path / "driver-root.yaml").write_text(patch)
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [os.path.relpath(DRA, tmp_path)],
                "patches": [{"path": "driver-root.yaml"}],
            }
        )  # fmt: skip
    )
    docs = kustomize(str(tmp_path))
    daemonset = by_kind(docs, "DaemonSet")
    kubernetes_validate.validate(daemonset, newest_bundled(), strict=True)
    pod = daemonset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    mount, volume = mount_for(env["DRIVER_ROOT_CTR_PATH"], pod, container)
    assert mount["mountPath"] == env["DRIVER_ROOT_CTR_PATH"]
    assert volume["hostPath"]["path"] == env["NVIDIA_DRIVER_ROOT"] == "/run/nvidia/driver"
    host_root = dict(a[2:].split("=", 1) for a in container["command"][3:])["host-root"]
    roots = driver_roots(host_root, env)
    assert roots.pairs == (
        ("/driver-root", "/run/nvidia/driver"),
        (host_root + "/run/nvidia/driver", "/run/nvidia/driver"),
    )
