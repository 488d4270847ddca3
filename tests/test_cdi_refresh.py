"""`nvshim cdi refresh` on simulated hosts changed the way a node changes: the spec is
rewritten after a driver upgrade, a MIG re-layout or a device node change, left alone
(bytes and mtime) on an unchanged host, and kept when discovery fails."""

from __future__ import annotations

import glob
import json
import os

import pytest
import yaml

from tests.conftest import run_nvshim
from tests.sim import devfs
from tests.sim.simhost import build_host, run_ldconfig
from tests.sim.topology import HOSTS_DIR, load_topology, render_fake_nvml

NEW_MIG = "MIG-11111111-2222-3333-4444-555555555555"


def raw_topology(name: str) -> dict:
    with open(os.path.join(HOSTS_DIR, f"{name}.yaml"), encoding="utf-8") as fh:
        return yaml.safe_load(fh)


@pytest.fixture
def node(tmp_path):
    """A private simulated host (the tests change it) and the spec path under tmp."""

    def make(topology):
        sim = build_host(topology, str(tmp_path / "host"))
        spec_dir = tmp_path / "cdi"
        spec_dir.mkdir(exist_ok=True)
        return sim, str(spec_dir / "nvidia.yaml")

    return make


def refresh(sim, output: str, *args: str):
    return run_nvshim(
        "cdi",
        "refresh",
        "-o",
        output,
        "--driver-root",
        sim.driver_root,
        "--dev-root",
        sim.dev_root,
        "--hook-path",
        "/usr/bin/nvshim-hook",
        *args,
    )


def refreshed(sim, output: str, *args: str) -> str:
    """Run a refresh that must rewrite the spec; return its log line."""
    before = snapshot(output)
    proc = refresh(sim, output, *args)
    assert proc.returncode == 0, proc.stderr
    lines = [x for x in proc.stderr.splitlines() if not x.startswith("nvshim: warning: ")]
    assert len(lines) == 1 and lines[0].startswith(f"nvshim: refreshed {output} ("), lines
    assert snapshot(output) != before
    return lines[0]


