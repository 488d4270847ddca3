"""PCIe locations from sysfs under the dev root, and the affinity of two devices in the
``nvidia-smi topo -m`` vocabulary.

``/sys/bus/pci/devices/<bdf>`` is a symlink into ``/sys/devices/pci<dom>:<bus>/<root
port>/<bridge>/.../<bdf>``: the components between the host bridge and the device are the
bridges (switch ports) above it. Links are resolved inside the dev root with a bounded
number of hops, so a loop or a missing link gives one error line, never a hang.
"""

from __future__ import annotations

import os

from nvshim.defaults import PCIE_LEVELS
from nvshim.errors import NvshimError
from nvshim.host.rootpath import host_path, resolve_in_root
from nvshim.record import record

# Best to worst; NV# (NVLink) ranks above all of them and is reported separately.
LEVELS = PCIE_LEVELS
LEGEND = {
    "X": "self",
    "PIX": "at most one PCIe bridge (the same switch)",
    "PXB": "several PCIe bridges, no host bridge",
    "PHB": "through a PCIe host bridge (root complex)",
    "NODE": "across host bridges within one NUMA node",
    "SYS": "across NUMA nodes (the SMP interconnect)",
    "NV#": "a bonded set of # NVLinks",
}
_HEX = frozenset("0123456789abcdef")


class TopologyError(NvshimError):
    """sysfs does not describe a usable PCIe tree for a device."""


@record(frozen=True)
class PciLocation:
    """Where a PCI function sits: host bridge, bridges from the root port down, NUMA node."""

    bdf: str  # 0000:13:00.0
    host_bridge: str  # pci0000:10
    bridges: tuple[str, ...] = ()
    numa_node: int | None = None

    @property
    def sysfs_path(self) -> str:
        return "/".join(("/sys/devices", self.host_bridge, *self.bridges, self.bdf))


def is_bdf(text: str) -> bool:
    """``dddd:bb:dd.f`` in lower-case hex."""
    return (
        len(text) == 12
        and text[4] == ":"
        and text[7] == ":"
        and text[10] == "."
        and set(text[:4] + text[5:7] + text[8:10]) <= _HEX
        and text[11] in "01234567"
    )


def bdf_from_bus_id(bus_id: str) -> str:
    """NVML's ``00000000:18:00.0`` as sysfs's ``0000:18:00.0``."""
    domain, _, rest = bus_id.lower().partition(":")
    return f"{domain[-4:]:0>4}:{rest}"


def read_numa(dev_root: str, sysfs_dir: str) -> int | None:
    """``numa_node`` of a device directory (container path); None when absent or -1."""
    try:
        with open(host_path(dev_root, sysfs_dir + "/numa_node"), encoding="ascii") as fh:
            value = int(fh.read().strip())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None


def location_of(dev_root: str, link: str, what: str, bdf: str | None = None) -> PciLocation:
    """The location behind ``link`` (a sysfs path inside the dev root that resolves into
    ``/sys/devices``). ``what`` names the device in errors; ``bdf``, when given, must be
    the function the link reaches."""
    if not os.path.lexists(host_path(dev_root, link)):
        raise TopologyError(f"{what}: {host_path(dev_root, link)}: missing from sysfs")
    real = _quick_resolve(dev_root, link)
    if real is None:
        try:
            real = resolve_in_root(dev_root, link)
        except OSError as err:
            raise TopologyError(
                f"{what}: {host_path(dev_root, link)}: {err.strerror} (a sysfs link loop)"
            ) from None
    parts = real.strip("/").split("/")
    problem = _check_parts(parts, bdf)
    if problem and not _has_pci_tree(dev_root):
        devices = host_path(dev_root, "/sys/devices")
        raise TopologyError(
            f"{what}: no PCIe topology: {devices} has no pci<domain>:<bus> tree "
            "(a sysfs without the host's device tree, as a simulated or minimal host has)"
        )
    if problem:
        raise TopologyError(f"{what}: {host_path(dev_root, link)} resolves to {real}: {problem}")
    if not os.path.isdir(host_path(dev_root, real)):
        raise TopologyError(f"{what}: {host_path(dev_root, real)}: dangling sysfs link")
    return PciLocation(
        bdf=parts[-1],
        host_bridge=parts[2],
        bridges=tuple(parts[3:-1]),
        numa_node=read_numa(dev_root, real),
    )


