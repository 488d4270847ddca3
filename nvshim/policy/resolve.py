"""Device ids of a request -> the host's GPUs and MIG devices."""

from __future__ import annotations

from nvshim.host.edits import all_devices  # noqa: F401 - what ``all`` means, one place
from nvshim.host.model import Gpu, Host, MigDevice
from nvshim.policy.request import DeviceList, RequestError, parse_device_id


def _inventory(host: Host) -> str:
    migs = len(host.mig_devices())
    return f"the host has {len(host.gpus)} GPU(s) and {migs} MIG device(s)"


def _unknown(device_id: str, host: Host) -> RequestError:
    return RequestError(f"unknown GPU device {device_id!r}: {_inventory(host)}")


def _whole_gpu(gpu: Gpu, device_id: str) -> Gpu:
    if gpu.mig_enabled:
        names = ", ".join(m.name_index for m in gpu.mig_devices) or "none configured"
        raise RequestError(
            f"GPU {device_id!r} (index {gpu.index}) is in MIG mode: request its MIG devices "
            f"instead ({names})"
        )
    return gpu


def _find_gpu(host: Host, index: int) -> Gpu | None:
    return next((g for g in host.gpus if g.index == index), None)


def _resolve_one(host: Host, device_id: str) -> Gpu | MigDevice:
    if device_id.isdigit():
        gpu = _find_gpu(host, int(device_id))
        if gpu is None:
            raise _unknown(device_id, host)
        return _whole_gpu(gpu, device_id)
    if ":" in device_id:
        gpu_part, _, mig_part = device_id.partition(":")
        gpu = _find_gpu(host, int(gpu_part))
        if gpu is None:
            raise _unknown(device_id, host)
        if not gpu.mig_enabled:
            raise RequestError(f"MIG device {device_id!r}: GPU {gpu.index} is not in MIG mode")
        mig = next((m for m in gpu.mig_devices if m.index == int(mig_part)), None)
        if mig is None:
            raise _unknown(device_id, host)
        return mig
    wanted = device_id.lower()
    if wanted.startswith("gpu-"):
        gpu = next((g for g in host.gpus if g.uuid.lower() == wanted), None)
        if gpu is None:
            raise _unknown(device_id, host)
        return _whole_gpu(gpu, device_id)
    for mig in host.mig_devices():
        if mig.uuid.lower() == wanted:
            return mig
    if wanted.startswith("mig-gpu-") and wanted.count("/") == 2:
        parent_uuid, gi, ci = wanted[4:].split("/")
        for gpu in host.gpus:
            if gpu.uuid.lower() == parent_uuid:
                for mig in gpu.mig_devices:
                    if (mig.gi, mig.ci) == (int(gi), int(ci)):
                        return mig
    raise _unknown(device_id, host)


def resolve_devices(host: Host, devices: DeviceList) -> list[Gpu | MigDevice]:
    """The host devices a request names, in request order, without duplicates.

    Ids are validated again (``parse_device_id``), so a hand-built list is safe. A whole
    GPU that is in MIG mode, or an id the host lacks, raises RequestError.
    """
    if devices.kind == "all":
        return all_devices(host)
    if devices.kind != "list":
        return []
    out: list[Gpu | MigDevice] = []
    seen: set[str] = set()
    for device_id in devices.ids:
        device = _resolve_one(host, parse_device_id(device_id, "device request"))
        key = device.uuid
        if key not in seen:
            seen.add(key)
            out.append(device)
    return out


def requirement_facts(host: Host, devices: list[Gpu | MigDevice]) -> list[tuple[str, str]]:
    """``(compute capability, brand)`` per device for ``check_requirements``; a MIG device
    reports its parent GPU's."""
    facts = []
    for device in devices:
        gpu = host.gpu(device.parent_index) if isinstance(device, MigDevice) else device
        facts.append((gpu.compute_capability, gpu.brand))
    return facts
