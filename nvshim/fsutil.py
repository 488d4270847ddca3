"""Host-side file helpers: atomic writes with fsync and an optional backup.

Standard library only, and nothing heavy at import: the runtime writes ``config.json``
through here for every GPU container.
"""

from __future__ import annotations

import os


def file_identity(path: str | int) -> tuple[int, int] | None:
    """``(st_dev, st_ino)`` of ``path`` (or of an open fd), None when it cannot be
    stat'ed: whether two names, or a name now and earlier, are the same file."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def write_new_at(dir_fd: int, name: str, data: bytes, mode: int) -> None:
    """Write ``data`` to a new file ``name`` in directory ``dir_fd`` (``O_EXCL``, no
    symlink followed), after removing one left there by a crash of a same-pid process."""
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(name, flags, mode, dir_fd=dir_fd)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _temp_file(directory: str, name: str) -> tuple[int, str]:
    """A new file beside the target (``O_EXCL``, mode 0600), as ``(fd, path)``."""
    for _ in range(100):
        tmp = os.path.join(directory, f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            return os.open(tmp, flags, 0o600), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"{directory}: no free temporary name for {name}")


def remove_temp_files(path: str) -> list[str]:
    """Remove the temporary files :func:`atomic_write` leaves beside ``path`` when it is
    killed mid-write; only call it while holding the lock every writer of ``path`` takes.
    Returns the paths removed."""
    directory = os.path.dirname(os.path.abspath(path)) or "."
    head = f".{os.path.basename(path)}."
    removed = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return removed
    for name in names:
        if name.startswith(head) and name.endswith(".tmp"):
            middle = name[len(head) : -len(".tmp")].split(".")
            if len(middle) == 2 and middle[0].isdigit():
                try:
                    os.unlink(os.path.join(directory, name))
                    removed.append(os.path.join(directory, name))
                except FileNotFoundError:
                    pass
    return removed


def atomic_write(
    path: str,
    data: bytes,
    mode: int | None = None,
    keep_owner: bool = True,
    durable: bool = True,
) -> None:
    """Replace ``path`` with ``data`` atomically (temp file in the same dir, fsync, rename).

    The original's mode and owner are kept unless ``mode`` is given. Backups are the
    caller's (an engine config's: ``nvshim.engines.common.write_backup``, through here).
    ``durable=False`` skips the fsyncs, for files that do not outlive a reboot (a
    bundle's ``config.json``, caches under ``/run``): the rename is still atomic.
    A failed write leaves ``path`` as it was, and no temporary file; its OSError names
    ``path`` (not the temporary file that could not be written).
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    try:
        _replace(path, data, mode, st, keep_owner, durable)
    except OSError as err:
        if err.errno is not None and err.filename != path:
            raise OSError(err.errno, err.strerror, path) from None  # not the temporary's
        raise


def _replace(path: str, data: bytes, mode: int | None, st, keep_owner: bool, durable: bool):
    """Write ``data`` to a temporary file beside ``path``, then rename it over ``path``."""
    directory = os.path.dirname(os.path.abspath(path)) or "."
    fd, tmp = _temp_file(directory, os.path.basename(path))
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
            if durable:
                os.fsync(fh.fileno())
        os.rename(tmp, path)
    except BaseException:
        _unlink(tmp)
        raise
    if durable:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


TREE_DEPTH = 64  # directory levels remove_tree goes down (deeper ones stay)


def remove_tree(top: str) -> None:
    """Remove ``top`` and what it holds through directory fds, never following a symlink
    nor resolving a path below ``top`` again (a container writes in its MPS pipe
    directory: a directory there swapped for a symlink to a host directory had that
    directory's files removed), never crossing into a mount point (an MPS daemon's
    ``/dev/shm`` that failed to unmount stays, with the directories above it)."""
    parent = os.open(os.path.dirname(top), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _remove_at(parent, os.path.basename(top), TREE_DEPTH)
    finally:
        os.close(parent)


def empty_dir(path: str) -> None:
    """Remove what directory ``path`` (no symlink) holds as :func:`remove_tree` does,
    keeping the directory itself (its inode: what bind mounts of it show)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for name in os.listdir(fd):
            _remove_at(fd, name, TREE_DEPTH)
    finally:
        os.close(fd)


def _remove_at(dir_fd: int, name: str, depth: int) -> None:
    """Remove ``name`` in directory ``dir_fd``: a directory on the same file system with
    what it holds (``depth`` levels), anything else (a symlink too) by unlinking it."""
    import errno

    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError as err:
        if err.errno in (errno.ENOTDIR, errno.ELOOP):
            try:
                os.unlink(name, dir_fd=dir_fd)
            except OSError:
                pass
        return
    try:
        if depth <= 0 or os.fstat(fd).st_dev != os.fstat(dir_fd).st_dev:
            return  # a mount point, or too deep: kept
        for entry in os.listdir(fd):
            _remove_at(fd, entry, depth - 1)
    finally:
        os.close(fd)
    try:
        os.rmdir(name, dir_fd=dir_fd)  # a symlink swapped in meanwhile: ENOTDIR, kept
    except OSError:
        pass
