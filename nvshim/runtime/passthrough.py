"""The low-level runtime for calls nvshim does not edit, and the cache the ``nvshim-runtime``
front (a POSIX sh script, ``nvshim.runtime.front``) reads so that those calls, and a
create/run whose ``config.json`` cannot ask for a GPU, never start Python.

The cache file (``runtime-front`` in the cache directory)::

    nvshim VERSION
    CONFIG FILE                 its path
    present | missing           that file
    PATH                        a caller's PATH (absolute entries only, not empty)
    RUNTIME                     the runtime resolved with it (up to MAX_PATHS pairs)
    ...
    (an empty line)
    TRIGGER                     one a line, at least one: nvshim.policy.request_triggers
    ...

The front reads it byte by byte (a shell's ``read``), so what every call needs comes
first: a call other than create or run stops at its ``PATH``'s pair.

The front uses it only when it is a regular file owned by the caller, every line matches
its own call, the runtime is still executable and the file is newer than the
configuration file (a config edit misses the cache until Python writes it again). Python
writes it only when no value holds a newline, and only when it is not current already.

The entry is keyed by ``PATH``, not by working directory, so it never holds a pair whose
look-up depended on the directory (``fixed``): a ``PATH`` with a relative entry (or one
that leads to a relative runtime) is resolved by Python on every call, as in every
directory the look-up then finds what ``find_runtime`` finds there; the front takes only
an absolute runtime from the file.
"""

from __future__ import annotations

import os

from nvshim import __version__
from nvshim.defaults import DEFAULT_CONFIG
from nvshim.runtime import FRONT_CACHE
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


def _pairs(lines: list[str]) -> list[list[str]]:
    return [lines[i : i + 2] for i in range(0, len(lines) - 1, 2)]


def _trusted_pairs(entry: str, head: list[str], triggers: list[str], config_mtime: int | None):
    """The (PATH, runtime) pairs of the entry on disk, when it was written for this
    configuration (same head and triggers, newer than the configuration file: every pair
    in it was then resolved with the file as it is), and whether every shell's ``-nt``
    sees it newer (some compare whole seconds). An entry we cannot trust is removed
    (never inherit its owner or mode)."""
    from nvshim.trusted import read_trusted

    raw = read_trusted(entry, 1 << 16)
    if raw is None:
        try:
            os.unlink(entry)
        except OSError:
            pass
        return [], False
    lines = raw.decode("utf-8", "surrogateescape").split("\n")[:-1]
    if lines[: len(head)] != head or "" not in lines[len(head) :]:
        return [], False
    end = lines.index("", len(head))
    if lines[end + 1 :] != triggers:
        return [], False
    settled = True
    if config_mtime is not None:
        try:
            mtime = os.stat(entry).st_mtime_ns
        except OSError:
            return [], False
        if mtime <= config_mtime:
            return [], False
        settled = mtime // 10**9 > config_mtime // 10**9
    return _pairs(lines[len(head) : end]), settled


def fixed(path: str, runtime: str) -> bool:
    """Whether the runtime found with ``path`` is the same in every working directory:
    an absolute runtime, and no relative entry in ``path`` (an empty one is skipped).
    An empty ``path`` has no pair either (an empty line ends the pairs)."""
    return (runtime.startswith("/") and path != ""
            and all(d.startswith("/") for d in path.split(":") if d))  # fmt: skip


def resolve_and_remember(found=None) -> str:
    """Resolve the low-level runtime from the configuration and bring the front's cache up
    to date (unless the configuration changed meanwhile). Raises NvshimError when none is
    found. ``found``: (configuration, runtime) this call already loaded and resolved; the
    runtime is taken when the configuration loaded again is that one (the same text)."""
    from nvshim.config import load_config
    from nvshim.policy.request import request_triggers
    from nvshim.runtime.lowlevel import runtime_for

    path = config_file()
    before = _identity(path)
    config = load_config()  # read after `before`: an edit from now on misses the entry
    runtime = found[1] if found is not None and found[0] is config else runtime_for(config)
    triggers = list(request_triggers(config.policy))
    status = "missing" if before is None else "present"
    head = [f"nvshim {__version__}", path, status]
    mine = [os.environ.get("PATH", ""), runtime]
    if any("\n" in v for v in (*head, *triggers, *mine)) or not all(triggers):
        return runtime
    entry = entry_file()
    from nvshim.trusted import cache_dir_trusted

    if not cache_dir_trusted():  # a directory others could change: no cache (the front
        return runtime  # starts Python for every call)
    pairs, settled = _trusted_pairs(entry, head, triggers, None if before is None else before[2])
    # one (PATH, runtime) pair per caller's PATH (engines differ), the newest first; none
    # for a look-up that depends on the directory (the head and triggers still serve)
    ours = [mine] if fixed(*mine) else []
    if settled and (mine in pairs or not ours) and all(fixed(*p) for p in pairs):
        return runtime
    pairs = [*ours, *(p for p in pairs if p[0] != mine[0] and fixed(*p))][:MAX_PATHS]
    text = "".join(f"{v}\n" for v in [*head, *(v for pair in pairs for v in pair), "", *triggers])
    from nvshim.filecache import write_entry

    write_entry(entry, text.encode("utf-8", "surrogateescape"))
    if _identity(path) != before:  # edited while we read it: the entry may be stale
        try:
            os.unlink(entry)
        except OSError:
            pass
    return runtime


def resolve(config=None, runtime: str | None = None) -> str:
    """The low-level runtime for a call that reached Python (``config``: the one loaded
    for it, else loaded here; ``runtime``: the one already found for it, if any). On the
    way the sh front's cache is brought up to date: after one create through Python, the
    front decides alone whether the next one may ask for a GPU."""
    if config is None:
        return resolve_and_remember()
    if runtime is None:
        from nvshim.runtime.lowlevel import runtime_for

        runtime = runtime_for(config)
    from nvshim.errors import NvshimError

    try:  # reads the configuration again, after noting its identity (a cheap cache hit)
        resolve_and_remember((config, runtime))
    except NvshimError:
        pass
    return runtime
