"""Discovery against each simulated host, through the compiled fake NVML (nvshim's binding;
tests/test_nvml_query.py holds it to the real pynvml); bad inputs; the inventory cache."""

from __future__ import annotations

import os
import shutil

import pytest

from nvshim.errors import NvshimError
from nvshim.host.discover import discover_host
from nvshim.host.inventory import load_host
from nvshim.host.model import Host
from tests.conftest import HOSTS, run_nvshim
from tests.sim.simhost import build_host
from tests.sim.topology import HOSTS_DIR

MIB = 1024 * 1024


def load_topology(name: str) -> dict:
    """A shipped topology in its raw (editable) YAML form."""
    import yaml

    with open(os.path.join(HOSTS_DIR, f"{name}.yaml")) as fh:
        return yaml.safe_load(fh)


@pytest.mark.parametrize("name", HOSTS)
def test_discovery_matches_topology(sim_hosts, name):
    sim = sim_hosts(name)
    host = discover_host(sim.driver_root, sim.dev_root)
    topo = sim.topology
    assert host.driver_version == topo["driver_version"]
    cuda = topo["cuda_driver_version"]
    assert host.cuda_version == f"{cuda // 1000}.{cuda % 1000 // 10}"
    assert [g.uuid for g in host.gpus] == sim.gpu_uuids()
    for gpu, want in zip(host.gpus, topo["gpus"], strict=True):
        assert gpu.index == want["index"]
        assert gpu.minor == want["minor"]
        assert gpu.name == want["name"]
        assert gpu.pci_bus_id == want["pci_bus_id"]
        assert gpu.memory_total == want["memory_mib"] * MIB
        assert gpu.compute_capability == want["compute_capability"]
        assert gpu.mig_enabled == (want["mig_mode"] == "enabled")
        assert gpu.numa_node == want.get("numa_node")
        assert gpu.node.path == f"/dev/nvidia{want['minor']}"
        assert (gpu.node.major, gpu.node.minor) == (195, want["minor"])
        assert gpu.node.host_path == os.path.join(sim.dev_root, f"dev/nvidia{want['minor']}")
        migs = sorted(want["mig_devices"], key=lambda m: m["slot"])
        assert [m.uuid for m in gpu.mig_devices] == [m["uuid"] for m in migs]
        for mig, wm in zip(gpu.mig_devices, migs, strict=True):
            assert (mig.index, mig.gi, mig.ci) == (wm["slot"], wm["gi"], wm["ci"])
            assert mig.profile == wm["profile"]
            assert mig.gi_cap.minor == sim.mig_minor(want["minor"], wm["gi"])
            assert mig.ci_cap.minor == sim.mig_minor(want["minor"], wm["gi"], wm["ci"])
            assert mig.gi_cap.path == f"/dev/nvidia-caps/nvidia-cap{mig.gi_cap.minor}"
    assert {n.path for n in host.control_nodes} == {
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidia-modeset",
    }
    assert Host.from_dict(host.to_dict()) == host


def test_driver_files_by_capability(sim_hosts):
    sim = sim_hosts("single")
    host = discover_host(sim.driver_root, sim.dev_root)
    libs = {
        os.path.basename(f.path): f
        for f in host.files
        if f.kind == "lib" and f.path.startswith("/usr/lib/x86_64-linux-gnu/")
    }
    compat = [f for f in host.files if f.kind == "lib" and "i386" in f.path]
    assert compat and {f.capability for f in compat} == {"compat32"}
    ver = sim.driver_version
    cuda = libs[f"libcuda.so.{ver}"]
    assert cuda.capability == "compute"
    assert cuda.soname == "libcuda.so.1"
    assert cuda.host_path == os.path.join(
        sim.driver_root, f"usr/lib/x86_64-linux-gnu/libcuda.so.{ver}"
    )
    assert dict(cuda.links) == {
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1": f"libcuda.so.{ver}",
        "/usr/lib/x86_64-linux-gnu/libcuda.so": "libcuda.so.1",
    }
    assert libs[f"libnvidia-ml.so.{ver}"].capability == "utility"
    assert libs[f"libnvidia-encode.so.{ver}"].capability == "video"
    assert libs["libGLX_nvidia.so." + ver].capability == "graphics"
    bins = {f.path: f.capability for f in host.files if f.kind == "bin"}
    assert bins["/usr/bin/nvidia-smi"] == "utility"
    assert bins["/usr/bin/nvidia-cuda-mps-control"] == "compute"
    firmware = {f.path for f in host.files if f.kind == "firmware"}
    assert f"/lib/firmware/nvidia/{ver}/gsp_ga10x.bin" in firmware
    ipc = {f.path for f in host.files if f.kind == "ipc"}
    assert "/run/nvidia-persistenced/socket" in ipc


def test_separate_dev_root_and_numa_warning(tmp_path):
    sim = build_host("a100-mig-1g5gb", str(tmp_path / "driver"), dev_root=str(tmp_path / "dev"))
    host = discover_host(sim.driver_root, sim.dev_root)
    assert host.gpus[0].node.host_path == str(tmp_path / "dev/dev/nvidia0")
    assert len(host.gpus[0].mig_devices) == 7
    assert {m.profile for m in host.gpus[0].mig_devices} == {"1g.5gb"}
    assert any("NUMA node unknown" in w and "-1" in w for w in host.warnings)


def test_unreadable_ld_cache_falls_back_with_warning(tmp_path):
    sim = build_host("single", str(tmp_path))
    with open(os.path.join(sim.driver_root, "etc/ld.so.cache"), "wb") as fh:
        fh.write(b"garbage, not a cache")
    host = discover_host(sim.driver_root, sim.dev_root)
    assert any("ld.so.cache: unreadable" in w for w in host.warnings)
    assert any(f.soname == "libcuda.so.1" for f in host.files)
    assert len(host.gpus) == 1


