"""``nvshim-runtimed``: a resident process that does ``nvshim-runtime``'s Python work with
every module already imported, so a GPU create costs a few milliseconds and no
interpreter start (through a slot; through the client one start) instead of a start
plus ~16 ms of imports (``bench/engine_start.py``).

It listens on ``<cache dir>/runtime.sock`` (mode 0600). Worker processes forked from
the warm parent accept the calls; for each, a worker takes on the client's stdio,
working directory and environment, runs ``nvshim.runtime.main.run`` with a ``LowLevel``
that hands the low-level runtime back to the client (exec, or spawn and report its
status), so runc stays the engine's grandchild, then puts its own back. The finishing
steps run in the worker. The parent keeps ``--workers`` alive, adds one whenever all
are busy (up to ``--max-workers``), retires extras idle for ``--idle-timeout``, and kills
a worker busy with one call for ``--call-timeout`` (its client fails the call and
deletes what it created).
Workers are recycled after ``RECYCLE`` calls and after any call that failed
unexpectedly. A worker serves calls one after another because a forked child would
pay copy-on-write faults for every page Python touches (~3 ms a call).

The sh front itself hands it a create or run that may ask for a GPU, through a slot
(``nvshim.runtime.slots``: a claim file and two FIFOs, no interpreter): the parent reads
the slot's request and hands the slot to an idle worker on its control pipe; the worker
takes the caller on from ``/proc`` and answers in lines, with the same code path.

A request is declined (the client does the call in-process, with its own privileges)
unless it comes from this user, with the capability sets, ``no_new_privs``, seccomp
mode and LSM label this process had at start, in its mount, pid and user namespaces
and root, from the same nvshim (version and files) with the same cache directory; and
when every worker is busy and no more may be added for ``QUEUE_WAIT`` seconds (a call
waits that long at most for others'). A served call runs with the caller's umask. The
daemon refuses to start on a cache directory another user could change
(``check_cache_dir``).

At start and every ``--marker-sweep`` seconds the parent removes the exec markers whose
container is gone (``nvshim.runtime.markers.sweep``).
"""

from __future__ import annotations

import gc
import importlib
import io
import os
import pkgutil
import select
import signal
import socket
import sys
import time
from collections.abc import Callable

import nvshim
from nvshim import __version__
from nvshim.errors import NvshimError, one_line
from nvshim.faults import fault_point
from nvshim.fsutil import file_identity
from nvshim.record import field, record
from nvshim.runtime import DAEMON_SOCKET, wire
from nvshim.runtime.lowlevel import LowLevel
from nvshim.runtime.main import run
from nvshim.runtime.slots import (
    ACCEPTED,
    DECLINED,
    DONE,
    DONE_WAIT,
    GO,
    GO_WAIT,
    LOST,
    NO,
    SLOTS,
    STALE_CLAIM,
    Caller,
    Declined,
    SlotRemote,
    Slots,
    alive,
    pidfd_getfd,
    slots_name,
)
from nvshim.trusted import CACHE_DIR, cache_dir_for, peer_credentials, peer_pidfd, pidfd_pid

TOOL = "nvshim-runtimed"
# What calls through nvshim-runtime may import; the CLI, installer, doctor and exporter
# never run there.
PRELOAD_PACKAGES = ("runtime", "hook", "rootfs", "policy", "host", "mps", "oci", "cdi", "pairing")
PRELOAD_MODULES = (
    "config", "edits", "errors", "fastjson", "filecache", "fsutil", "ldcache", "log", "record",
    "trusted",
)  # fmt: skip
# imported inside functions on a call's path: a configuration or inventory cache miss
# (TOML, NVML), an MPS daemon query
PRELOAD_LAZY = ("tomllib", "pynvml", "subprocess")
NAMESPACES = ("mnt", "pid", "user")
RECYCLE = 1000  # calls per worker
# how long a call may wait for a worker when every one is busy and no more may be added
# (below the front's ACK_WAIT): a burst is queued, not sent to a hundred interpreters;
# a call stuck on a hostile image holds its worker, never the queue past this
QUEUE_WAIT = 1.5


@record(frozen=True)
class Limits:
    """The pool's size and timeouts (the command's options)."""

    workers: int = 2  # kept ready
    max_workers: int = 64  # added while all are busy
    idle_timeout: float = 60.0  # an extra worker idle this long is retired
    call_timeout: float = 300.0  # a call busy this long is killed (kubelet gives up at 120 s)
    marker_sweep: float = 60.0  # seconds between sweeps of the exec markers


