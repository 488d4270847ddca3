"""``nvshim-runtime``'s Python entry point: the calls the sh front sends to Python go to
``nvshim-runtimed`` when it runs, else to ``nvshim.runtime.main`` in this process.

The daemon has every module imported already, so a GPU create costs this interpreter's
start and a few milliseconds of work instead of the start plus ~16 ms of imports. The
daemon only decides and edits: this process keeps running the low-level runtime (as
its child, or exec'd), so the container's init is re-parented to the engine's
subreaper (containerd-shim, conmon) exactly as without the daemon.

The daemon is used only when its socket in the cache directory answers and belongs to
this user; whatever goes wrong before a request is sent (no daemon, a closed stdio fd,
an environment too large for one packet) falls back to the in-process path, as does a
request the daemon declines (another mount namespace, another nvshim). Once sent, a
request is never redone: a daemon that stops answering fails the call, and a container
it had this process create is deleted. Built-in modules only until a fallback.
"""

# no `from __future__ import annotations`: loading __future__ costs 0.1 ms per GPU create
import _socket
import posix
import sys

from nvshim import __file__ as NVSHIM_FILE
from nvshim import __version__
from nvshim.runtime import DAEMON_SOCKET, exit_status, wire
from nvshim.trusted import CACHE_DIR, peer_credentials

TOOL = "nvshim-runtime"
_FD_SPACE = _socket.CMSG_SPACE(4 * 8)  # ancillary room: up to 8 fds in one answer
CONNECT_TIMEOUT = 2.0  # a daemon that does not accept: go in-process
ANSWER_TIMEOUT = 120.0  # kubelet's runtime request timeout is 2 minutes


def main() -> int:
    argv = sys.argv[1:]
    sock = connect(CACHE_DIR + "/" + DAEMON_SOCKET)
    if sock is not None:
        code = served(sock, argv)
        if code is not None:
            return code
    from nvshim.runtime.main import main as in_process

    return in_process(argv)


def abandoned() -> int:
    """The sh front's call that nvshim-runtimed lost after the low-level runtime created
    the container (``sys.argv``: the front, that runtime, the call): delete it, fail."""
    runtime, argv = sys.argv[1], sys.argv[2:]
    from nvshim.runtime.args import parse_runc_args
    from nvshim.runtime.finish import delete_argv

    try:
        cleanup = [runtime, *delete_argv(argv, parse_runc_args(argv))]
    except Exception:  # noqa: BLE001 - the front sent it after runc accepted it
        cleanup = []
    return _lost("no answer", [wire.encode(a) for a in cleanup])


def connect(path: str):
    """A connection to the daemon at ``path`` run by this user, or None."""
    try:
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET | _socket.SOCK_CLOEXEC)
    except OSError:
        return None
    try:
        sock.settimeout(CONNECT_TIMEOUT)
        sock.connect(path)
        if peer_credentials(sock)[1] != posix.geteuid():
            raise OSError("the daemon runs as another user")
        sock.settimeout(ANSWER_TIMEOUT)
    except OSError:
        sock.close()
        return None
    return sock


def request(argv: list[str]) -> bytes:
    """The request packet for ``argv``: this nvshim, the call (after this program's
    name, which the runtime lookup must never return) and this environment."""
    env = [k + b"=" + v for k, v in posix.environ.items()]
    head = [wire.PROTOCOL, wire.encode(__version__), wire.encode(NVSHIM_FILE)]
    call = wire.counted([wire.encode(a) for a in (sys.argv[0], *argv)])
    return wire.pack(wire.REQUEST, *head, *call, *env)


