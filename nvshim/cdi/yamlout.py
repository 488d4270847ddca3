"""YAML for CDI specs without importing PyYAML (about 15 ms to import, and its pure-Python
emitter takes about 30 ms for an 8-GPU MIG spec).

``dump(data)`` gives exactly what ``yaml.safe_dump(data, sort_keys=False,
default_flow_style=False)`` gives for the data a spec holds: block mappings and
sequences (a sequence inside a mapping not indented, as PyYAML writes it), ints, bools,
None, and strings of printable ASCII without spaces, plain where PyYAML writes them plain
(not an indicator, not read back as another type under YAML 1.1) and single-quoted
otherwise. Anything else (a space, a non-ASCII character, a float, a nested sequence, a
number-like string this module does not decide, an empty key, a key of ``LONG_KEY``
characters or more, which PyYAML writes as an explicit ``? key``, a dict or list met
twice, which PyYAML writes with an anchor) is handed to PyYAML for the whole document,
so the output is always PyYAML's.
"""

from __future__ import annotations

DIGITS = "0123456789"
# YAML 1.1 words that read back as bools or null, and the merge and value keys.
NOT_STRINGS = frozenset(
    "yes Yes YES no No NO true True TRUE false False FALSE on On ON off Off OFF"
    " ~ null Null NULL << =".split()
)
FLOAT_WORDS = frozenset(".inf .Inf .INF .nan .NaN .NAN".split())
FIRST_INDICATORS = "#,[]{}&*!|>'\"%@`"
_DIGITS_COLONS = frozenset(DIGITS + ":")
_DIGITS_DOTS = frozenset(DIGITS + ".")
_PRINTABLE = frozenset(chr(c) for c in range(0x21, 0x7F))
LONG_KEY = 100  # PyYAML writes a key of 128 written characters or more as "? key"


class Unsupported(Exception):
    """Data this module leaves to PyYAML."""


def dump(data) -> str:
    """``data`` as PyYAML's ``safe_dump(sort_keys=False, default_flow_style=False)``."""
    if isinstance(data, dict) and data:
        out: list[str] = []
        try:
            _mapping(data, "", "", out, set())
            return "".join(out)
        except Unsupported:
            pass
    import yaml

    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


def _once(node, seen: set[int]) -> None:
    """Unsupported when dict or list ``node`` was met before (PyYAML anchors it)."""
    if id(node) in seen:
        raise Unsupported
    seen.add(id(node))


def _mapping(data: dict, first: str, pad: str, out: list[str], seen: set[int]) -> None:
    """Write ``data``'s entries at ``pad``; the first line starts with ``first``.
    ``seen``: the ids of the dicts and lists written so far."""
    _once(data, seen)
    lead = first
    inner = pad + "  "
    for key, value in data.items():
        if type(key) is not str or not key or len(key) >= LONG_KEY:
            raise Unsupported
        key = _scalar(key)
        kind = type(value)
        if kind is dict:
            if value:
                out.append(f"{lead}{key}:\n")
                _mapping(value, inner, inner, out, seen)
            else:
                _once(value, seen)
                out.append(f"{lead}{key}: {{}}\n")
        elif kind is list:
            _once(value, seen)
            if value:
                out.append(f"{lead}{key}:\n")
                _sequence(value, pad, out, seen)
            else:
                out.append(f"{lead}{key}: []\n")
        else:
            out.append(f"{lead}{key}: {_scalar(value)}\n")
        lead = pad


def _sequence(items: list, pad: str, out: list[str], seen: set[int]) -> None:
    dash = pad + "- "
    for item in items:
        kind = type(item)
        if kind is dict:
            if item:
                _mapping(item, dash, pad + "  ", out, seen)
            else:
                _once(item, seen)
                out.append(f"{dash}{{}}\n")
        elif kind is list:
            raise Unsupported
        else:
            out.append(f"{dash}{_scalar(item)}\n")


_CACHE: dict[str, str] = {}


def _scalar(value) -> str:
    kind = type(value)
    if kind is str:
        text = _CACHE.get(value)
        if text is None:
            quoted = value.replace("'", "''")
            text = _CACHE[value] = value if plain(value) else f"'{quoted}'"
        return text
    if kind is int:
        return str(value)
    if kind is bool:
        return "true" if value else "false"
    if value is None:
        return "null"
    raise Unsupported


def plain(text: str) -> bool:
    """Whether PyYAML writes ``text`` plain (False: single-quoted). Unsupported for a
    string it would write otherwise or this module cannot decide."""
    if not text:
        return False  # '' reads back as null
    if not _PRINTABLE.issuperset(text):
        raise Unsupported  # spaces (PyYAML may fold lines), controls, non-ASCII
    first = text[0]
    # indicators: the first character, '-', '?' or ':' alone, ':' at the end, document markers
    if first in FIRST_INDICATORS or text in ("-", "?", ":") or text[-1] == ":":
        return False
    if text.startswith(("---", "...")):
        return False
    if text in NOT_STRINGS:
        return False
    if first in "-+":
        rest = text[1:]
        if rest and rest[0] in DIGITS:
            return not _number(rest)
        if rest[:1] == ".":
            if rest in (".inf", ".Inf", ".INF"):
                return False
            if rest[1:2] and rest[1:2] in DIGITS:
                raise Unsupported
        return True
    if first == ".":
        if text in FLOAT_WORDS:
            return False
        if text[1:2] and text[1:2] in DIGITS:
            raise Unsupported
        return True
    if first in DIGITS:
        return not _number(text)
    return True


def _number(text: str) -> bool:
    """Whether ``text`` (starting with a digit, a sign already removed) reads back as a
    YAML 1.1 int or float or timestamp; Unsupported unless it is digits and colons only,
    or digits and dots only (a version such as ``0.5.0``: a float has one dot)."""
    if "." in text and _DIGITS_DOTS.issuperset(text):
        return text.count(".") < 2
    if not _DIGITS_COLONS.issuperset(text):
        raise Unsupported
    parts = text.split(":")
    if len(parts) == 1:  # decimal (no leading zero), octal, or "0"
        return text == "0" or text[0] != "0" or all(c in "01234567" for c in text)
    # sexagesimal int: [1-9][0-9_]*(:[0-5]?[0-9])+
    return text[0] != "0" and all(
        len(part) == 1 or (len(part) == 2 and part[0] in "012345") for part in parts[1:]
    )
