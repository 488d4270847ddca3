"""`cdi generate` defaults the device plugin can use: index and UUID names (resolved by real
podman both ways), type-index, --no-all-device, --mode management, the output's parent
directories created 0755, and `cdi list --json`."""

from __future__ import annotations

import json
import os
import stat

import yaml

from tests.conftest import run_nvshim
from tests.podman_util import make_busybox_rootfs, podman_run
from tests.test_cdi_generate import generate, generate_for_podman


def _names(spec: dict) -> list[str]:
    return [d["name"] for d in spec["devices"]]


def test_default_names_are_index_and_uuid(sim_hosts):
    sim = sim_hosts("h100x8-mig")
    spec = yaml.safe_load(generate(sim).stdout)
    uuids = sim.gpu_uuids()
    assert _names(spec)[:4] == ["0", uuids[0], "1", uuids[1]]
    assert "6:0" in _names(spec) and sim.mig_uuids()[0] in _names(spec)
    assert _names(spec)[-1] == "all"


def test_type_index_and_no_all_device(sim_hosts, tmp_path):
    sim = sim_hosts("h100x8-mig")
    out = tmp_path / "nvidia.yaml"
    generate(sim, "--device-name-strategy", "type-index", "--no-all-device", "-o", str(out))
    spec = yaml.safe_load(out.read_text())
    assert _names(spec) == [f"gpu{i}" for i in range(6)] + [
        "mig6:0",
        "mig6:1",
        "mig6:2",
        *(f"mig7:{i}" for i in range(7)),
    ]
    assert run_nvshim("cdi", "validate", str(out)).returncode == 0


def test_management_mode_has_the_nodes_and_no_compute_libraries(sim_hosts):
    sim = sim_hosts("h100x8-mig")
    for minor in (1, 2):  # the MIG config and monitor capabilities (mig-minors: 1 and 2)
        assert stat.S_ISCHR(os.stat(sim.host_path(f"/dev/nvidia-caps/nvidia-cap{minor}")).st_mode)
    spec = yaml.safe_load(generate(sim, "--mode", "management").stdout)
    assert _names(spec) == ["all"]
    nodes = {n["path"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"]}
    assert nodes == {f"/dev/nvidia{i}" for i in range(8)} | {  # GPUs in MIG mode included
        "/dev/nvidia-caps/nvidia-cap1",
        "/dev/nvidia-caps/nvidia-cap2",
    }
    common = spec["containerEdits"]
    assert {n["path"] for n in common["deviceNodes"]} == {"/dev/nvidiactl"}  # no UVM
    mounts = {m["containerPath"] for m in common["mounts"]}
    assert any("libnvidia-ml.so" in m for m in mounts) and "/usr/bin/nvidia-smi" in mounts
    assert not any("libcuda.so" in m for m in mounts)


def test_parent_directories_are_created_0755(sim_hosts, tmp_path):
    sim = sim_hosts("single")
    out = tmp_path / "var" / "run" / "cdi" / "nvidia.yaml"
    old = os.umask(0o077)
    try:
        generate(sim, "-o", str(out))
    finally:
        os.umask(old)
    for directory in (tmp_path / "var", tmp_path / "var" / "run", out.parent):
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o755
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o644


def test_cdi_list_json(sim_hosts, tmp_path):
    sim = sim_hosts("single")
    generate(sim, "-o", str(tmp_path / "cdi" / "nvidia.json"))
    proc = run_nvshim("cdi", "list", "--json", "--spec-dir", str(tmp_path / "cdi"))
    assert proc.returncode == 0, proc.stderr
    uuid = sim.gpu_uuids()[0]
    assert json.loads(proc.stdout) == [
        {"name": "nvidia.com/gpu=0", "kind": "nvidia.com/gpu", "device": "0"},
        {"name": f"nvidia.com/gpu={uuid}", "kind": "nvidia.com/gpu", "device": uuid},
        {"name": "nvidia.com/gpu=all", "kind": "nvidia.com/gpu", "device": "all"},
    ]


def test_podman_resolves_index_and_uuid_names(sim_hosts, launchers, tmp_path):
    sim = sim_hosts("h100x8-mig")
    cdi_dir = tmp_path / "cdi"
    generate_for_podman(sim, cdi_dir / "nvidia.yaml", launchers, tmp_path)
    rootfs = make_busybox_rootfs(tmp_path / "rootfs")
    uuid = sim.gpu_uuids()[2]
    for n, name in enumerate(("2", uuid)):
        proc = podman_run(
            tmp_path / f"run{n}",
            rootfs,
            ["--device", f"nvidia.com/gpu={name}", "--", "/bin/sh", "-c", "ls /dev"],
            cdi_dir=str(cdi_dir),
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        listed = set(proc.stdout.split())
        assert "nvidia2" in listed and "nvidiactl" in listed
        assert not {f"nvidia{i}" for i in (0, 1, 3, 4, 5, 6, 7)} & listed
