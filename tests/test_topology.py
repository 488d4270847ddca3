"""Topology discovery on simulated hosts with a PCIe tree: `nvshim info --topology` gives
the nvidia-smi topo -m matrix cell by cell; broken sysfs gives one clear error line."""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import run_nvshim
from tests.sim.simhost import build_host

# GPU->NIC and NIC->GPU follow the switch layout in hosts/hgx-h100x8-rdma.yaml.
HGX = """
     GPU0 GPU1 GPU2 GPU3 GPU4 GPU5 GPU6 GPU7 NIC0 NIC1 NIC2 NIC3 NUMA
GPU0 X    NV18 NV18 NV18 NV18 NV18 NV18 NV18 PIX  NODE SYS  SYS  0
GPU1 NV18 X    NV18 NV18 NV18 NV18 NV18 NV18 PIX  NODE SYS  SYS  0
GPU2 NV18 NV18 X    NV18 NV18 NV18 NV18 NV18 NODE PIX  SYS  SYS  0
GPU3 NV18 NV18 NV18 X    NV18 NV18 NV18 NV18 NODE PIX  SYS  SYS  0
GPU4 NV18 NV18 NV18 NV18 X    NV18 NV18 NV18 SYS  SYS  PIX  PHB  1
GPU5 NV18 NV18 NV18 NV18 NV18 X    NV18 NV18 SYS  SYS  PIX  PHB  1
GPU6 NV18 NV18 NV18 NV18 NV18 NV18 X    NV18 SYS  SYS  PHB  PXB  1
GPU7 NV18 NV18 NV18 NV18 NV18 NV18 NV18 X    SYS  SYS  PHB  PXB  1
NIC0 PIX  PIX  NODE NODE SYS  SYS  SYS  SYS  X    NODE SYS  SYS  0
NIC1 NODE NODE PIX  PIX  SYS  SYS  SYS  SYS  NODE X    SYS  SYS  0
NIC2 SYS  SYS  SYS  SYS  PIX  PIX  PHB  PHB  SYS  SYS  X    PHB  1
NIC3 SYS  SYS  SYS  SYS  PHB  PHB  PXB  PXB  SYS  SYS  PHB  X    1
"""
CROSS = """
     GPU0 GPU1 NIC0 NIC1 NIC2 NUMA
GPU0 X    NV12 SYS  SYS  SYS  0
GPU1 NV12 X    SYS  SYS  SYS  0
NIC0 SYS  SYS  X    NODE NODE 1
NIC1 SYS  SYS  NODE X    PIX  1
NIC2 SYS  SYS  NODE PIX  X    1
"""


def parse_matrix(text: str) -> dict[tuple[str, str], str]:
    """(row label, column label) -> cell, from the matrix part of the output."""
    lines = [x for x in text.strip("\n").split("\n\n")[0].splitlines() if x.strip()]
    header = lines[0].split()
    return {
        (row[0], col): cell
        for row in (x.split() for x in lines[1:])
        for col, cell in zip(header, row[1:], strict=True)
    }


def topology(host, *extra):
    return run_nvshim(
        "info", "--topology", *extra, "--driver-root", host.driver_root, "--dev-root", host.dev_root
    )


@pytest.mark.parametrize(
    ("name", "expected"), [("hgx-h100x8-rdma", HGX), ("rdma-cross-socket", CROSS)]
)
def test_matrix_cell_by_cell(sim_hosts, name, expected):
    proc = topology(sim_hosts(name))
    assert proc.returncode == 0, proc.stderr
    got, want = parse_matrix(proc.stdout), parse_matrix(expected)
    assert got.keys() == want.keys()
    wrong = {k: (got[k], v) for k, v in want.items() if got[k] != v}
    assert not wrong, wrong


def test_nic_legend_names_hca_function_netdev_and_uverbs(sim_hosts):
    host = sim_hosts("rdma-cross-socket")
    out = topology(host).stdout
    legend = {x.split()[0]: x.split()[1:] for x in out.splitlines() if x.startswith("  NIC")}
    assert legend["NIC0:"][:4] == ["mlx5_0", "0000:98:00.0", "NUMA", "1"]
    assert "Ethernet" in legend["NIC0:"] and "PF" in legend["NIC0:"]
    assert " ".join(legend["NIC2:"]).count("VF of 0000:b1:00.0") == 1
    assert "/dev/infiniband/uverbs2" in legend["NIC2:"]
    assert "ens177v0" in " ".join(legend["NIC2:"])


