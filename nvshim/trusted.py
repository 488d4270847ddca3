"""Reading cache files that only we could have written. Built-in modules only
(``posix``): the runtime's pass-through path uses it and does not import ``os``."""

# no `from __future__ import annotations`: loading __future__ costs 0.1 ms per GPU create
import posix
import sys

DEFAULT_CACHE_DIR = "/run/nvshim"  # the cache directory (tmpfs: gone at reboot)


def cache_dir_for(environ) -> str:
    """``NVSHIM_CACHE_DIR`` of ``environ`` (bytes keys and values), if an absolute path
    (the operator's, like ``NVSHIM_CONFIG``), else the default."""
    value = environ.get(b"NVSHIM_CACHE_DIR", b"").decode("utf-8", "surrogateescape")
    return value if value.startswith("/") else DEFAULT_CACHE_DIR


CACHE_DIR = cache_dir_for(posix.environ)
_REGULAR = 0o100000
_DIRECTORY = 0o040000
_TYPE_MASK = 0o170000
_STICKY = 0o1000
_SO_PEERPIDFD = 77  # Linux 6.5; the same number on every architecture but parisc/sparc


class UntrustedDir(Exception):
    """A directory another user could change: ``str()`` is the path, then why."""


def open_trusted_dir(path: str, create: bool = False) -> int:
    """An ``O_PATH`` fd of directory ``path``, walked from ``/`` one component at a
    time (``O_NOFOLLOW``: a symlink anywhere on the way is refused), when no user but
    root and this one can change what the path leads to: every directory above it is
    root's or this user's and not writable by group or others unless sticky (then
    others may add entries there but cannot rename or remove root's: ``/tmp``), and
    ``path`` itself is this user's and not writable by group or others. With
    ``create``, missing directories are made (0755) in the checked ones. Raises
    UntrustedDir (the offending path and why) or OSError."""
    if not path.startswith("/") or any(p in (".", "..") for p in path.split("/")):
        raise UntrustedDir(f"{path}: not an absolute path without . or ..")
    names = [p for p in path.split("/") if p]
    flags = posix.O_PATH | posix.O_DIRECTORY | posix.O_NOFOLLOW | posix.O_CLOEXEC
    fd = posix.open("/", flags)
    here = "/"
    try:
        for i in range(len(names) + 1):
            st = posix.fstat(fd)
            last = i == len(names)
            why = dir_problem(st, last)
            if why:
                raise UntrustedDir(f"{here}: {why}")
            if last:
                return fd
            here = here.rstrip("/") + "/" + names[i]
            try:
                if create:
                    try:
                        posix.mkdir(names[i], 0o755, dir_fd=fd)
                    except FileExistsError:
                        pass
                nfd = posix.open(names[i], flags, dir_fd=fd)
            except OSError as err:
                if err.errno not in (20, 40):  # ENOTDIR, ELOOP: a symlink or another file
                    raise
                st = posix.stat(names[i], dir_fd=fd, follow_symlinks=False)
                link = (st.st_mode & _TYPE_MASK) == 0o120000
                what = "a symbolic link" if link else "not a directory"
                raise UntrustedDir(f"{here}: {what}") from None
            posix.close(fd)
            fd = nfd
    except BaseException:
        posix.close(fd)
        raise
    raise AssertionError("unreachable")  # pragma: no cover


def trusted_dir_fd(path: str, what: str) -> int:
    """A read fd of directory ``path`` (made when missing) that ``open_trusted_dir``
    accepts, for the ``*at`` calls and ``flock`` of a write the user asked for; else
    NvshimError: one line naming the offending directory, why, and ``what`` nvshim was
    to keep there."""
    from nvshim.errors import NvshimError

    try:
        fd = open_trusted_dir(path, create=True)
        try:
            return posix.open(".", posix.O_RDONLY | posix.O_DIRECTORY | posix.O_CLOEXEC, dir_fd=fd)
        finally:
            posix.close(fd)
    except UntrustedDir as err:
        why = f"nvshim keeps {what} only in a directory no other user can change"
        raise NvshimError(f"{err}: {why}") from None
    except OSError as err:
        raise NvshimError(f"{path}: cannot keep {what} there: {err.strerror}") from None


