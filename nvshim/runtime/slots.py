"""nvshim-runtimed's slots: how the sh front has the daemon serve a GPU create without
starting any Python (``bench/engine_start.py``: about one interpreter start less).

The daemon keeps a directory of ``SLOTS`` slots (``slots_dir``; mode 0700, so only its
user reaches it), each a claim file and two FIFOs that every daemon process holds open
for reading and writing: ``K.r`` (daemon -> front) and ``K.u`` (front -> daemon). The
front (``nvshim.runtime.front``, function ``srv``)

0. uses the directory only if one ``ls -dn`` (an lstat of each path) shows it and
   every directory from ``/`` to it root's, no symlink, those above the cache directory
   not writable by group or others unless sticky, the cache directory not writable by
   group or others, the slot directory 0700; and a slot only if both FIFOs, as opened
   (``/proc/self/fd``), are its user's: a directory another user planted or swapped in
   is never written to (Python does the call);
1. claims a slot: creates ``K.c`` with ``set -C`` (``O_EXCL``), its pid inside;
2. opens ``K.r`` for reading only (opening it read-write first, so the open never
   waits), so that a daemon that is gone reads as end of file, never as a hang;
3. writes ``PID NARGS`` to ``K.u``: the parent reads it and hands the slot to a worker
   (or declines it when every worker stays busy, no more may be added, for ``QUEUE_WAIT``);
4. waits ``ACK_WAIT`` seconds at most for the first answer (bash: ``read -t``; dash and
   busybox sh: a ``sleep`` whose exit, a trapped SIGCHLD, stops the ``read``; another
   shell: a watchdog subshell, killed with its ``sleep`` once an answer came, writes ``t``
   to ``K.r``); with no answer in time (or end of file) the front writes ``n`` to ``K.u``
   and Python does the call (a stopped or hung daemon);
5. follows the answers on ``K.r``, one a line:
   ``a`` the worker took the call: the front writes ``y`` to ``K.u``, and only then does
   the worker act (so a front that gave up and a worker that took the call never both
   do it); before ``a``, end of file or any other line: nothing was done, Python does
   the call; ``f`` declined (Python does it); ``x RUNTIME`` exec it
   with the call's arguments; ``s RUNTIME`` run it, write its exit status to ``K.u``;
   ``e CODE`` exit with it; ``l`` (or end of file) after ``a``: the daemon lost the
   call, which fails (a container it had the front create is deleted); a late ``t`` is
   skipped. RUNTIME is absolute or starts with ``./`` (found through a relative
   ``PATH`` entry: the front runs in the caller's directory, as the worker looked);
6. writes ``d`` to ``K.u`` once it has read its last answer; the worker then frees the
   slot. A slot whose caller did not say ``d`` is freed by the parent once the caller
   has exited; a claim never followed by a request, once its pid is gone.

The worker takes the caller on from ``/proc/PID`` after checking that PID holds this
slot's ``K.r`` at fd 5, is in the daemon's namespaces and has the privileges it had
at start (``nvshim.runtimed.trust.caller_decline_reason``): its umask, arguments (the last
``NARGS`` of its command line), environment, working directory, and stdio with
``pidfd_getfd`` (the same open files, not reopened ones). A kernel or policy that refuses
any of it declines; the front then starts Python, which asks over the socket.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import os
import select
import shutil
import time

from nvshim.errors import NvshimError
from nvshim.fsutil import file_identity
from nvshim.runtime.lowlevel import LowLevel

SLOTS = 128
REPLY_FD = 5  # where the front holds K.r while it talks (checked by the worker)
ACCEPTED, DECLINED, LOST, EXEC, SPAWN, EXIT, DONE = "a", "f", "l", "x", "s", "e", "d"
GO, NO, TIMEOUT = "y", "n", "t"  # front -> worker after "a"; a watchdog subshell's line
ACK_WAIT = 2  # whole seconds (POSIX sleep) the front waits for the first answer
GO_WAIT = 10.0  # seconds a worker waits for the front's "y" after its "a"
STALE_CLAIM = 10.0  # seconds a claim may wait for its request before its pid is checked
DONE_WAIT = 2.0  # seconds a worker waits for the front's ``d`` before leaving it to the parent
_PIDFD_GETFD = 438  # the same number on every architecture (Linux 5.6)
_libc = ctypes.CDLL(None, use_errno=True)


def slots_name(version: str, nvshim_file: str) -> str:
    """The name in the cache directory where the daemon of this nvshim (version and
    files) keeps its slots: a front written by another nvshim looks elsewhere, finds
    none, and starts Python."""
    key = hashlib.sha256(f"{version}\0{nvshim_file}".encode(errors="surrogateescape"))
    return f"runtimed.{key.hexdigest()[:16]}"


class Slots:
    """One daemon's slot directory and the FIFOs it holds (inherited by its workers)."""

    def __init__(self, path: str) -> None:
        """Build the directory beside ``path`` and move it there (a stale one removed)."""
        self.path = path
        staging = f"{path}.{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        self.fds: list[tuple[int, int]] = []  # (reply, up) a slot
        try:
            os.mkdir(staging, 0o700)
            for k in range(SLOTS):
                pair = []
                for end in ("r", "u"):
                    fifo = os.path.join(staging, f"{k}.{end}")
                    os.mkfifo(fifo, 0o600)
                    pair.append(os.open(fifo, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC))
                self.fds.append((pair[0], pair[1]))
            self.replies = [file_identity(r) for r, _ in self.fds]
            shutil.rmtree(path, ignore_errors=True)
            os.rename(staging, path)
            self.identity = file_identity(path)
        except OSError as err:
            self.close()
            shutil.rmtree(staging, ignore_errors=True)
            raise NvshimError(f"{path}: cannot make the runtime's slots: {err.strerror}") from None

    def close(self) -> None:
        for pair in self.fds:
            for fd in pair:
                os.close(fd)
        self.fds = []

    def remove(self) -> None:
        """Remove the directory if it is still this daemon's."""
        if file_identity(self.path) == self.identity:
            shutil.rmtree(self.path, ignore_errors=True)

    def say(self, k: int, line: str) -> None:
        """Write one answer to slot ``k``'s front."""
        os.write(self.fds[k][0], f"{line}\n".encode(errors="surrogateescape"))

    def request(self, k: int) -> tuple[int, int] | None:
        """The ``PID NARGS`` the front wrote to slot ``k`` (the parent, when ``K.u`` is
        readable and the slot is free); None for anything else."""
        try:
            data = os.read(self.fds[k][1], 64)
        except BlockingIOError:
            return None
        fields = data.split()
        if len(fields) != 2 or not data.endswith(b"\n") or not all(f.isdigit() for f in fields):
            return None
        return int(fields[0]), int(fields[1])

    def claim(self, k: int) -> tuple[int | None, float] | None:
        """Slot ``k``'s claim: its pid (None if unreadable) and age; None if unclaimed."""
        path = os.path.join(self.path, f"{k}.c")
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            age = time.time() - os.fstat(fd).st_mtime
            text = os.read(fd, 32)
        finally:
            os.close(fd)
        return (int(text) if text.strip().isdigit() else None), age

    def release(self, k: int) -> None:
        """Empty slot ``k``'s FIFOs and remove its claim: the next front may take it."""
        for fd in self.fds[k]:
            try:
                while os.read(fd, 4096):
                    pass
            except BlockingIOError:
                pass
        try:
            os.unlink(os.path.join(self.path, f"{k}.c"))
        except FileNotFoundError:
            pass


