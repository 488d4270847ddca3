"""NVML queries through the real ``pynvml``, loaded from the driver root when one is given."""

from __future__ import annotations

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
    engines: dict[str, int] | None = None  # the GPU instance profile's engine counts
    memory_slices: tuple[int, int] | None = None  # (start, size) of its placement


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


def load_library(path: str | None):
    """Import pynvml and bind it to the NVML library at ``path`` (None: the system's)."""
    try:
        import pynvml
    except ImportError:
        raise NvshimError("the Python package nvidia-ml-py (pynvml) is not installed") from None
    if path is not None:
        import ctypes

        try:
            lib = ctypes.CDLL(path)
        except OSError as err:
            raise NvshimError(f"cannot load NVML library {path}: {err}") from None
        with pynvml.libLoadLock:
            pynvml.nvmlLib = lib
            # pynvml caches function pointers per name: drop those of any earlier library.
            pynvml._nvmlGetFunctionPointer_cache.clear()
    return pynvml


# nvmlGpuInstanceProfileInfo_t's engine counts, in order (copyEngineCount .. ofaCount)
ENGINES = ("copyEngines", "decoders", "encoders", "jpegEngines", "ofaEngines")
GPU_INSTANCE_PROFILES = 16  # NVML_GPU_INSTANCE_PROFILE_* indexes tried (14 known)
# nvmlReturn_t values discovery tells apart (nvml.h)
NOT_SUPPORTED = 3
NOT_FOUND = 6
FUNCTION_NOT_FOUND = 13
UUID_SIZE = 96  # NVML_DEVICE_UUID_V2_BUFFER_SIZE (also the name buffer)
VERSION_SIZE = 80  # NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE


class NvmlCallError(Exception):
    """An NVML call returned ``code``; ``str()`` is NVML's own text for it."""

    def __init__(self, code: int, text: str):
        super().__init__(text)
        self.code = code


def c_types():
    """The ctypes pieces the binding uses (``CDLL``, ``c_int``, ``c_uint``, ``c_ulonglong``,
    ``c_void_p``, ``c_char_p``, ``byref``, ``create_string_buffer``), defined on ``_ctypes``,
    the C module under ctypes, as ctypes defines them: importing ctypes itself costs about
    2 ms more (its byte-order structure classes). Falls back to ctypes."""
    try:
        import _ctypes as c

        def simple(code: str):
            return type(f"c_{code}", (c._SimpleCData,), {"_type_": code})

        c_int = simple("i")
        c_char = simple("c")
        function = type(
            "Function", (c.CFuncPtr,), {"_flags_": c.FUNCFLAG_CDECL, "_restype_": c_int}
        )

        class CDLL:
            """A shared library; its attributes are its functions (int result)."""

            def __init__(self, name: str):
                self._handle = c.dlopen(name, 0)  # RTLD_NOW | RTLD_LOCAL, as ctypes does

            def __getattr__(self, name: str):
                if name.startswith("__"):
                    raise AttributeError(name)
                found = function((name, self))  # AttributeError when not exported
                setattr(self, name, found)
                return found

        class types:  # what the binding takes from the ctypes module
            c_uint = simple("I")
            c_ulonglong = simple("Q")
            c_void_p = simple("P")
            c_char_p = simple("z")
            byref = staticmethod(c.byref)

            @staticmethod
            def create_string_buffer(size: int):
                return (c_char * size)()

        types.CDLL = CDLL
        types.c_int = c_int
        return types
    except (ImportError, AttributeError):  # pragma: no cover - CPython has them all
        import ctypes

        return ctypes