def dir_problem(st, last: bool) -> str:
    """Why a directory with ``st`` cannot be trusted ("" if it can)."""
    if (st.st_mode & _TYPE_MASK) != _DIRECTORY:
        return "not a directory"
    uid = posix.geteuid()
    if st.st_uid != uid and (last or st.st_uid != 0):
        return f"owned by uid {st.st_uid}"
    if st.st_mode & 0o022 and (last or not st.st_mode & _STICKY):
        return f"writable by {'group' if st.st_mode & 0o020 else 'others'}"
    return ""


_trusted: list[str] = []  # cache directories found trusted in this process


def cache_dir_trusted(path: str = "") -> bool:
    """Whether nvshim may keep its caches in ``path`` (``CACHE_DIR`` by default, made
    if missing): ``open_trusted_dir`` accepts it. Once true, true for the life of this process (a
    trusted path can only be changed by root), so a daemon checks it once."""
    path = path or CACHE_DIR
    if path in _trusted:
        return True
    try:
        posix.close(open_trusted_dir(path, create=True))
    except (UntrustedDir, OSError):
        return False
    _trusted.append(path)
    return True


def read_trusted(path: str, limit: int) -> bytes | None:
    """The bytes of ``path`` if it is a regular file (no symlink followed) owned by this
    user and not writable by group or others, and at most ``limit`` bytes; else None."""
    flags = posix.O_RDONLY | posix.O_NOFOLLOW | posix.O_CLOEXEC | posix.O_NONBLOCK
    try:
        fd = posix.open(path, flags)
    except OSError:
        return None
    try:
        st = posix.fstat(fd)
        if (st.st_mode & _TYPE_MASK) != _REGULAR or st.st_uid != posix.geteuid():
            return None
        if st.st_mode & 0o022:
            return None
        chunks, size = [], 0
        while size <= limit:
            chunk = posix.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError:
        return None
    finally:
        posix.close(fd)
    return b"".join(chunks) if size <= limit else None


def peer_credentials(sock) -> tuple[int, int, int]:
    """``(pid, uid, gid)`` of the process at the other end of the connected unix socket
    ``sock`` (``SO_PEERCRED``: the kernel's word, as of ``connect``)."""
    import _socket

    raw = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)
    pid, uid, gid = (int.from_bytes(raw[i : i + 4], sys.byteorder, signed=True) for i in (0, 4, 8))
    return pid, uid, gid


def peer_pidfd(sock) -> int | None:
    """A pidfd of the process that connected the unix socket ``sock`` (``SO_PEERPIDFD``,
    Linux 6.5: the process itself, not a pid that may be reused); None where the kernel
    has none or that process is gone."""
    import _socket

    try:
        raw = sock.getsockopt(_socket.SOL_SOCKET, _SO_PEERPIDFD, 4)
    except OSError:
        return None
    fd = int.from_bytes(raw[:4], sys.byteorder, signed=True)
    return fd if fd >= 0 else None


def pidfd_pid(pidfd: int) -> int | None:
    """The pid of the process behind ``pidfd`` in this pid namespace, from
    ``/proc/self/fdinfo`` (None: exited, or unknown)."""
    try:
        fd = posix.open(f"/proc/self/fdinfo/{pidfd}", posix.O_RDONLY | posix.O_CLOEXEC)
    except OSError:
        return None
    try:
        text = posix.read(fd, 4096)
    finally:
        posix.close(fd)
    for line in text.split(b"\n"):
        if line.startswith(b"Pid:"):
            value = int(line[4:])
            return value if value > 0 else None
    return None
