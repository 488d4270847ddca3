"""The shared-devices CDI spec: content, minimum version, validity, and podman applying it."""

from __future__ import annotations

import json
import os

import pytest

from nvshim.cdi.validate import validate_spec
from nvshim.config import amended, load_config
from nvshim.errors import InputFileError
from nvshim.hookentries import hook_env
from nvshim.host.discover import discover_host
from nvshim.mps.cdi import shared_spec
from tests.conftest import run_nvshim
from tests.podman_util import make_busybox_rootfs, podman_run
from tests.sharing_util import mixed_sharing
from tests.sim import fake_mps_control
from tests.sim.simhost import build_host

GPU1 = "GPU-9d9231cf-dcd5-4b0e-0f9d-e8a86f92f3cc"
GPU3 = "GPU-4998f9d2-f279-514d-1035-17bd5c4caca3"
# mixed: GPUs 0-5 are nvidia.com/gpu and MPS-shared; 6 and 7 are MIG devices, not shared
SHARING = mixed_sharing("mps", {"nvidia.com/gpu": 4})


@pytest.fixture(scope="module")
def cdi_host(tmp_path_factory):
    root = tmp_path_factory.mktemp("mps-cdi")
    sim = build_host("h100x8-mig", str(root / "host"), extra_files=fake_mps_control.extra_files())
    (root / "sharing.yaml").write_text(SHARING)
    config = root / "config.toml"
    config.write_text(
        f'[host]\ndriver-root = "{sim.driver_root}"\ndev-root = "{sim.dev_root}"\n'
        f'[sharing]\nconfig = "{root / "sharing.yaml"}"\nmps-root = "{root / "mps"}"\n'
    )
    return root, discover_host(sim.driver_root, sim.dev_root), load_config(str(config))


def _devices(spec) -> dict:
    return {d["name"]: d["containerEdits"] for d in spec["devices"]}


def test_shared_spec_carries_the_mps_edits_of_shared_devices_only(cdi_host):
    root, host, config = cdi_host
    spec = shared_spec(
        host, config, ("utility", "compute"), "/bin/true", strategies=("index", "uuid")
    )
    assert spec["kind"] == "nvidia.com/gpu.shared"
    assert spec["cdiVersion"] == "0.6.0"  # the dot in the class
    devices = _devices(spec)
    whole = [g for g in host.gpus if not g.mig_enabled]
    assert [g.index for g in whole] == [0, 1, 2, 3, 4, 5]
    # no "all", nothing unshared: no MIG device, no GPU in MIG mode
    assert sorted(devices) == sorted([str(g.index) for g in whole] + [g.uuid for g in whole])
    gpu1 = devices["1"]
    assert gpu1 == devices[GPU1]
    assert gpu1["env"] == [
        "CUDA_MPS_PIPE_DIRECTORY=/run/nvidia-mps",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25",
        f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={GPU1}={81559 // 4}M",
    ]
    assert [(m["hostPath"], m["containerPath"]) for m in gpu1["mounts"]] == [
        (f"{root}/mps/{GPU1}/pipe", "/run/nvidia-mps"),
        (f"{root}/mps/{GPU1}/shm", "/dev/shm"),
    ]
    assert [n["path"] for n in gpu1["deviceNodes"]] == ["/dev/nvidia1"]
    assert devices["3"]["mounts"][0]["hostPath"] == f"{root}/mps/{GPU3}/pipe"
    assert validate_spec(spec) == []


def test_daemon_check_hook_and_time_slicing(cdi_host, tmp_path):
    root, host, config = cdi_host
    spec = shared_spec(
        host, config, ("compute",), "/usr/local/bin/nvshim-hook", daemon_check_hook=True
    )
    hooks = _devices(spec)["1"]["hooks"]
    assert hooks == [
        {
            "hookName": "createRuntime",
            "path": "/usr/local/bin/nvshim-hook",
            "args": ["nvshim-hook", "mps-check", GPU1],
            "env": list(hook_env()),
        }
    ]

    sharing = tmp_path / "ts.yaml"
    sharing.write_text(
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        "    - {name: nvidia.com/gpu, replicas: 2}\n"
    )
    config = amended(config, "sharing", config=str(sharing))
    spec = shared_spec(host, config, ("compute",), "/bin/true", cls="gpu-ts")
    assert spec["cdiVersion"] == "0.5.0"  # device names start with a digit
    # none shares every GPU whole, but a GPU in MIG mode (6, 7) cannot be given whole
    assert list(_devices(spec)) == [str(i) for i in range(6)]
    assert _devices(spec)["3"] == {"deviceNodes": _devices(spec)["3"]["deviceNodes"]}


def test_nothing_shared_is_a_bad_sharing_file(cdi_host, tmp_path):
    _, host, config = cdi_host
    config = amended(config, "sharing", config=str(tmp_path / "absent.yaml"))
    with pytest.raises(InputFileError, match="absent.yaml: no shared devices") as refused:
        shared_spec(host, config, ("compute",), "/bin/true")
    assert refused.value.exit_code == 1  # a bad file, not a usage error


def test_podman_applies_the_shared_spec(cdi_host, tmp_path):
    """podman 4.3 knows CDI up to 0.5.0, so this spec uses a class without a dot."""
    root, host, config = cdi_host
    env = {"NVSHIM_CONFIG": config.path}
    started = run_nvshim("mps", "start", "--gpu", "1", env=env)
    assert started.returncode == 0, started.stderr
    try:
        cdi_dir = tmp_path / "cdi"
        cdi_dir.mkdir()
        spec = shared_spec(host, config, ("utility", "compute"), "/bin/true", cls="gpushared")
        (cdi_dir / "shared.json").write_text(json.dumps(spec))
        script = (
            "env | grep ^CUDA_MPS_; ls /run/nvidia-mps /dev/shm; "
            "grep ' /run/nvidia-mps ' /proc/self/mountinfo"
        )
        proc = podman_run(
            tmp_path,
            make_busybox_rootfs(tmp_path / "rootfs"),
            ["--device", "nvidia.com/gpushared=1", "--", "/bin/sh", "-c", script],
            cdi_dir=str(cdi_dir),
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        out = proc.stdout.split()
        assert "CUDA_MPS_PIPE_DIRECTORY=/run/nvidia-mps" in out
        assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in out
        assert "control" in out and "nvidia-cuda-mps-control.pid" in out
        shm = os.path.join(root, "mps", GPU1, "shm")
        marker = next(n for n in os.listdir(shm) if n.startswith("fake-mps-control."))
        assert marker in out
    finally:
        run_nvshim("mps", "stop", env=env)


def test_cli_generate_sharing_writes_the_shared_spec(cdi_host, tmp_path):
    root, _host, _config = cdi_host
    out = tmp_path / "shared.yaml"
    proc = run_nvshim(
        "cdi",
        "generate",
        "--sharing",
        "-o",
        str(out),
        "--device-name-strategy",
        "uuid",
        env={"NVSHIM_CONFIG": str(root / "config.toml")},
    )
    assert proc.returncode == 0, proc.stderr
    import yaml

    spec = yaml.safe_load(out.read_text())
    assert spec["kind"] == "nvidia.com/gpu.shared"
    assert spec["cdiVersion"] == "0.6.0"
    names = {d["name"] for d in spec["devices"]}
    assert {GPU1, GPU3} <= names and not any(n.startswith("MIG-") for n in names)
    env = _devices(spec)[GPU1].get("env", [])
    assert "CUDA_MPS_PIPE_DIRECTORY=/run/nvidia-mps" in env
    assert run_nvshim("cdi", "validate", str(out)).returncode == 0
