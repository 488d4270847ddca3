"""The CDI sink: a spec from the host's edits, serialised as YAML or JSON and written
atomically (mode 0644)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from nvshim.cdi.version import spec_min_version
from nvshim.edits import ContainerEdits
from nvshim.errors import UsageError
from nvshim.host.edits import Device, all_devices, common_edits, device_edits
from nvshim.host.model import Gpu, Host

NAME_STRATEGIES = ("index", "uuid")


def device_names(device: Device, strategies: Sequence[str]) -> list[str]:
    """The CDI names of a device under each naming strategy, in order, without repeats."""
    names: list[str] = []
    for strategy in strategies:
        if strategy == "index":
            name = str(device.index) if isinstance(device, Gpu) else device.name_index
        elif strategy == "uuid":
            name = device.uuid
        else:
            raise UsageError(f"unknown device name strategy {strategy!r} (use index or uuid)")
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
) -> dict[str, Any]:
    """A CDI spec: spec-level edits for what every device needs, each device its own nodes,
    and an ``all`` device. ``extra_device_edits`` (by device UUID) amend single devices
    (used for sharing and pairing), ``all_edits`` the ``all`` device. ``cdiVersion`` is the
    minimum the content needs."""
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
    if devices:
        everything = everything.merge(all_edits or ContainerEdits())
        devices.append({"name": "all", "containerEdits": everything.to_cdi()})
    spec: dict[str, Any] = {
        "cdiVersion": "",
        "kind": f"{vendor}/{cls}",
        "devices": devices,
        "containerEdits": common_edits(host, capabilities, hook_path).to_cdi(),
    }
    spec["cdiVersion"] = spec_min_version(spec)
    return spec


def dump_spec(spec: dict[str, Any], fmt: str) -> str:
    """Serialise as ``yaml`` or ``json``."""
    if fmt == "json":
        return json.dumps(spec, indent=2) + "\n"
    if fmt == "yaml":
        import yaml

        return yaml.safe_dump(spec, sort_keys=False, default_flow_style=False)
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
