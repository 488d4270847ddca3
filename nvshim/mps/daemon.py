"""Per-device MPS control daemons: start, stop, status, and the running check enforcement uses.

One ``nvidia-cuda-mps-control -d`` (from the driver root, never from an image) per
MPS-shared GPU or MIG device, with its own pipe, log and shm directories under the MPS root
(see ``nvshim.mps``). The daemon runs in a private mount namespace whose ``/dev/shm`` is that
device's small tmpfs, the same one its client containers get at ``/dev/shm``: clients and
server share POSIX shared memory without any container seeing the host's ``/dev/shm``.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator

from nvshim.errors import NvshimError
from nvshim.host.model import Host
from nvshim.mps import CONTROL_BINARY, PID_FILE
from nvshim.mps.sharing import SharedDevice
from nvshim.record import asdict, record

COMMAND_TIMEOUT = 10.0  # seconds for one client command round
START_TIMEOUT = 10.0  # seconds for ``-d`` to return and the pid file to name a live daemon
STOP_TIMEOUT = 10.0  # seconds for the daemon to exit after ``quit``
HEALTH_PROBES = 16  # health queries at once (daemon_statuses)
SHM_SIZE = "64m"
SHM_OPTIONS = f"size={SHM_SIZE},mode=1777"
SHM_SOURCE = "nvshim-mps-shm"  # the source of each device's shm tmpfs in the mount table
STATE_FILE = "state.json"
START_OUTPUT = "nvshim-start.out"
MAX_PID_FILE = 64
VIEW_ENTRIES = 256  # entries of a pipe directory a control client's view takes at most
BASE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}

_CLONE_NEWNS = 0x00020000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 0x2, 0x4, 0x8
_MS_BIND, _MS_REC, _MS_SLAVE = 0x1000, 0x4000, 0x80000
_MNT_DETACH = 0x2


@record(frozen=True)
class DaemonDirs:
    """Host directories of one device's daemon."""

    base: str
    pipe: str
    log: str
    shm: str

    @property
    def state(self) -> str:
        return os.path.join(self.base, STATE_FILE)


@record
class DaemonStatus:
    """What ``start``/``stop``/``status`` report for one device."""

    uuid: str
    name: str
    replicas: int | None
    thread_percentage: int | None  # the share configured for each client
    memory_limit_mib: int | None
    pipe_dir: str
    log_dir: str
    running: bool = False
    pid: int | None = None
    reported_thread_percentage: float | None = None
    compute_mode: str | None = None
    in_config: bool = True
    action: str | None = None  # started, already running, stopped, not running
    problem: str | None = None

    @property
    def healthy(self) -> bool:
        """Running, answering, and holding the configured default share."""
        return (
            self.running
            and self.problem is None
            and self.reported_thread_percentage is not None
            and self.thread_percentage is not None
            and abs(self.reported_thread_percentage - self.thread_percentage) < 0.05
        )

    def to_dict(self) -> dict:
        return {**asdict(self), "healthy": self.healthy}


def daemon_dirs(mps_root: str, uuid: str) -> DaemonDirs:
    """The pipe, log and shm directories of the daemon for ``uuid``."""
    if not uuid or "/" in uuid or uuid in (".", ".."):
        raise NvshimError(f"invalid device UUID {uuid!r}")
    base = os.path.join(mps_root, uuid)
    return DaemonDirs(
        base, os.path.join(base, "pipe"), os.path.join(base, "log"), os.path.join(base, "shm")
    )


def read_pid_file(pipe_dir: str) -> int | None:
    """The pid named by the pid file in ``pipe_dir`` when root's daemon could have
    written it: a regular file (no symlink followed) of this user's that no other can
    write (``nvshim.trusted.read_trusted``). Client containers write in the pipe
    directory: a pid file of theirs names no daemon."""
    from nvshim.trusted import read_trusted

    text = (read_trusted(os.path.join(pipe_dir, PID_FILE), MAX_PID_FILE) or b"").strip()
    if not text.isdigit():
        return None
    pid = int(text)
    return pid if pid > 0 else None