def _quick_resolve(dev_root: str, path: str, hops: int = 0) -> str | None:
    """``path`` resolved lexically when it is a relative link whose parent is a real
    directory or another such link (how sysfs is made): a few syscalls instead of one
    ``readlink`` per component. Checked against the kernel's own resolution (same inode);
    None when that does not hold, and the caller resolves the slow, exact way."""
    if hops > 4:
        return None
    parent, name = os.path.split(path)
    if os.path.islink(host_path(dev_root, parent)):
        parent = _quick_resolve(dev_root, parent, hops + 1)
        if parent is None:
            return None
    full = f"{parent.rstrip('/')}/{name}"
    try:
        target = os.readlink(host_path(dev_root, full))
    except OSError:
        target = None
    real = full if target is None else os.path.normpath(os.path.join(parent, target))
    if target is not None and target.startswith("/"):
        return None
    if hops:
        return real
    try:
        mine, kernel = os.stat(host_path(dev_root, real)), os.stat(host_path(dev_root, path))
    except OSError:
        return None
    return real if (mine.st_dev, mine.st_ino) == (kernel.st_dev, kernel.st_ino) else None


def _has_pci_tree(dev_root: str) -> bool:
    """Whether the dev root's sysfs has any ``/sys/devices/pci<domain>:<bus>`` tree."""
    try:
        return any(
            name.startswith("pci") for name in os.listdir(host_path(dev_root, "/sys/devices"))
        )
    except OSError:
        return False


def _check_parts(parts: list[str], bdf: str | None) -> str | None:
    if parts[:2] != ["sys", "devices"] or len(parts) < 4 or not parts[2].startswith("pci"):
        return "not a PCI device under /sys/devices/pci<domain>:<bus>"
    chain = parts[3:]
    if not all(is_bdf(p) for p in chain):
        return "a path component is not a PCI address"
    if len(set(chain)) != len(chain):
        return "a PCI address repeats in the bridge chain (a sysfs loop)"
    if bdf is not None and chain[-1] != bdf:
        return f"reaches {chain[-1]}, not {bdf}"
    return None


def pci_location(dev_root: str, bdf: str, what: str) -> PciLocation:
    """The location of PCI function ``bdf`` through ``/sys/bus/pci/devices``."""
    return location_of(dev_root, f"/sys/bus/pci/devices/{bdf}", what, bdf)


def affinity(a: PciLocation, b: PciLocation) -> str:
    """How ``a`` reaches ``b``: PIX, PXB, PHB, NODE or SYS (``X`` for the same function).

    Same host bridge: PHB when the deepest common point is the host bridge itself, PIX when
    each device is at most one bridge below the deepest common bridge (siblings under one
    switch), PXB otherwise. Different host bridges: NODE when both report the same NUMA
    node, SYS when they differ or either is unknown.
    """
    if a.bdf == b.bdf:
        return "X"
    if a.host_bridge != b.host_bridge:
        same = a.numa_node is not None and a.numa_node == b.numa_node
        return "NODE" if same else "SYS"
    common = 0
    for x, y in zip(a.bridges, b.bridges, strict=False):
        if x != y:
            break
        common += 1
    if common == 0:
        return "PHB"
    below = max(len(a.bridges), len(b.bridges)) - common
    return "PIX" if below <= 1 else "PXB"


def rank(level: str) -> int:
    """Position of a level in ``LEVELS`` (0 best); NV# and X rank best."""
    return LEVELS.index(level) if level in LEVELS else -1
