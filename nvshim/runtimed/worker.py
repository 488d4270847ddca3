"""One call served in a worker of nvshim-runtimed: the worker takes on the caller's
stdio, working directory, environment and umask, runs ``nvshim.runtime.main.run`` with
a low-level runtime that the caller runs (``Remote``, ``SlotRemote``), then puts its
own back; and the worker's loop."""

from __future__ import annotations

import io
import os
import select
import socket
import sys
import time
from collections.abc import Callable

from nvshim.defaults import fault_point
from nvshim.errors import NvshimError, one_line
from nvshim.runtime import wire
from nvshim.runtime.lowlevel import LowLevel
from nvshim.runtime.main import run
from nvshim.runtime.slots import (
    ACCEPTED,
    DECLINED,
    DONE,
    DONE_WAIT,
    GO,
    GO_WAIT,
    NO,
    Caller,
    Declined,
    SlotRemote,
    Slots,
    alive,
)
from nvshim.runtimed import say
from nvshim.runtimed.trust import caller_decline_reason, decline_reason, parse_request
from nvshim.trusted import CACHE_DIR, cache_dir_for

RECYCLE = 1000  # calls per worker
# worker -> parent, one pipe: 6-byte records, its pid, one of these, a slot (NO_SLOT)
BUSY, IDLE, FREE, HELD = b"b", b"i", b"f", b"h"  # FREE/HELD: done with the slot, idle
NO_SLOT = 255
DISPATCH = 12  # parent -> worker, its control pipe: slot, pid, nargs (uint32 each)


class Remote(LowLevel):
    """The low-level runtime run by the client on the other end of ``conn``; ``last``
    is called before the answer that ends the call (``nvshim.runtime.slots.SlotRemote``:
    the same for a front that talks through a slot)."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.last: Callable[[], None] = lambda: None
        self.waited = 0.0  # seconds the client's low-level runtime ran

    def exec(self, runtime: str, argv: list[str], keep: list[int] = ()) -> None:
        self.last()
        numbers = wire.counted([str(fd).encode() for fd in keep])
        packet = wire.pack(wire.EXEC, *numbers, *map(wire.encode, [runtime, *argv]))
        socket.send_fds(self.conn, [packet], list(keep))  # the client puts them at these numbers
        return None

    def start(self, runtime: str, argv: list[str], cleanup: list[str]) -> None:
        self.started = time.monotonic()
        args = wire.counted([wire.encode(a) for a in argv])
        self.conn.sendall(wire.pack(wire.SPAWN, wire.encode(runtime), *args,
                                    *map(wire.encode, cleanup)))  # fmt: skip

    def wait(self) -> int:
        try:
            fields = wire.unpack(self.conn.recv(wire.LIMIT))
        except OSError:
            fields = []
        self.waited = time.monotonic() - self.started
        if len(fields) != 2 or fields[0] != wire.STATUS or not fields[1].isdigit():
            raise NvshimError("nvshim-runtime went away while the low-level runtime ran")
        return int(fields[1])

    def exit(self, code: int) -> None:
        self.conn.sendall(wire.pack(wire.EXIT, str(code).encode()))


class Saved:
    """What a worker gives a call (fds 0-2, working directory, environment, umask) and
    takes back afterwards."""

    def __init__(self) -> None:
        self.stdio = [os.dup(n) for n in range(3)]
        self.cwd = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        self.environ = dict(os.environb)
        self.argv = list(sys.argv)
        self.umask = os.umask(0o022)
        os.umask(self.umask)

    def restore(self) -> None:
        _become(self.stdio, self.cwd, self.environ, self.argv)
        os.umask(self.umask)


def _become(stdio: list[int], cwd: int, environ: dict[bytes, bytes], argv: list[str]) -> None:
    """Take on a process's stdio (fds 0-2), working directory, environment and argv: the
    client's for its call, the worker's own after it. ``sys.stdout``/``sys.stderr`` are
    new, so nothing buffered for one call can reach another's."""
    for n, fd in enumerate(stdio):
        os.dup2(fd, n)
    os.fchdir(cwd)
    os.environb.clear()
    os.environb.update(environ)
    sys.argv = list(argv)
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), errors="backslashreplace")
    sys.stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False), errors="backslashreplace", write_through=True
    )


def handle(conn: socket.socket, log_fd: int, verbose: bool = False) -> None:
    """Serve the one call on ``conn`` with the client's stdio, working directory and
    environment (the caller puts the worker's back). ``log_fd``: the daemon's stderr,
    for declines, and with ``verbose`` one line per call."""
    modules, began = set(sys.modules), time.monotonic()
    packet, fds, _, _ = socket.recv_fds(conn, wire.LIMIT, wire.FDS)
    if not packet:  # connected and went: a probe (nvshim doctor)
        return
    try:
        why, umask = decline_reason(conn)
        argv, environ = parse_request(packet) if why is None else ([], {})
        if why is None and len(fds) != wire.FDS:
            why = "no stdio and working directory"
    except ValueError as err:
        why = str(err)
    if why is not None:
        for fd in fds:
            os.close(fd)
        say(log_fd, f"declined: {why}")  # the client does the call itself: slower, say so
        conn.sendall(wire.pack(wire.DECLINE, wire.encode(why)))
        return
    start = (modules, began, "socket")
    _serve(argv, environ, fds, Remote(conn), log_fd, verbose, start, umask)