class Nvml:
    """The NVML calls discovery makes, bound with ctypes to the symbols pynvml binds
    (``nvmlDeviceGetCount_v2``, ``nvmlDeviceGetPciInfo_v3``, ...). Importing pynvml costs
    about 15 ms (it defines every NVML struct); this is the part ``nvshim cdi generate``
    and a cold inventory need. Other NVML users (MPS compute mode, topology) use pynvml."""

    def __init__(self, path: str | None):
        ctypes = c_types()
        self.ctypes = ctypes
        self.lib = ctypes.CDLL(path or "libnvidia-ml.so.1")
        self.handle_type = ctypes.c_void_p

    def __call__(self, name: str, *args) -> None:
        """Call ``name``; NvmlCallError unless it returns NVML_SUCCESS."""
        try:
            function = getattr(self.lib, name)
        except AttributeError:
            raise NvmlCallError(FUNCTION_NOT_FOUND, f"Function Not Found ({name})") from None
        code = function(*args)
        if code:
            raise NvmlCallError(code, self.error_text(code))

    def error_text(self, code: int) -> str:
        try:
            function = self.lib.nvmlErrorString
        except AttributeError:
            return f"NVML error {code}"
        function.restype = self.ctypes.c_char_p
        text = function(code)
        return text.decode(errors="replace") if text else f"NVML error {code}"

    def uint(self, name: str, handle) -> int:
        value = self.ctypes.c_uint()
        self(name, handle, self.ctypes.byref(value))
        return value.value

    def text(self, name: str, *args, size: int = UUID_SIZE) -> str:
        buffer = self.ctypes.create_string_buffer(size)
        self(name, *args, buffer, self.ctypes.c_uint(size))
        return buffer.value.decode(errors="replace")

    def handle(self, name: str, *args):
        handle = self.handle_type()
        self(name, *args, self.ctypes.byref(handle))
        return handle

    def memory_total(self, handle) -> int:
        memory = (self.ctypes.c_ulonglong * 3)()  # nvmlMemory_t: total, free, used
        self("nvmlDeviceGetMemoryInfo", handle, memory)
        return memory[0]

    def pci_bus_id(self, handle) -> str:
        info = self.ctypes.create_string_buffer(68)  # nvmlPciInfo_t (v3)
        self("nvmlDeviceGetPciInfo_v3", handle, info)
        return info.raw[36:68].split(b"\0", 1)[0].decode()  # busId[32] after 36 bytes

    def attributes(self, handle) -> tuple[int, int, int, int]:
        """A MIG device's GPU-instance and compute-instance slices, memory (MiB) and
        multiprocessors."""
        attrs = (self.ctypes.c_uint * 10)()  # nvmlDeviceAttributes_t: 8 uints, then a u64
        self("nvmlDeviceGetAttributes_v2", handle, attrs)
        return attrs[6], attrs[7], attrs[8] | attrs[9] << 32, attrs[0]

    def gpu_instance(self, parent, gi: int, profiles: dict[int, dict[str, int]]):
        """A GPU instance's engine counts (its profile's info) and memory-slice placement
        ``(start, size)``; ``(None, None)`` where the driver has no such calls.
        ``profiles`` caches the parent's profiles by id."""
        try:
            handle = self.handle("nvmlDeviceGetGpuInstanceById", parent, self.ctypes.c_uint(gi))
            info = (self.ctypes.c_uint * 6)()  # nvmlGpuInstanceInfo_t: a pointer, 4 uints
            self("nvmlGpuInstanceGetInfo", handle, info)
        except NvmlCallError:
            return None, None
        if not profiles:
            for index in range(GPU_INSTANCE_PROFILES):
                raw = (self.ctypes.c_uint * 12)()  # nvmlGpuInstanceProfileInfo_t (v1)
                try:
                    self("nvmlDeviceGetGpuInstanceProfileInfo", parent, index, raw)
                except NvmlCallError:
                    continue
                profiles[raw[0]] = dict(zip(ENGINES, raw[5:10], strict=True))
            profiles.setdefault(-1, {})  # looked: not again for the next instance
        return profiles.get(info[3]), (info[4], info[5]) if info[5] else None


def query(library: str | None) -> NvmlSnapshot:
    """Query the driver, every GPU and every MIG device through NVML."""
    where = library or "libnvidia-ml.so.1 (system)"
    try:
        nvml = Nvml(library)
    except OSError as err:
        if library is None:
            raise NvshimError(f"NVML library not found: {where}") from None
        raise NvshimError(f"cannot load NVML library {library}: {err}") from None
    try:
        nvml("nvmlInitWithFlags", 0)
    except NvmlCallError as err:
        raise NvshimError(f"NVML initialisation failed ({where}): {err}") from None
    try:
        return _snapshot(nvml, where)
    finally:
        try:
            nvml("nvmlShutdown")
        except NvmlCallError:
            pass


