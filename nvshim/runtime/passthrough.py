"""The pass-through fast path: which low-level runtime a call nvshim does not edit goes
to, from a one-line cache. Engines call the runtime for every ``state``, ``kill``,
``delete`` and ``exec``; the brief is to stay within 5 ms of bare runc, of which Python's
own start takes most. So this module uses only built-in modules (``posix``: importing
``os`` alone costs ~0.8 ms) and reads no TOML.

An entry is keyed by the exact bytes of the configuration file (or its absence), the
nvshim version and ``PATH``; it is trusted only when owned by us and not writable by
others, and used only while the runtime it names is still executable.
"""

from __future__ import annotations

import posix

from nvshim import __version__
from nvshim.runtime import DEFAULT_CONFIG
from nvshim.trusted import CACHE_DIR, read_trusted

MAX_CONFIG = 1 << 20


def config_file() -> str:
    """The configuration file in effect: ``$NVSHIM_CONFIG`` or the default."""
    value = posix.environ.get(b"NVSHIM_CONFIG")
    return value.decode("utf-8", "surrogateescape") if value else DEFAULT_CONFIG


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read(MAX_CONFIG + 1)
    except OSError:
        return None


def entry_key(config_path: str) -> bytes:
    """What the resolved runtime depends on, as bytes."""
    text = _read(config_path)
    path = posix.environ.get(b"PATH", b"")
    config = b"missing" if text is None else b"text " + text
    name = config_path.encode("utf-8", "surrogateescape")
    return b"\0".join((b"nvshim " + __version__.encode(), name, config, path))


def entry_file() -> str:
    """The one cache entry (the key names the configuration file)."""
    return f"{CACHE_DIR}/runtime-cache"


def cached_runtime(config_path: str) -> tuple[str | None, bytes]:
    """(the cached runtime or None, the key to store a fresh one under)."""
    key = entry_key(config_path)
    entry = read_trusted(entry_file(), 2 * MAX_CONFIG)
    if entry is None or not entry.startswith(key + b"\0\0"):
        return None, key
    runtime = entry[len(key) + 2 :].decode("utf-8", "surrogateescape")
    if runtime.startswith("/") and posix.access(runtime, posix.X_OK):
        return runtime, key
    return None, key


def remember(key: bytes, runtime: str) -> None:
    """Store the resolved runtime under ``key``; failing to is not an error."""
    from nvshim.filecache import write_entry

    write_entry(entry_file(), key + b"\0\0" + runtime.encode("utf-8", "surrogateescape"))
