"""ctypes wrappers for the Linux calls the hook needs that Python 3.11 lacks: openat2,
setns, unshare, mount/umount2 and the new mount API. Standard library only.

System call numbers from 424 on are the same on every architecture nvshim supports
(x86_64, aarch64). Each wrapper raises ``OSError`` with the kernel's errno.
"""

from __future__ import annotations

import ctypes
import os

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long

SYS_OPEN_TREE = 428
SYS_MOVE_MOUNT = 429
SYS_FSOPEN = 430
SYS_FSCONFIG = 431
SYS_FSMOUNT = 432
SYS_OPENAT2 = 437
SYS_CLOSE_RANGE = 436
SYS_MOUNT_SETATTR = 442

RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
RESOLVE_IN_ROOT = 0x10

CLONE_FS = 0x00000200
CLONE_FILES = 0x00000400
CLOSE_RANGE_CLOEXEC = 1 << 2
CLONE_NEWNS = 0x00020000
AT_EMPTY_PATH = 0x1000
AT_RECURSIVE = 0x8000
OPEN_TREE_CLONE = 1
OPEN_TREE_CLOEXEC = os.O_CLOEXEC
MOVE_MOUNT_F_EMPTY_PATH = 0x04
MOVE_MOUNT_T_EMPTY_PATH = 0x40
FSOPEN_CLOEXEC = 1
FSMOUNT_CLOEXEC = 1
FSCONFIG_SET_STRING = 1
FSCONFIG_CMD_CREATE = 6

MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4
MOUNT_ATTR_NOEXEC = 0x8

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_NOATIME = 0x400
MS_NODIRATIME = 0x800
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
MS_STRICTATIME = 1 << 24
MNT_DETACH = 0x2
UMOUNT_NOFOLLOW = 0x8


class _OpenHow(ctypes.Structure):
    _fields_ = [
        ("flags", ctypes.c_uint64),
        ("mode", ctypes.c_uint64),
        ("resolve", ctypes.c_uint64),
    ]


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def _syscall(nr: int, *args) -> int:
    return _libc.syscall(ctypes.c_long(nr), *args)


def _path(path: str | None) -> ctypes.c_char_p:
    return ctypes.c_char_p(None if path is None else os.fsencode(path))


def openat2(dirfd: int, path: str, flags: int, mode: int = 0, resolve: int = 0) -> int:
    """openat2(2): open ``path`` relative to ``dirfd`` under the ``resolve`` restrictions."""
    how = _OpenHow(flags, mode, resolve)
    result = _syscall(
        SYS_OPENAT2,
        ctypes.c_int(dirfd),
        _path(path),
        ctypes.byref(how),
        ctypes.c_size_t(ctypes.sizeof(how)),
    )
    return _check(result, "openat2")


_host_proc: int | None = None


def host_proc() -> int:
    """An fd of the procfs this process sees on first use: call it before ``setns``.
    After entering a container's mount namespace ``/proc`` is the container's, whose pid
    namespace does not hold this process; ``self/...`` under this fd still names it."""
    global _host_proc
    if _host_proc is None:
        _host_proc = os.open("/proc", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    return _host_proc


def setns(fd: int, nstype: int) -> None:
    """Move the calling (single-threaded) process into the namespace ``fd`` refers to."""
    _check(_libc.setns(ctypes.c_int(fd), ctypes.c_int(nstype)), "setns")


def unshare(flags: int) -> None:
    """unshare(2)."""
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")


def close_range(first: int, last: int, flags: int = 0) -> None:
    """close_range(2) (kernel 5.9+; ``CLOSE_RANGE_CLOEXEC`` 5.11+)."""
    result = _syscall(SYS_CLOSE_RANGE, ctypes.c_uint(first), ctypes.c_uint(last),
                      ctypes.c_uint(flags))  # fmt: skip
    _check(result, "close_range")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data=None) -> None:
    """mount(2)."""
    result = _libc.mount(
        _path(source), _path(target), _path(fstype), ctypes.c_ulong(flags), _path(data)
    )
    _check(result, "mount")


def umount2(target: str, flags: int) -> None:
    """umount2(2)."""
    _check(_libc.umount2(_path(target), ctypes.c_int(flags)), "umount2")


def open_tree(dirfd: int, path: str, flags: int) -> int:
    """open_tree(2); with OPEN_TREE_CLONE, a detached copy of the mount at ``path``."""
    return _check(
        _syscall(SYS_OPEN_TREE, ctypes.c_int(dirfd), _path(path), ctypes.c_uint(flags)),
        "open_tree",
    )


def move_mount(from_fd: int, to_fd: int) -> None:
    """Attach the detached mount ``from_fd`` onto the file or directory ``to_fd``."""
    result = _syscall(
        SYS_MOVE_MOUNT,
        ctypes.c_int(from_fd),
        _path(""),
        ctypes.c_int(to_fd),
        _path(""),
        ctypes.c_uint(MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH),
    )
    _check(result, "move_mount")


def mount_setattr(fd: int, attr_set: int, attr_clr: int = 0, recursive: bool = False) -> None:
    """Set (``attr_set``) and clear (``attr_clr``) MOUNT_ATTR_* flags on the mount whose
    root ``fd`` refers to (with ``recursive``, and on every mount below it; kernel 5.12+)."""
    attr = _MountAttr(attr_set, attr_clr, 0, 0)
    result = _syscall(
        SYS_MOUNT_SETATTR,
        ctypes.c_int(fd),
        _path(""),
        ctypes.c_uint(AT_EMPTY_PATH | (AT_RECURSIVE if recursive else 0)),
        ctypes.byref(attr),
        ctypes.c_size_t(ctypes.sizeof(attr)),
    )
    _check(result, "mount_setattr")


def private_tmpfs(size: str = "64k") -> int:
    """A detached tmpfs mount (fd), reachable only through the returned descriptor."""
    fs = _check(_syscall(SYS_FSOPEN, _path("tmpfs"), ctypes.c_uint(FSOPEN_CLOEXEC)), "fsopen")
    try:
        for key, value in (("mode", "0755"), ("size", size)):
            _check(
                _syscall(
                    SYS_FSCONFIG,
                    ctypes.c_int(fs),
                    ctypes.c_uint(FSCONFIG_SET_STRING),
                    _path(key),
                    _path(value),
                    ctypes.c_int(0),
                ),
                "fsconfig",
            )
        _check(
            _syscall(
                SYS_FSCONFIG,
                ctypes.c_int(fs),
                ctypes.c_uint(FSCONFIG_CMD_CREATE),
                _path(None),
                _path(None),
                ctypes.c_int(0),
            ),
            "fsconfig",
        )
        flags = ctypes.c_uint(FSMOUNT_CLOEXEC)
        return _check(_syscall(SYS_FSMOUNT, ctypes.c_int(fs), flags, ctypes.c_uint(0)), "fsmount")
    finally:
        os.close(fs)