def _proc_status(pid: int) -> tuple[str, str, int, bool] | None:
    """``(name, state, effective uid, here)`` of a process from ``/proc/<pid>/status``:
    the uid of its credentials (``/proc/<pid>``'s owner is root for a non-dumpable
    process), and whether it is in this PID namespace (``NSpid`` names no deeper one: not
    a container's). None when it is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            text = fh.read(4096).decode("utf-8", "replace")
    except OSError:
        return None
    fields = dict(line.partition(":")[::2] for line in text.splitlines())
    try:
        euid = int(fields["Uid"].split()[1])
        here = len(fields["NSpid"].split()) == 1
        return fields["Name"].strip(), fields["State"].split()[0], euid, here
    except (KeyError, IndexError, ValueError):
        return None


def daemon_pid(pipe_dir: str) -> int | None:
    """The pid of the control daemon of ``pipe_dir`` when it is running, else None.

    Running means: the pid file names a process that exists in ``/proc``, is not a zombie,
    runs as this user (root) in this PID namespace (a container's process, named like the
    daemon, that took a dead daemon's pid is not it) and is an MPS control daemon (its
    name starts with ``nvidia-cuda-mps``), so a stale pid file whose pid was reused does
    not count.
    """
    pid = read_pid_file(pipe_dir)
    status = None if pid is None else _proc_status(pid)
    if status is None or status[1] in ("Z", "X", "x"):
        return None
    name, _, euid, here = status
    return pid if name.startswith(CONTROL_BINARY[:15]) and euid == os.geteuid() and here else None


def process_start_time(pid: int) -> int | None:
    """When ``pid`` started (``/proc/<pid>/stat`` field 22, clock ticks after boot): with
    the pid, the process's identity (a reused pid starts later). None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            tail = fh.read(1024).rpartition(b")")[2].split()
        return int(tail[19])
    except (OSError, IndexError, ValueError):
        return None


def pin_daemon(pipe_dir: str, expect: tuple[int, int] | None = None) -> tuple[int, int, int] | None:
    """``(pidfd, pid, start_time)`` of the live control daemon of ``pipe_dir``, held through
    a pidfd (the caller closes it). The identity is checked after the pidfd is open, so the
    fd names that very process however long it is held. ``expect``: the ``(pid,
    start_time)`` recorded when it was started; another daemon (or a reused pid) is None."""
    pid = daemon_pid(pipe_dir)
    if pid is None or (expect is not None and expect[0] != pid):
        return None
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return None
    started = process_start_time(pid)
    if (
        started is None
        or (expect is not None and expect[1] != started)
        or daemon_pid(pipe_dir) != pid
    ):
        os.close(fd)
        return None
    return fd, pid, started


def wait_pidfd(fd: int, timeout: float) -> bool:
    """True once the process behind ``fd`` has exited (within ``timeout`` seconds)."""
    import select

    poll = select.poll()
    poll.register(fd, select.POLLIN)
    return bool(poll.poll(max(0, int(timeout * 1000))))


def is_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    status = _proc_status(pid)
    return status is not None and status[1] not in ("Z", "X", "x")


def control_binary(host: Host) -> str:
    """Host path of the driver root's ``nvidia-cuda-mps-control``; it must be root-owned
    and writable by nobody else (nvshim runs it as root)."""
    path = next(
        (
            f.host_path
            for f in host.files
            if f.kind == "bin" and f.path.endswith("/" + CONTROL_BINARY)
        ),
        None,
    )
    if path is None:
        raise NvshimError(f"driver root {host.driver_root}: {CONTROL_BINARY} not found")
    try:
        st = os.stat(path)
    except OSError as err:
        raise NvshimError(f"{path}: {err.strerror}") from None
    if st.st_uid != 0 or st.st_mode & 0o022:
        raise NvshimError(
            f"{path}: refusing to run a binary not owned by root or writable by group/others"
        )
    return path


def daemon_env(host: Host, dirs: DaemonDirs, uuid: str) -> dict[str, str]:
    """The whole environment of a daemon (and of the client commands sent to it)."""
    env = dict(BASE_ENV)
    if host.driver_root not in ("", "/"):
        root = host.driver_root.rstrip("/")
        env["PATH"] = f"{root}/usr/bin:{root}/usr/sbin:{env['PATH']}"
        lib_dirs = sorted(
            {
                os.path.dirname(f.host_path)
                for f in host.files
                if f.kind == "lib" and f.capability != "compat32"
            }
        )
        if lib_dirs:
            env["LD_LIBRARY_PATH"] = ":".join(lib_dirs)
    env["CUDA_MPS_PIPE_DIRECTORY"] = dirs.pipe
    env["CUDA_MPS_LOG_DIRECTORY"] = dirs.log
    env["CUDA_VISIBLE_DEVICES"] = uuid
    return env


