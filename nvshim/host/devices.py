"""Device nodes and kernel facts under the dev root: ``/dev``, ``/proc`` and ``/sys``."""

from __future__ import annotations

import os
import stat

from nvshim.errors import NvshimError
from nvshim.host import driver_files as df
from nvshim.host.model import NodeInfo
from nvshim.host.procfs import MigMinors, parse_mig_minors, parse_proc_devices
from nvshim.host.rootpath import host_path

GPU_MAJOR = 195


def check_dev_root(dev_root: str) -> None:
    if not os.path.isdir(dev_root):
        raise NvshimError(f"dev root {dev_root}: not a directory")
    if not os.path.isdir(host_path(dev_root, "/dev")):
        raise NvshimError(f"dev root {dev_root}: has no dev/ directory")


def stat_node(dev_root: str, path: str) -> NodeInfo | None:
    """A char device node's facts, or None when absent or not a char device."""
    hp = host_path(dev_root, path)
    try:
        st = os.stat(hp)
    except OSError:
        return None
    if not stat.S_ISCHR(st.st_mode):
        return None
    return NodeInfo(
        path=path,
        host_path=hp,
        major=os.major(st.st_rdev),
        minor=os.minor(st.st_rdev),
        type="c",
        mode=stat.S_IMODE(st.st_mode),
        uid=st.st_uid,
        gid=st.st_gid,
    )


def control_nodes(dev_root: str) -> list[NodeInfo]:
    out = []
    for rel in df.CONTROL_NODES:
        node = stat_node(dev_root, "/" + rel)
        if node is not None:
            out.append(node)
    return out


def _read_proc(dev_root: str, path: str, parse, empty, warnings: list[str], effect: str = ""):
    """``parse`` of a kernel file under the dev root; a warning and ``empty`` on failure."""
    hp = host_path(dev_root, path)
    try:
        with open(hp, encoding="utf-8", errors="replace") as fh:
            return parse(fh.read())
    except OSError as err:
        warnings.append(f"{hp}: unreadable ({err.strerror}){effect}")
    except ValueError as err:
        warnings.append(f"{hp}: {err}")
    return empty


def read_char_majors(dev_root: str, warnings: list[str]) -> dict[str, int]:
    return _read_proc(dev_root, "/proc/devices", parse_proc_devices, {}, warnings)


def read_mig_minors(dev_root: str, warnings: list[str]) -> MigMinors:
    return _read_proc(
        dev_root,
        "/proc/driver/nvidia-caps/mig-minors",
        parse_mig_minors,
        MigMinors(),
        warnings,
        "; MIG devices get no capability nodes",
    )


def cap_node(dev_root: str, caps_major: int | None, minor: int | None) -> NodeInfo | None:
    if minor is None:
        return None
    node = stat_node(dev_root, f"/dev/nvidia-caps/nvidia-cap{minor}")
    if node is not None and (caps_major is None or node.major == caps_major):
        return node
    return None


def numa_node(dev_root: str, pci_bus_id: str) -> int | None:
    """``numa_node`` from sysfs for an NVML bus id (``00000000:18:00.0``); None if unknown."""
    domain, _, rest = pci_bus_id.lower().partition(":")
    bdf = f"{domain[-4:]:0>4}:{rest}"
    path = host_path(dev_root, f"/sys/bus/pci/devices/{bdf}/numa_node")
    try:
        with open(path) as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None