def snapshot(path: str):
    """(bytes, mtime_ns, inode) of a file, None when missing."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    with open(path, "rb") as fh:
        return fh.read(), st.st_mtime_ns, st.st_ino


def spec_names(output: str) -> list[str]:
    with open(output) as fh:
        return [d["name"] for d in yaml.safe_load(fh)["devices"]]


def test_unchanged_host_leaves_spec_and_key_untouched(node):
    sim, output = node("single")
    line = refreshed(sim, output)
    assert "no previous key" in line and "driver 550.90.12, 3 devices" in line
    assert spec_names(output) == ["0", sim.gpu_uuids()[0], "all"]  # generate's defaults
    assert run_nvshim("cdi", "validate", output).returncode == 0
    key_file = output + ".nvshim-key"
    spec_before, key_before = snapshot(output), snapshot(key_file)
    for _ in range(2):
        proc = refresh(sim, output)
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr == f"nvshim: {output} is current (driver 550.90.12, 3 devices)\n"
        assert snapshot(output) == spec_before
        assert snapshot(key_file) == key_before
    # engines load only .json and .yaml: the key file is not a spec to them
    assert not key_file.endswith((".json", ".yaml"))
    assert json.loads(open(key_file).read())["driver"] == "550.90.12"


def test_driver_upgrade_rewrites(node):
    sim, output = node("single")
    refreshed(sim, output)
    # an upgrade: the old version's files go, the new ones come, ldconfig runs, the new
    # kernel module reports its version
    for directory, _dirs, files in os.walk(sim.root):
        for name in files:
            if "550.90.12" in name:
                os.unlink(os.path.join(directory, name))
    topo = raw_topology("single")
    topo["driver_version"] = "570.124.06"
    upgraded = build_host(topo, sim.root)
    line = refreshed(upgraded, output)
    assert "driver libraries" in line and "driver module" in line
    assert "driver 550.90.12 -> 570.124.06" in line
    text = open(output).read()
    assert "libcuda.so.570.124.06" in text and "550.90.12" not in text
    proc = refresh(upgraded, output)
    assert proc.returncode == 0 and "is current" in proc.stderr


def test_mig_layout_change_rewrites(node):
    sim, output = node("a100-mig-1g5gb")
    both = ("--device-name-strategy", "index", "--device-name-strategy", "uuid")
    refreshed(sim, output, *both)
    assert len(spec_names(output)) == 15  # seven MIG devices twice, and all
    # an operator turns the last two 1g.5gb instances (GI 13, 14) into one 2g.10gb (GI 5):
    # NVML reports the new layout and the driver creates the new GI's capability node
    raw = raw_topology("a100-mig-1g5gb")
    gone = [m["uuid"] for m in raw["gpus"][0]["mig_devices"][5:]]
    raw["gpus"][0]["mig_devices"][5:] = [{"gi": 5, "ci": 0, "profile": "2g.10gb", "uuid": NEW_MIG}]
    new_topo = load_topology(raw)
    with open(sim.topology_path, "w") as fh:
        fh.write(render_fake_nvml(new_topo))
    devfs.make_nodes(new_topo, sim.dev_root)
    line = refreshed(sim, output, *both)
    assert "MIG capability nodes" in line and "driver libraries" not in line
    assert f"devices added {NEW_MIG};" in line
    assert f"devices removed {gone[0]},0:6,{gone[1]})" in line
    names = spec_names(output)
    assert names[:12:2] == ["0:0", "0:1", "0:2", "0:3", "0:4", "0:5"]
    assert names[11] == NEW_MIG and not set(gone) & set(names)


def test_device_node_change_rewrites(node, tmp_path):
    from tests.sim.topology import generate_topology

    sim, output = node(generate_topology(2, mig=False))
    refreshed(sim, output, "--device-name-strategy", "index")
    assert spec_names(output) == ["0", "1", "all"]
    os.unlink(os.path.join(sim.dev_root, "dev", "nvidia1"))  # the GPU's node is gone
    line = refreshed(sim, output, "--device-name-strategy", "index")
    assert "device nodes" in line and "devices removed 1" in line
    assert spec_names(output) == ["0", "all"]


def test_discovery_failure_keeps_the_previous_spec(node):
    sim, output = node("single")
    refreshed(sim, output)
    spec_before, key_before = snapshot(output), snapshot(output + ".nvshim-key")
    # the driver is uninstalled: NVML is gone
    for path in glob.glob(sim.host_path(sim.lib_dir) + "/libnvidia-ml.so*"):
        os.unlink(path)
    run_ldconfig(sim.driver_root)
    proc = refresh(sim, output)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"nvshim: error: {output}: kept the previous spec: ")
    assert "libnvidia-ml.so.1" in proc.stderr
    assert snapshot(output) == spec_before
    assert snapshot(output + ".nvshim-key") == key_before


def test_first_failure_writes_nothing(node, tmp_path):
    sim, output = node("single")
    proc = refresh(sim, output, "--driver-root", str(tmp_path / "missing"))
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1
    assert f"{output}: nothing written: " in proc.stderr
    assert os.listdir(os.path.dirname(output)) == []


def test_options_edits_and_force_rewrite(node):
    sim, output = node("single")
    refreshed(sim, output)
    assert "options" in refreshed(sim, output, "--device-name-strategy", "uuid")
    assert spec_names(output) == [sim.gpu_uuids()[0], "all"]
    with open(output, "a") as fh:
        fh.write("# edited\n")
    assert "spec edited" in refreshed(sim, output, "--device-name-strategy", "uuid")
    os.unlink(output)
    assert "spec missing" in refreshed(sim, output, "--device-name-strategy", "uuid")
    assert "forced" in refreshed(sim, output, "--device-name-strategy", "uuid", "--force")
    # an nvshim upgrade: the key names the version that wrote the spec
    record = json.loads(open(output + ".nvshim-key").read())
    record["key"]["nvshim"] = "0.0.1"
    with open(output + ".nvshim-key", "w") as fh:
        json.dump(record, fh)
    assert "(nvshim version)" in refreshed(sim, output, "--device-name-strategy", "uuid")


def test_unusable_output_directory_is_one_line(node, tmp_path):
    sim, _ = node("single")
    (tmp_path / "file").write_text("")
    output = str(tmp_path / "file" / "cdi" / "nvidia.yaml")
    proc = refresh(sim, output)
    assert proc.returncode == 1
    assert proc.stderr == (f"nvshim: error: {output}: cannot create {tmp_path}/file: File exists\n")


def test_missing_output_directory_is_created(node, tmp_path):
    sim, _ = node("single")
    output = str(tmp_path / "run" / "cdi" / "nvidia.yaml")
    refreshed(sim, output)
    assert os.stat(tmp_path / "run" / "cdi").st_mode & 0o777 == 0o755


def test_a_key_path_that_is_a_directory_writes_nothing(node):
    """The key is written after the spec: a directory in its place failed only then,
    with the new spec already written. Now refused first, every file as it was."""
    sim, output = node("single")
    refreshed(sim, output)
    spec_before = snapshot(output)
    key_file = output + ".nvshim-key"
    os.unlink(key_file)
    os.mkdir(key_file)
    proc = refresh(sim, output, "--force")
    assert proc.returncode == 1
    assert proc.stderr == (
        f"nvshim: error: {key_file}: the refresh's key file is not a regular file\n"
    )
    assert snapshot(output) == spec_before
    assert sorted(os.listdir(os.path.dirname(output))) == ["nvidia.yaml", "nvidia.yaml.nvshim-key"]
    assert os.listdir(key_file) == []
