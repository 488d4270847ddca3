"""The minimum CDI version a spec's content needs (runtimes reject newer ones they do not know)."""

from __future__ import annotations

TYPE_CHECKING = False  # typing costs ~3 ms to import
if TYPE_CHECKING:
    from typing import Any

KNOWN_VERSIONS = ("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")
BASELINE = "0.3.0"


def version_key(version: str) -> tuple[int, ...]:
    """Numeric sort key of a dotted version; raises ValueError on garbage."""
    return tuple(int(p) for p in version.split("."))


def edits_min_version(edits: dict[str, Any] | None) -> str:
    """Minimum version needed by one CDI ``containerEdits`` mapping."""
    need = BASELINE
    if not edits:
        return need
    if any(m.get("type") for m in edits.get("mounts") or ()):
        need = _max(need, "0.4.0")
    if any(d.get("hostPath") for d in edits.get("deviceNodes") or ()):
        need = _max(need, "0.5.0")
    if edits.get("additionalGids") or edits.get("intelRdt") is not None:
        need = _max(need, "0.7.0")
    if edits.get("netDevices"):
        need = _max(need, "1.1.0")
    rdt = edits.get("intelRdt")
    if isinstance(rdt, dict) and (rdt.get("schemata") is not None or rdt.get("enableMonitoring")):
        need = _max(need, "1.1.0")
    return need


def spec_min_version(spec: dict[str, Any]) -> str:
    """Minimum ``cdiVersion`` a whole spec mapping needs (FACTS §5)."""
    need = edits_min_version(spec.get("containerEdits"))
    kind = str(spec.get("kind", ""))
    if "/" in kind and "." in kind.split("/", 1)[1]:
        need = _max(need, "0.6.0")
    if spec.get("annotations"):
        need = _max(need, "0.6.0")
    for dev in spec.get("devices") or ():
        need = _max(need, edits_min_version(dev.get("containerEdits")))
        name = str(dev.get("name", ""))
        if name[:1].isdigit():
            need = _max(need, "0.5.0")
        if dev.get("annotations"):
            need = _max(need, "0.6.0")
    return need


def _max(a: str, b: str) -> str:
    return a if version_key(a) >= version_key(b) else b
