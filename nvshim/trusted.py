"""Reading cache files that only we could have written. Built-in modules only
(``posix``): the runtime's pass-through path uses it and does not import ``os``."""

# no `from __future__ import annotations`: loading __future__ costs 0.1 ms per GPU create
import posix
import sys

DEFAULT_CACHE_DIR = "/run/nvshim"  # where nvshim's caches live (tmpfs: gone at reboot)


def cache_dir_for(environ) -> str:
    """``NVSHIM_CACHE_DIR`` of ``environ`` (bytes keys and values), if an absolute path
    (the operator's, like ``NVSHIM_CONFIG``), else the default."""
    value = environ.get(b"NVSHIM_CACHE_DIR", b"").decode("utf-8", "surrogateescape")
    return value if value.startswith("/") else DEFAULT_CACHE_DIR


CACHE_DIR = cache_dir_for(posix.environ)
_REGULAR = 0o100000
_TYPE_MASK = 0o170000


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
