"""What the engine editors need from a configuration document, TOML or JSON alike.

A document is a tree of tables addressed by key tuples. ``get`` returns plain Python
values (``MISSING`` when absent); the mutators keep every byte they do not own.
"""

from __future__ import annotations

import abc
from typing import Any

Keys = tuple[str, ...]


class _Missing:
    """The absence of a key (distinct from any value a document can hold)."""

    _instance: _Missing | None = None

    def __new__(cls) -> _Missing:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "MISSING"

    def __bool__(self) -> bool:
        return False


MISSING: Any = _Missing()


def same(a: Any, b: Any) -> bool:
    """Deep equality that tells ``True`` from ``1`` and ``1`` from ``1.0``."""
    if type(a) is not type(b):
        if isinstance(a, dict) and isinstance(b, dict):
            pass
        elif isinstance(a, list) and isinstance(b, list):
            pass
        elif isinstance(a, str) and isinstance(b, str):
            return str(a) == str(b)
        else:
            return False
    if isinstance(a, dict):
        return set(a) == set(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def dotted(keys: Keys) -> str:
    """``keys`` written as a TOML dotted key (quoted where needed)."""
    out = []
    for key in keys:
        if key and all(c.isalnum() or c in "_-" for c in key) and key.isascii():
            out.append(key)
        else:
            out.append('"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"')
    return ".".join(out)


def type_name(value: Any) -> str:
    """A short article + type word for error messages ("a string", "an array")."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    if value is None:
        return "null"
    return "a " + type(value).__name__.lower()


class Document(abc.ABC):
    """A parsed configuration file that can be edited without losing its formatting."""

    path: str

    @abc.abstractmethod
    def get(self, keys: Keys) -> Any:
        """The plain value at ``keys`` or ``MISSING``; a non-table on the way is an error."""

    @abc.abstractmethod
    def set(self, keys: Keys, value: Any) -> list[Keys]:
        """Set ``keys`` to ``value`` (a ``dict`` makes a table); return the tables created."""

    @abc.abstractmethod
    def delete(self, keys: Keys) -> None:
        """Remove ``keys`` (a value or a whole table) if present."""

    @abc.abstractmethod
    def list_add(self, keys: Keys, item: Any) -> None:
        """Append ``item`` to the existing array at ``keys``."""

    @abc.abstractmethod
    def list_remove(self, keys: Keys, item: Any) -> None:
        """Remove every ``item`` from the array at ``keys``."""

    @abc.abstractmethod
    def render(self) -> bytes:
        """The document's bytes."""

    def is_empty(self) -> bool:
        """True when the document holds no key at all."""
        return not self.get(())

    def type_error(self, keys: Keys, want: str, found: Any) -> Exception:
        """The one-line error for a wrong type at ``keys`` (with its line when known)."""
        from nvshim.errors import InputFileError

        line = self.line_of(keys)
        where = f"{self.path}:{line}" if line else self.path
        return InputFileError(f"{where}: {self.key_name(keys)} must be {want}, found {found}")

    def key_name(self, keys: Keys) -> str:
        return dotted(keys) or "the top level"

    def line_of(self, keys: Keys) -> int | None:
        """1-based line where ``keys`` is defined, when it can be found."""
        return None