def handle_slot(
    slots: Slots, k: int, pid: int, nargs: int, log_fd: int, verbose: bool = False
) -> bytes:
    """Serve the call of slot ``k``'s front ``pid`` (``nvshim.runtime.slots``) as
    ``handle`` does; ``FREE`` when the front said it is done, else ``HELD``."""
    modules, began = set(sys.modules), time.monotonic()
    remote, caller = SlotRemote(slots, k), None
    try:
        try:
            caller = Caller(slots, k, pid, nargs, caller_decline_reason)
            environ = caller.environ
            environ.setdefault(b"NVSHIM_CACHE_DIR", os.fsencode(CACHE_DIR))  # as the front's $c
            if cache_dir_for(environ) != CACHE_DIR:
                raise Declined("another cache directory")
        except Declined as err:
            say(log_fd, f"declined: {err}")
            slots.say(k, DECLINED)
            if not alive(pid):  # gone while its request waited
                return FREE
        else:
            slots.say(k, ACCEPTED)
            remote.pidfd, remote.argv = caller.pidfd, caller.argv[1:]
            go = remote.hear(GO_WAIT)
            if go != GO:  # the front gave up waiting (or went): Python does the call
                say(log_fd, f"declined: the front did not wait for slot {k}")
                return FREE if go == NO or go is None and caller.gone() else HELD
            fds, caller.fds = caller.fds, []
            start = (modules, began, f"slot {k}")
            _serve(caller.argv, environ, fds, remote, log_fd, verbose, start, caller.umask)
        return FREE if remote.hear(DONE_WAIT) == DONE else HELD
    finally:
        if caller is not None:
            caller.close()


def _serve(argv, environ, fds, remote, log_fd: int, verbose: bool, start, umask: int) -> None:
    """The call ``argv`` (program first) with the caller's ``environ``, ``fds``
    (stdin, stdout, stderr, working directory; closed here) and ``umask``, answered
    through ``remote``. ``start``: the modules loaded, the time when the call came and
    how (socket, slot K), for the log line."""
    _become(fds[:3], fds[3], environ, argv)  # argv[0]: the runtime lookup skips it
    os.umask(umask)
    for fd in fds:
        os.close(fd)
    modules, began, how = start

    def served() -> None:  # before the last answer: once the client has it, it is done
        if verbose:
            late = sorted(set(sys.modules) - modules)  # preload() missed these: each costs
            ms = (time.monotonic() - began - remote.waited) * 1000
            took = f"{ms:.1f} ms (+ {remote.waited * 1000:.1f} ms in the runtime) by {how}"
            call = " ".join(argv[1:])[:2000]
            say(log_fd, f"{took} served: {call} imports={len(late)} {' '.join(late)}".rstrip())

    remote.last = served
    code = run(argv[1:], remote)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            code = code or 1
    if code is not None:
        served()
        fault_point("answer")
        remote.exit(code)


def worker_loop(
    listener: socket.socket, control: int, status: int, verbose: bool, slots: Slots | None
) -> None:
    """Serve calls (socket connections it accepts, slots the parent hands it on
    ``control``) until the parent closes ``control`` (or dies), ``RECYCLE`` calls were
    served or one failed unexpectedly; report busy (a socket call: the parent knows a
    slot it handed over) and idle on ``status``."""
    saved = Saved()
    log_fd = saved.stdio[2]
    me = os.getpid().to_bytes(4, sys.byteorder)
    poller = select.poll()
    poller.register(listener.fileno(), select.POLLIN)
    poller.register(control, select.POLLIN)
    for _ in range(RECYCLE):
        conn = slot = None
        while conn is None and slot is None:
            events = dict(poller.poll())
            if control in events:
                data = os.read(control, DISPATCH)
                if len(data) != DISPATCH or slots is None:
                    return
                slot = [int.from_bytes(data[i : i + 4], sys.byteorder) for i in (0, 4, 8)]
                break
            try:
                conn, _ = listener.accept()
            except BlockingIOError:
                continue  # another worker took it
        k = slot[0] if slot else NO_SLOT
        if conn is not None:  # a slot's worker is busy from the hand-over (``Pool.dispatch``)
            os.write(status, me + BUSY + bytes([k]))
        end = IDLE
        try:
            if conn is not None:
                with conn:
                    handle(conn, log_fd, verbose)
            else:
                end = handle_slot(slots, *slot, log_fd, verbose)
        except Exception as err:  # noqa: BLE001 - this worker's state is unknown: retire it
            say(log_fd, f"call failed, worker retired: {one_line(err)}")
            return  # the parent answers a slot's front when it reaps this worker
        finally:
            saved.restore()
        os.write(status, me + end + bytes([k]))
