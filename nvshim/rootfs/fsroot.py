"""fd-based work inside a container root filesystem, which is hostile input.

Every path is resolved by the kernel relative to an open root descriptor with
``openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)``: symlinks (absolute or with ``..``)
cannot leave the root and procfs magic links are refused. Where openat2 is missing
(ENOSYS) a component-by-component ``O_PATH | O_NOFOLLOW`` walk gives the same meaning.
Work then happens on the parent directory's descriptor (``mkdirat``, ``symlinkat``,
``mknodat``, ``renameat``): a path is never resolved once and used again later.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat

from nvshim.rootfs import kernel

TYPE_CHECKING = False  # typing costs ~5 ms at import, per container
if TYPE_CHECKING:
    from collections.abc import Callable

RESOLVE = kernel.RESOLVE_IN_ROOT | kernel.RESOLVE_NO_MAGICLINKS
MAX_PATH = 4096
_MAX_LINKS = 40
_RETRIES = 16

# None: not tried yet; False: the kernel has no openat2 (ENOSYS), use the walk.
_openat2_works: bool | None = None


class RootPathError(ValueError):
    """A container path that cannot be used (not absolute, NUL byte, too long, no name)."""


def normalize(path: str) -> str:
    """``path`` as a clean absolute container path (lexical; symlinks are the kernel's job)."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise RootPathError(f"{path!r}: not an absolute container path")
    if "\0" in path or len(path) > MAX_PATH:
        raise RootPathError(f"{path[:80]!r}: invalid container path")
    return posixpath.normpath("/" + path.lstrip("/"))


def _relative(path: str) -> str:
    return normalize(path).lstrip("/") or "."


def open_in_root(root_fd: int, path: str, flags: int, mode: int = 0) -> int:
    """Open ``path`` (container path) inside the root ``root_fd`` and return the fd."""
    global _openat2_works
    rel = _relative(path)
    flags |= os.O_CLOEXEC
    if not flags & (os.O_CREAT | os.O_TMPFILE):
        mode = 0
    if _openat2_works is not False:
        for _ in range(_RETRIES):
            try:
                fd = kernel.openat2(root_fd, rel, flags, mode, RESOLVE)
            except OSError as err:
                if err.errno == errno.EAGAIN:  # a concurrent rename; the kernel asks to retry
                    continue
                if err.errno == errno.ENOSYS:
                    _openat2_works = False
                    break
                _openat2_works = True
                raise OSError(err.errno, os.strerror(err.errno), path) from None
            _openat2_works = True
            return fd
        else:
            raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN), path)
    return _walk(root_fd, rel, flags, mode, path)


def _walk(root_fd: int, rel: str, flags: int, mode: int, shown: str) -> int:
    """openat2(RESOLVE_IN_ROOT) done by hand: each component opened with O_NOFOLLOW,
    symlinks read and re-resolved from the root, ``..`` never above the root."""
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    stack: list[int] = []  # opened directories below the root
    links = 0

    def here() -> int:
        return stack[-1] if stack else root_fd

    try:
        while True:
            if not parts:
                return os.dup(here()) if flags & os.O_PATH else _reopen_dir(here(), flags)
            part = parts.pop(0)
            if part == "..":
                if stack:
                    os.close(stack.pop())
                continue
            last = not parts
            follow = not (last and flags & (os.O_NOFOLLOW | os.O_EXCL))
            try:
                probe = os.open(part, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=here())
            except FileNotFoundError:
                if last and flags & os.O_CREAT:
                    return os.open(part, flags | os.O_NOFOLLOW, mode, dir_fd=here())
                raise
            st = os.fstat(probe)
            if stat.S_ISLNK(st.st_mode) and follow:
                target = os.readlink(part, dir_fd=here())
                os.close(probe)
                links += 1
                if links > _MAX_LINKS:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), shown)
                if target.startswith("/"):
                    while stack:
                        os.close(stack.pop())
                parts[:0] = [p for p in target.split("/") if p not in ("", ".")]
                continue
            if not last:
                if not stat.S_ISDIR(st.st_mode):
                    os.close(probe)
                    raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), shown)
                stack.append(probe)
                continue
            if flags & os.O_PATH:
                if flags & os.O_DIRECTORY and not stat.S_ISDIR(st.st_mode):
                    os.close(probe)
                    raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), shown)
                return probe
            os.close(probe)
            # O_NOFOLLOW: a swap to a symlink since the probe fails (ELOOP) instead of following.
            return os.open(part, flags | os.O_NOFOLLOW, mode, dir_fd=here())
    finally:
        for fd in stack:
            os.close(fd)


def _reopen_dir(dir_fd: int, flags: int) -> int:
    return os.open(".", flags & ~(os.O_CREAT | os.O_EXCL), dir_fd=dir_fd)