# worker -> parent, one pipe: 6-byte records, its pid, one of these, a slot (NO_SLOT)
BUSY, IDLE, FREE, HELD = b"b", b"i", b"f", b"h"  # FREE/HELD: done with the slot, idle
NO_SLOT = 255
DISPATCH = 12  # parent -> worker, its control pipe: slot, pid, nargs (uint32 each)


def preload() -> list[str]:
    """Import what a call may need; the modules that failed to import (named)."""
    failed = []
    names = [*PRELOAD_LAZY, *(f"nvshim.{m}" for m in PRELOAD_MODULES)]
    for package in PRELOAD_PACKAGES:
        module = importlib.import_module(f"nvshim.{package}")
        names += [i.name for i in pkgutil.walk_packages(module.__path__, f"nvshim.{package}.")]
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as err:  # noqa: BLE001 - an optional dependency; the call imports it
            failed.append(f"{name} ({one_line(err)})")
    return failed


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
    for ns in NAMESPACES:
        if file_identity(f"/proc/{pid}/ns/{ns}") != file_identity(f"/proc/self/ns/{ns}"):
            return f"another {ns} namespace"
    if file_identity(f"/proc/{pid}/root") != file_identity("/"):
        return "another root"
    return None


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
        _say(log_fd, f"declined: {why}")  # the client does the call itself: slower, say so
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
            _say(log_fd, f"declined: {err}")
            slots.say(k, DECLINED)
            if not alive(pid):  # gone while its request waited
                return FREE
        else:
            slots.say(k, ACCEPTED)
            remote.pidfd, remote.argv = caller.pidfd, caller.argv[1:]
            go = remote.hear(GO_WAIT)
            if go != GO:  # the front gave up waiting (or went): Python does the call
                _say(log_fd, f"declined: the front did not wait for slot {k}")
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
            _say(log_fd, f"{took} served: {call} imports={len(late)} {' '.join(late)}".rstrip())

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


def _say(fd: int, line: str) -> None:
    try:
        os.write(fd, f"{TOOL}: {line}\n".encode(errors="replace"))
    except OSError:  # a log that cannot be written (full, closed) must not fail calls
        pass


def listen(path: str) -> tuple[socket.socket, tuple[int, int]]:
    """A non-blocking socket bound at ``path`` (replaced atomically), mode 0600: the
    listener and the identity of the socket file, to remove it at exit only if it is
    still ours."""
    staging = f"{path}.{os.getpid()}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        if os.path.lexists(staging):
            os.unlink(staging)
        listener.bind(staging)
        os.chmod(staging, 0o600)
        listener.listen(1024)
        listener.setblocking(False)  # workers poll, then race to accept
        identity = file_identity(staging)
        os.rename(staging, path)
    except OSError as err:
        listener.close()
        raise NvshimError(f"{path}: cannot listen: {err.strerror}") from None
    return listener, identity


def worker_loop(
    listener: socket.socket, control: int, status: int, verbose: bool, slots: Slots | None
) -> None:
    """Serve calls (socket connections it accepts, slots the parent hands it on
    ``control``) until the parent closes ``control`` (or dies), ``RECYCLE`` calls were
    served or one failed unexpectedly; report busy/idle on ``status``."""
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
        os.write(status, me + BUSY + bytes([k]))
        end = IDLE
        try:
            if conn is not None:
                with conn:
                    handle(conn, log_fd, verbose)
            else:
                end = handle_slot(slots, *slot, log_fd, verbose)
        except Exception as err:  # noqa: BLE001 - this worker's state is unknown: retire it
            _say(log_fd, f"call failed, worker retired: {one_line(err)}")
            return  # the parent answers a slot's front when it reaps this worker
        finally:
            saved.restore()
        os.write(status, me + end + bytes([k]))


@record
class Worker:
    """The parent's view of one worker."""

    control: int | None  # the pipe whose closing retires it; None once retired
    busy_since: float | None = None  # a call's start, None while idle
    idle_since: float = 0.0
    slots: set[int] = field(default_factory=set)  # handed to it, not done


@record
class Flight:
    """A slot whose front made a request, until the slot is free again."""

    pid: int  # the front's
    nargs: int = 0  # its arguments: the last of its command line
    worker: int | None = None  # the one serving it
    held: bool = False  # answered: free once ``pid`` has exited (unknown: after a while)
    since: float = field(default_factory=time.monotonic)


