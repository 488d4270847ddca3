"""A CDI spec for the shared devices (``nvshim cdi generate --sharing``): class
``gpu.shared`` by default (the dot needs cdiVersion 0.6.0), one entry per shared device, each
MPS device carrying its pipe directory, shm and share env. No ``all`` device: an MPS client
can reach only one daemon."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from nvshim.cdi.version import spec_min_version
from nvshim.errors import InputFileError
from nvshim.host.edits import all_devices
from nvshim.host.model import Host
from nvshim.mps.enforce import mps_device_edits
from nvshim.mps.sharing import sharing_for

SHARED_CLASS = "gpu.shared"


def shared_spec(
    host: Host,
    config,
    capabilities: Iterable[str],
    hook_path: str,
    vendor: str = "nvidia.com",
    cls: str = SHARED_CLASS,
    strategies: Sequence[str] = ("index",),
    daemon_check_hook: bool = False,
) -> dict[str, Any]:
    """The spec of the devices the sharing config shares.

    With ``daemon_check_hook`` each MPS device also gets a ``createRuntime`` hook
    ``nvshim-hook mps-check <uuid>`` that refuses the container when the daemon is down
    (static specs cannot check that otherwise). Raises InputFileError when nothing is shared.
    """
    from nvshim.cdi.writer import build_spec, device_names
    from nvshim.hookentries import hook_entry

    shared = sharing_for(config, host)
    if not shared:
        path = config.sharing.config
        raise InputFileError(f"{path}: no shared devices (missing file or no sharing section)")
    mps_root = config.sharing.mps_root
    extra = {}
    for uuid, share in shared.items():
        if share.mode != "mps":
            continue
        edits = mps_device_edits(share, mps_root)
        if daemon_check_hook:
            edits.hooks.append(hook_entry(hook_path, "createRuntime", "mps-check", uuid))
        extra[uuid] = edits
    spec = build_spec(
        host,
        capabilities,
        hook_path,
        vendor=vendor,
        cls=cls,
        strategies=strategies,
        extra_device_edits=extra,
    )
    names = {
        name for d in all_devices(host) if d.uuid in shared for name in device_names(d, strategies)
    }
    spec["devices"] = [d for d in spec["devices"] if d["name"] in names]
    spec["cdiVersion"] = spec_min_version(spec)
    return spec
