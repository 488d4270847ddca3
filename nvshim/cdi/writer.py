"""The CDI sink: a spec from the host's edits, serialised as YAML or JSON and written
atomically (mode 0644)."""

from __future__ import annotations

from nvshim.cdi.version import spec_min_version
from nvshim.edits import ContainerEdits
from nvshim.errors import UsageError
from nvshim.host.edits import Device, all_devices, common_edits, device_edits, node_edit
from nvshim.host.model import Gpu, Host

TYPE_CHECKING = False  # typing and collections.abc cost ~3 ms to import at run time
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from typing import Any

NAME_STRATEGIES = ("index", "uuid", "type-index")
DEFAULT_NAME_STRATEGIES = ("index", "uuid")  # the device plugin asks for UUIDs by default
MODES = ("nvml", "management")


def device_names(device: Device, strategies: Sequence[str]) -> list[str]:
    """The CDI names of a device under each naming strategy, in order, without repeats."""
    names: list[str] = []
    for strategy in strategies:
        if strategy == "index":
            name = str(device.index) if isinstance(device, Gpu) else device.name_index
        elif strategy == "uuid":
            name = device.uuid
        elif strategy == "type-index":  # nvidia-ctk's: gpu0, mig1:0
            name = f"gpu{device.index}" if isinstance(device, Gpu) else f"mig{device.name_index}"
        else:
            raise UsageError(
                f"unknown device name strategy {strategy!r} (use {', '.join(NAME_STRATEGIES)})"
            )
        if name not in names:
            names.append(name)
    return names


def build_spec(
    host: Host,
    capabilities: Iterable[str],
    hook_path: str,
    vendor: str = "nvidia.com",
    cls: str = "gpu",
    strategies: Sequence[str] = ("index",),
    extra_device_edits: dict[str, ContainerEdits] | None = None,
    all_edits: ContainerEdits | None = None,
    all_device: bool = True,
) -> dict[str, Any]:
    """A CDI spec: spec-level edits for what every device needs, each device its own nodes,
    and an ``all`` device (unless not ``all_device``). ``extra_device_edits`` (by device
    UUID) amend single devices (used for sharing and pairing), ``all_edits`` the ``all``
    device. ``cdiVersion`` is the minimum the content needs."""
    extra = extra_device_edits or {}
    devices = []
    everything = ContainerEdits()
    for device in all_devices(host):
        edits = device_edits(device, host)
        everything = everything.merge(edits)
        if device.uuid in extra:
            edits = edits.merge(extra[device.uuid])
        for name in device_names(device, strategies):
            devices.append({"name": name, "containerEdits": edits.to_cdi()})
    if devices and all_device:
        everything = everything.merge(all_edits or ContainerEdits())
        devices.append({"name": "all", "containerEdits": everything.to_cdi()})
    return assemble_spec(vendor, cls, devices, common_edits(host, capabilities, hook_path))


def assemble_spec(vendor: str, cls: str, devices: list, common: ContainerEdits) -> dict[str, Any]:
    """A spec of ``devices`` (CDI dicts) and spec-level ``common`` edits, at the minimum
    ``cdiVersion`` its content needs."""
    spec: dict[str, Any] = {
        "cdiVersion": "",
        "kind": f"{vendor}/{cls}",
        "devices": devices,
        "containerEdits": common.to_cdi(),
    }
    spec["cdiVersion"] = spec_min_version(spec)
    return spec


def build_management_spec(
    host: Host, hook_path: str, vendor: str = "nvidia.com", cls: str = "gpu"
) -> dict[str, Any]:
    """The spec a monitoring container (a metrics exporter) needs: one ``all`` device
    with every GPU node (GPUs in MIG mode included), the MIG config and monitor capability
    nodes when present, the control node, and the ``utility`` files (NVML, nvidia-smi)
    only: no compute libraries, no UVM."""
    nodes = [g.node for g in host.gpus if g.node is not None]
    if any(g.mig_enabled for g in host.gpus):  # MIG metrics: the config and monitor caps
        from nvshim.host.devices import cap_node, read_mig_minors

        minors = read_mig_minors(host.dev_root, [])
        found = (cap_node(host.dev_root, None, m) for m in (minors.config, minors.monitor))
        nodes += [n for n in found if n is not None]
    edits = ContainerEdits(device_nodes=[node_edit(n) for n in nodes])
    devices = [{"name": "all", "containerEdits": edits.to_cdi()}] if nodes else []
    return assemble_spec(vendor, cls, devices, common_edits(host, ("utility",), hook_path))


def dump_spec(spec: dict[str, Any], fmt: str) -> str:
    """Serialise as ``yaml`` (what PyYAML's ``safe_dump`` writes) or ``json``."""
    if fmt == "json":
        import json

        return json.dumps(spec, indent=2) + "\n"
    if fmt == "yaml":
        from nvshim.cdi.yamlout import dump

        return dump(spec)
    raise UsageError(f"unknown format {fmt!r} (use yaml or json)")


def format_for(path: str | None, fmt: str | None) -> str:
    """The output format: explicit, else from the file extension, else YAML."""
    if fmt:
        return fmt
    if path and path.endswith(".json"):
        return "json"
    if path and not path.endswith((".yaml", ".yml")):
        raise UsageError(f"{path}: cannot tell the format from the extension; use --format")
    return "yaml"
