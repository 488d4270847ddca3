"""Bind mounts with the new mount API: a detached clone of the source (``open_tree``),
its flags set while detached (``mount_setattr``), then attached onto an fd of the
target (``move_mount``). No path is resolved at mount time, so nothing can be swapped
under it. Needs Linux 5.12+.
"""

from __future__ import annotations

import errno
import os

from nvshim.errors import NvshimError
from nvshim.fsutil import write_new_at
from nvshim.rootfs import kernel

AT_FDCWD = -100
BASE_ATTRS = kernel.MOUNT_ATTR_NOSUID | kernel.MOUNT_ATTR_NODEV

# False once the kernel refused to clone from a detached tmpfs (older than about 6.15).
_clone_detached_works = True


def attrs_for(options: tuple[str, ...] | list[str]) -> int:
    """Mount attributes for a bind: always nosuid and nodev, read-only unless ``rw`` is
    asked for explicitly, noexec when asked for."""
    attrs = BASE_ATTRS
    if "rw" not in options:
        attrs |= kernel.MOUNT_ATTR_RDONLY
    if "noexec" in options:
        attrs |= kernel.MOUNT_ATTR_NOEXEC
    return attrs


# None: not asked yet; else whether the kernel has mount_setattr (Linux 5.12+), the
# newest of the calls ``attach`` makes
_mount_api: bool | None = None


def mount_api() -> bool:
    """Whether this kernel lets ``attach`` bind a clone, asked once per process: a
    ``mount_setattr`` that changes nothing succeeds where the call exists (or fails
    EBADF on no fd), and fails ENOSYS before Linux 5.12 (EPERM without the privilege, or
    under a seccomp filter that forbids it)."""
    global _mount_api
    if _mount_api is None:
        try:
            kernel.mount_setattr(-1, 0)
            _mount_api = True
        except OSError as err:
            _mount_api = err.errno == errno.EBADF
    return _mount_api


# how runc reads a bind's options: the flag each sets (True) or clears (False), in order
_RUNC_OPTIONS = {
    "ro": (kernel.MOUNT_ATTR_RDONLY, True),
    "rw": (kernel.MOUNT_ATTR_RDONLY, False),
    "nosuid": (kernel.MOUNT_ATTR_NOSUID, True),
    "nodev": (kernel.MOUNT_ATTR_NODEV, True),
    "noexec": (kernel.MOUNT_ATTR_NOEXEC, True),
    "bind": (0, True),
}


def runc_attrs(options: tuple[str, ...] | list[str]) -> int | None:
    """The mount attributes runc gives a bind with ``options`` (read-write unless ``ro``),
    or None when one of them is an option this module does not reproduce (``rbind``,
    propagation, atime and the like: such a mount is left to runc)."""
    attrs = 0
    for option in options:
        if option not in _RUNC_OPTIONS:
            return None
        flag, on = _RUNC_OPTIONS[option]
        attrs = attrs | flag if on else attrs & ~flag
    return attrs


def clone_tree(host_path: str) -> int:
    """A detached bind mount (fd) of host file or directory ``host_path``."""
    try:
        return kernel.open_tree(
            AT_FDCWD, host_path, kernel.OPEN_TREE_CLONE | kernel.OPEN_TREE_CLOEXEC
        )
    except OSError as err:
        raise NvshimError(f"{host_path}: cannot bind-mount: {os.strerror(err.errno)}") from None


def attach(tree_fd: int, target_fd: int, attrs: int, shown: str) -> None:
    """Set ``attrs`` on the detached ``tree_fd`` and mount it on ``target_fd``."""
    try:
        kernel.mount_setattr(tree_fd, attrs)
        kernel.move_mount(tree_fd, target_fd)
    except OSError as err:
        if err.errno == errno.ENOSYS:
            raise NvshimError("the kernel lacks mount_setattr/move_mount (Linux 5.12+)") from None
        raise NvshimError(f"{shown}: cannot mount: {os.strerror(err.errno)}") from None


class private_file_tree:  # noqa: N801 - used as ``with private_file_tree(...) as fd``
    """A detached bind mount (fd) of a new read-only file holding ``data`` that no path
    on the host leads to once the block ends.

    The file lives on a private detached tmpfs; on kernels that cannot clone from a
    detached mount it is written under ``state_dir`` (only where no other user can
    change it: else NvshimError) and unlinked when the block ends (after the caller
    attached the clone: an unlinked source cannot be attached).
    A class rather than ``contextlib``: the hook avoids that import per container.
    """

    def __init__(self, data: bytes, state_dir: str, name: str) -> None:
        self._data, self._state_dir, self._name = data, state_dir, name
        self._fds: list[int] = []  # closed last first
        self._unlink: tuple[int, str] | None = None

    def __enter__(self) -> int:
        try:
            return self._open()
        except BaseException:
            self.__exit__(None, None, None)
            raise

    def _open(self) -> int:
        global _clone_detached_works
        flags = kernel.OPEN_TREE_CLONE | kernel.OPEN_TREE_CLOEXEC
        if _clone_detached_works:
            tmpfs = kernel.private_tmpfs()
            self._fds.append(tmpfs)
            try:
                write_new_at(tmpfs, "file", self._data, 0o444)
                self._fds.append(kernel.open_tree(tmpfs, "file", flags))
                return self._fds[-1]
            except OSError as err:
                if err.errno != errno.EINVAL:
                    raise
                _clone_detached_works = False
        from nvshim.trusted import trusted_dir_fd

        dir_fd = trusted_dir_fd(self._state_dir, f"the hook's {self._name} file")
        self._fds.append(dir_fd)
        tmp = f".{self._name}.{os.getpid()}"
        self._unlink = (dir_fd, tmp)
        write_new_at(dir_fd, tmp, self._data, 0o444)
        self._fds.append(kernel.open_tree(dir_fd, tmp, flags))
        return self._fds[-1]

    def __exit__(self, *exc) -> None:
        while self._fds:
            fd = self._fds.pop()
            if self._unlink is not None and fd == self._unlink[0]:
                try:
                    os.unlink(self._unlink[1], dir_fd=fd)
                except FileNotFoundError:
                    pass
                self._unlink = None
            os.close(fd)
