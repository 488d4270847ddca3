"""``NVIDIA_DRIVER_CAPABILITIES``: which driver capabilities a container gets."""

from __future__ import annotations

from nvshim.defaults import CAPABILITIES, DEFAULT_CAPABILITIES

VARIABLE = "NVIDIA_DRIVER_CAPABILITIES"
MAX_VALUE = 4096


def parse_capabilities(
    value: str | None, default: str, warnings: list[str] | None = None, source: str = VARIABLE
) -> tuple[str, ...]:
    """The capabilities ``value`` names, in canonical order (``CAPABILITIES``).

    Unset or empty (or only commas and blanks) means ``default``; ``all`` means every
    capability. Names are case-insensitive. Unknown names are ignored and a warning is
    appended to ``warnings`` when given, naming ``source`` (where ``value`` came from); if
    no known name is left, ``default`` applies. ``default`` is the config's ``[policy]
    default-capabilities``, checked when the config is loaded (``nvshim.config``); one
    that names nothing known (a caller's own) falls back to ``utility,compute``.
    """
    if warnings is None:
        warnings = []
    names = _names(value, warnings, source)
    if names is None:
        names = _names(default, warnings, "default-capabilities")
        if names is None:
            return tuple(c for c in CAPABILITIES if c in DEFAULT_CAPABILITIES)
    return names


def _names(value: str | None, warnings: list[str], what: str) -> tuple[str, ...] | None:
    """The known names in ``value``; None when it names nothing usable."""
    if value is None:
        return None
    if len(value) > MAX_VALUE:
        warnings.append(f"{what}: value longer than {MAX_VALUE} characters ignored")
        return None
    tokens = [t.strip().lower() for t in value.split(",")]
    tokens = [t for t in tokens if t]
    if not tokens:
        return None
    if "all" in tokens:
        return CAPABILITIES
    wanted = set()
    for token in tokens:
        if token in CAPABILITIES:
            wanted.add(token)
        else:
            warnings.append(f"{what}: unknown capability {_show(token)} ignored")
    if not wanted:
        return None
    return tuple(c for c in CAPABILITIES if c in wanted)


def _show(text: str, limit: int = 40) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")
