"""Host-side file helpers: atomic writes with fsync and an optional backup."""

from __future__ import annotations

import os
import shutil
import tempfile


def atomic_write(
    path: str,
    data: bytes,
    mode: int | None = None,
    backup: bool = True,
    keep_owner: bool = True,
) -> str | None:
    """Replace ``path`` with ``data`` atomically (temp file in the same dir, fsync, rename).

    The original's mode and owner are kept unless ``mode`` is given. With ``backup``, an
    existing original is copied to ``path + ".nvshim.bak"`` first; its path is returned.
    """
    directory = os.path.dirname(os.path.abspath(path)) or "."
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    backup_path = None
    if backup and st is not None:
        backup_path = path + ".nvshim.bak"
        shutil.copy2(path, backup_path)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            if mode is not None:
                os.fchmod(fh.fileno(), mode)
            elif st is not None:
                os.fchmod(fh.fileno(), st.st_mode & 0o7777)
            else:
                os.fchmod(fh.fileno(), 0o644)
            if keep_owner and st is not None:
                try:
                    os.fchown(fh.fileno(), st.st_uid, st.st_gid)
                except PermissionError:
                    pass
            os.fsync(fh.fileno())
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return backup_path
