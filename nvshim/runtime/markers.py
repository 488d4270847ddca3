"""Exec markers: ``exec/<container id>`` in the cache directory, one per container
nvshim prepared for a GPU. The sh front (``nvshim.runtime.front``) sends an exec of a
marked container to Python (which sets the enforced variables). When it deletes the
container it removes the marker, except one naming a state root while nvshim-runtimed
keeps its slots: the daemon's sweep removes that one (no ``rm`` process per delete).

A marker holds one line: the low-level runtime's state root (runc's ``--root``, else its
default), when nvshim knows that runtime's layout (``<root>/<id>`` while the container
exists: runc, crun); else it is empty. ``sweep`` (run by ``nvshim-runtimed``) removes a
marker whose container is gone from its root: those the front left to it, and those whose
delete failed or did not come through nvshim-runtime (runc deleted directly, a node
crash), so none pile up. An
empty marker (written by an older nvshim, or for another runtime) is never swept: a wrong
guess at its root would drop a live container's exec enforcement.
"""

from __future__ import annotations

import os
import stat

from nvshim.errors import NvshimError
from nvshim.runtime import MARKER_DIR

MIN_AGE = 60.0  # seconds: a younger marker may belong to a create in flight
MAX_MARKER = 4096  # bytes read from a marker at most


def valid_id(container_id: str) -> bool:
    """Whether ``container_id`` can name a marker (one path component)."""
    return not ("/" in container_id or "\0" in container_id or container_id in ("", ".", ".."))


def state_root(root_flag: str | None, runtime: str) -> str:
    """The state root ``runtime`` keeps its containers in (``<root>/<id>``): its global
    ``--root`` flag, else its default for this user; "" when unknown (another runtime,
    a relative or odd root)."""
    name = os.path.basename(runtime)
    if root_flag is not None:
        root = root_flag if name in ("runc", "crun") else ""
    elif name == "runc" or (name == "crun" and os.geteuid() == 0):
        from nvshim.runtime.execenv import runtime_root

        root = runtime_root(name, None)
    else:
        root = ""
    if not root.startswith("/") or "\n" in root or "\0" in root or len(root) >= MAX_MARKER:
        return ""
    return root


def mark_prepared(cache_dir: str, container_id: str, root: str = "", prepared: bool = True) -> None:
    """Leave a marker holding ``root`` (or, for a container asking for no GPU, remove a
    stale one). Written atomically, with the caller's umask. Without it an exec would
    escape the enforcement, so failing to write it fails the create (NvshimError)."""
    from nvshim.trusted import cache_dir_trusted

    if not valid_id(container_id) or not cache_dir_trusted(cache_dir):
        return  # in a directory others could change the front trusts nothing: no marker
    directory = os.path.join(cache_dir, MARKER_DIR)
    path = os.path.join(directory, container_id)
    if not prepared:
        try:
            os.unlink(path)
        except OSError:
            pass
        return
    from nvshim.fsutil import atomic_write

    mask = os.umask(0o022)
    os.umask(mask)
    try:
        os.makedirs(directory, mode=0o755, exist_ok=True)
        data = f"{root}\n".encode("utf-8", "surrogateescape") if root else b""
        atomic_write(path, data, 0o644 & ~mask, keep_owner=False, durable=False)
    except OSError as err:
        raise NvshimError(f"{directory}: cannot write the exec marker: {err.strerror}") from None


def read_root(path: str) -> str | None:
    """The state root a marker holds: None when it is not a regular file of this user's
    (no symlink followed, no FIFO opened blocking) of at most ``MAX_MARKER`` bytes; ""
    when it names none (empty, or not one absolute path)."""
    from nvshim.trusted import read_trusted

    raw = read_trusted(path, MAX_MARKER)
    if raw is None:
        return None
    text = raw.decode("utf-8", "surrogateescape")
    if not text.endswith("\n") or "\n" in text[:-1] or "\0" in text:
        return ""
    root = text[:-1]
    return root if root.startswith("/") else ""


def container_gone(root: str, container_id: str) -> bool:
    """Whether ``<root>/<id>`` no longer exists while ``root`` is a directory (a root that
    is missing, or cannot be looked at, proves nothing)."""
    try:
        if not stat.S_ISDIR(os.stat(root).st_mode):
            return False
    except OSError:
        return False
    try:
        os.lstat(os.path.join(root, container_id))
    except FileNotFoundError:
        return True
    except OSError:
        pass
    return False


def stale_markers(cache_dir: str, now: float, min_age: float = MIN_AGE):
    """The markers whose container is gone: ``(id, root, lstat)`` for each marker at
    least ``min_age`` seconds old that names a root in which ``<root>/<id>`` is missing;
    and the ids of markers that name no root (kept)."""
    directory = os.path.join(cache_dir, MARKER_DIR)
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return [], []
    stale, unknown = [], []
    for name in names:
        path = os.path.join(directory, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode) or not valid_id(name):
            continue
        root = read_root(path)
        if root == "":
            unknown.append(name)
        elif root is not None and now - st.st_mtime >= min_age and container_gone(root, name):
            stale.append((name, root, st))
    return stale, unknown


def sweep(cache_dir: str, now: float, min_age: float = MIN_AGE) -> list[tuple[str, str]]:
    """Remove the markers whose container is gone (``stale_markers``); ``(id, root)`` of
    each removed. A marker rewritten meanwhile (a create of that id) is kept."""
    removed = []
    for name, root, st in stale_markers(cache_dir, now, min_age)[0]:
        path = os.path.join(cache_dir, MARKER_DIR, name)
        try:
            again = os.lstat(path)
            if (again.st_ino, again.st_mtime_ns) != (st.st_ino, st.st_mtime_ns):
                continue
            os.unlink(path)
        except OSError:
            continue
        removed.append((name, root))
    return removed


def delete_unmarking(cache_dir: str, runtime: str, argv: list[str], container_id: str, lowlevel):
    """A delete of ``container_id`` that reached Python (the front could not classify it,
    or had no runtime for this ``PATH``): for a marked container, run it through
    ``lowlevel`` and remove the marker once it succeeded, as the front does; its exit
    status. None: no marker (the caller execs the runtime)."""
    from nvshim.trusted import cache_dir_trusted

    marker = os.path.join(cache_dir, MARKER_DIR, container_id)
    if not valid_id(container_id) or not cache_dir_trusted(cache_dir):
        return None  # no marker is kept, nor removed, where others could change the path
    if not os.path.lexists(marker):
        return None
    lowlevel.start(runtime, argv, [])
    status = lowlevel.wait()
    if status == 0:
        mark_prepared(cache_dir, container_id, prepared=False)
    return status
