"""NVML queries through the real ``pynvml``, loaded from the driver root when one is given."""

from __future__ import annotations

import ctypes
import math
import os

from nvshim.errors import NvshimError
from nvshim.record import field, record

ARCHITECTURES = {
    2: "kepler",
    3: "maxwell",
    4: "pascal",
    5: "volta",
    6: "turing",
    7: "ampere",
    8: "ada",
    9: "hopper",
    10: "blackwell",
}

BRANDS = {
    0: "unknown",
    1: "quadro",
    2: "tesla",
    3: "nvs",
    4: "grid",
    5: "geforce",
    6: "titan",
    7: "nvidiavapps",
    8: "nvidiavpc",
    9: "nvidiavcs",
    10: "nvidiavws",
    11: "nvidiacloudgaming",
    12: "quadrortx",
    13: "nvidiartx",
    14: "nvidia",
    15: "geforcertx",
    16: "titanrtx",
}

MIB = 1024 * 1024


@record
class NvmlMig:
    index: int
    gi: int
    ci: int
    uuid: str
    profile: str
    memory_total: int
    multiprocessors: int | None = None


@record
class NvmlGpu:
    index: int
    minor: int
    uuid: str
    name: str
    pci_bus_id: str
    memory_total: int
    compute_capability: str
    architecture: str
    brand: str
    mig_enabled: bool
    migs: list[NvmlMig] = field(default_factory=list)


@record
class NvmlSnapshot:
    driver_version: str
    cuda_version: str
    gpus: list[NvmlGpu]
    warnings: list[str]
    library: str


def cuda_version_text(value: int) -> str:
    """NVML's integer CUDA version (12040) as "12.4"."""
    return f"{value // 1000}.{(value % 1000) // 10}"


def mig_profile(gi_slices: int, ci_slices: int, mig_mib: int, parent_bytes: int) -> str:
    """Profile name such as "1g.5gb" or "1c.2g.20gb" from MIG attributes.

    Memory is the slice's share of the parent rounded up to eighths, times the parent's
    size in whole GB (the convention NVIDIA's tools use for profile names).
    """
    parent_gb = (parent_bytes + 1024**3 - 1) // 1024**3
    parent_mib = max(parent_bytes // MIB, 1)
    fraction = math.ceil(mig_mib / parent_mib * 8) / 8
    gb = round(fraction * parent_gb)
    base = f"{gi_slices}g.{gb}gb"
    return base if ci_slices == gi_slices else f"{ci_slices}c.{base}"


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def load_library(path: str | None):
    """Import pynvml and bind it to the NVML library at ``path`` (None: the system's)."""
    try:
        import pynvml
    except ImportError:
        raise NvshimError("the Python package nvidia-ml-py (pynvml) is not installed") from None
    if path is not None:
        try:
            lib = ctypes.CDLL(path)
        except OSError as err:
            raise NvshimError(f"cannot load NVML library {path}: {err}") from None
        with pynvml.libLoadLock:
            pynvml.nvmlLib = lib
            # pynvml caches function pointers per name: drop those of any earlier library.
            pynvml._nvmlGetFunctionPointer_cache.clear()
    return pynvml


def query(library: str | None) -> NvmlSnapshot:
    """Query the driver, every GPU and every MIG device through NVML."""
    pynvml = load_library(library)
    where = library or "libnvidia-ml.so.1 (system)"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        raise NvshimError(f"NVML library not found: {where}") from None
    except pynvml.NVMLError as err:
        raise NvshimError(f"NVML initialisation failed ({where}): {err}") from None
    try:
        return _snapshot(pynvml, where)
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def _snapshot(pynvml, where: str) -> NvmlSnapshot:
    warnings: list[str] = []
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        cuda = cuda_version_text(pynvml.nvmlSystemGetCudaDriverVersion())
        count = pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError as err:
        raise NvshimError(f"NVML query failed ({where}): {err}") from None
    gpus = []
    for index in range(count):
        try:
            gpus.append(_gpu(pynvml, index))
        except pynvml.NVMLError as err:
            warnings.append(f"GPU {index}: NVML error ({err}); GPU skipped")
    return NvmlSnapshot(driver, cuda, gpus, warnings, where)


def _gpu(pynvml, index: int) -> NvmlGpu:
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    major, minor_cc = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total
    try:
        arch = ARCHITECTURES.get(pynvml.nvmlDeviceGetArchitecture(handle), "unknown")
    except pynvml.NVMLError_NotSupported:
        arch = "unknown"
    try:
        current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
        mig_enabled = current == 1
    except pynvml.NVMLError_NotSupported:
        mig_enabled = False
    gpu = NvmlGpu(
        index=index,
        minor=pynvml.nvmlDeviceGetMinorNumber(handle),
        uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
        name=_text(pynvml.nvmlDeviceGetName(handle)),
        pci_bus_id=_text(pynvml.nvmlDeviceGetPciInfo(handle).busId),
        memory_total=memory,
        compute_capability=f"{major}.{minor_cc}",
        architecture=arch,
        brand=BRANDS.get(pynvml.nvmlDeviceGetBrand(handle), "unknown"),
        mig_enabled=mig_enabled,
    )
    if mig_enabled:
        for slot in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except pynvml.NVMLError_NotFound:
                continue
            attrs = pynvml.nvmlDeviceGetAttributes(mig)
            gpu.migs.append(
                NvmlMig(
                    index=slot,
                    gi=pynvml.nvmlDeviceGetGpuInstanceId(mig),
                    ci=pynvml.nvmlDeviceGetComputeInstanceId(mig),
                    uuid=_text(pynvml.nvmlDeviceGetUUID(mig)),
                    profile=mig_profile(
                        attrs.gpuInstanceSliceCount,
                        attrs.computeInstanceSliceCount,
                        attrs.memorySizeMB,
                        memory,
                    ),
                    memory_total=pynvml.nvmlDeviceGetMemoryInfo(mig).total,
                    multiprocessors=attrs.multiprocessorCount,
                )
            )
    return gpu


def find_library(driver_root: str, ld_entries) -> str | None:
    """Host path of ``libnvidia-ml.so.1`` under ``driver_root`` (None: use the system's)."""
    from nvshim.host.rootpath import host_path

    for entry in ld_entries:
        if entry.name == "libnvidia-ml.so.1" and entry.arch == "x86_64":
            path = host_path(driver_root, entry.path)
            if os.path.exists(path):
                return path
    from nvshim.host.driver_files import LIB_DIRS

    for rel in LIB_DIRS:
        path = host_path(driver_root, f"/{rel}/libnvidia-ml.so.1")
        if os.path.exists(path):
            return path
    return None