class RootFS:
    """An open container root; every method takes container paths and stays inside it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> RootFS:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def open(self, path: str, flags: int, mode: int = 0) -> int:
        """Open ``path`` inside the root (symlinks followed, but only within it)."""
        return open_in_root(self.fd, path, flags, mode)

    def stat(self, path: str) -> os.stat_result:
        """``fstat`` of ``path`` inside the root through an ``O_PATH`` open, which never
        blocks on a FIFO nor opens a device; errors as ``open``."""
        fd = self.open(path, os.O_PATH)
        try:
            return os.fstat(fd)
        finally:
            os.close(fd)

    def open_dir(self, path: str, create: bool = False, mode: int = 0o755, _links: int = 0) -> int:
        """An O_PATH fd of directory ``path``; with ``create``, missing ones are made
        component by component (``mkdirat`` on the parent's fd). A dangling symlink on
        the way is followed inside the root: its target is created there."""
        path = normalize(path)
        for _ in range(_RETRIES):
            try:
                return self.open(path, os.O_PATH | os.O_DIRECTORY)
            except FileNotFoundError:
                if not create or path == "/":
                    raise
            parent, name = posixpath.split(path)
            pfd = self.open_dir(parent, create=True, mode=mode, _links=_links)
            try:
                os.mkdir(name, mode, dir_fd=pfd)
                continue
            except FileExistsError:
                try:
                    target = os.readlink(name, dir_fd=pfd)
                except OSError:
                    continue  # made meanwhile: the next open decides
            finally:
                os.close(pfd)
            if _links >= _MAX_LINKS:
                break
            return self.open_dir(posixpath.join(parent, target), create, mode, _links + 1)
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)

    def parent(self, path: str, create: bool = True) -> tuple[int, str]:
        """(O_PATH fd of the parent directory, final name) of ``path``."""
        path = normalize(path)
        parent, name = posixpath.split(path)
        if not name:
            raise RootPathError(f"{path}: has no file name")
        return self.open_dir(parent, create=create), name

    def read(self, path: str, limit: int) -> bytes | None:
        """The content of regular file ``path`` (at most ``limit`` bytes), None if absent.

        The file is identified with an O_PATH open first so that FIFOs and device nodes
        are refused without being opened.
        """
        try:
            want = self.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        if not stat.S_ISREG(want.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        if want.st_size > limit:
            raise OSError(errno.EFBIG, f"larger than {limit} bytes", path)
        fd = self.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
        try:
            got = os.fstat(fd)
            if (got.st_dev, got.st_ino) != (want.st_dev, want.st_ino):
                raise OSError(errno.EAGAIN, "file replaced while opening", path)
            chunks, size = [], 0
            while size <= limit:
                chunk = os.read(fd, min(1 << 20, limit + 1 - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
        finally:
            os.close(fd)
        if size > limit:
            raise OSError(errno.EFBIG, f"larger than {limit} bytes", path)
        return b"".join(chunks)

    def holds(self, path: str, data: bytes, mode: int = 0o644) -> bool:
        """True when regular file ``path`` holds exactly ``data``, with ``mode``: what
        ``write_file`` would write is there already (a restart of the container)."""
        try:
            if self.read(path, len(data)) != data:
                return False
            return stat.S_IMODE(self.stat(path).st_mode) == mode
        except (OSError, RootPathError):
            return False

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        """Replace (or create) regular file ``path`` atomically: a temp file in the
        parent's fd, then renameat. A symlink at ``path`` is replaced, never followed.

        Not fsynced: what the finishing steps write into a container's root is made
        again at every ``create`` of it, and a file a crash left empty or short is read
        as garbage and rebuilt then (an fsync on a node's disk costs milliseconds per
        file, and a burst of creates queues them on one journal)."""

        def make(pfd: int, tmp: str) -> None:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(tmp, flags, mode, dir_fd=pfd)
            try:
                os.fchmod(fd, mode)
                if os.write(fd, data) != len(data):
                    raise OSError(errno.ENOSPC, "short write", path)
            finally:
                os.close(fd)

        self._swap_in(path, make)

    def replace_symlink(self, target: str, link: str) -> None:
        """Make ``link`` a symlink to ``target`` atomically, whatever file was there
        (never followed); a directory there is an error (EISDIR)."""
        self._swap_in(link, lambda pfd, tmp: os.symlink(target, tmp, dir_fd=pfd))

    def _swap_in(self, path: str, make: Callable[[int, str], None]) -> None:
        """``make(parent fd, temp name)`` beside ``path``, then renameat over it."""
        pfd, name = self.parent(path)
        tmp = f".{name}.nvshim-{os.getpid()}.tmp"
        try:
            try:
                os.unlink(tmp, dir_fd=pfd)
            except FileNotFoundError:
                pass
            make(pfd, tmp)
            try:
                os.rename(tmp, name, src_dir_fd=pfd, dst_dir_fd=pfd)
            except OSError:
                os.unlink(tmp, dir_fd=pfd)
                raise
        finally:
            os.close(pfd)

    def create_exclusive(self, path: str, data: bytes, mode: int = 0o644) -> bool:
        """Create ``path`` with ``data`` unless something is there; True if created."""
        pfd, name = self.parent(path)
        try:
            try:
                fd = os.open(
                    name,
                    os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                    mode,
                    dir_fd=pfd,
                )
            except FileExistsError:
                return False
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
            return True
        finally:
            os.close(pfd)

    @staticmethod
    def close_opened(opened: dict[str, int]) -> None:
        """Close and forget the directories ``parent_in`` kept in ``opened``."""
        while opened:
            os.close(opened.popitem()[1])

    def parent_in(self, path: str, opened: dict[str, int]) -> tuple[int, str]:
        """``parent``, the directory's fd taken from ``opened`` (directory -> O_PATH fd)
        or opened once and kept there: the caller closes them all."""
        path = normalize(path)
        parent, name = posixpath.split(path)
        if parent not in opened:
            opened[parent] = self.parent(path)[0]
        return opened[parent], name

    def symlink(self, target: str, link: str, opened: dict[str, int] | None = None) -> str:
        """Make ``link`` a symlink to ``target`` (the target string is stored, never
        resolved). Returns ``created``, ``exists`` (identical link) or ``kept`` (another
        file is there and is left alone). ``opened``: as for ``parent_in`` (several
        links in one directory: it is opened once)."""
        if opened is not None:
            return self._symlink_at(target, *self.parent_in(link, opened))
        pfd, name = self.parent(link)
        try:
            return self._symlink_at(target, pfd, name)
        finally:
            os.close(pfd)

    @staticmethod
    def _symlink_at(target: str, pfd: int, name: str) -> str:
        try:
            os.symlink(target, name, dir_fd=pfd)
            return "created"
        except FileExistsError:
            pass
        try:
            return "exists" if os.readlink(name, dir_fd=pfd) == target else "kept"
        except OSError:
            return "kept"

    def mknod(
        self, path: str, kind: str, major: int, minor: int, mode: int, uid: int, gid: int
    ) -> str:
        """Create device node ``path``; an existing node with the same type and numbers is
        kept (its owner set), anything else there (not a directory) is replaced."""
        fmt = {"c": stat.S_IFCHR, "u": stat.S_IFCHR, "b": stat.S_IFBLK}.get(kind)
        if fmt is None:
            raise ValueError(f"{path}: unsupported device type {kind!r}")
        rdev = os.makedev(major, minor)
        pfd, name = self.parent(path)
        try:
            outcome = "created"
            try:
                st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            if st is not None:
                if stat.S_IFMT(st.st_mode) == fmt and st.st_rdev == rdev:
                    outcome = "exists"
                elif stat.S_ISDIR(st.st_mode):
                    raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
                else:
                    os.unlink(name, dir_fd=pfd)
                    outcome = "replaced"
            if outcome != "exists":
                old = os.umask(0)
                try:
                    os.mknod(name, fmt | (mode & 0o7777), rdev, dir_fd=pfd)
                finally:
                    os.umask(old)
            os.chown(name, uid, gid, dir_fd=pfd, follow_symlinks=False)
            return outcome
        finally:
            os.close(pfd)

    def mountpoint(self, path: str, directory: bool, opened: dict[str, int] | None = None) -> int:
        """An O_PATH fd of ``path`` ready to be mounted on, created (empty file or
        directory) when missing; its type must match ``directory``. ``opened``: as for
        ``parent_in`` (several mount points in one directory: it is opened once; the
        caller empties it once it mounted a directory, which may hide one of them)."""
        if opened is not None:
            return self._mountpoint_at(path, *self.parent_in(path, opened), directory)
        pfd, name = self.parent(path)
        try:
            return self._mountpoint_at(path, pfd, name, directory)
        finally:
            os.close(pfd)

    def _mountpoint_at(self, path: str, pfd: int, name: str, directory: bool) -> int:
        if directory:
            try:
                os.mkdir(name, 0o755, dir_fd=pfd)
            except FileExistsError:
                pass
        else:
            try:
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                os.close(os.open(name, flags, 0o644, dir_fd=pfd))
            except FileExistsError:
                pass
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=pfd)
        mode = os.fstat(fd).st_mode
        if stat.S_ISLNK(mode):  # the image's link: followed, within the root
            os.close(fd)
            fd = self.open(path, os.O_PATH)
            mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode) != directory:
            os.close(fd)
            raise OSError(errno.ENOTDIR if directory else errno.EISDIR, "wrong file type", path)
        return fd

    def listdir(self, path: str) -> list[str] | None:
        """Names in directory ``path`` (None if absent)."""
        try:
            fd = self.open(path, os.O_RDONLY | os.O_DIRECTORY)
        except (FileNotFoundError, NotADirectoryError):
            return None
        try:
            return os.listdir(fd)
        finally:
            os.close(fd)
