"""Whom nvshim-runtimed serves: a caller pinned by its pidfd, with this daemon's user,
privileges, namespaces and root, the same nvshim and cache directory; and the cache
directory it refuses to serve from."""

from __future__ import annotations

import os
import select
import socket

import nvshim
from nvshim import __version__
from nvshim.errors import NvshimError
from nvshim.fsutil import file_identity
from nvshim.runtime import wire
from nvshim.trusted import CACHE_DIR, cache_dir_for, peer_credentials, peer_pidfd, pidfd_pid

NAMESPACES = ("mnt", "pid", "user")


def decline_reason(conn: socket.socket) -> tuple[str | None, int]:
    """Why the peer of ``conn`` must do its call itself (or None), and its umask. The
    process that connected is pinned by a pidfd (``SO_PEERPIDFD``) and ``/proc/PID`` is
    believed only while that pidfd shows it alive at that pid: a caller that handed its
    connection on and exited is declined, whoever has its pid now. A kernel without
    ``SO_PEERPIDFD`` (before Linux 6.5) cannot pin it: every socket call is declined."""
    pid, uid, _ = peer_credentials(conn)
    pidfd = peer_pidfd(conn)
    if pidfd is None:
        return "the caller cannot be pinned (no SO_PEERPIDFD) or has exited", 0o022
    try:
        if pidfd_pid(pidfd) != pid:
            return f"pid {pid} exited", 0o022
        why, umask = caller_decline_reason(pid, uid)
        if select.select([pidfd], [], [], 0)[0]:  # exited meanwhile: /proc was another's
            return f"pid {pid} exited", 0o022
        return why, umask
    finally:
        os.close(pidfd)


def privileges(pid: int) -> tuple[dict[bytes, bytes], int | None, int | None]:
    """What process ``pid`` may do, from ``/proc/PID/status`` and its LSM label
    (``PRIVILEGES``), its effective uid and its umask (None: unknown)."""
    found: dict[bytes, bytes] = {}
    uid = umask = None
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                name, _, value = line.partition(b":")
                if name in PRIVILEGES:
                    found[name] = value.strip()
                elif name == b"Uid":
                    uid = int(value.split()[1])
                elif name == b"Umask":
                    umask = int(value, 8)
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open(f"/proc/{pid}/attr/current", "rb") as fh:
            found[b"label"] = fh.read(4096).rstrip(b"\0\n")
    except OSError:
        found[b"label"] = b""  # no LSM (EINVAL): the same for every process
    return found, uid, umask


# a caller with other values than the daemon had at start is declined: served, it would
# act with privileges (capabilities, no seccomp filter, another LSM label) it lacks
PRIVILEGES = (b"CapInh", b"CapPrm", b"CapEff", b"CapBnd", b"CapAmb", b"NoNewPrivs", b"Seccomp")
_plain: list[dict[bytes, bytes]] = []  # the daemon's own, read at start
_places: list[tuple] = []  # the daemon's namespaces and root, read at start


def caller_decline_reason(pid: int, uid: int | None = None) -> tuple[str | None, int]:
    """Why process ``pid`` (of ``uid``, else read) must do its call itself (or None),
    and its umask (0o022 if unknown: that reason then declines it)."""
    found, status_uid, umask = privileges(pid)
    uid = status_uid if uid is None else uid
    return _reason(pid, uid, found, umask), 0o022 if umask is None else umask


def _reason(pid: int, uid: int | None, found: dict[bytes, bytes], umask: int | None) -> str | None:
    if uid != os.geteuid():
        return f"uid {uid}"
    if umask is None:
        return "no umask in /proc/PID/status"
    plain = _plain[0] if _plain else privileges(os.getpid())[0]
    for name in (*PRIVILEGES, b"label"):
        if found.get(name) != plain.get(name):
            return f"{name.decode()} {found.get(name, b'?').decode(errors='replace')}"
    places = _places[0] if _places else own_places()
    for ns, own in zip(NAMESPACES, places[:-1], strict=True):
        theirs = file_identity(f"/proc/{pid}/ns/{ns}")
        if theirs is None or theirs != own:  # unreadable: not known to be the same
            return f"another {ns} namespace"
    theirs = file_identity(f"/proc/{pid}/root")
    if theirs is None or theirs != places[-1]:
        return "another root"
    return None


def own_places() -> tuple:
    """This process's namespaces (``NAMESPACES``, in order) and root, by identity."""
    return (*(file_identity(f"/proc/self/ns/{ns}") for ns in NAMESPACES), file_identity("/"))


def parse_request(packet: bytes) -> tuple[list[str], dict[bytes, bytes]]:
    """The call's argv (the client's program name first) and environment. Raises
    ValueError (declined) for a request of another nvshim or a malformed one."""
    fields = wire.unpack(packet)
    if fields[:2] != [wire.REQUEST, wire.PROTOCOL] or len(fields) < 5:
        raise ValueError("not a request of this protocol")
    if fields[2:4] != [wire.encode(__version__), wire.encode(nvshim.__file__)]:
        raise ValueError("another nvshim")
    argv, env = wire.split_counted(fields[4:])
    if not argv:
        raise ValueError("no program name")
    environ = dict(e.split(b"=", 1) for e in env if e.find(b"=") > 0)  # as getenv reads it
    if cache_dir_for(environ) != CACHE_DIR:
        raise ValueError("another cache directory")
    return [wire.decode(a) for a in argv], environ


def remember_own() -> None:
    """Read this daemon's own privileges, namespaces and root (at start): callers must
    have the same."""
    _plain[:] = [privileges(os.getpid())[0]]
    _places[:] = [own_places()]


def check_cache_dir(path: str) -> None:
    """Refuse (NvshimError) a cache directory another user could change
    (``nvshim.trusted.open_trusted_dir``: walked from ``/`` without following a symlink;
    made 0755 when missing), or whose exec marker directory is not this user's real
    directory, unwritable by group and others. The daemon's socket and slots, the
    front's cache and the markers live there; checked once: only root can change a
    directory that passes."""
    from nvshim.runtime import MARKER_DIR
    from nvshim.trusted import UntrustedDir, dir_problem, open_trusted_dir

    why = "nvshim-runtimed serves root's calls only from a cache directory (and the" \
        " directories above it) no other user can change"  # fmt: skip
    try:
        fd = open_trusted_dir(path, create=True)
        try:
            flags = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
            markers = os.open(MARKER_DIR, flags, dir_fd=fd)
        except FileNotFoundError:
            markers = -1  # made by the first GPU create, in a checked directory
        finally:
            os.close(fd)
        if markers >= 0:
            try:
                bad = dir_problem(os.fstat(markers), True)
            finally:
                os.close(markers)
            if bad:
                raise UntrustedDir(f"{os.path.join(path, MARKER_DIR)}: {bad}")
    except UntrustedDir as err:
        raise NvshimError(f"{err}: {why}") from None
    except OSError as err:
        raise NvshimError(f"{path}: cannot check the cache directory: {err.strerror}") from None
