"""The low-level runtime for calls nvshim does not edit, and the cache the ``nvshim-runtime``
front (a POSIX sh script, ``nvshim.launch``) reads so that those calls never start Python.

The cache file (``runtime-front`` in the cache directory) has three lines: nvshim's
version, the configuration file's path, ``present`` or ``missing`` (that file); then a
``PATH`` line and the runtime resolved with it, for up to ``MAX_PATHS`` callers' PATHs.
The front uses it only when it is a regular file owned by the
caller, every line matches its own call, the runtime is still executable and the file is
newer than the configuration file (a config edit misses the cache until Python resolves
the runtime again). Python writes it only when no value holds a newline.
"""

from __future__ import annotations

import os

from nvshim import __version__
from nvshim.runtime import DEFAULT_CONFIG, FRONT_CACHE
from nvshim.trusted import CACHE_DIR

MAX_PATHS = 8


def config_file() -> str:
    """The configuration file in effect: ``$NVSHIM_CONFIG`` or the default."""
    return os.environ.get("NVSHIM_CONFIG") or DEFAULT_CONFIG


def entry_file(cache_dir: str = CACHE_DIR) -> str:
    return os.path.join(cache_dir, FRONT_CACHE)


def _identity(path: str) -> tuple | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def resolve_and_remember() -> str:
    """Resolve the low-level runtime from the configuration and write the front's cache
    (unless the configuration changed meanwhile). Raises NvshimError when none is found."""
    from nvshim.runtime.lowlevel import resolve

    path = config_file()
    before = _identity(path)
    runtime = resolve(None)
    head = [f"nvshim {__version__}", path, "missing" if before is None else "present"]
    mine = [os.environ.get("PATH", ""), runtime]
    if any("\n" in v for v in (*head, *mine)):
        return runtime
    from nvshim.filecache import write_entry
    from nvshim.trusted import read_trusted

    entry = entry_file()
    # one (PATH, runtime) pair per caller's PATH (engines differ), the newest first
    raw = read_trusted(entry, 1 << 16)
    if raw is None:  # absent, or not one we can trust: never inherit its owner or mode
        try:
            os.unlink(entry)
        except OSError:
            pass
    raw = raw or b""
    lines = raw.decode("utf-8", "surrogateescape").split("\n")[:-1]
    pairs = [mine]
    if lines[:3] == head:
        old = lines[3:]
        pairs += [old[i : i + 2] for i in range(0, len(old) - 1, 2) if old[i] != mine[0]]
    text = "".join(f"{v}\n" for v in head + [v for pair in pairs[:MAX_PATHS] for v in pair])
    write_entry(entry, text.encode("utf-8", "surrogateescape"))
    if _identity(path) != before:  # edited while we read it: the entry may be stale
        try:
            os.unlink(entry)
        except OSError:
            pass
    return runtime
