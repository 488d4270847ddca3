"""Finishing a container whose root is read-only (``"root": {"readonly": true}``, what
``readOnlyRootFilesystem`` and ``--read-only`` ask for).

runc remounts the root read-only at the end of ``create``: hooks run before that, but
nvshim-runtime's own finishing steps (``nvshim.hook.steps``, run after ``runc create``)
find it read-only. ``while_writable`` runs them with the root's mount made writable
and makes it read-only again before it returns, whatever happened; if that fails the
caller fails, and nvshim-runtime deletes the container. The container's process is
still waiting for ``start`` meanwhile, so it never sees the window. Only the mount's
flag changes (``mount_setattr``, else a bind remount keeping its other flags): a file
system that is itself read-only, or a read-only flag another user namespace locked,
gives one clear error instead.
"""

from __future__ import annotations

import errno
import os

from nvshim.defaults import fault_point
from nvshim.errors import NvshimError, one_line
from nvshim.rootfs import kernel

TYPE_CHECKING = False  # typing costs ~5 ms at import, per container
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

# statvfs f_flag bits a bind remount must carry over, and the MS_ flag for each
_KEPT = (
    (os.ST_NOSUID, kernel.MS_NOSUID),
    (os.ST_NODEV, kernel.MS_NODEV),
    (os.ST_NOEXEC, kernel.MS_NOEXEC),
    (os.ST_NOATIME, kernel.MS_NOATIME),
    (os.ST_NODIRATIME, kernel.MS_NODIRATIME),
    (os.ST_RELATIME, kernel.MS_RELATIME),
)


def is_readonly(fd: int) -> bool:
    """True when the mount (or file system) of ``fd`` is read-only."""
    return bool(os.fstatvfs(fd).f_flag & os.ST_RDONLY)


def _remount_flags(fd: int, readonly: bool) -> int:
    """MS_REMOUNT|MS_BIND flags that keep the mount's other flags and set ``readonly``."""
    have = os.fstatvfs(fd).f_flag
    flags = kernel.MS_REMOUNT | kernel.MS_BIND | (kernel.MS_RDONLY if readonly else 0)
    for st_flag, ms_flag in _KEPT:
        if have & st_flag:
            flags |= ms_flag
    if not have & (os.ST_NOATIME | os.ST_RELATIME):
        flags |= kernel.MS_STRICTATIME  # else the remount would make it relatime
    return flags


def set_readonly(fd: int, path: str, readonly: bool) -> None:
    """Make the mount whose root is ``fd`` (named ``path`` in this thread's namespace)
    read-only or writable; OSError from the kernel."""
    try:
        if readonly:
            kernel.mount_setattr(fd, kernel.MOUNT_ATTR_RDONLY)
        else:
            kernel.mount_setattr(fd, 0, kernel.MOUNT_ATTR_RDONLY)
        return
    except OSError as err:
        if err.errno != errno.ENOSYS:  # Linux before 5.12: remount it
            raise
    kernel.mount(None, path, None, _remount_flags(fd, readonly))


def while_writable(fd: int, path: str, shown: str, fn: Callable[[], Any]) -> Any:
    """``fn()`` with the read-only root ``fd`` (at ``path`` here, ``shown`` in messages)
    made writable for its duration; a writable root is left alone. Raises NvshimError
    when the root cannot be made writable, or read-only again (the caller must then
    not hand the container out)."""
    if not is_readonly(fd):
        return fn()
    try:
        set_readonly(fd, path, False)
    except OSError as err:
        if err.errno == errno.EPERM:
            raise NvshimError(
                f"{shown}: the container's read-only root is locked by another user "
                "namespace; nvshim cannot write its files, links and ld cache into it"
            ) from None
        raise NvshimError(f"{shown}: cannot make the read-only root writable: {err}") from None
    failure = None
    try:
        if is_readonly(fd):
            raise NvshimError(
                f"{shown}: the container root's file system is itself read-only; "
                "nvshim cannot write its files, links and ld cache into it"
            )
        fault_point("writable")
        return fn()
    except BaseException as err:
        failure = err
        raise
    finally:
        try:
            set_readonly(fd, path, True)
            if not is_readonly(fd):
                raise OSError(errno.EIO, "still writable")
        except OSError as err:
            first = f"{one_line(failure)}; and " if failure is not None else ""
            raise NvshimError(
                f"{first}{shown}: cannot make the root read-only again: {err}"
            ) from None
