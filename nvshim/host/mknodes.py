"""Create the NVIDIA device nodes a host lacks (``nvshim system create-device-nodes``).

GPU nodes ``/dev/nvidia<minor>`` for the minors NVML reports; with ``control``, also
``/dev/nvidiactl`` (195:255), ``/dev/nvidia-modeset`` (195:254) and ``/dev/nvidia-uvm`` /
``/dev/nvidia-uvm-tools`` (the ``nvidia-uvm`` major from ``/proc/devices``, minors 0 and 1).
Nodes are char devices, mode 0666, as the driver's own nvidia-modprobe makes them. An
existing node is left alone; a wrong file in its place is an error, never replaced.
"""

from __future__ import annotations

import os
import stat

from nvshim.errors import NvshimError
from nvshim.host.devices import GPU_MAJOR, read_char_majors
from nvshim.host.rootpath import host_path
from nvshim.record import record

NODE_MODE = 0o666
CTL_MINOR = 255
MODESET_MINOR = 254


@record(frozen=True)
class Node:
    """A device node to have: its path in /dev, major and minor."""

    path: str
    major: int
    minor: int


def wanted_nodes(dev_root: str, minors: list[int], control: bool) -> list[Node]:
    """The nodes for GPU ``minors`` (and the control nodes), majors from ``/proc/devices``."""
    warnings: list[str] = []
    majors = read_char_majors(dev_root, warnings)
    gpu_major = majors.get("nvidia-frontend", majors.get("nvidia", GPU_MAJOR))
    nodes = [Node(f"/dev/nvidia{m}", gpu_major, m) for m in sorted(minors)]
    if control:
        nodes += [
            Node("/dev/nvidiactl", gpu_major, CTL_MINOR),
            Node("/dev/nvidia-modeset", gpu_major, MODESET_MINOR),
        ]
        uvm = majors.get("nvidia-uvm")
        if uvm is None:
            raise NvshimError(
                f"{host_path(dev_root, '/proc/devices')}: no nvidia-uvm major "
                "(is the nvidia-uvm module loaded?)"
            )
        nodes += [Node("/dev/nvidia-uvm", uvm, 0), Node("/dev/nvidia-uvm-tools", uvm, 1)]
    return nodes


def _state(path: str, node: Node) -> str:
    """``ok`` (the right node is there), ``missing``, or what is wrong."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "missing"
    if not stat.S_ISCHR(st.st_mode):
        return "not a character device"
    found = (os.major(st.st_rdev), os.minor(st.st_rdev))
    if found != (node.major, node.minor):
        return f"is {found[0]}:{found[1]}, expected {node.major}:{node.minor}"
    return "ok"


def create_nodes(dev_root: str, nodes: list[Node], dry_run: bool = False) -> list[str]:
    """Make the missing ``nodes`` under ``dev_root``; the lines saying what was done.
    Every problem is found before anything is created."""
    plan = []
    for node in nodes:
        path = host_path(dev_root, node.path)
        state = _state(path, node)
        if state not in ("ok", "missing"):
            raise NvshimError(f"{path}: {state}; not touched")
        plan.append((node, path, state))
    lines = []
    for node, path, state in plan:
        if state == "ok":
            lines.append(f"{path}: present ({node.major}:{node.minor})")
            continue
        if not dry_run:
            try:
                os.mknod(path, stat.S_IFCHR | NODE_MODE, os.makedev(node.major, node.minor))
                os.chmod(path, NODE_MODE)  # mknod honours the umask
            except OSError as err:
                raise NvshimError(f"{path}: cannot create: {err.strerror}") from None
        verb = "would create" if dry_run else "created"
        lines.append(f"{path}: {verb} ({node.major}:{node.minor}, mode 0666)")
    return lines


def create_missing(
    driver_root: str, dev_root: str, control: bool, dry_run: bool = False
) -> list[str]:
    """Create the nodes of every GPU NVML reports under ``driver_root`` (and the control
    nodes) that ``dev_root`` lacks; one line per node."""
    from nvshim.host import files, nvml

    library = nvml.find_library(driver_root, files.read_ld_cache(driver_root, []))
    minors = [g.minor for g in nvml.query(library).gpus]
    return create_nodes(dev_root, wanted_nodes(dev_root, minors, control), dry_run)
