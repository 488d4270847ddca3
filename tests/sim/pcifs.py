"""The PCIe tree and RDMA entries of a simulated host, laid out as the kernel's sysfs does.

For a topology whose devices give ``pci_path`` (see ``topology``), under the dev root:

- ``sys/devices/pci<dom>:<bus>/<root port>/<bridge>/.../<device>``: real directories, one
  per bridge and device, each with ``numa_node`` and ``class``; the host bridge
  ``pci<dom>:<bus>`` is named after the root port's bus.
- ``sys/bus/pci/devices/<bdf>``: relative symlinks into that tree (as the kernel makes them).
- per NIC: ``<device>/infiniband/<name>/ports/<n>/link_layer`` with a ``device`` link back,
  ``<device>/net/<netdev>/``, ``<device>/infiniband_verbs/uverbs<N>/{ibdev,dev}``,
  ``physfn`` for a virtual function; ``sys/class/infiniband/<name>``,
  ``sys/class/infiniband_verbs/uverbs<N>`` and ``sys/class/net/<netdev>`` links.
- char devices ``dev/infiniband/uverbs<N>`` (231:192+N) and ``dev/infiniband/rdma_cm``.
"""

from __future__ import annotations

import os
import stat
from typing import Any

UVERBS_MAJOR = 231
UVERBS_MINOR_BASE = 192
RDMA_CM = (10, 58)
CLASS_BRIDGE, CLASS_3D, CLASS_IB, CLASS_ETH = "0x060400", "0x030200", "0x020700", "0x020000"


def host_bridge(path: list[str], bdf: str) -> str:
    """``pci<domain>:<bus>`` of the root complex above ``path`` (or the device itself)."""
    top = path[0] if path else bdf
    return f"pci{top[:4]}:{top[5:7]}"


def device_dir(dev_root: str, path: list[str], bdf: str) -> str:
    """Host path of the device's real sysfs directory."""
    return os.path.join(dev_root, "sys/devices", host_bridge(path, bdf), *path, bdf)


def _write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="ascii") as fh:
        fh.write(text)


def _link(target_dir: str, link: str) -> None:
    """A relative symlink ``link`` -> ``target_dir`` (replacing an old one)."""
    os.makedirs(os.path.dirname(link), exist_ok=True)
    if os.path.lexists(link):
        os.unlink(link)
    os.symlink(os.path.relpath(target_dir, os.path.dirname(link)), link)


def _device(dev_root: str, path: list[str], bdf: str, numa: int | None, cls: str) -> str:
    """Create the directories of ``path`` and the device, with the bus links; return it."""
    for depth, bridge in enumerate(path):
        bdir = device_dir(dev_root, path[:depth], bridge)
        _write(os.path.join(bdir, "class"), CLASS_BRIDGE + "\n")
        _write(os.path.join(bdir, "numa_node"), f"{-1 if numa is None else numa}\n")
        _link(bdir, os.path.join(dev_root, "sys/bus/pci/devices", bridge))
    ddir = device_dir(dev_root, path, bdf)
    _write(os.path.join(ddir, "class"), cls + "\n")
    if numa is not None:
        _write(os.path.join(ddir, "numa_node"), f"{numa}\n")
    _link(ddir, os.path.join(dev_root, "sys/bus/pci/devices", bdf))
    return ddir


def _mknod(path: str, major: int, minor: int) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.lexists(path):
        os.unlink(path)
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(major, minor))
    os.chmod(path, 0o666)


def write_pci_tree(topo: dict[str, Any], dev_root: str) -> None:
    """Lay out the PCIe tree of GPUs with a ``pci_path`` and every NIC (needs root: mknod)."""
    for g in topo["gpus"]:
        if g.get("pci_path") is not None:
            _device(dev_root, g["pci_path"], g["pci_bdf"], g["numa_node"], CLASS_3D)
    for nic in topo.get("nics", []):
        _nic(dev_root, nic)
    if topo.get("nics"):
        _mknod(os.path.join(dev_root, "dev/infiniband/rdma_cm"), *RDMA_CM)


def _nic(dev_root: str, nic: dict[str, Any]) -> None:
    cls = CLASS_IB if nic["link_layer"] == "InfiniBand" else CLASS_ETH
    ddir = _device(dev_root, nic["pci_path"], nic["pci_bdf"], nic["numa_node"], cls)
    if nic["physfn"]:
        _link(device_dir(dev_root, nic["pci_path"], nic["physfn"]), os.path.join(ddir, "physfn"))
    ib = os.path.join(ddir, "infiniband", nic["name"])
    for port in range(1, nic["ports"] + 1):
        _write(os.path.join(ib, "ports", str(port), "link_layer"), nic["link_layer"] + "\n")
    _link(ddir, os.path.join(ib, "device"))
    _link(ib, os.path.join(dev_root, "sys/class/infiniband", nic["name"]))
    for netdev in nic["netdevs"]:
        ndir = os.path.join(ddir, "net", netdev)
        _write(os.path.join(ndir, "operstate"), "up\n")
        _link(ddir, os.path.join(ndir, "device"))
        _link(ndir, os.path.join(dev_root, "sys/class/net", netdev))
    n = nic["uverbs"]
    vdir = os.path.join(ddir, "infiniband_verbs", f"uverbs{n}")
    _write(os.path.join(vdir, "ibdev"), nic["name"] + "\n")
    _write(os.path.join(vdir, "dev"), f"{UVERBS_MAJOR}:{UVERBS_MINOR_BASE + n}\n")
    _link(ddir, os.path.join(vdir, "device"))
    _link(vdir, os.path.join(dev_root, "sys/class/infiniband_verbs", f"uverbs{n}"))
    _mknod(os.path.join(dev_root, f"dev/infiniband/uverbs{n}"), UVERBS_MAJOR, UVERBS_MINOR_BASE + n)
