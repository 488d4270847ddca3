"""Discovery's output as container edits: what every GPU container needs (per capability)
and what each GPU or MIG device adds. All three sinks start from these."""

from __future__ import annotations

import os

from nvshim.edits import ContainerEdits, DeviceNode, Mount
from nvshim.hookentries import hook_entry
from nvshim.host import driver_files as df
from nvshim.host.model import DriverFile, Gpu, Host, MigDevice, NodeInfo

TYPE_CHECKING = False  # typing costs ~5 ms at import, per container
if TYPE_CHECKING:
    from collections.abc import Iterable

FILE_MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "bind")
IPC_MOUNT_OPTIONS = ("nosuid", "nodev", "noexec", "bind")

Device = Gpu | MigDevice


def node_edit(node: NodeInfo) -> DeviceNode:
    """A host device node as a CDI/OCI device node (host path kept only if it differs)."""
    return DeviceNode(
        path=node.path,
        host_path=node.host_path if node.host_path != node.path else None,
        type=node.type,
        major=node.major,
        minor=node.minor,
        file_mode=node.mode,
    )


def selected_files(host: Host, capabilities: Iterable[str]) -> list[DriverFile]:
    """Driver files needed by ``capabilities`` (files without a capability always are)."""
    caps = set(capabilities)
    return [f for f in host.files if f.capability is None or f.capability in caps]


def common_edits(host: Host, capabilities: Iterable[str], hook_path: str) -> ContainerEdits:
    """Edits every GPU container with these capabilities needs, whatever its devices."""
    caps = tuple(capabilities)
    nodes = [
        node_edit(n)
        for n in host.control_nodes
        if df.CONTROL_NODES.get(n.path.lstrip("/")) in (None, *caps)
    ]
    chosen = selected_files(host, caps)
    mounts = [
        Mount(
            f.host_path,
            f.path,
            IPC_MOUNT_OPTIONS if f.kind == "ipc" else FILE_MOUNT_OPTIONS,
        )
        for f in chosen
    ]
    hooks = []
    links = [f"{target}::{link}" for f in chosen for link, target in f.links]
    if links:
        args = [a for spec in links for a in ("--link", spec)]
        hooks.append(hook_entry(hook_path, "createContainer", "create-symlinks", *args))
    folders = sorted({os.path.dirname(f.path) for f in chosen if f.kind == "lib"})
    if folders:
        if host.driver_version:  # before update-ldcache: it puts an enabled compat folder first
            compat = f"--host-driver-version={host.driver_version}"  # as NVIDIA's generator
            hooks.append(hook_entry(hook_path, "createContainer", "enable-cuda-compat", compat))
        args = [a for d in folders for a in ("--folder", d)]
        hooks.append(hook_entry(hook_path, "createContainer", "update-ldcache", *args))
    hooks.append(hook_entry(hook_path, "createContainer", "disable-device-node-modification"))
    return ContainerEdits(device_nodes=nodes, mounts=mounts, hooks=hooks)


def device_nodes(device: Device, host: Host) -> list[NodeInfo]:
    """The nodes a GPU or MIG device needs (a MIG device: its parent plus two caps)."""
    if isinstance(device, MigDevice):
        parent = host.gpu(device.parent_index)
        return [n for n in (parent.node, device.gi_cap, device.ci_cap) if n is not None]
    return [device.node] if device.node is not None else []


def device_edits(device: Device, host: Host) -> ContainerEdits:
    """Edits one GPU or MIG device adds."""
    return ContainerEdits(device_nodes=[node_edit(n) for n in device_nodes(device, host)])


def devices_edits(devices: Iterable[Device], host: Host) -> ContainerEdits:
    """Edits a set of devices adds, de-duplicated (MIG siblings share a parent node)."""
    return ContainerEdits().merge(*(device_edits(d, host) for d in devices))


def all_devices(host: Host) -> list[Device]:
    """Every full GPU not in MIG mode, then every MIG device."""
    return [g for g in host.gpus if not g.mig_enabled] + host.mig_devices()
