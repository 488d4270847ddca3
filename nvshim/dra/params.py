"""Opaque claim parameters: nvshim's small, versioned ``GpuConfig`` kind::

    apiVersion: gpu.nvshim.io/v1alpha1
    kind: GpuConfig
    sharing:
      strategy: MPS            # or TimeSlicing (the default: CUDA's own time-slicing)
      mps:
        activeThreadPercentage: 50     # 1..100, each client's share of the SMs
        pinnedMemoryLimit: 8Gi         # each client's device memory (Mi, Gi, Ti, or bytes)

given in a ResourceClaim's (or DeviceClass's) ``spec.devices.config[].opaque`` with
``driver: gpu.nvshim.io``. Unknown keys are refused: a typo must not silently share a GPU
without limits. Class configs apply first, then the claim's; a later one replaces an
earlier one for the requests it names.
"""

from __future__ import annotations

from typing import Any

from nvshim.dra import DRIVER_NAME
from nvshim.errors import NvshimError
from nvshim.record import record

API_VERSION = f"{DRIVER_NAME}/v1alpha1"
KIND = "GpuConfig"
STRATEGIES = ("TimeSlicing", "MPS")
_UNITS = {"Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "Ti": 1024**4}
MIB = 1024**2


class ParamsError(NvshimError):
    """Opaque parameters nvshim cannot honour."""


@record(frozen=True)
class GpuConfig:
    """A checked ``GpuConfig``; ``strategy`` None: not shared beyond the claim."""

    strategy: str | None = None
    threads: int | None = None  # MPS activeThreadPercentage
    memory_mib: int | None = None  # MPS pinnedMemoryLimit


def _check_keys(table: Any, where: str, allowed: tuple[str, ...]) -> dict:
    if not isinstance(table, dict):
        raise ParamsError(f"{where}: must be a mapping")
    for key in table:
        if key not in allowed:
            raise ParamsError(f"{where}.{key}: unknown field (known: {', '.join(allowed)})")
    return table


MAX_DIGITS = 18  # a quantity's digits: below 2**63 bytes, far from int()'s 4300 limit


def _digits(text: str) -> bool:
    """1 to ``MAX_DIGITS`` ASCII digits (``str.isdigit`` takes ``²``, which ``int``
    refuses)."""
    return 0 < len(text) <= MAX_DIGITS and text.isascii() and text.isdigit()


def _shown(value: Any) -> str:
    """``repr(value)``, cut to one short line."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:40]}... ({len(text)} characters)"


def _quantity_mib(value: Any, where: str) -> int:
    """A memory quantity (``8Gi``, ``512Mi``, or an integer of bytes) in whole MiB (>= 1)."""
    if isinstance(value, int) and not isinstance(value, bool) and value < 10**MAX_DIGITS:
        size = value
    elif isinstance(value, str) and value[-2:] in _UNITS and _digits(value[:-2]):
        size = int(value[:-2]) * _UNITS[value[-2:]]
    elif isinstance(value, str) and _digits(value):
        size = int(value)
    else:
        raise ParamsError(
            f"{where}: must be a quantity such as 8Gi or 512Mi (at most {MAX_DIGITS} digits), "
            f"got {_shown(value)}"
        )
    if size < MIB:
        raise ParamsError(f"{where}: {value!r} is below 1Mi")
    return size // MIB


def parse_gpu_config(data: Any, where: str = "GpuConfig") -> GpuConfig:
    """Check one opaque ``parameters`` object (ParamsError names the field)."""
    data = _check_keys(data, where, ("apiVersion", "kind", "sharing"))
    if data.get("apiVersion") != API_VERSION or data.get("kind") != KIND:
        raise ParamsError(
            f"{where}: apiVersion/kind must be {API_VERSION}/{KIND}, got "
            f"{data.get('apiVersion')!r}/{data.get('kind')!r}"
        )
    sharing = data.get("sharing")
    if sharing is None:
        return GpuConfig()
    sharing = _check_keys(sharing, f"{where}.sharing", ("strategy", "mps"))
    strategy = sharing.get("strategy", "TimeSlicing")
    if strategy not in STRATEGIES:
        raise ParamsError(
            f"{where}.sharing.strategy: must be {' or '.join(STRATEGIES)}, got {strategy!r}"
        )
    mps = sharing.get("mps")
    if strategy != "MPS":
        if mps is not None:
            raise ParamsError(f"{where}.sharing.mps: only with strategy MPS")
        return GpuConfig(strategy)
    mps = _check_keys(
        mps or {}, f"{where}.sharing.mps", ("activeThreadPercentage", "pinnedMemoryLimit")
    )
    threads = mps.get("activeThreadPercentage")
    if threads is not None and (
        isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= 100
    ):
        raise ParamsError(
            f"{where}.sharing.mps.activeThreadPercentage: must be an integer 1..100, "
            f"got {threads!r}"
        )
    memory = mps.get("pinnedMemoryLimit")
    memory_mib = (
        None if memory is None else _quantity_mib(memory, f"{where}.sharing.mps.pinnedMemoryLimit")
    )
    return GpuConfig("MPS", threads, memory_mib)


def _request_matches(names: list[str], request: str) -> bool:
    """A config naming no requests applies to all; a subrequest ``main/sub`` matches
    ``main``."""
    return not names or request in names or request.split("/", 1)[0] in names


def configs_for_requests(allocation: dict[str, Any], requests: list[str]) -> dict[str, GpuConfig]:
    """The effective ``GpuConfig`` per request name, from the allocation's ``config``
    (class entries first, then the claim's). ParamsError names the bad entry."""
    entries = (allocation.get("devices") or {}).get("config") or []
    ordered = [e for e in entries if e.get("source") == "FromClass"] + [
        e for e in entries if e.get("source") != "FromClass"
    ]
    out = {request: GpuConfig() for request in requests}
    for i, entry in enumerate(ordered):
        opaque = entry.get("opaque") or {}
        if opaque.get("driver") != DRIVER_NAME:
            continue
        where = f"config[{i}] ({entry.get('source', 'FromClaim')})"
        config = parse_gpu_config(opaque.get("parameters"), where)
        for request in requests:
            if _request_matches(entry.get("requests") or [], request):
                out[request] = config
    return out