def test_json_matches_table_and_model(sim_hosts):
    host = sim_hosts("hgx-h100x8-rdma")
    proc = topology(host, "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    labels, rows = data["matrix"]["labels"], data["matrix"]["rows"]
    want = parse_matrix(HGX)
    assert {(a, b): rows[i][j] for i, a in enumerate(labels) for j, b in enumerate(labels)} == {
        k: v for k, v in want.items() if k[1] != "NUMA"
    }
    gpu6 = data["gpus"][6]["location"]
    assert gpu6["host_bridge"] == "pci0000:90"
    assert gpu6["bridges"] == [
        "0000:90:02.0",
        "0000:a1:00.0",
        "0000:a2:01.0",
        "0000:a4:00.0",
        "0000:a5:00.0",
    ]
    nic = data["nics"][1]
    assert (nic["name"], nic["ports"], nic["netdevs"]) == (
        "mlx5_1",
        [[1, "InfiniBand"]],
        ["ibp53s0"],
    )
    assert (nic["uverbs"]["path"], nic["uverbs"]["major"], nic["uverbs"]["minor"]) == (
        "/dev/infiniband/uverbs1",
        231,
        193,
    )
    assert data["rdma_cm"]["path"] == "/dev/infiniband/rdma_cm"


@pytest.fixture
def broken_host(tmp_path):
    return build_host("rdma-cross-socket", str(tmp_path / "host"))


def _error_line(proc) -> str:
    assert proc.returncode != 0
    lines = [x for x in proc.stderr.splitlines() if not x.startswith("nvshim: warning:")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def test_a_host_without_a_pcie_tree_says_so(sim_hosts):
    """The simulated hosts without a PCIe tree (their sysfs has only /sys/bus/pci/devices
    entries, as a minimal host's) get one line saying there is no topology."""
    host = sim_hosts("h100x8-mig")
    line = _error_line(topology(host))
    devices = os.path.join(host.dev_root, "sys/devices")
    assert line.startswith(f"nvshim: error: GPU 0: no PCIe topology: {devices} has no pci")


def test_sysfs_loop_is_one_error_line(broken_host):
    link = os.path.join(broken_host.dev_root, "sys/bus/pci/devices/0000:31:00.0")
    os.unlink(link)
    os.symlink("0000:31:00.0", link)  # a link to itself
    line = _error_line(topology(broken_host))
    assert line.startswith("nvshim: error: GPU 1: ") and link in line and "loop" in line


def test_chain_loop_in_sysfs_is_one_error_line(broken_host):
    devices = os.path.join(broken_host.dev_root, "sys/bus/pci/devices")
    os.unlink(os.path.join(devices, "0000:98:00.0"))
    # a device directory that names its own bridge again further down
    looped = os.path.join(broken_host.dev_root, "sys/devices/pci0000:97/0000:97:01.0/0000:97:01.0")
    os.makedirs(os.path.join(looped, "0000:98:00.0"))
    os.symlink(
        "../../../devices/pci0000:97/0000:97:01.0/0000:97:01.0/0000:98:00.0",
        os.path.join(devices, "0000:98:00.0"),
    )
    ib = os.path.join(broken_host.dev_root, "sys/class/infiniband/mlx5_0/device")
    os.unlink(ib)
    os.symlink("/sys/bus/pci/devices/0000:98:00.0", ib)  # absolute: inside the dev root
    line = _error_line(topology(broken_host))
    assert "RDMA device mlx5_0" in line and "repeats in the bridge chain" in line


def test_missing_link_is_one_error_line(broken_host):
    link = os.path.join(broken_host.dev_root, "sys/class/infiniband/mlx5_1/device")
    os.unlink(link)
    line = _error_line(topology(broken_host))
    assert line == f"nvshim: error: RDMA device mlx5_1: {link}: missing from sysfs"


def test_dangling_link_is_one_error_line(broken_host):
    gpu_dir = os.path.join(broken_host.dev_root, "sys/devices/pci0000:16/0000:16:01.0/0000:17:00.0")
    os.rename(gpu_dir, gpu_dir + ".gone")
    line = _error_line(topology(broken_host))
    assert line.startswith("nvshim: error: GPU 0: ") and "dangling" in line


def test_pairing_on_broken_sysfs_refuses_with_the_same_line(broken_host, tmp_path):
    """The runtime's pairing reads the same sysfs: a loop refuses the container with one
    error naming the device, before anything is written."""
    from nvshim.config import load_config
    from nvshim.errors import NvshimError
    from nvshim.host.discover import discover_host
    from nvshim.policy.select import edits_for_spec

    link = os.path.join(broken_host.dev_root, "sys/class/infiniband/mlx5_0/device")
    os.unlink(link)
    os.symlink("device", link)
    config = tmp_path / "config.toml"
    config.write_text(
        "[policy]\naccept-env-unprivileged = true\n[pairing]\n"
        'enabled = true\nworst-affinity = "SYS"\n'
    )
    host = discover_host(broken_host.driver_root, broken_host.dev_root)
    spec = {"process": {"env": ["NVIDIA_VISIBLE_DEVICES=0", "NVSHIM_RDMA=paired"]}}
    with pytest.raises(NvshimError) as err:
        edits_for_spec(spec, load_config(str(config)), host)
    assert str(err.value) == (
        f"RDMA device mlx5_0: {link}: too many levels of symbolic links (a sysfs link loop)"
    )
