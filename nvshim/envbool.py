"""Boolean environment variables, read one way everywhere: Go's ``strconv.ParseBool``
spellings exactly (the GPU Operator's variables); ``NVSHIM_*`` ones also take
yes/no/on/off in any case, and empty for no."""

from __future__ import annotations

from nvshim.errors import UsageError

__all__ = ["GO_FALSE", "GO_TRUE", "parse_bool"]

GO_TRUE = ("1", "t", "T", "TRUE", "true", "True")
GO_FALSE = ("0", "f", "F", "FALSE", "false", "False")
_TRUE = ("1", "t", "true", "yes", "on")
_FALSE = ("0", "f", "false", "no", "off", "")


def parse_bool(name: str, raw: str) -> bool:
    """Variable ``name``'s value ``raw`` as a boolean; UsageError naming both if none."""
    if raw in GO_TRUE:
        return True
    if raw in GO_FALSE:
        return False
    if name.startswith("NVSHIM_"):
        value = raw.strip().lower()
        if value in _TRUE:
            return True
        if value in _FALSE:
            return False
    raise UsageError(f"{name}={raw!r}: expected a boolean (1, t, true, TRUE, 0, f, false ...)")
