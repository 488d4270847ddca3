"""Small JSON caches for the per-container path: the config's in the cache directory
(``NVSHIM_CACHE_DIR``), the host inventory in the inventory directory (``[runtime]
inventory-dir``); both ``/run/nvshim`` by default (docs/configuration.md).

A cache entry holds a key (what the value was computed from) and the value; a reader
gets the value only when the key matches exactly. Entries are trusted only when owned by
this user and not writable by group or others, in a directory no other user can change
(``nvshim.trusted.cache_dir_trusted``): elsewhere nothing is read or written. Failing
to write one is never an error: the next reader computes the value again.
"""

from __future__ import annotations

import os

from nvshim import fastjson
from nvshim.trusted import CACHE_DIR, cache_dir_trusted, read_trusted

MAX_ENTRY = 16 << 20


def entry_path(kind: str, directory: str = CACHE_DIR) -> str:
    """The cache file of a ``kind``: one entry per kind (a node runs one configuration;
    any other just replaces it), so the directory never grows."""
    return os.path.join(directory, f"{kind}-cache.json")


def read(path: str) -> bytes | None:
    """The entry at ``path`` as stored, if it may be trusted (else None)."""
    return read_trusted(path, MAX_ENTRY) if cache_dir_trusted(os.path.dirname(path)) else None


def load(path: str, key, raw: bytes | None = None):
    """The cached value at ``path`` (``raw``: its bytes, already ``read``) if its key
    equals ``key``, else None."""
    raw = read(path) if raw is None else raw
    if raw is None:
        return None
    try:
        data = fastjson.loads(raw)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("key") != key:
        return None
    return data.get("value")


def store(path: str, key, value) -> None:
    """Write an entry (``key`` and ``value`` as JSON); see ``write_entry``."""
    try:
        data = fastjson.dumps({"key": key, "value": value}).encode()
    except (TypeError, ValueError):
        return
    write_entry(path, data)


def write_entry(path: str, data: bytes) -> None:
    """Write a cache file atomically (mode 0644; not fsynced: ``/run`` does not outlive a
    boot). Failing to is not an error."""
    from nvshim.fsutil import atomic_write

    if not cache_dir_trusted(os.path.dirname(path)):  # made here when missing
        return
    try:
        atomic_write(path, data, mode=0o644, durable=False)
    except OSError:
        pass
