"""The Kubernetes RuntimeClass shipped for nvshim matches what `configure` registers."""

from __future__ import annotations

from pathlib import Path

import yaml

from nvshim.engines.settings import DEFAULT_RUNTIME_NAME

KUBE = Path(__file__).resolve().parents[1] / "packaging" / "kubernetes"
MANIFEST = KUBE / "base" / "runtimeclass.yaml"


def test_runtimeclass_names_the_configured_handler():
    docs = list(yaml.safe_load_all(MANIFEST.read_text()))
    assert len(docs) == 1
    rc = docs[0]
    assert rc["apiVersion"] == "node.k8s.io/v1"
    assert rc["kind"] == "RuntimeClass"
    assert rc["metadata"] == {"name": "nvshim"}
    # The CRI handler is the runtime name `nvshim configure` writes by default.
    assert rc["handler"] == DEFAULT_RUNTIME_NAME
    assert set(rc) == {"apiVersion", "kind", "metadata", "handler", "scheduling"}
    # only onto GPU nodes, where the installer DaemonSet runs
    assert rc["scheduling"]["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