def served(sock, argv: list[str]) -> int | None:
    """The call done by the daemon: its exit status, or None when the daemon could not
    be asked or declined (the caller does it in-process). Execs when told to."""
    try:
        cwd = posix.open(".", posix.O_PATH | posix.O_DIRECTORY | posix.O_CLOEXEC)
    except OSError:
        sock.close()
        return None
    try:
        fds = b"".join(fd.to_bytes(4, sys.byteorder, signed=True) for fd in (0, 1, 2, cwd))
        sock.sendmsg([request(argv)], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
    except OSError:  # a closed stdio fd, a packet over the limit
        sock.close()
        return None
    finally:
        posix.close(cwd)
    try:
        return follow(sock)
    finally:
        sock.close()


def follow(sock) -> int | None:
    """Carry out the daemon's answers until one ends the call."""
    cleanup: list[bytes] = []  # runtime argv that deletes a container this process created
    spawned = False  # from then on the call cannot be handed back
    while True:
        try:
            fields, fds = receive(sock)
        except OSError as err:
            return _lost(f"{err.strerror or err}", cleanup)
        tag = fields[0]
        if tag == wire.EXEC and len(fields) >= 2:
            sock.close()
            return execute(fields[1:], fds)
        elif tag == wire.SPAWN and len(fields) >= 2:
            runtime = fields[1]
            try:
                argv, cleanup = wire.split_counted(fields[2:])
            except ValueError:
                return _lost("a malformed answer", cleanup)
            spawned = True
            status = _run([runtime, *argv])
            cleanup = [runtime, *cleanup] if status == 0 and cleanup else []
            try:
                sock.sendall(wire.pack(wire.STATUS, str(status).encode()))
            except OSError as err:
                return _lost(err.strerror or str(err), cleanup)
        elif tag == wire.EXIT and len(fields) == 2 and fields[1].isdigit():
            return int(fields[1])
        elif tag == wire.DECLINE and not spawned:
            return None
        else:
            return _lost("no answer" if fields == [b""] else "a malformed answer", cleanup)


def receive(sock) -> tuple[list[bytes], list[int]]:
    """One answer: its fields and the fds it carried (close-on-exec)."""
    data, ancillary, _, _ = sock.recvmsg(wire.LIMIT, _FD_SPACE, _socket.MSG_CMSG_CLOEXEC)
    fds = []
    for level, kind, raw in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            fds += [int.from_bytes(raw[i : i + 4], sys.byteorder) for i in range(0, len(raw), 4)]
    return wire.unpack(data), fds


def execute(fields: list[bytes], fds: list[int]) -> int:
    """Put ``fds`` at the numbers the answer names, then exec its runtime argv; 127 (one
    line) when that cannot be done."""
    try:
        numbers, argv = wire.split_counted(fields)
        if not argv or len(numbers) != len(fds) or not all(n.isdigit() for n in numbers):
            raise ValueError("bad exec answer")
        for fd, number in zip(fds, numbers, strict=True):
            posix.dup2(fd, int(number))  # inheritable: runc opens /proc/self/fd/N
        posix.execv(argv[0], argv)
    except ValueError:
        print(f"{TOOL}: error: nvshim-runtimed sent a malformed answer", file=sys.stderr)
    except OSError as err:
        print(f"{TOOL}: error: {wire.decode(argv[0])}: {err.strerror}", file=sys.stderr)
    return 127


def _run(argv: list[bytes]) -> int:
    """Run ``argv`` (this process's stdio and environment) and return its exit status."""
    try:
        pid = posix.posix_spawn(argv[0], argv, posix.environ)
    except OSError as err:
        print(f"{TOOL}: error: {wire.decode(argv[0])}: {err.strerror}", file=sys.stderr)
        return 127
    return exit_status(posix.waitpid(pid, 0)[1])


def _lost(why: str, cleanup: list[bytes]) -> int:
    """The daemon went away mid-call: delete what was created, fail with one line."""
    message = f"{TOOL}: error: nvshim-runtimed stopped answering ({why})"
    if cleanup:
        from nvshim.runtime.lowlevel import spawn_quiet  # rare: the imports are affordable

        try:
            spawn_quiet(cleanup[0], cleanup[1:])
        except OSError:
            pass
        message += "; the container it had created was deleted"
    print(message, file=sys.stderr)
    return 1
