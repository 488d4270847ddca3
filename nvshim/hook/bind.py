"""Bind mounts with the new mount API: a detached clone of the source (``open_tree``),
its flags set while detached (``mount_setattr``), then attached onto an fd of the
target (``move_mount``). No path is resolved at mount time, so nothing can be swapped
under it. Needs Linux 5.12+.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator

from nvshim.errors import NvshimError
from nvshim.hook import kernel

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


@contextlib.contextmanager
def private_file_tree(data: bytes, state_dir: str, name: str) -> Iterator[int]:
    """A detached bind mount (fd) of a new read-only file holding ``data`` that no path
    on the host leads to once the block ends.

    The file lives on a private detached tmpfs; on kernels that cannot clone from a
    detached mount it is written under ``state_dir`` and unlinked when the block ends
    (after the caller attached the clone: an unlinked source cannot be attached).
    """
    global _clone_detached_works
    flags = kernel.OPEN_TREE_CLONE | kernel.OPEN_TREE_CLOEXEC
    if _clone_detached_works:
        tmpfs = kernel.private_tmpfs()
        try:
            _write_new(tmpfs, "file", data)
            tree = kernel.open_tree(tmpfs, "file", flags)
        except OSError as err:
            if err.errno != errno.EINVAL:
                raise
            _clone_detached_works = False
        else:
            try:
                yield tree
            finally:
                os.close(tree)
            return
        finally:
            os.close(tmpfs)
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    dir_fd = os.open(state_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    tmp = f".{name}.{os.getpid()}"
    try:
        try:
            os.unlink(tmp, dir_fd=dir_fd)  # left by an earlier crash of a same-pid process
        except FileNotFoundError:
            pass
        _write_new(dir_fd, tmp, data)
        try:
            tree = kernel.open_tree(dir_fd, tmp, flags)
            try:
                yield tree
            finally:
                os.close(tree)
        finally:
            os.unlink(tmp, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)


def _write_new(dir_fd: int, name: str, data: bytes) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(name, flags, 0o444, dir_fd=dir_fd)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
