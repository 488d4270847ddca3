"""No CDI request is dropped (issue 27): nvshim-runtime, where the engine applied no CDI
(containerd 1.6; a CDI annotation on any runtime), resolves every CDI name of any vendor
from the spec directories; NVIDIA devices get nvshim's own edits and enforcement, other
devices their spec's edits; a name no spec defines fails the create with the reason; GPU
nodes the engine injected itself get ``CUDA_VISIBLE_DEVICES``. Real runc, busybox root,
the simulated 8 x H100 host; the foreign spec is the shape NVIDIA's device plugin v0.20.0
writes (``/var/run/cdi/k8s.device-plugin.nvidia.com-gpu.json``, measured on this host)."""

from __future__ import annotations

import json
import os

import pytest

from tests.podman_util import make_busybox_rootfs
from tests.runc_util import make_bundle, runc_run
from tests.test_runtime import SHOW, Runtime, gpu_nodes

PLUGIN_KIND = "k8s.device-plugin.nvidia.com/gpu"


def plugin_spec(sim) -> dict:
    """The device plugin's spec for this host: each GPU and MIG device by UUID with its
    nodes only, and spec-level edits whose hooks call NVIDIA's hook at its default path
    (absent here: nvshim must not run them for the NVIDIA devices it serves itself)."""
    dev = sim.dev_root
    devices = []
    for gpu in sim.topology["gpus"]:
        node = f"/dev/nvidia{gpu['minor']}"
        gpu_node = {"path": node, "hostPath": dev + node, "major": 195, "minor": gpu["minor"]}
        if gpu.get("mig_mode") != "enabled":
            devices.append({"name": gpu["uuid"], "containerEdits": {"deviceNodes": [gpu_node]}})
        for mig in gpu.get("mig_devices", []):
            caps = [f"/dev/nvidia-caps/{c}" for c in sim.mig_cap_names(mig["uuid"])]
            nodes = [gpu_node] + [{"path": c, "hostPath": dev + c} for c in caps]
            devices.append({"name": mig["uuid"], "containerEdits": {"deviceNodes": nodes}})
    hook = {"hookName": "createContainer", "path": "/usr/bin/nvidia-ctk",
            "args": ["nvidia-ctk", "hook", "update-ldcache"]}  # fmt: skip
    return {
        "cdiVersion": "0.5.0",
        "kind": PLUGIN_KIND,
        "devices": devices,
        "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"], "hooks": [hook]},
    }


class CdiRuntime(Runtime):
    """The runtime test's host, with spec directories of the test's own."""

    def __init__(self, sim, launchers, tmp_path, rootfs) -> None:
        super().__init__(sim, launchers, tmp_path, rootfs)
        self.etc_cdi, self.run_cdi = tmp_path / "etc-cdi", tmp_path / "run-cdi"
        self.etc_cdi.mkdir()
        self.run_cdi.mkdir()
        with open(self.config, "a") as fh:
            fh.write(f'cdi-spec-dirs = ["{self.etc_cdi}", "{self.run_cdi}"]\n')

    def run_spec(self, edit) -> object:
        """Run a bundle whose config.json ``edit(spec)`` changed (what an engine wrote)."""
        self.count += 1
        name = f"x{self.count}"
        rootfs = make_busybox_rootfs(self.tmp / f"rootfs-{name}")
        bundle = make_bundle(self.tmp, rootfs, ["/bin/sh", "-c", SHOW], name=name)
        path = os.path.join(bundle, "config.json")
        with open(path) as fh:
            spec = json.load(fh)
        edit(spec)
        with open(path, "w") as fh:
            json.dump(spec, fh)
        return runc_run(bundle, f"nvshim-test-{os.getpid()}-{name}", runtime=self.runtime,
                        env={"NVSHIM_CONFIG": self.config})  # fmt: skip


@pytest.fixture
def rt(sim_hosts, launchers, tmp_path):
    rootfs = make_busybox_rootfs(tmp_path / "rootfs")
    rt = CdiRuntime(sim_hosts("h100x8-mig"), launchers, tmp_path, rootfs)
    (rt.run_cdi / "k8s.device-plugin.nvidia.com-gpu.json").write_text(
        json.dumps(plugin_spec(rt.sim))
    )
    return rt