class Pool:
    """The parent's view of its workers, by pid, and of the slots in flight."""

    def __init__(
        self, listener: socket.socket, verbose: bool, limits: Limits, slots: Slots | None = None
    ) -> None:
        self.listener, self.verbose, self.limits, self.slots = listener, verbose, limits, slots
        self.status_r, self.status_w = os.pipe2(os.O_CLOEXEC)
        self.workers: dict[int, Worker] = {}
        self.flights: dict[int, Flight] = {}  # by slot
        self.pending: list[int] = []  # slots waiting for a worker
        self.swept = 0.0
        self.full_since: float | None = None  # when every worker became busy

    def spawn(self) -> None:
        control_r, control_w = os.pipe2(os.O_CLOEXEC)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
                    signal.signal(sig, signal.SIG_DFL)
                signal.set_wakeup_fd(-1)
                os.close(self.status_r)
                for other in self.workers.values():
                    if other.control is not None:
                        os.close(other.control)
                os.close(control_w)
                worker_loop(self.listener, control_r, self.status_w, self.verbose, self.slots)
            except BaseException as err:  # noqa: BLE001 - reported, the parent replaces it
                code = 1
                _say(2, f"worker failed: {one_line(err)}")
            finally:
                os._exit(code)
        os.close(control_r)
        self.workers[pid] = Worker(control_w, idle_since=time.monotonic())

    def retire(self, pid: int) -> None:
        """Ask worker ``pid`` to stop once idle (it finishes a call it has)."""
        worker = self.workers.get(pid)
        if worker is not None and worker.control is not None:
            os.close(worker.control)
            worker.control = None

    def read_status(self) -> None:
        try:
            data = os.read(self.status_r, 6 * 512)  # whole records
        except BlockingIOError:
            return
        now = time.monotonic()
        for i in range(0, len(data) - 5, 6):
            pid = int.from_bytes(data[i : i + 4], sys.byteorder)
            tag, k = data[i + 4 : i + 5], data[i + 5]
            worker = self.workers.get(pid)
            if worker is None:
                continue
            if tag == BUSY:
                worker.busy_since = now
                continue
            worker.busy_since, worker.idle_since = None, now
            if tag in (FREE, HELD) and k in worker.slots:
                worker.slots.discard(k)
                self.flights[k].worker = None
                if tag == FREE:
                    self.free(k)
                else:
                    self.flights[k].held = True

    def free(self, k: int) -> None:
        self.slots.release(k)
        self.flights.pop(k, None)

    def waiting(self) -> list[int]:
        """The slots whose ``K.u`` the parent watches for a request: those not in flight."""
        if self.slots is None:
            return []
        return [k for k in range(SLOTS) if k not in self.flights]

    def requested(self, k: int) -> None:
        """Slot ``k``'s ``K.u`` is readable: a front's request, queued for a worker."""
        request = self.slots.request(k)
        if request is None:  # not one of this protocol's: the front (if any) starts Python
            claim = self.slots.claim(k)
            self.slots.say(k, DECLINED)
            self.flights[k] = Flight(claim[0] if claim and claim[0] else 0, held=True)
            return
        self.flights[k] = Flight(*request)
        self.pending.append(k)

    def idle(self) -> list[int]:
        return [p for p, w in self.workers.items()
                if w.control is not None and w.busy_since is None and not w.slots]  # fmt: skip

    def saturated(self) -> bool:
        """Every worker busy and no more may be added: a call would wait for another's."""
        full = not self.idle() and len(self.workers) >= self.limits.max_workers
        if not full:
            self.full_since = None
        elif self.full_since is None:
            self.full_since = time.monotonic()
        return full

    def overdue(self) -> bool:
        """Saturated for ``QUEUE_WAIT`` seconds: calls are declined (socket ones too)."""
        return self.saturated() and time.monotonic() - self.full_since >= QUEUE_WAIT

    def wait_ms(self) -> int:
        """How long the parent may sleep: 0 with a queued slot an idle worker can take;
        else until the oldest queued slot is due, or the pool's saturation (then the
        socket's callers are declined), 1 s at most."""
        if self.pending and self.idle():
            return 0
        due = [self.flights[k].since + QUEUE_WAIT for k in self.pending]
        if self.full_since is not None and not self.overdue():
            due.append(self.full_since + QUEUE_WAIT)
        if not due:
            return 1000
        return min(1000, max(1, int((min(due) - time.monotonic()) * 1000) + 1))

    def dispatch(self) -> None:
        """Hand queued slots to idle workers (``tend`` adds workers when none is); with
        none and no more allowed, a slot waits ``QUEUE_WAIT`` seconds at most, then is
        declined (its front starts Python) rather than wait longer for others' calls."""
        while self.pending:
            idle = self.idle()
            if not idle and self.saturated():
                now, keep = time.monotonic(), []
                for k in self.pending:
                    if now - self.flights[k].since < QUEUE_WAIT:
                        keep.append(k)
                        continue
                    _say(2, f"declined: all {len(self.workers)} workers busy (slot {k})")
                    self.slots.say(k, DECLINED)
                    self.flights[k].held = True
                self.pending = keep
                return
            if not idle:
                return
            k = self.pending.pop(0)
            flight, worker = self.flights[k], self.workers[idle[0]]
            fields = (k, flight.pid, flight.nargs)
            record = b"".join(n.to_bytes(4, sys.byteorder) for n in fields)
            os.write(worker.control, record)
            worker.slots.add(k)
            worker.busy_since, flight.worker = time.monotonic(), idle[0]

    def sweep(self) -> None:
        """Free held slots whose front exited and claims a front left without asking."""
        now = time.monotonic()
        if self.slots is None or now - self.swept < 1.0:
            return
        self.swept = now
        for k in range(SLOTS):
            flight = self.flights.get(k)
            if flight is not None:
                if flight.held and not alive(flight.pid):
                    if flight.pid or now - flight.since > STALE_CLAIM:
                        self.free(k)
                continue
            claim = self.slots.claim(k)
            if claim is not None and claim[1] > STALE_CLAIM and not alive(claim[0]):
                self.slots.release(k)

    def reap(self) -> None:
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.retire(pid)  # closes its control pipe
            worker = self.workers.pop(pid, None)
            for k in worker.slots if worker else ():  # killed, or failed: answer its fronts
                self.slots.say(k, LOST)  # (before "a": they start Python)
                self.flights[k].worker, self.flights[k].held = None, True

    def tend(self) -> None:
        """Keep the pool the right size; kill calls stuck past the watchdog."""
        now, limits = time.monotonic(), self.limits
        live = {p: w for p, w in self.workers.items() if w.control is not None}
        for pid, worker in live.items():
            busy = worker.busy_since
            if busy is not None and now - busy > limits.call_timeout:
                _say(2, f"worker {pid}: a call busy for {limits.call_timeout:g} s, killed")
                os.kill(pid, signal.SIGKILL)
        idle = [p for p, w in live.items() if w.busy_since is None and not w.slots]
        if len(live) < limits.workers or (not idle and len(self.workers) < limits.max_workers):
            self.spawn()
        elif len(live) > limits.workers:
            for pid in idle[: len(live) - limits.workers]:
                if now - live[pid].idle_since > limits.idle_timeout:
                    self.retire(pid)

    def stop(self) -> None:
        for pid in list(self.workers):
            self.retire(pid)
        deadline = time.monotonic() + 10
        while self.workers and time.monotonic() < deadline:
            self.reap()
            time.sleep(0.05)