def alive(pid: int | None) -> bool:
    """Whether process ``pid`` exists (a zombie does)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def pidfd_getfd(pidfd: int, fd: int) -> int:
    """A duplicate (close-on-exec) of ``fd`` of the process behind ``pidfd``."""
    new = _libc.syscall(_PIDFD_GETFD, pidfd, fd, 0)
    if new < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return new


def _read_proc(pid: int, name: str, limit: int = 1 << 20) -> bytes:
    with open(f"/proc/{pid}/{name}", "rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise OSError(errno.E2BIG, f"/proc/{pid}/{name} too large")
    return data


class Declined(Exception):
    """The worker will not serve this slot's call (the reason); the front starts Python."""


class Caller:
    """The front process behind slot ``k``: its pidfd, argv (program first), environment,
    and stdio plus working directory as fds (the worker's, close-on-exec)."""

    def __init__(self, slots: Slots, k: int, pid: int, nargs: int, decline_reason) -> None:
        """Take the caller on; raises Declined. ``decline_reason(pid)``: why a process
        must do its call itself (its uid, namespaces, root), or None."""
        try:
            self.pidfd = os.pidfd_open(pid)
        except OSError as err:
            raise Declined(f"pid {pid}: {err.strerror}") from None
        self.fds: list[int] = []
        try:
            self._take(slots, k, pid, nargs, decline_reason)
        except BaseException:
            self.close()
            raise

    def _take(self, slots: Slots, k: int, pid: int, nargs: int, decline_reason) -> None:
        if file_identity(f"/proc/{pid}/fd/{REPLY_FD}") != slots.replies[k]:
            raise Declined(f"pid {pid} does not hold slot {k}")
        why, self.umask = decline_reason(pid)
        if why is not None:
            raise Declined(why)
        try:
            cmdline = _read_proc(pid, "cmdline").split(b"\0")[:-1]
            env = _read_proc(pid, "environ").split(b"\0")
            for n in (0, 1, 2):
                self.fds.append(pidfd_getfd(self.pidfd, n))
            self.fds.append(os.open(f"/proc/{pid}/cwd", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
        except OSError as err:
            raise Declined(f"cannot take the caller on: {err.strerror or err}") from None
        if nargs + 1 > len(cmdline):
            raise Declined("a command line shorter than its arguments")
        if self.gone():  # pid was reused while /proc was read: none of it is the caller's
            raise Declined(f"pid {pid} exited")
        self.argv = [os.fsdecode(a) for a in cmdline[len(cmdline) - nargs - 1 :]]
        self.environ = dict(e.split(b"=", 1) for e in env if e.find(b"=") > 0)

    def gone(self, timeout: float = 0) -> bool:
        """Whether the caller has exited (waiting up to ``timeout`` seconds)."""
        return bool(select.select([self.pidfd], [], [], timeout)[0])

    def close(self) -> None:
        for fd in [self.pidfd, *self.fds]:
            os.close(fd)
        self.fds, self.pidfd = [], -1


class SlotRemote(LowLevel):
    """The low-level runtime run by the front of slot ``k`` (the call's own arguments
    only: nothing else can be said in a line); ``last`` is called before the answer
    that ends the call. ``pidfd``: the caller's (None before it was taken on)."""

    def __init__(self, slots: Slots, k: int, pidfd: int | None = None) -> None:
        self.slots, self.k, self.pidfd = slots, k, pidfd
        self.argv: list[str] = []  # the call's arguments, once taken on
        self.last = lambda: None
        self.heard = b""
        self.waited = 0.0

    def _runtime(self, runtime: str, argv: list[str], keep) -> str:
        """``runtime`` as the front runs it: a relative path (found through a relative
        ``PATH`` entry) starts with ``./``, and resolves in the caller's directory."""
        if list(argv) != self.argv or keep or "\n" in runtime:
            raise NvshimError("nvshim-runtimed: a slot can only run the call as it came")
        return runtime if runtime.startswith("/") else f"./{runtime}"

    def exec(self, runtime: str, argv: list[str], keep: list[int] = ()) -> None:
        runtime = self._runtime(runtime, argv, keep)
        self.last()
        self.slots.say(self.k, f"{EXEC} {runtime}")

    def start(self, runtime: str, argv: list[str], cleanup: list[str]) -> None:
        self.started = time.monotonic()
        self.slots.say(self.k, f"{SPAWN} {self._runtime(runtime, argv, ())}")

    def wait(self) -> int:
        line = self.hear()
        self.waited = time.monotonic() - self.started
        if line is None or not line.isdigit():
            raise NvshimError("nvshim-runtime went away while the low-level runtime ran")
        return int(line)

    def exit(self, code: int) -> None:
        self.slots.say(self.k, f"{EXIT} {code}")

    def hear(self, timeout: float | None = None) -> str | None:
        """The front's next line on ``K.u``; None once the caller exited or after
        ``timeout`` seconds."""
        up = self.slots.fds[self.k][1]
        watch = [up] if self.pidfd is None else [up, self.pidfd]
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self.heard:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select(watch, [], [], left)
            if up in ready:
                try:
                    self.heard += os.read(up, 64)
                except BlockingIOError:
                    pass
            elif ready or (deadline is not None and time.monotonic() >= deadline):
                return None
        line, self.heard = self.heard.split(b"\n", 1)
        return line.decode(errors="replace")