@contextlib.contextmanager
def _client_view(pipe_dir: str) -> Iterator[str]:
    """A new directory beside ``pipe_dir`` (in the device's directory: root's alone)
    holding hard links to the sockets and regular files of root's in ``pipe_dir``, for a
    control client to use as its pipe directory; removed after. Client containers write
    in ``pipe_dir``: a ``control`` symlink of theirs to another daemon's socket sent
    root's commands (``quit``) there."""
    try:
        pfd = os.open(pipe_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        raise NvshimError(f"{pipe_dir}: {err.strerror}") from None
    try:
        import tempfile

        from nvshim.fsutil import remove_tree

        view = tempfile.mkdtemp(prefix=".client-", dir=os.path.dirname(pipe_dir))
        try:
            _link_roots_entries(pfd, view)
            yield view
        finally:
            remove_tree(view)
    finally:
        os.close(pfd)


def _link_roots_entries(pfd: int, view: str) -> None:
    """Hard-link into ``view`` the first ``VIEW_ENTRIES`` entries of directory ``pfd``
    that are this user's sockets, or regular files of this user's no other can write.
    Each is linked as it is (no symlink followed), then looked at in ``view``, where
    nobody else can swap it."""
    import itertools
    import stat

    vfd = os.open(view, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        with os.scandir(pfd) as entries:
            for name in itertools.islice((e.name for e in entries), VIEW_ENTRIES):
                try:
                    os.link(name, name, src_dir_fd=pfd, dst_dir_fd=vfd, follow_symlinks=False)
                    st = os.stat(name, dir_fd=vfd, follow_symlinks=False)
                except OSError:
                    continue
                # a socket's write bits only let others connect (clients do)
                regular = stat.S_ISREG(st.st_mode) and not st.st_mode & 0o022
                if not (regular or stat.S_ISSOCK(st.st_mode)) or st.st_uid != os.geteuid():
                    os.unlink(name, dir_fd=vfd)
    finally:
        os.close(vfd)


def run_control(
    binary: str, env: dict[str, str], commands: list[str], timeout: float = COMMAND_TIMEOUT
) -> str:
    """Send ``commands`` to a daemon through the client form, in a view of its pipe
    directory (``_client_view``); its stdout, stripped."""
    import subprocess

    text = "".join(c + "\n" for c in commands)
    try:
        with _client_view(env["CUDA_MPS_PIPE_DIRECTORY"]) as view:
            proc = subprocess.run(
                [binary],
                input=text,
                capture_output=True,
                text=True,
                env={**env, "CUDA_MPS_PIPE_DIRECTORY": view},
                timeout=timeout,
                cwd="/",
                check=False,
            )
    except subprocess.TimeoutExpired:
        raise NvshimError(
            f"MPS control daemon of {env['CUDA_MPS_PIPE_DIRECTORY']}: no answer within {timeout:g}s"
        ) from None
    except OSError as err:
        raise NvshimError(f"{binary}: cannot run: {err.strerror}") from None
    if proc.returncode != 0:
        detail = " ".join((proc.stderr or proc.stdout).split())[:200] or f"exit {proc.returncode}"
        raise NvshimError(f"{binary} ({', '.join(commands)}): {detail}")
    return proc.stdout.strip()


def query_thread_percentage(
    binary: str, env: dict[str, str], timeout: float = COMMAND_TIMEOUT
) -> float:
    """The daemon's ``get_default_active_thread_percentage`` answer (the health check)."""
    answer = run_control(binary, env, ["get_default_active_thread_percentage"], timeout)
    last = answer.splitlines()[-1].strip() if answer else ""
    try:
        return float(last)
    except ValueError:
        raise NvshimError(
            f"MPS control daemon of {env['CUDA_MPS_PIPE_DIRECTORY']}: unexpected answer "
            f"{last[:64]!r} to get_default_active_thread_percentage"
        ) from None


# ---- the shm tmpfs and the daemon's mount namespace -------------------------------------


def _libc():
    """libc through the process's own symbol table (no ``find_library`` subprocess)."""
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        import ctypes

        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def mount_shm(shm_dir: str) -> bool:
    """Mount the device's tmpfs on ``shm_dir`` unless one is there; True when mounted now."""
    if os.path.ismount(shm_dir):
        return False
    libc = _libc()
    flags = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
    rc = libc.mount(SHM_SOURCE.encode(), shm_dir.encode(), b"tmpfs", flags, SHM_OPTIONS.encode())
    try:
        _check(rc, f"mount tmpfs on {shm_dir}")
    except OSError as err:
        raise NvshimError(str(err.strerror)) from None
    return True


def unmount_shm(shm_dir: str) -> None:
    """Detach the device's tmpfs (clients still running keep their own view)."""
    if os.path.ismount(shm_dir):
        _libc().umount2(shm_dir.encode(), _MNT_DETACH)


def _enter_private_shm(libc, shm_dir: str) -> None:
    """In a child: a private mount namespace (slave of the host's) with ``shm_dir`` bound on
    ``/dev/shm``."""
    _check(libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _check(libc.mount(None, b"/", None, _MS_REC | _MS_SLAVE, None), "make / a slave mount")
    _check(
        libc.mount(shm_dir.encode(), b"/dev/shm", None, _MS_BIND, None),
        f"bind {shm_dir} on /dev/shm",
    )


def _spawn_daemon(binary: str, env: dict[str, str], dirs: DaemonDirs, timeout: float) -> None:
    """Run ``binary -d`` in its private namespace and wait for it to return."""
    out_path = os.path.join(dirs.log, START_OUTPUT)
    err_r, err_w = os.pipe()  # close-on-exec: EOF at exec, or the child's error text
    libc = _libc()  # loaded before fork: the child only makes system calls
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.close(err_r)
            os.chdir("/")
            os.setsid()  # the daemon's own session: nothing of the caller's reaches it
            os.umask(0o022)  # a pid file no other user can write: read_pid_file trusts it
            _enter_private_shm(libc, dirs.shm)
            out = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o640)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(out, 1)
            os.dup2(out, 2)
            os.execve(binary, [binary, "-d"], env)
        except BaseException as err:  # noqa: BLE001 - reported through the pipe
            try:
                os.write(err_w, str(getattr(err, "strerror", None) or err).encode()[:500])
            finally:
                os._exit(127)
        os._exit(127)
    os.close(err_w)
    with os.fdopen(err_r, "rb") as fh:
        failure = fh.read().decode("utf-8", "replace")
    status = _wait_child(pid, timeout)
    if failure:
        raise NvshimError(f"cannot start {binary}: {failure}")
    if status is None:
        raise NvshimError(f"{binary} -d did not return within {timeout:g}s")
    if status != 0:
        raise NvshimError(f"{binary} -d failed (exit {status}): {_tail(out_path)}")


def _wait_child(pid: int, timeout: float) -> int | None:
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            return None
        time.sleep(0.01)


def _tail(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            text = fh.read()[-400:].decode("utf-8", "replace")
    except OSError:
        return "no output"
    return " ".join(text.split()) or "no output"


def _wait_for(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


# ---- state ------------------------------------------------------------------------------


def _read_state(dirs: DaemonDirs) -> dict:
    try:
        with open(dirs.state, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_state(dirs: DaemonDirs, state: dict) -> None:
    from nvshim.fsutil import atomic_write

    atomic_write(dirs.state, (json.dumps(state, indent=2) + "\n").encode(), mode=0o644)


def _make_dirs(dirs: DaemonDirs) -> None:
    for path, mode in (
        (dirs.base, 0o755),
        (dirs.pipe, 0o755),
        (dirs.log, 0o755),
        (dirs.shm, 0o755),
    ):
        try:
            os.makedirs(path, mode=mode, exist_ok=True)
        except OSError as err:
            raise NvshimError(f"{path}: cannot create: {err.strerror}") from None
        if os.path.islink(path) or not os.path.isdir(path):
            raise NvshimError(f"{path}: not a directory")


def _empty_pipe(pipe_dir: str) -> None:
    """Remove what is in the pipe directory of a daemon about to start (no daemon of
    root's runs there): client containers of an earlier one write there, and root's
    daemon writes its pid file and sockets by name (a symlink left as the pid file had it
    write its pid into a host file). The directory stays: those containers reach the new
    daemon through it."""
    from nvshim.fsutil import empty_dir

    try:
        empty_dir(pipe_dir)
    except OSError as err:
        raise NvshimError(f"{pipe_dir}: cannot empty: {err.strerror}") from None


# ---- start / stop / status ----------------------------------------------------------------


def _status(shared: SharedDevice, dirs: DaemonDirs) -> DaemonStatus:
    return DaemonStatus(
        uuid=shared.uuid,
        name=shared.name,
        replicas=shared.replicas,
        thread_percentage=shared.thread_percentage,
        memory_limit_mib=shared.memory_limit_mib,
        pipe_dir=dirs.pipe,
        log_dir=dirs.log,
    )


def _status_of(
    shared: SharedDevice | None, uuid: str, dirs: DaemonDirs, state: dict
) -> DaemonStatus:
    """The status skeleton: from the sharing config, else from the daemon's saved state
    (a daemon no longer in the config)."""
    if shared is not None:
        return _status(shared, dirs)
    return DaemonStatus(
        uuid,
        uuid,
        state.get("replicas"),
        state.get("thread_percentage"),
        state.get("memory_limit_mib"),
        dirs.pipe,
        dirs.log,
        in_config=False,
    )


def start_daemon(
    host: Host, shared: SharedDevice, mps_root: str, timeout: float = START_TIMEOUT
) -> DaemonStatus:
    """Start (if needed) the daemon of one MPS-shared device and set its defaults.

    Sets the GPU's compute mode to EXCLUSIVE_PROCESS first (whole GPUs only; MIG devices
    keep theirs) and records the previous mode for ``stop``. On failure what this call
    changed is undone and NvshimError names the device.
    """
    from nvshim.mps import compute

    dirs = daemon_dirs(mps_root, shared.uuid)
    result = _status(shared, dirs)
    binary = control_binary(host)
    env = daemon_env(host, dirs, shared.uuid)
    _make_dirs(dirs)
    pid = daemon_pid(dirs.pipe)
    if pid is not None:
        result.running, result.pid, result.action = True, pid, "already running"
        _fill_health(result, binary, env, timeout)
        return result
    _empty_pipe(dirs.pipe)
    state = _read_state(dirs)
    undo = []
    try:
        if not shared.is_mig:
            with compute.nvml_session(host) as nvml:
                previous = compute.get_compute_mode(nvml, shared.uuid)
                compute.set_compute_mode(nvml, shared.uuid, compute.EXCLUSIVE_PROCESS)
            if "previous_compute_mode" in state:  # a crashed daemon's: keep the original
                previous = state["previous_compute_mode"]
            undo.append(lambda: _restore_mode(host, shared.uuid, previous))
            state["previous_compute_mode"] = previous
        if mount_shm(dirs.shm):
            undo.append(lambda: unmount_shm(dirs.shm))
        _spawn_daemon(binary, env, dirs, timeout)
        if not _wait_for(lambda: daemon_pid(dirs.pipe) is not None, timeout):
            raise NvshimError(
                f"{binary} -d returned but no live daemon is named by "
                f"{os.path.join(dirs.pipe, PID_FILE)}"
            )
        result.pid = daemon_pid(dirs.pipe)
        undo.insert(0, lambda: run_control(binary, env, ["quit"], timeout))
        run_control(
            binary,
            env,
            [
                f"set_default_active_thread_percentage {shared.thread_percentage}",
                f"set_default_device_pinned_mem_limit 0 {shared.memory_limit_mib}M",
            ],
            timeout,
        )
        state.update(
            uuid=shared.uuid,
            replicas=shared.replicas,
            thread_percentage=shared.thread_percentage,
            memory_limit_mib=shared.memory_limit_mib,
            pid=result.pid,
            started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        )
        _write_state(dirs, state)
    except BaseException:
        for step in undo:
            try:
                step()
            except (NvshimError, OSError):
                pass
        raise
    result.running, result.action = True, "started"
    if not shared.is_mig:
        result.compute_mode = compute.mode_name(compute.EXCLUSIVE_PROCESS)
    _fill_health(result, binary, env, timeout)
    return result


def _restore_mode(host: Host, uuid: str, mode: int) -> None:
    from nvshim.mps import compute

    with compute.nvml_session(host) as nvml:
        compute.set_compute_mode(nvml, uuid, mode)


def _fill_health(result: DaemonStatus, binary: str, env: dict[str, str], timeout: float) -> None:
    try:
        reported = query_thread_percentage(binary, env, timeout)
    except NvshimError as err:
        result.problem = str(err)
        return
    result.reported_thread_percentage = reported
    wanted = result.thread_percentage
    if wanted is not None and abs(reported - wanted) >= 0.05:
        result.problem = (
            f"the daemon's default active thread percentage is {reported:g}%, the sharing "
            f"config wants {wanted}%: restart it (nvshim mps stop, then start)"
        )


def stop_daemon(
    host: Host,
    uuid: str,
    mps_root: str,
    shared: SharedDevice | None = None,
    timeout: float = STOP_TIMEOUT,
) -> DaemonStatus:
    """Send ``quit`` to the device's daemon, wait (on its pidfd) for it to exit, restore
    the compute mode recorded by ``start`` and detach the shm tmpfs. ``shared``: its
    sharing config entry, when it still has one."""
    from nvshim.mps import compute

    dirs = daemon_dirs(mps_root, uuid)
    state = _read_state(dirs)
    result = _status_of(shared, uuid, dirs, state)
    pinned = pin_daemon(dirs.pipe)
    if pinned is None:
        result.action = "not running"
    else:
        fd, pid, _ = pinned
        try:
            binary = control_binary(host)
            run_control(binary, daemon_env(host, dirs, uuid), ["quit"], timeout)
            if not wait_pidfd(fd, timeout):
                result.running, result.pid = True, pid
                result.problem = f"daemon {pid} did not exit within {timeout:g}s of quit"
                return result
        finally:
            os.close(fd)
        result.action = "stopped"
    if "previous_compute_mode" in state:
        previous = int(state["previous_compute_mode"])
        _restore_mode(host, uuid, previous)
        result.compute_mode = compute.mode_name(previous)
    unmount_shm(dirs.shm)
    if state:
        try:
            os.unlink(dirs.state)
        except FileNotFoundError:
            pass
    return result


def _daemon_state(
    host: Host, shared: SharedDevice | None, uuid: str, mps_root: str
) -> DaemonStatus:
    """Running state, pid, limits and compute mode of one device's daemon (its health:
    ``daemon_statuses``)."""
    from nvshim.mps import compute

    dirs = daemon_dirs(mps_root, uuid)
    result = _status_of(shared, uuid, dirs, _read_state(dirs) if shared is None else {})
    result.pid = daemon_pid(dirs.pipe)
    result.running = result.pid is not None
    gpu = next((g for g in host.gpus if g.uuid == uuid), None)
    if gpu is not None:
        try:
            with compute.nvml_session(host) as nvml:
                result.compute_mode = compute.mode_name(compute.get_compute_mode(nvml, uuid))
        except NvshimError as err:
            result.problem = str(err)
    if not result.running and read_pid_file(dirs.pipe) is not None:
        result.problem = "stale pid file: the daemon it names is not running"
    return result


def daemon_statuses(
    host: Host,
    devices: list[tuple[str, SharedDevice | None]],
    mps_root: str,
    timeout: float = COMMAND_TIMEOUT,
) -> list[DaemonStatus]:
    """Running state, pid, limits, compute mode and health of each (UUID, sharing entry)
    in ``devices``' daemon, in that order. The running daemons' health queries run at
    once (at most ``HEALTH_PROBES``): hung daemons cost about one ``timeout`` together,
    not one each."""
    from concurrent.futures import ThreadPoolExecutor

    results = [_daemon_state(host, share, uuid, mps_root) for uuid, share in devices]
    running = [(r, uuid) for r, (uuid, _) in zip(results, devices, strict=True) if r.running]
    if not running:
        return results
    binary = control_binary(host)

    def probe(item: tuple[DaemonStatus, str]) -> None:
        result, uuid = item
        _fill_health(result, binary, daemon_env(host, daemon_dirs(mps_root, uuid), uuid), timeout)

    with ThreadPoolExecutor(min(HEALTH_PROBES, len(running))) as pool:
        list(pool.map(probe, running))
    return results


def daemon_uuids(mps_root: str) -> list[str]:
    """UUIDs that have a daemon directory under the MPS root (running or not)."""
    try:
        names = sorted(os.listdir(mps_root))
    except OSError:
        return []
    return [
        n
        for n in names
        if n.startswith(("GPU-", "MIG-")) and os.path.isdir(os.path.join(mps_root, n, "pipe"))
    ]