def decline_busy(listener: socket.socket, workers: int) -> None:
    """Answer a connection no worker is free for with a decline (its client does the
    call in-process) instead of leaving it in the backlog."""
    try:
        conn, _ = listener.accept()
    except OSError:  # a worker took it
        return
    with conn:
        _say(2, f"declined: all {workers} workers busy (socket)")
        try:  # the request first: closing with it unread would reset the connection
            conn.settimeout(1.0)
            _, fds, _, _ = socket.recv_fds(conn, wire.LIMIT, wire.FDS)
            for fd in fds:
                os.close(fd)
            conn.sendall(wire.pack(wire.DECLINE, b"busy"))
        except OSError:
            pass


def sweep_markers() -> None:
    """Remove the exec markers whose container is gone; one line for each."""
    from nvshim.runtime.markers import sweep

    for name, root in sweep(CACHE_DIR, time.time()):
        _say(2, f"exec marker {name} removed: no container {name} in {root}")


def _stop(*_) -> None:
    raise SystemExit(0)


def _notify_ready() -> None:
    """Tell systemd (``Type=notify``) the socket is live."""
    address = os.environ.get("NOTIFY_SOCKET", "")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        try:
            sock.sendto(b"READY=1", address)
        except OSError:
            pass


def serve(path: str, verbose: bool = False, limits: Limits | None = None) -> None:
    """Listen at ``path`` and on the slots (``nvshim.runtime.slots``) and serve calls
    with a pool of workers until SIGTERM."""
    limits = limits or Limits()
    check_cache_dir(os.path.dirname(path))
    _plain[:] = [privileges(os.getpid())[0]]
    failed = preload()
    for name in failed:
        _say(2, f"not preloaded: {name}")
    listener, identity = listen(path)
    slots = make_slots()
    pool = Pool(listener, verbose, limits, slots)
    wake_r, wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    os.set_blocking(pool.status_r, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes poll through wake_w
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    gc.freeze()  # the workers share the imported modules' pages instead of copying them
    ups = {} if slots is None else {slots.fds[k][1]: k for k in range(SLOTS)}
    sweep_markers()
    swept = time.monotonic()
    try:
        for _ in range(limits.workers):
            pool.spawn()
        where = path if slots is None else f"{path} and {slots.path}"
        _say(2, f"listening on {where} (nvshim {__version__})")
        _notify_ready()
        poller, watched, listening = select.poll(), set(), False
        for fd in (pool.status_r, wake_r):
            poller.register(fd, select.POLLIN)
        while True:
            wanted = {slots.fds[k][1] for k in pool.waiting()} if slots else set()
            for fd in watched - wanted:
                poller.unregister(fd)
            for fd in wanted - watched:
                poller.register(fd, select.POLLIN)
            watched = wanted
            busy = pool.overdue()  # then the parent declines connections no worker takes
            if busy != listening:
                (poller.register if busy else poller.unregister)(listener.fileno())
                listening = busy
            for fd, _ in poller.poll(pool.wait_ms()):
                if fd == wake_r:
                    _drain(wake_r)
                elif fd == listener.fileno():
                    decline_busy(listener, len(pool.workers))
                elif fd in ups and ups[fd] not in pool.flights:
                    pool.requested(ups[fd])
            pool.read_status()
            pool.reap()
            pool.tend()
            pool.dispatch()
            pool.sweep()
            if time.monotonic() - swept >= limits.marker_sweep:
                sweep_markers()
                swept = time.monotonic()
    finally:
        if file_identity(path) == identity:
            try:
                os.unlink(path)
            except OSError:
                pass
        if slots is not None:
            slots.remove()
        pool.stop()
        listener.close()


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


def make_slots() -> Slots | None:
    """This daemon's slots, or None (said why) where the kernel cannot hand a caller's
    stdio over (``pidfd_getfd``, Linux 5.6): fronts then start Python."""
    try:
        pidfd = os.pidfd_open(os.getpid())
        try:
            os.close(pidfd_getfd(pidfd, 2))
        finally:
            os.close(pidfd)
    except OSError as err:
        _say(2, f"no slots, every GPU create starts Python: pidfd_getfd: {err.strerror}")
        return None
    return Slots(os.path.join(CACHE_DIR, slots_name(__version__, nvshim.__file__)))


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog=TOOL,
        description=f"nvshim-runtime's resident half: listens on {CACHE_DIR}/{DAEMON_SOCKET} "
        "($NVSHIM_CACHE_DIR/... when set), where nvshim-runtime looks",
    )
    default = Limits()
    parser.add_argument("--version", action="version", version=f"{TOOL} version {__version__}")
    parser.add_argument("--verbose", action="store_true", help="one line per call on stderr")
    parser.add_argument("--workers", type=int, default=default.workers,
                        help="workers kept ready (default %(default)s)")  # fmt: skip
    parser.add_argument("--max-workers", type=int, default=default.max_workers,
                        help="at most, added while all are busy (default %(default)s)")  # fmt: skip
    parser.add_argument("--idle-timeout", type=float, default=default.idle_timeout,
                        help="seconds an extra worker may idle (default %(default)g)")  # fmt: skip
    parser.add_argument("--call-timeout", type=float, default=default.call_timeout,
                        help="seconds a call may run (default %(default)g)")  # fmt: skip
    parser.add_argument("--marker-sweep", type=float, default=default.marker_sweep,
                        help="seconds between sweeps of the exec markers of containers "
                        "that are gone (default %(default)g)")  # fmt: skip
    opts = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if not 1 <= opts.workers <= opts.max_workers:
        parser.error(f"--workers {opts.workers}: must be 1 to --max-workers ({opts.max_workers})")
    for name in ("idle_timeout", "call_timeout", "marker_sweep"):
        if not getattr(opts, name) > 0:
            parser.error(f"--{name.replace('_', '-')} {getattr(opts, name)}: must be above 0")
    limits = Limits(
        opts.workers, opts.max_workers, opts.idle_timeout, opts.call_timeout, opts.marker_sweep
    )
    try:
        serve(os.path.join(CACHE_DIR, DAEMON_SOCKET), opts.verbose, limits)
    except NvshimError as err:
        print(f"{TOOL}: error: {err}", file=sys.stderr)
        return err.exit_code
    return 0
