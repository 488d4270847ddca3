"""RDMA devices from sysfs under the dev root (``/sys/class/infiniband``), and the state of
their netdevs through netlink (pyroute2).

Per device: its PCI function and location, the link layer of each port, its netdevs
(``<function>/net/``), its uverbs char device (``/sys/class/infiniband_verbs/uverbsN``,
whose ``ibdev`` names it), and, for an SR-IOV virtual function, its physical function.
"""

from __future__ import annotations

import os

from nvshim.host.devices import stat_node
from nvshim.host.model import NodeInfo
from nvshim.host.pcie import PciLocation, location_of
from nvshim.host.rootpath import host_path
from nvshim.record import record

IB_CLASS = "/sys/class/infiniband"
VERBS_CLASS = "/sys/class/infiniband_verbs"
RDMA_CM = "/dev/infiniband/rdma_cm"
UVERBS_MAJOR = 231


@record(frozen=True)
class RdmaDevice:
    """One RDMA device (HCA) and what a container needs to use it."""

    name: str  # mlx5_0
    location: PciLocation
    ports: tuple[tuple[int, str], ...] = ()  # (port, link layer)
    netdevs: tuple[str, ...] = ()
    uverbs: NodeInfo | None = None
    physfn: str | None = None  # the PF's address when this is a virtual function

    @property
    def bdf(self) -> str:
        return self.location.bdf

    @property
    def is_vf(self) -> bool:
        return self.physfn is not None

    def link_layers(self) -> str:
        return ",".join(sorted({layer for _, layer in self.ports})) or "unknown"


def _listdir(dev_root: str, path: str) -> list[str]:
    try:
        return sorted(os.listdir(host_path(dev_root, path)))
    except OSError:
        return []


def _read(dev_root: str, path: str) -> str | None:
    try:
        with open(host_path(dev_root, path), encoding="utf-8", errors="replace") as fh:
            return fh.read(4096).strip()
    except OSError:
        return None


def _verbs_by_ibdev(dev_root: str) -> dict[str, str]:
    """ibdev name -> ``uverbsN``."""
    out = {}
    for entry in _listdir(dev_root, VERBS_CLASS):
        ibdev = _read(dev_root, f"{VERBS_CLASS}/{entry}/ibdev")
        if entry.startswith("uverbs") and ibdev:
            out.setdefault(ibdev, entry)
    return out


def _uverbs_node(dev_root: str, entry: str, warnings: list[str]) -> NodeInfo | None:
    node = stat_node(dev_root, f"/dev/infiniband/{entry}")
    want = _read(dev_root, f"{VERBS_CLASS}/{entry}/dev")
    if node is None:
        warnings.append(f"{host_path(dev_root, '/dev/infiniband/' + entry)}: missing")
        return None
    if want and want != f"{node.major}:{node.minor}":
        warnings.append(f"{node.host_path}: is {node.major}:{node.minor}, sysfs says {want}")
        return None
    return node


def discover_rdma(dev_root: str, warnings: list[str]) -> list[RdmaDevice]:
    """Every RDMA device under the dev root, by name. A device whose sysfs is broken
    raises TopologyError naming it (a loop, a missing or dangling link)."""
    verbs = _verbs_by_ibdev(dev_root)
    out = []
    for name in _listdir(dev_root, IB_CLASS):
        base = f"{IB_CLASS}/{name}"
        location = location_of(dev_root, f"{base}/device", f"RDMA device {name}")
        ports = []
        for port in _listdir(dev_root, f"{base}/ports"):
            if port.isdigit():
                ports.append((int(port), _read(dev_root, f"{base}/ports/{port}/link_layer") or "?"))
        function = location.sysfs_path
        physfn = None
        if os.path.islink(host_path(dev_root, f"{function}/physfn")):
            physfn = os.path.basename(os.readlink(host_path(dev_root, f"{function}/physfn")))
        uverbs = None
        if name in verbs:
            uverbs = _uverbs_node(dev_root, verbs[name], warnings)
        else:
            warnings.append(f"RDMA device {name}: no uverbs device (is ib_uverbs loaded?)")
        out.append(
            RdmaDevice(
                name=name,
                location=location,
                ports=tuple(sorted(ports)),
                netdevs=tuple(_listdir(dev_root, f"{function}/net")),
                uverbs=uverbs,
                physfn=physfn,
            )
        )
    return out


def rdma_cm_node(dev_root: str) -> NodeInfo | None:
    """``/dev/infiniband/rdma_cm`` when present."""
    return stat_node(dev_root, RDMA_CM)


def netlink_links() -> dict[str, dict[str, object]]:
    """Links of this network namespace by name: ``index`` and ``state`` (pyroute2).
    Empty when netlink is unavailable."""
    try:
        from pyroute2 import IPRoute
    except ImportError:
        return {}
    out: dict[str, dict[str, object]] = {}
    try:
        with IPRoute() as ipr:
            for link in ipr.get_links():
                name = link.get_attr("IFLA_IFNAME")
                out[name] = {"index": link["index"], "state": link.get_attr("IFLA_OPERSTATE")}
    except OSError:
        return {}
    return out
