"""CDI name rules: vendor, class, device names and fully qualified ``vendor/class=name``.

Vendor and class: ASCII letter first, then letters, digits, ``_ . -``, ending in a letter
or digit. Device names: letter or digit first, then letters, digits, ``_ . : -``, ending
in a letter or digit. (A dot in the class needs cdiVersion 0.6.0, a leading digit in a
device name 0.5.0; see ``nvshim.cdi.version``.) Every check raises ``ValueError`` with a
one-line message naming the value.
"""

from __future__ import annotations

# The rules as the CDI spec writes them; VENDOR_RE etc. are compiled on first use (importing
# re costs ~5 ms of `nvshim cdi generate`), the checks below test the same character sets.
PATTERNS = {
    "VENDOR_RE": r"[A-Za-z](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?",
    "CLASS_RE": r"[A-Za-z](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?",
    "DEVICE_RE": r"[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?",
}


def __getattr__(name: str):
    if name not in PATTERNS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import re

    regex = globals()[name] = re.compile(PATTERNS[name], re.ASCII)
    return regex


_ALNUM = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
_LETTERS = frozenset(c for c in _ALNUM if not c.isdigit())


def quote(value: object, limit: int = 80) -> str:
    """``value`` as a double-quoted, escaped, one-line string, shortened past ``limit`` chars."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) > limit:
        text = text[:limit] + "..."
    import json

    return json.dumps(text)


_RULES = {
    "vendor": (_LETTERS, "a letter", "_.-"),
    "class": (_LETTERS, "a letter", "_.-"),
    "device name": (_ALNUM, "a letter or digit", "_.:-"),
}


def why_invalid(what: str, value: object) -> str | None:
    """Why ``value`` is not a valid ``what`` (``vendor``, ``class``, ``device name``), or None.

    The reason is a bare phrase (``must start with a letter``) for the caller to prefix.
    """
    first, first_text, middle = _RULES[what]
    if not isinstance(value, str):
        return f"must be a string, got {type(value).__name__}"
    if value == "":
        return "must not be empty"
    if value[0] not in first:
        return f"must start with {first_text}"
    allowed = _ALNUM | frozenset(middle)
    for ch in value:
        if ch not in allowed:
            return f"character {quote(ch)} is not allowed"
    if value[-1] not in _ALNUM:
        return "must end with a letter or digit"
    return None


def _check(what: str, value: str, shown: str = "") -> str:
    reason = why_invalid(what, value)
    if reason is not None:
        raise ValueError(f"{shown or what} {quote(value)}: {reason}")
    return value


def validate_vendor(vendor: str, shown: str = "") -> str:
    """Return ``vendor`` if it is a valid CDI vendor name, else raise ValueError naming
    it as ``shown`` (an option: ``--vendor``), or as the vendor."""
    return _check("vendor", vendor, shown)


def validate_class(cls: str, shown: str = "") -> str:
    """Return ``cls`` if it is a valid CDI class name, else raise ValueError naming it
    as ``shown`` (an option: ``--class``), or as the class."""
    return _check("class", cls, shown)


def validate_device_name(name: str) -> str:
    """Return ``name`` if it is a valid CDI device name, else raise ValueError."""
    return _check("device name", name)


def parse_kind(kind: str) -> tuple[str, str]:
    """Split a spec ``kind`` (``vendor/class``) into a validated ``(vendor, class)``."""
    if not isinstance(kind, str):
        raise ValueError(f"kind must be a string, got {type(kind).__name__} {quote(kind)}")
    vendor, sep, cls = kind.partition("/")
    if not sep or not vendor or not cls:
        raise ValueError(f"kind {quote(kind)}: must have the form vendor/class")
    try:
        validate_vendor(vendor)
        validate_class(cls)
    except ValueError as err:
        raise ValueError(f"kind {quote(kind)}: {err}") from None
    return vendor, cls


def parse_qualified_name(device: str) -> tuple[str, str, str]:
    """Split ``vendor/class=name`` into a validated ``(vendor, class, name)``."""
    if not isinstance(device, str):
        raise ValueError(
            f"CDI device must be a string, got {type(device).__name__} {quote(device)}"
        )
    kind, sep, name = device.partition("=")
    vendor, slash, cls = kind.partition("/")
    if not sep or not slash or not vendor or not cls or not name:
        raise ValueError(f"CDI device {quote(device)}: must have the form vendor/class=name")
    try:
        validate_vendor(vendor)
        validate_class(cls)
        validate_device_name(name)
    except ValueError as err:
        raise ValueError(f"CDI device {quote(device)}: {err}") from None
    return vendor, cls, name


def qualified_name(vendor: str, cls: str, name: str) -> str:
    """The fully qualified ``vendor/class=name`` (each part validated)."""
    validate_vendor(vendor)
    validate_class(cls)
    validate_device_name(name)
    return f"{vendor}/{cls}={name}"
