"""A one-entry memo for long-lived processes (``nvshim-runtimed``'s workers load the
configuration and the host inventory, and build the host's edits, for every create):
what was last made, kept while the inputs it was made from stay equal. Only immutable
values (frozen records, or values never modified) may be kept."""

from __future__ import annotations


class Last:
    """The value last made, and the key (a tuple of its inputs) it was made for."""

    __slots__ = ("_key", "_value")

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._value = None

    def get(self, key: tuple):
        """The value kept for ``key``, else None. Keys compare with ``==``, a tuple's items
        by identity first: the same object is found without comparing its contents. A key
        equal to the kept one but not the same objects takes its place, so that the next
        call with these objects is found by identity (a host parsed again compares equal
        to the one first kept, field by field)."""
        if self._key is None or self._key != key:
            return None
        self._key = key
        return self._value

    def keep(self, key: tuple, value):
        """Keep ``value`` (not None) for ``key``, in place of the last; returns it."""
        self._key, self._value = key, value
        return value
