"""GPU compute mode through NVML (the driver root's libnvidia-ml, via real pynvml)."""

from __future__ import annotations

from contextlib import contextmanager

from nvshim.errors import NvshimError
from nvshim.host.model import Host

DEFAULT = 0
PROHIBITED = 2
EXCLUSIVE_PROCESS = 3
MODE_NAMES = {0: "Default", 1: "Exclusive_Thread", 2: "Prohibited", 3: "Exclusive_Process"}


def mode_name(mode: int | None) -> str:
    """Readable compute mode (``Exclusive_Process``), ``-`` for None."""
    return "-" if mode is None else MODE_NAMES.get(mode, str(mode))


def nvml_library(host: Host) -> str | None:
    """Host path of the host's ``libnvidia-ml.so.1`` (None: the system's)."""
    for f in host.files:
        if f.kind == "lib" and f.soname == "libnvidia-ml.so.1" and f.capability != "compat32":
            return f.host_path
    return None


@contextmanager
def nvml_session(host: Host):
    """An initialised pynvml bound to the host's NVML; shut down on exit."""
    from nvshim.host.nvml import load_library

    pynvml = load_library(nvml_library(host))
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        raise NvshimError(f"NVML initialisation failed: {err}") from None
    try:
        yield pynvml
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def get_compute_mode(pynvml, uuid: str) -> int:
    """The compute mode of the GPU ``uuid``; NvshimError naming the GPU on failure."""
    try:
        return int(pynvml.nvmlDeviceGetComputeMode(pynvml.nvmlDeviceGetHandleByUUID(uuid)))
    except pynvml.NVMLError as err:
        raise NvshimError(f"GPU {uuid}: cannot read the compute mode: {err}") from None


def set_compute_mode(pynvml, uuid: str, mode: int) -> None:
    """Set the compute mode of the GPU ``uuid``; NvshimError naming the GPU on failure."""
    try:
        pynvml.nvmlDeviceSetComputeMode(pynvml.nvmlDeviceGetHandleByUUID(uuid), mode)
    except pynvml.NVMLError as err:
        raise NvshimError(
            f"GPU {uuid}: cannot set the compute mode to {mode_name(mode)}: {err}"
        ) from None
