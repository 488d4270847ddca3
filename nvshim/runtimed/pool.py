"""nvshim-runtimed's parent: its workers (kept ready, added while all are busy, retired
when idle, killed when a call runs too long) and the slots in flight."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from collections.abc import Callable

from nvshim.errors import one_line
from nvshim.record import field, record
from nvshim.runtime import wire
from nvshim.runtime.slots import DECLINED, LOST, SLOTS, STALE_CLAIM, Slots, alive
from nvshim.runtimed import say
from nvshim.runtimed.worker import BUSY, FREE, HELD, worker_loop

# how long a call may wait for a worker when every one is busy and no more may be added
# (below the front's ACK_WAIT): a burst is queued, not sent to a hundred interpreters;
# a call stuck on a hostile image holds its worker, never the queue past this
QUEUE_WAIT = 1.5


@record(frozen=True)
class Limits:
    """The pool's size and timeouts (the command's options)."""

    workers: int = 2  # kept ready
    # added while all are busy: as many as there are slots, so a burst the slots take
    # is served rather than declined while runc holds every worker (each idle one is a
    # fork of the parent: about 1.5 MB of its own)
    max_workers: int = SLOTS
    idle_timeout: float = 60.0  # an extra worker idle this long is retired
    call_timeout: float = 300.0  # a call busy this long is killed (kubelet gives up at 120 s)
    marker_sweep: float = 60.0  # seconds between sweeps of the exec markers


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
        self,
        listener: socket.socket,
        verbose: bool,
        limits: Limits,
        slots: Slots | None = None,
        warm: Callable[[], None] = lambda: None,
    ) -> None:
        """``warm``: run before workers are forked (what they inherit)."""
        self.listener, self.verbose, self.limits, self.slots = listener, verbose, limits, slots
        self.warm = warm
        self.status_r, self.status_w = os.pipe2(os.O_CLOEXEC)
        self.workers: dict[int, Worker] = {}
        self.flights: dict[int, Flight] = {}  # by slot
        self.flights_changed = True  # a slot began or ended flight since the parent looked
        self.inherited: list[int] = []  # the parent's own fds, closed in a worker
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
                for fd in self.inherited:
                    os.close(fd)
                for other in self.workers.values():
                    if other.control is not None:
                        os.close(other.control)
                os.close(control_w)
                worker_loop(self.listener, control_r, self.status_w, self.verbose, self.slots)
            except BaseException as err:  # noqa: BLE001 - reported, the parent replaces it
                code = 1
                say(2, f"worker failed: {one_line(err)}")
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
        self.flights_changed = True

    def waiting(self) -> list[int]:
        """The slots whose ``K.u`` the parent watches for a request: those not in flight."""
        if self.slots is None:
            return []
        return [k for k in range(SLOTS) if k not in self.flights]

    def requested(self, k: int) -> None:
        """Slot ``k``'s ``K.u`` is readable: a front's request, queued for a worker."""
        request = self.slots.request(k)
        self.flights_changed = True  # k is in flight from here, either way
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
                    say(2, f"declined: all {len(self.workers)} workers busy (slot {k})")
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
                say(2, f"worker {pid}: a call busy for {limits.call_timeout:g} s, killed")
                os.kill(pid, signal.SIGKILL)
        idle = [p for p, w in live.items() if w.busy_since is None and not w.slots]
        # one worker short, or one for each queued slot no idle worker can take: a burst
        # gets its workers in one pass, not one per wake-up
        wanted = max(limits.workers - len(live), len(self.pending) - len(idle), not idle)
        wanted = min(wanted, limits.max_workers - len(self.workers))
        if wanted > 0:
            self.warm()
        for _ in range(wanted):
            self.spawn()
        if wanted <= 0 and len(live) > limits.workers:
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
        say(2, f"declined: all {workers} workers busy (socket)")
        try:  # the request first: closing with it unread would reset the connection
            conn.settimeout(1.0)
            _, fds, _, _ = socket.recv_fds(conn, wire.LIMIT, wire.FDS)
            for fd in fds:
                os.close(fd)
            conn.sendall(wire.pack(wire.DECLINE, b"busy"))
        except OSError:
            pass