def _snapshot(nvml: Nvml, where: str) -> NvmlSnapshot:
    warnings: list[str] = []
    ctypes = nvml.ctypes
    try:
        driver = nvml.text("nvmlSystemGetDriverVersion", size=VERSION_SIZE)
        cuda = ctypes.c_int()
        nvml("nvmlSystemGetCudaDriverVersion", ctypes.byref(cuda))
        count = ctypes.c_uint()
        nvml("nvmlDeviceGetCount_v2", ctypes.byref(count))
    except NvmlCallError as err:
        raise NvshimError(f"NVML query failed ({where}): {err}") from None
    gpus = []
    for index in range(count.value):
        try:
            gpus.append(_gpu(nvml, index))
        except NvmlCallError as err:
            warnings.append(f"GPU {index}: NVML error ({err}); GPU skipped")
    return NvmlSnapshot(driver, cuda_version_text(cuda.value), gpus, warnings, where)


def _gpu(nvml: Nvml, index: int) -> NvmlGpu:
    ctypes = nvml.ctypes
    handle = nvml.handle("nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(index))
    major, minor_cc = ctypes.c_int(), ctypes.c_int()
    nvml("nvmlDeviceGetCudaComputeCapability", handle, ctypes.byref(major), ctypes.byref(minor_cc))
    memory = nvml.memory_total(handle)
    try:
        arch = ARCHITECTURES.get(nvml.uint("nvmlDeviceGetArchitecture", handle), "unknown")
    except NvmlCallError as err:
        if err.code != NOT_SUPPORTED:
            raise
        arch = "unknown"
    current, pending = ctypes.c_uint(), ctypes.c_uint()
    try:
        nvml("nvmlDeviceGetMigMode", handle, ctypes.byref(current), ctypes.byref(pending))
        mig_enabled = current.value == 1
    except NvmlCallError as err:
        if err.code != NOT_SUPPORTED:
            raise
        mig_enabled = False
    brand = ctypes.c_int()
    minor = nvml.uint("nvmlDeviceGetMinorNumber", handle)
    uuid = nvml.text("nvmlDeviceGetUUID", handle)
    name = nvml.text("nvmlDeviceGetName", handle)
    pci_bus_id = nvml.pci_bus_id(handle)
    nvml("nvmlDeviceGetBrand", handle, ctypes.byref(brand))
    gpu = NvmlGpu(
        index=index,
        minor=minor,
        uuid=uuid,
        name=name,
        pci_bus_id=pci_bus_id,
        memory_total=memory,
        compute_capability=f"{major.value}.{minor_cc.value}",
        architecture=arch,
        brand=BRANDS.get(brand.value, "unknown"),
        mig_enabled=mig_enabled,
    )
    if mig_enabled:
        profiles: dict[int, dict[str, int]] = {}
        for slot in range(nvml.uint("nvmlDeviceGetMaxMigDeviceCount", handle)):
            try:
                mig = nvml.handle(
                    "nvmlDeviceGetMigDeviceHandleByIndex", handle, ctypes.c_uint(slot)
                )
            except NvmlCallError as err:
                if err.code != NOT_FOUND:
                    raise
                continue
            gi_slices, ci_slices, mig_mib, multiprocessors = nvml.attributes(mig)
            gi = nvml.uint("nvmlDeviceGetGpuInstanceId", mig)
            engines, memory_slices = nvml.gpu_instance(handle, gi, profiles)
            gpu.migs.append(
                NvmlMig(
                    index=slot,
                    gi=gi,
                    ci=nvml.uint("nvmlDeviceGetComputeInstanceId", mig),
                    uuid=nvml.text("nvmlDeviceGetUUID", mig),
                    profile=mig_profile(gi_slices, ci_slices, mig_mib, memory),
                    memory_total=nvml.memory_total(mig),
                    multiprocessors=multiprocessors,
                    engines=engines,
                    memory_slices=memory_slices,
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
