"""Dump what the real pynvml sees through an NVML library, as JSON (run in a subprocess).

``python3 tests/sim/nvmlprobe.py [LIB] [--set-compute-mode INDEX MODE]`` loads ``LIB`` with
ctypes and points pynvml at it (without ``LIB``, pynvml loads ``libnvidia-ml.so.1`` itself),
optionally sets a compute mode, then prints one JSON object: ``{"driver_version": ...,
"gpus": [...]}`` or ``{"error": {"code": N, "message": ...}}``.
Per-GPU failures are reported in the GPU's entry as ``{"error": ...}``. pynvml keeps global
state, so tests run this in a fresh process per host.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
from typing import Any

import pynvml


def _error(err: pynvml.NVMLError) -> dict[str, Any]:
    return {"error": {"code": err.value, "message": str(err)}}


def _optional(fn, *args) -> Any:
    try:
        return fn(*args)
    except pynvml.NVMLError as err:
        return _error(err)


def _memory(handle) -> dict[str, int]:
    v1 = pynvml.nvmlDeviceGetMemoryInfo(handle)
    v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    return {"total": v1.total, "free": v1.free, "used": v1.used, "v2_total": v2.total}


def _attributes(handle) -> dict[str, int]:
    attrs = pynvml.nvmlDeviceGetAttributes_v2(handle)
    return {name: getattr(attrs, name) for name, _ in attrs._fields_}


def _mig(handle) -> dict[str, Any]:
    parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
    return {
        "uuid": pynvml.nvmlDeviceGetUUID(handle),
        "name": pynvml.nvmlDeviceGetName(handle),
        "is_mig": bool(pynvml.nvmlDeviceIsMigDeviceHandle(handle).value),
        "parent_uuid": pynvml.nvmlDeviceGetUUID(parent),
        "gi": pynvml.nvmlDeviceGetGpuInstanceId(handle),
        "ci": pynvml.nvmlDeviceGetComputeInstanceId(handle),
        "memory": _memory(handle),
        "pci_bus_id": pynvml.nvmlDeviceGetPciInfo_v3(handle).busId,
        "attributes": _attributes(handle),
        "compute_capability": list(pynvml.nvmlDeviceGetCudaComputeCapability(handle)),
    }


def _gpu(index: int) -> dict[str, Any]:
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        pci = pynvml.nvmlDeviceGetPciInfo_v3(handle)
        out: dict[str, Any] = {
            "index": pynvml.nvmlDeviceGetIndex(handle),
            "uuid": pynvml.nvmlDeviceGetUUID(handle),
            "name": pynvml.nvmlDeviceGetName(handle),
            "minor": pynvml.nvmlDeviceGetMinorNumber(handle),
            "pci_bus_id": pci.busId,
            "pci_bus_id_legacy": pci.busIdLegacy,
            "pci_device_id": pci.pciDeviceId,
            "memory": _memory(handle),
            "compute_capability": list(pynvml.nvmlDeviceGetCudaComputeCapability(handle)),
            "architecture": pynvml.nvmlDeviceGetArchitecture(handle),
            "brand": pynvml.nvmlDeviceGetBrand(handle),
            "compute_mode": pynvml.nvmlDeviceGetComputeMode(handle),
            "numa_node": _optional(pynvml.nvmlDeviceGetNumaNodeId, handle),
            "is_mig": bool(pynvml.nvmlDeviceIsMigDeviceHandle(handle).value),
            "attributes": _optional(_attributes, handle),
            "mig_mode": _optional(pynvml.nvmlDeviceGetMigMode, handle),
            "max_mig_devices": pynvml.nvmlDeviceGetMaxMigDeviceCount(handle),
        }
    except pynvml.NVMLError as err:
        return _error(err)
    migs: list[Any] = []
    for slot in range(out["max_mig_devices"]):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except pynvml.NVMLError_NotFound:
            migs.append(None)
            continue
        migs.append(_mig(mig))
    out["mig_devices"] = migs
    return out


def probe(lib: str | None, set_mode: tuple[int, int] | None = None) -> dict[str, Any]:
    """Everything pynvml reports through ``lib`` (None: pynvml's own loading, which honours
    ``LD_LIBRARY_PATH``); sets a compute mode first if asked."""
    if lib:
        pynvml.nvmlLib = ctypes.CDLL(lib)
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        return _error(err)
    try:
        if set_mode is not None:
            handle = pynvml.nvmlDeviceGetHandleByIndex(set_mode[0])
            pynvml.nvmlDeviceSetComputeMode(handle, set_mode[1])
        count = pynvml.nvmlDeviceGetCount()
        return {
            "driver_version": pynvml.nvmlSystemGetDriverVersion(),
            "nvml_version": pynvml.nvmlSystemGetNVMLVersion(),
            "cuda_driver_version": pynvml.nvmlSystemGetCudaDriverVersion_v2(),
            "count": count,
            "gpus": [_gpu(i) for i in range(count)],
        }
    except pynvml.NVMLError as err:
        return _error(err)
    finally:
        pynvml.nvmlShutdown()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("lib", nargs="?", help="library to load (default: pynvml's choice)")
    parser.add_argument("--set-compute-mode", nargs=2, type=int, metavar=("INDEX", "MODE"))
    args = parser.parse_args()
    mode = tuple(args.set_compute_mode) if args.set_compute_mode else None
    json.dump(probe(args.lib, mode), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