def test_device_plugin_cdi_annotation_gets_its_gpu(rt):
    """The plugin's cdi-annotations form on an engine without CDI (containerd 1.6)."""
    gpu = rt.sim.topology["gpus"][3]
    key = f"cdi.k8s.io/nvidia-device-plugin_{gpu['uuid']}"
    proc, _, after = rt.run(annotations={key: f"{PLUGIN_KIND}={gpu['uuid']}"})
    view = rt.view(proc)
    assert gpu_nodes(view) == {"nvidia3"}
    assert view["CVD"] == [gpu["uuid"]]
    assert f"libcuda.so.{rt.sim.driver_version}" in view["LIBS"]
    spec = json.loads(after)
    hooks = [h["path"] for stage in spec.get("hooks", {}).values() for h in stage]
    assert "/usr/bin/nvidia-ctk" not in hooks  # nvshim's edits replace the plugin's
    assert "source=cdi" in rt.log_lines()[-1] and gpu["uuid"] in rt.log_lines()[-1]


def test_device_plugin_mig_device_gets_its_capabilities(rt):
    mig = rt.sim.topology["gpus"][6]["mig_devices"][2]
    proc, _, _ = rt.run(annotations={"cdi.k8s.io/x": f"{PLUGIN_KIND}={mig['uuid']}"})
    view = rt.view(proc)
    assert gpu_nodes(view) == {"nvidia7"}  # GPU index 6 is /dev/nvidia7 on this host
    assert sorted(view["CAPS"]) == sorted(rt.sim.mig_cap_names(mig["uuid"]))
    assert view["CVD"] == [mig["uuid"]]


def test_other_vendor_device_gets_its_spec_edits_and_no_nvidia_driver(rt):
    spec = {
        "cdiVersion": "0.5.0",
        "kind": "acme.example/nic",
        "devices": [{"name": "nic0", "containerEdits": {"env": ["ACME_NIC=nic0"]}}],
        "containerEdits": {"env": ["ACME_SPEC=1"]},
    }
    (rt.etc_cdi / "acme.json").write_text(json.dumps(spec))
    proc, _, after = rt.run(annotations={"cdi.k8s.io/nic": "acme.example/nic=nic0"})
    view = rt.view(proc)
    assert view["DEV"] == [] and view["LIBS"] == [] and view["CVD"] == ["unset"]
    env = json.loads(after)["process"]["env"]
    assert "ACME_NIC=nic0" in env and "ACME_SPEC=1" in env


@pytest.mark.parametrize(
    "value, reason",
    [
        (f"{PLUGIN_KIND}=GPU-00000000-0000-0000-0000-000000000000", "no spec in"),
        ("acme.example/nic=nic9", "no spec in"),
        ("k8s.device-plugin.nvidia.com/gpu=../../x", "CDI device"),
    ],
)
def test_unresolvable_or_invalid_name_fails_the_create(rt, value, reason):
    proc, before, after = rt.run(annotations={"cdi.k8s.io/x": value})
    assert proc.returncode != 0
    assert reason in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert before == after


def test_engine_injected_gpu_gets_cuda_visible_devices(rt):
    """containerd 1.7 applied the plugin's spec itself (cdi-cri): the GPU node is in
    linux.devices and the spec's NVIDIA_VISIBLE_DEVICES=void in the env."""
    gpu = rt.sim.topology["gpus"][2]

    def engine_cdi(spec):
        spec["process"]["env"].append("NVIDIA_VISIBLE_DEVICES=void")
        spec["linux"].setdefault("devices", []).append(
            {"path": "/dev/nvidia2", "type": "c", "major": 195, "minor": 2, "fileMode": 438,
             "uid": 0, "gid": 0}
        )  # fmt: skip

    view = rt.view(rt.run_spec(engine_cdi))
    assert gpu_nodes(view) == {"nvidia2"}
    assert view["CVD"] == [gpu["uuid"]]
    assert "source=engine" in rt.log_lines()[-1]
