"""Policy: from a container's request to the edits it gets. Used by the runtime and the
standalone prestart hook alike, so both enforce the same rules."""

from __future__ import annotations

from nvshim.memo import Last
from nvshim.record import field, record

TYPE_CHECKING = False  # typing costs ~5 ms at import, per container
if TYPE_CHECKING:
    from typing import Any

    from nvshim.config import Config
    from nvshim.edits import ContainerEdits
    from nvshim.host.edits import Device
    from nvshim.host.model import Host


@record
class Selection:
    """What a container gets: ``edits`` (empty: hand the container on untouched), the
    ``devices`` injected, and ``log`` fields describing the decision."""

    edits: ContainerEdits
    devices: list[Device] = field(default_factory=list)
    log: dict[str, Any] = field(default_factory=dict)


def select(request, host: Host | None, config: Config, rootfs: str | None = None) -> Selection:
    """Resolve the request's devices, build the edits and check requirements.

    ``host`` None: the cached inventory, loaded only when the request is honoured.
    ``rootfs``: the image root (host path); requirements are then judged against the
    driver the container will use, the image's CUDA compat library when it applies.
    Raises NvshimError (RequestError/RequirementError) when the request cannot be met.
    """
    from nvshim.policy.require import check_requirements
    from nvshim.policy.resolve import requirement_facts, resolve_devices
    from nvshim.policy.visible import cuda_visible_devices

    log: dict[str, Any] = {"source": request.source, "request": str(request.devices)}
    if request.warnings:
        log["warnings"] = "; ".join(request.warnings)
    if request.denied:
        log["denied"] = request.denied
        from nvshim.edits import ContainerEdits

        return Selection(ContainerEdits(), [], log)
    host = host or load_host_for(config)
    devices = resolve_devices(host, request.devices)
    foreign = None
    if getattr(request, "cdi_names", ()) or getattr(request, "device_nodes", ()):
        devices, foreign = _cdi_and_engine_devices(devices, request, host, config)
        if not devices and request.devices.kind == "list" and not request.devices.ids:
            # only other vendors' devices (or no known GPU node): no NVIDIA driver
            log["devices"] = "none"
            return Selection(foreign, [], log)
    edits = _device_edits(host, request.capabilities, config.runtime.hook_path, devices)
    caps = request.capabilities
    driver, cuda = host.driver_version, host.cuda_version
    if rootfs and request.requirements and not request.disable_require:
        from nvshim.hook.cudacompat import judged_versions
        from nvshim.hook.steps import cuda_compat_for

        found = cuda_compat_for(rootfs, edits.hooks)  # the driver the container will really use
        driver, cuda = judged_versions(found, driver, cuda)
        if found is not None:
            log["cuda_compat"] = found.version
    check_requirements(
        request.requirements,
        cuda,
        driver,
        requirement_facts(host, devices),
        disable=request.disable_require,
    )
    if foreign is not None:
        edits = edits.merge(foreign)
    uuids = [d.uuid for d in devices]
    value, replaced = cuda_visible_devices(request.env.get("CUDA_VISIBLE_DEVICES"), uuids)
    edits = edits.with_env(CUDA_VISIBLE_DEVICES=value)
    log.update(devices=",".join(uuids) or "none", capabilities=",".join(caps))
    if replaced:
        log["cuda_visible_devices_replaced"] = replaced
    edits = _amend_sharing(edits, devices, request, host, config, log)
    if getattr(request, "rdma", None) is not None:
        from nvshim.policy.pairing import pairing_edits

        edits = pairing_edits(edits, devices, request, host, config, log)
    return Selection(edits, devices, log)


# the last host's common edits (a worker of nvshim-runtimed keeps the host it loaded
# while the inventory is unchanged)
_common = Last()


def _common_edits(host: Host, caps, hook_path: str) -> ContainerEdits:
    """``common_edits`` of the same host object, capabilities and hook made once per
    process. Never handed out: ``select`` merges it into new edits at once (its entries
    are frozen records)."""
    from nvshim.host.edits import common_edits

    key = (host, tuple(caps), hook_path)
    kept = _common.get(key)
    return kept if kept is not None else _common.keep(key, common_edits(*key))


# the last common edits merged with the last devices' (a worker's next create of the same
# shape: most ask for the same GPUs)
_merged = Last()


def _device_edits(host: Host, caps, hook_path: str, devices: list[Device]) -> ContainerEdits:
    """The common edits merged with ``devices``' own, made once per process for the same
    host object, capabilities, hook and devices. Never handed out: ``select`` always
    makes new edits from it (``with_env``)."""
    from nvshim.host.edits import devices_edits

    key = (host, tuple(caps), hook_path, tuple(devices))
    kept = _merged.get(key)
    if kept is None:
        kept = _merged.keep(
            key, _common_edits(host, caps, hook_path).merge(devices_edits(devices, host))
        )
    return kept


def _cdi_and_engine_devices(devices, request, host, config) -> tuple[list, ContainerEdits]:
    """``devices`` plus the NVIDIA devices other vendors' CDI names and the engine's own
    injected nodes stand for (``nvshim.policy.cdinames``), without repeats; and the edits
    of the other CDI devices named."""
    from nvshim.edits import ContainerEdits
    from nvshim.policy.cdinames import devices_for_nodes, resolve_cdi_names

    foreign = ContainerEdits()
    extra = []
    if request.cdi_names:
        dirs = config.policy.cdi_spec_dirs
        found, foreign = resolve_cdi_names(host, request.cdi_names, dirs)
        extra += found
    if request.device_nodes:
        extra += devices_for_nodes(host, request.device_nodes, False, "linux.devices")
    seen = {d.uuid for d in devices}
    for device in extra:
        if device.uuid not in seen:
            seen.add(device.uuid)
            devices.append(device)
    return devices, foreign


def _amend_sharing(edits, devices, request, host, config, log) -> ContainerEdits:
    """The sharing policy's (MPS) amendments for these devices."""
    from nvshim.mps.enforce import sharing_edits

    return sharing_edits(edits, devices, request, host, config, log)


def load_host_for(config: Config) -> Host:
    """The host inventory for the runtime and hook (cached; NVML only on a cache miss)."""
    from nvshim.host.inventory import load_host

    return load_host(config.host.driver_root, config.host.dev_root, config.runtime.inventory_dir)


def edits_for_spec(
    spec: dict[str, Any], config: Config, host: Host | None = None, bundle: str | None = None
):
    """The selection for an OCI spec, or None when the container asks for no GPU.
    ``bundle``: where the spec lives (its root is looked at for CUDA compat libraries)."""
    from nvshim.policy.request import request_from_spec

    request = request_from_spec(spec, config.policy)
    if request is None:
        return None
    rootfs = None
    if bundle is not None and request.requirements:
        from nvshim.hook.state import rootfs_path

        rootfs = rootfs_path(spec, bundle)
    return select(request, host, config, rootfs)