def test_gpu_lost_is_skipped_with_warning(tmp_path):
    topo = load_topology("h100x8-mig")
    topo["gpus"][2]["fail"] = {"code": 15}
    sim = build_host(topo, str(tmp_path))
    host = discover_host(sim.driver_root, sim.dev_root)
    assert sim.gpu_uuids()[2] not in [g.uuid for g in host.gpus]
    assert len(host.gpus) == 7
    assert any(w.startswith("GPU 2: NVML error") for w in host.warnings)


def _one_line_failure(proc, *needles):
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0]


def test_no_nvml_under_driver_root(tmp_path, sim_hosts):
    sim = sim_hosts("single")
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = run_nvshim("info", "--driver-root", str(empty), "--dev-root", sim.dev_root)
    _one_line_failure(proc, str(empty), "no NVML library")


def test_nvml_init_failure(tmp_path):
    topo = load_topology("single")
    topo["init_error"] = 9  # NVML_ERROR_DRIVER_NOT_LOADED
    sim = build_host(topo, str(tmp_path))
    proc = run_nvshim("cdi", "generate", "--driver-root", sim.driver_root)
    _one_line_failure(proc, "NVML initialisation failed", "Driver Not Loaded")


def test_missing_dev_root(sim_hosts, tmp_path):
    sim = sim_hosts("single")
    missing = str(tmp_path / "nope")
    proc = run_nvshim("info", "--driver-root", sim.driver_root, "--dev-root", missing)
    _one_line_failure(proc, missing, "not a directory")


def test_info_table_and_json(sim_hosts):
    sim = sim_hosts("h100x8-mig")
    proc = run_nvshim("info", "--driver-root", sim.driver_root, "--dev-root", sim.dev_root)
    assert proc.returncode == 0, proc.stderr
    assert "Driver 550.90.12" in proc.stdout
    for uuid in sim.gpu_uuids() + sim.mig_uuids():
        assert uuid in proc.stdout
    proc = run_nvshim(
        "info", "--json", "--driver-root", sim.driver_root, "--dev-root", sim.dev_root
    )
    import json

    data = json.loads(proc.stdout)
    assert [g["uuid"] for g in data["gpus"]] == sim.gpu_uuids()


def test_inventory_cache_avoids_nvml_until_the_driver_changes(tmp_path):
    sim = build_host("single", str(tmp_path / "root"))
    state = str(tmp_path / "state")
    first = load_host(sim.driver_root, sim.dev_root, state)
    # Break NVML: a cache hit must not touch it.
    topo = sim.topology_path
    shutil.copy(topo, topo + ".orig")
    with open(topo, "a") as fh:
        fh.write("init_error 9\n")
    assert load_host(sim.driver_root, sim.dev_root, state) == first
    # A driver change (new ld.so.cache) invalidates the cache: NVML is asked again.
    os.utime(os.path.join(sim.driver_root, "etc/ld.so.cache"), ns=(1, 1))
    with pytest.raises(NvshimError, match="NVML initialisation failed"):
        load_host(sim.driver_root, sim.dev_root, state)


def test_a_process_parses_the_inventory_again_only_when_it_changed(tmp_path):
    """nvshim-runtimed's workers load the inventory for every create: the parsed host is
    kept while the entry's bytes, its path and the host's key are the same."""
    from nvshim.host import inventory
    from nvshim.record import replace

    sim = build_host("single", str(tmp_path / "root"))
    state = str(tmp_path / "state")
    load_host(sim.driver_root, sim.dev_root, state)  # discovered, then stored
    first = load_host(sim.driver_root, sim.dev_root, state)  # parsed
    assert load_host(sim.driver_root, sim.dev_root, state) is first
    inventory.store(state, replace(first, warnings=["rewritten"]))  # another entry
    changed = load_host(sim.driver_root, sim.dev_root, state)
    assert changed is not first and changed.warnings == ["rewritten"]
    other = str(tmp_path / "other")  # the same bytes at another path: read as its own
    inventory.store(other, changed)
    assert load_host(sim.driver_root, sim.dev_root, other) == changed
    assert load_host(sim.driver_root, sim.dev_root, other) is not changed
    os.utime(os.path.join(sim.driver_root, "etc/ld.so.cache"), ns=(1, 1))  # another key
    assert load_host(sim.driver_root, sim.dev_root, state) is not changed


def test_info_shows_sharing_and_fails_on_a_broken_sharing_config(sim_hosts, tmp_path):
    sim = sim_hosts("single")
    sharing = tmp_path / "sharing.yaml"
    config = tmp_path / "config.toml"
    config.write_text(f'[sharing]\nconfig = "{sharing}"\n')
    sharing.write_text(
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        "    - {name: nvidia.com/gpu, replicas: 3}\n"
    )
    args = ("info", "--driver-root", sim.driver_root, "--dev-root", sim.dev_root)
    proc = run_nvshim(*args, env={"NVSHIM_CONFIG": str(config)})
    assert proc.returncode == 0, proc.stderr
    row = next(line for line in proc.stdout.splitlines() if sim.gpu_uuids()[0] in line)
    assert row.split()[-1] != "none"
    sharing.write_text("version: v9\n")
    proc = run_nvshim(*args, env={"NVSHIM_CONFIG": str(config)})
    assert proc.returncode == 1  # the host is still shown, the broken file fails the command
    assert sim.gpu_uuids()[0] in proc.stdout
    assert proc.stderr.strip() == (f"nvshim: error: {sharing}: version: must be 'v1', got 'v9'")
