"""Files the installer puts on the host (nvshim's config, the sharing config, the CDI spec)
with the same safety as engine configs (:mod:`nvshim.engines.common`): a lock, the
original kept beside the file, a state record written before the file, atomic writes.
``take_back`` gives the original bytes back (or removes a file nvshim created) unless
someone else changed the file since, in which case it is left alone."""

from __future__ import annotations

import os

from nvshim.engines.common import (
    backup_path,
    commit_file,
    load_state,
    locked,
    make_dirs,
    read_bytes,
    remove_empty_dirs,
    remove_state,
    sha256,
    state_path,
    write_file,
)


def original(path: str) -> bytes | None:
    """The bytes ``path`` had before nvshim first placed it (its current bytes if never)."""
    state = load_state(path)
    if state is None:
        return read_bytes(path)
    return read_bytes(backup_path(path)) if state.original_sha256 is not None else None


def place(path: str, data: bytes) -> str:
    """Write ``data`` at ``path`` (an installer path); return a line saying what changed."""
    created = make_dirs(os.path.dirname(path))  # before the lock file needs the directory
    with locked(path):
        old = read_bytes(path)
        state = load_state(path)
        if old == data and state is not None:
            return f"{path}: unchanged"
        state, _ = commit_file(path, old, data, state, created=created)
    return f"{path}: written" + ("" if state.original_sha256 is None else " (original kept)")


def take_back(path: str) -> str | None:
    """Undo :func:`place` for ``path``; a line saying what happened (None: never placed)."""
    if not os.path.exists(state_path(path)):
        return None  # (and no lock file either: that would create the directory)
    with locked(path):
        state = load_state(path)
        if state is None:
            return None
        now = read_bytes(path)
        if sha256(now) not in (state.written_sha256, state.original_sha256):
            remove_state(path, keep_backup=True)
            return (
                f"{path}: changed by someone else since nvshim wrote it; left as it is"
                f" (the original is in {backup_path(path)})"
            )
        before = read_bytes(backup_path(path)) if state.original_sha256 is not None else None
        if state.original_sha256 is not None and sha256(before) != state.original_sha256:
            remove_state(path, keep_backup=True)
            return f"{path}: its kept original does not match the record; left as it is"
        write_file(path, before)
        remove_state(path)
    if before is None:
        remove_empty_dirs(state.created_dirs)  # after the lock file beside it is gone
    return f"{path}: " + ("original restored" if before is not None else "removed")
