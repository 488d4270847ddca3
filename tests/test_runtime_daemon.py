"""``nvshim-runtimed``: nvshim-runtime's Python work done by warm workers, with real runc.

The client (the interpreter the sh front starts) keeps running runc itself; the worker
decides, edits the bundle and runs the finishing steps with the client's stdio, working
directory and environment. Whatever the daemon cannot or will not serve is done in the
client's own process, and a daemon that stops mid-call fails the call without leaving
a container behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest

from nvshim import __version__
from nvshim.runtime import wire
from tests.podman_util import make_busybox_rootfs
from tests.runc_util import daemon_calls, make_bundle, read_log, served_by, start_daemon
from tests.test_runtime_finish import CONF, LIBDIR, RUNC, Creates

GPU = {"NVIDIA_VISIBLE_DEVICES": "0"}


class Daemon:
    """``nvshim-runtimed --verbose`` of ``creates``' launchers, on its own cache dir."""

    def __init__(self, creates: Creates, *flags: str) -> None:
        self.creates = creates
        self.socket = os.path.join(creates.cache_dir, "runtime.sock")
        self.err = creates.tmp / "daemon.err"
        self.proc = start_daemon(creates.bin_dir, creates.env(), self.err, "--verbose", *flags)

    def text(self) -> str:
        return self.err.read_text()

    def served(self) -> list[str]:
        """The calls it served, as its log names them (``imports=N`` last)."""
        return daemon_calls(self.err)

    def declined(self) -> list[str]:
        return daemon_calls(self.err, "declined")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)


@pytest.fixture
def creates(sim_hosts, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    c = Creates(sim_hosts("single"), tmp_path, cache_dir=str(cache))
    yield c
    c.cleanup()


@pytest.fixture
def daemon(creates):
    d = Daemon(creates, "--workers", "1")
    yield d
    assert d.stop() == 0
    assert not os.path.lexists(d.socket)  # removed on the way out


def _workers(daemon_pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(daemon_pid)],
                         capture_output=True, text=True).stdout  # fmt: skip
    return [int(p) for p in out.split()]


def test_a_gpu_create_is_served_by_the_daemon(creates, daemon):
    """One interpreter (the client's), nothing imported per call, and the container is
    finished before create returns, as in-process."""
    before = creates.python_starts()  # the daemon's own
    rootfs = make_busybox_rootfs(creates.tmp / "rootfs")
    cid = f"daemon-{os.getpid()}"
    _, status = creates.create(rootfs, cid)
    assert status == 0, creates.output(cid)
    (served,) = daemon.served()
    assert " create --pid-file" in f" {served}" and served.endswith(f"{cid} imports=0"), served
    state = creates.state(cid)
    assert state["status"] == "created"
    inside = f"/proc/{state['pid']}/root"
    assert os.readlink(f"{inside}{LIBDIR}/libcuda.so.1").startswith("libcuda.so.")
    assert Path(f"{inside}{CONF}").read_text().splitlines()[-1] == LIBDIR
    assert creates.python_starts() - before == 1
    link, _, _, cvd = creates.start_and_wait(cid).splitlines()
    assert link == f"libcuda.so.{creates.sim.driver_version}"
    assert cvd == f"CVD={creates.sim.topology['gpus'][0]['uuid']}"
    (line,) = read_log(str(creates.log))
    assert line["id"] == cid and line["devices"] == creates.sim.topology["gpus"][0]["uuid"]


def test_a_refusal_reaches_the_callers_stderr_and_log(creates, daemon, tmp_path):
    """The worker writes with the caller's stderr and working directory (a relative
    ``--log``), then takes its own back: the next call is unaffected."""
    rootfs = make_busybox_rootfs(tmp_path / "rootfs")
    bundle = make_bundle(tmp_path, rootfs, ["/bin/true"], env={"NVIDIA_VISIBLE_DEVICES": "7"},
                         name="refused")  # fmt: skip
    calls = tmp_path / "calls"
    calls.mkdir()
    cid = f"daemon-refused-{os.getpid()}"
    proc = creates.call("--log", "rel.log", "--log-format", "json", "create", "--bundle", bundle,
                        cid, capture_output=True, text=True, cwd=calls)  # fmt: skip
    assert proc.returncode == 1
    (line,) = proc.stderr.splitlines()
    assert line.startswith("nvshim-runtime: error: ") and "7" in line
    (record,) = [json.loads(x) for x in (calls / "rel.log").read_text().splitlines()]
    assert record["level"] == "error"
    assert record["msg"] == "nvshim-runtime: " + line.split("error: ", 1)[1]
    assert len(daemon.served()) == 1 and line not in daemon.text()
    assert creates.state(cid) is None
    cid2 = f"daemon-after-{os.getpid()}"
    _, status = creates.create(rootfs, cid2)
    assert status == 0, creates.output(cid2)
    assert len(daemon.served()) == 2


def test_each_call_gets_its_own_environment(creates, sim_hosts, tmp_path):
    """One worker serves callers with different configurations in turn: GPU 5 exists on
    the eight-GPU host only."""
    from tests.conftest import write_config

    eight = write_config(tmp_path / "eight.toml", sim_hosts("h100x8-mig"), creates.bin_dir,
                         tmp_path / "state", creates.log, accept_env_unprivileged=True)  # fmt: skip
    d = Daemon(creates, "--workers", "1", "--max-workers", "1")
    try:
        rootfs = make_busybox_rootfs(tmp_path / "rootfs")
        statuses = []
        for n, config in enumerate([creates.config, eight, creates.config]):
            bundle = make_bundle(tmp_path, rootfs, ["/bin/true"],
                                 env={"NVIDIA_VISIBLE_DEVICES": "5"}, name=f"env{n}")  # fmt: skip
            cid = f"daemon-env-{os.getpid()}-{n}"
            creates.ids.append(cid)
            with open(tmp_path / f"{cid}.out", "w+") as out:  # the container keeps its stdio
                proc = subprocess.run(
                    [creates.runtime, "--root", creates.root, "create", "--bundle", bundle, cid],
                    env={**creates.env(), "NVSHIM_CONFIG": config},
                    stdin=subprocess.DEVNULL, stdout=out, stderr=out, timeout=60,
                )  # fmt: skip
                out.seek(0)
                statuses.append((proc.returncode, out.read().strip()))
        assert len(d.served()) == 3 and len(_workers(d.proc.pid)) == 1
    finally:
        assert d.stop() == 0
    assert [code for code, _ in statuses] == [1, 0, 1], statuses
    assert statuses[0][1] == statuses[2][1] and statuses[0][1].startswith("nvshim-runtime: error:")


def test_calls_from_another_mount_namespace_are_done_in_process(creates, daemon):
    rootfs = make_busybox_rootfs(creates.tmp / "rootfs")
    bundle = make_bundle(creates.tmp, rootfs, ["/bin/true"], env=GPU, name="ns")
    cid = f"daemon-ns-{os.getpid()}"
    creates.ids.append(cid)
    before = creates.python_starts()
    with open(creates.tmp / "ns.out", "w+") as out:  # the container keeps its stdio
        proc = subprocess.run(
            ["unshare", "--mount", "--propagation", "unchanged", creates.runtime, "--root",
             creates.root, "create", "--bundle", bundle, cid],
            env=creates.env(), stdin=subprocess.DEVNULL, stdout=out, stderr=out, timeout=60,
        )  # fmt: skip
    assert proc.returncode == 0, (creates.tmp / "ns.out").read_text()
    assert daemon.declined() == ["another mnt namespace"] and daemon.served() == []
    assert creates.python_starts() - before == 1  # the client did it itself
    assert creates.state(cid)["status"] == "created"


def test_exec_of_a_prepared_container_gets_the_enforced_variables(creates, daemon):
    rootfs = make_busybox_rootfs(creates.tmp / "rootfs")
    bundle = make_bundle(creates.tmp, rootfs, ["/bin/busybox", "sleep", "60"], env=GPU,
                         name="exec")  # fmt: skip
    cid = f"daemon-exec-{os.getpid()}"
    creates.ids.append(cid)
    with open(creates.tmp / "exec.out", "w") as out:  # the container keeps its stdio
        assert creates.call("create", "--bundle", bundle, cid, stdout=out).returncode == 0
    assert creates.call("start", cid, runtime=RUNC).returncode == 0
    proc = creates.call("exec", "--env", "CUDA_VISIBLE_DEVICES=all", cid, "/bin/busybox", "env",
                        capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    uuid = creates.sim.topology["gpus"][0]["uuid"]
    assert f"CUDA_VISIBLE_DEVICES={uuid}" in proc.stdout.splitlines()
    # the engines' form: a process file, which reaches runc as a memory file the worker
    # made and handed to the client with its number
    process = creates.tmp / "process.json"
    process.write_text(json.dumps({"args": ["/bin/busybox", "env"], "cwd": "/",
                                   "env": ["PATH=/bin", "CUDA_VISIBLE_DEVICES=all"],
                                   "user": {"uid": 0, "gid": 0}}))  # fmt: skip
    before = process.read_bytes()
    proc = creates.call("exec", "--process", str(process), cid, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert f"CUDA_VISIBLE_DEVICES={uuid}" in proc.stdout.splitlines()
    assert process.read_bytes() == before  # the engine's file is never written
    assert [s.split()[2] for s in daemon.served()] == ["create", "exec", "exec"]


def send_request(sock, packet: bytes) -> None:
    """Send ``packet`` with this process's stdio and an ``O_PATH`` fd of ``/`` as its
    working directory, as the client does; that fd is closed once sent."""
    cwd = os.open("/", os.O_PATH)
    try:
        socket.send_fds(sock, [packet], [0, 1, 2, cwd])
    finally:
        os.close(cwd)


def test_the_daemon_declines_what_it_must_not_serve(creates, daemon):
    """Another nvshim, a malformed request, another user: declined, and it keeps serving."""

    def ask(packet: bytes, uid: int | None = None) -> list[bytes]:
        read_end, write_end = os.pipe()
        child = os.fork()
        if child == 0:  # pragma: no cover - reports through the pipe
            try:
                path = os.open(daemon.socket, os.O_PATH)  # the test's tmp dir is root's only
                if uid is not None:
                    os.setgid(uid)
                    os.setuid(uid)
                with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
                    sock.connect(f"/proc/self/fd/{path}")
                    os.close(path)
                    send_request(sock, packet)
                    os.write(write_end, sock.recv(wire.LIMIT))
            finally:
                os._exit(0)
        os.close(write_end)
        with os.fdopen(read_end, "rb") as fh:
            answer = fh.read()
        os.waitpid(child, 0)
        return wire.unpack(answer)

    nvshim_file = wire.encode(__import__("nvshim").__file__)
    base = [wire.REQUEST, wire.PROTOCOL, __version__.encode(), nvshim_file]
    argv = wire.counted([b"nvshim-runtime", b"--version"])
    env = [f"{k}={v}".encode() for k, v in creates.env().items()]
    assert ask(wire.pack(*base[:2], b"0.0.0", nvshim_file, *argv)) == [
        wire.DECLINE, b"another nvshim"]  # fmt: skip
    assert ask(wire.pack(*base, b"9", b"x")) == [wire.DECLINE, b"bad count"]
    assert ask(b"hello") == [wire.DECLINE, b"not a request of this protocol"]
    os.chmod(daemon.socket, 0o666)
    try:
        assert ask(wire.pack(*base, *argv, *env), uid=65534) == [wire.DECLINE, b"uid 65534"]
    finally:
        os.chmod(daemon.socket, 0o600)
    assert ask(wire.pack(*base, *argv)) == [wire.DECLINE, b"another cache directory"]
    (answer, *_) = ask(wire.pack(*base, *argv, *env))
    assert answer == wire.EXEC  # served: --version goes on to runc
    assert daemon.served() == ["--version imports=0"]


def test_a_daemon_that_stops_answering_fails_the_call_and_deletes_the_container(creates):
    """A stand-in daemon has the client run runc create, then hangs up: the client deletes
    the container it created and fails with one line."""
    os.makedirs(creates.cache_dir, exist_ok=True)
    path = os.path.join(creates.cache_dir, "runtime.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(1)

    def stand_in() -> None:
        conn, _ = listener.accept()
        with conn:
            packet, fds, _, _ = socket.recv_fds(conn, wire.LIMIT, wire.FDS)
            for fd in fds:
                os.close(fd)
            (_, *argv), _ = wire.split_counted(wire.unpack(packet)[4:])  # after the program
            cleanup = [*argv[:2], b"delete", b"--force", argv[-1]]
            conn.sendall(wire.pack(wire.SPAWN, RUNC.encode(), *wire.counted(argv), *cleanup))
            conn.recv(wire.LIMIT)  # the status; then hang up

    thread = threading.Thread(target=stand_in)
    thread.start()
    try:
        rootfs = make_busybox_rootfs(creates.tmp / "rootfs")
        cid = f"daemon-lost-{os.getpid()}"
        _, status = creates.create(rootfs, cid)
    finally:
        thread.join(timeout=60)
        listener.close()
    assert status == 1
    (line,) = creates.output(cid).splitlines()
    assert line == ("nvshim-runtime: error: nvshim-runtimed stopped answering (no answer); "
                    "the container it had created was deleted")  # fmt: skip
    assert creates.state(cid) is None


def test_a_killed_daemon_leaves_calls_to_the_client_and_no_workers(creates):
    d = Daemon(creates, "--workers", "2")
    workers = _workers(d.proc.pid)
    assert len(workers) == 2
    d.proc.kill()
    d.proc.wait()
    deadline = time.monotonic() + 30
    while any(os.path.exists(f"/proc/{w}") for w in workers):
        assert time.monotonic() < deadline, "workers outlived their daemon"
        time.sleep(0.05)
    assert os.path.exists(d.socket)  # stale: nobody listens
    rootfs = make_busybox_rootfs(creates.tmp / "rootfs")
    cid = f"daemon-killed-{os.getpid()}"
    _, status = creates.create(rootfs, cid)
    assert status == 0, creates.output(cid)
    assert creates.state(cid)["status"] == "created"


def test_concurrent_calls_are_all_served(creates, daemon):
    """With one worker ready, more are added while it is busy; every call is served."""
    procs = []
    for n in range(4):
        rootfs = make_busybox_rootfs(creates.tmp / f"rootfs{n}")  # each writes its ld cache
        bundle = make_bundle(creates.tmp, rootfs, ["/bin/true"], env=GPU, name=f"many{n}")
        cid = f"daemon-many-{os.getpid()}-{n}"
        creates.ids.append(cid)
        with open(creates.tmp / f"{cid}.out", "w") as out:  # the container keeps its stdio
            procs.append((cid, subprocess.Popen(
                [creates.runtime, "--root", creates.root, "create", "--bundle", bundle, cid],
                env=creates.env(), stdin=subprocess.DEVNULL, stdout=out, stderr=out,
            )))  # fmt: skip
    for cid, proc in procs:
        assert proc.wait(timeout=120) == 0, (creates.tmp / f"{cid}.out").read_text()
    assert len(daemon.served()) == 4
    assert all(s.endswith("imports=0") for s in daemon.served())


def test_doctor_reports_the_daemon(creates):
    """Not running, answering, then a stale socket; a probe costs the daemon no worker."""
    from tests.conftest import run_nvshim

    def doctor() -> tuple[str, str]:
        proc = run_nvshim("doctor", "--only", "runtime-daemon", "--json",
                          env={"NVSHIM_CACHE_DIR": creates.cache_dir})  # fmt: skip
        (result,) = json.loads(proc.stdout)["checks"]
        assert proc.returncode == 0  # a warning: nvshim-runtime works without the daemon
        return result["status"], result["reason"]

    socket_path = os.path.join(creates.cache_dir, "runtime.sock")
    assert doctor() == ("warn", f"{socket_path}: not running; nvshim-runtime does each GPU "
                                "create in-process (slower)")  # fmt: skip
    d = Daemon(creates, "--workers", "1")
    try:
        workers = _workers(d.proc.pid)
        assert doctor() == ("ok", f"nvshim-runtimed (pid {d.proc.pid}) answers at {socket_path}")
        assert set(workers) <= set(_workers(d.proc.pid)) and "failed" not in d.text()
        (slots,) = [n for n in os.listdir(creates.cache_dir) if n.startswith("runtimed.")]
        slots = os.path.join(creates.cache_dir, slots)
        os.rename(slots, f"{slots}.away")
        assert doctor() == ("warn", f"nvshim-runtimed (pid {d.proc.pid}) answers at "
                            f"{socket_path} but keeps no slots at {slots}: each GPU create "
                            "starts an interpreter")  # fmt: skip
        os.rename(f"{slots}.away", slots)
    except BaseException:
        d.stop()  # a failed check leaves no daemon behind
        raise
    d.proc.kill()
    d.proc.wait()
    status, reason = doctor()
    assert status == "warn" and reason.startswith(f"{socket_path}: a stale socket")


def test_the_runtime_lookup_never_returns_the_callers_own_program(creates, daemon, tmp_path):
    """Served by the daemon as in-process: a configured runtime that is nvshim-runtime
    itself is skipped (else the client would exec itself, call after call)."""
    config = tmp_path / "self.toml"
    text = Path(creates.config).read_text()
    config.write_text(text.replace("[runtime]\n", f'[runtime]\nruntimes = ["{creates.runtime}"]\n'))
    rootfs = make_busybox_rootfs(tmp_path / "rootfs")
    bundle = make_bundle(tmp_path, rootfs, ["/bin/true"], env=GPU, name="self")
    proc = subprocess.run(
        [creates.runtime, "--root", creates.root, "create", "--bundle", bundle, "self"],
        env={**creates.env(), "NVSHIM_CONFIG": str(config)},
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr == (f"nvshim-runtime: error: no low-level runtime found (tried "
                           f"{creates.runtime})\n")  # fmt: skip
    assert len(daemon.served()) == 1


def _wait_for(predicate, what: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_call_past_the_call_timeout_is_killed(creates):
    """A caller that never reports runc's status holds its worker: the watchdog kills the
    worker, the caller sees the connection end, and a fresh worker serves the next call."""
    d = Daemon(creates, "--workers", "1", "--call-timeout", "1")
    try:
        rootfs = make_busybox_rootfs(creates.tmp / "rootfs")
        bundle = make_bundle(creates.tmp, rootfs, ["/bin/true"], env=GPU, name="stuck")
        argv = [creates.runtime, "--root", creates.root, "create", "--bundle", bundle, "stuck"]
        env = [f"{k}={v}".encode() for k, v in creates.env().items()]
        base = [wire.REQUEST, wire.PROTOCOL, __version__.encode(),
                wire.encode(__import__("nvshim").__file__)]  # fmt: skip
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
            sock.connect(d.socket)
            packet = wire.pack(*base, *wire.counted([a.encode() for a in argv]), *env)
            send_request(sock, packet)
            assert wire.unpack(sock.recv(wire.LIMIT))[0] == wire.SPAWN
            sock.settimeout(30)
            assert sock.recv(wire.LIMIT) == b""  # killed while waiting for the status
        assert "a call busy for 1 s, killed" in d.text()
        cid = f"daemon-after-stuck-{os.getpid()}"
        _, status = creates.create(rootfs, cid)
        assert status == 0, creates.output(cid)
        assert len(d.served()) == 1
    finally:
        assert d.stop() == 0


def test_extra_workers_idle_past_the_idle_timeout_are_retired(creates):
    """A worker busy with a silent connection makes the daemon add one; once both are
    idle again the extra one goes."""
    d = Daemon(creates, "--workers", "1", "--idle-timeout", "0.5")
    try:
        (first,) = _workers(d.proc.pid)
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as held:
            held.connect(d.socket)  # a worker takes it and waits for the request
            _wait_for(lambda: len(_workers(d.proc.pid)) == 2, "no worker was added")
            rootfs = make_busybox_rootfs(creates.tmp / "rootfs")
            cid = f"daemon-idle-{os.getpid()}"
            _, status = creates.create(rootfs, cid)  # served by the added worker
            assert status == 0, creates.output(cid)
        _wait_for(lambda: len(_workers(d.proc.pid)) == 1, "the extra worker stayed")
        assert len(d.served()) == 1 and "failed" not in d.text()
    finally:
        assert d.stop() == 0


IN_OPEN = 0x20


def _watch_opens(paths: list[str]) -> int:
    """An inotify fd (non-blocking) that reports each open of the files ``paths``."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    assert fd >= 0, os.strerror(ctypes.get_errno())
    for path in paths:
        assert libc.inotify_add_watch(fd, os.fsencode(path), IN_OPEN) >= 0, path
    return fd


def _opens(fd: int) -> int:
    """How many opens the watch ``fd`` reported since it was last read (watches of
    files: no event carries a name)."""
    events = b""
    with contextlib.suppress(BlockingIOError):
        while data := os.read(fd, 65536):
            events += data
    masks = [mask for _, mask, _, _ in struct.iter_unpack("iIII", events)]
    return sum(bool(mask & IN_OPEN) for mask in masks)


def test_a_new_worker_finds_the_driver_libraries_already_read(creates):
    """The parent reads what a worker keeps (the host from its inventory cache, the
    driver libraries' ELF headers) before it forks one: on a node whose inventory is
    cached, a worker's first create opens none of the host's libraries, though its
    ld-cache step checks each of them in the container."""
    first = Daemon(creates, "--workers", "1")
    try:
        rootfs = make_busybox_rootfs(creates.tmp / "rootfs")
        cid = f"daemon-warm-{os.getpid()}"
        _, status = creates.create(rootfs, cid)  # the inventory is cached
        assert status == 0, creates.output(cid)
    finally:
        assert first.stop() == 0
    folder = creates.sim.host_path(LIBDIR)
    libraries = [e.path for e in os.scandir(folder)
                 if ".so." in e.name and e.is_file(follow_symlinks=False)]  # fmt: skip
    d = Daemon(creates, "--workers", "1")
    try:
        watch = _watch_opens(libraries)
        try:
            rootfs2 = make_busybox_rootfs(creates.tmp / "rootfs2")
            cid2 = f"daemon-warm2-{os.getpid()}"
            _, status = creates.create(rootfs2, cid2)  # its worker's first call
            assert status == 0, creates.output(cid2)
            opened = _opens(watch)
        finally:
            os.close(watch)
        assert opened == 0, f"the worker opened host libraries {opened} times"
        inside = f"/proc/{creates.state(cid2)['pid']}/root"
        assert Path(f"{inside}{CONF}").read_text().splitlines()[-1] == LIBDIR
        assert os.readlink(f"{inside}{LIBDIR}/libcuda.so.1").startswith("libcuda.so.")
        assert len(d.served()) == 1 and "failed" not in d.text()
    finally:
        assert d.stop() == 0


def test_a_worker_holds_no_epoll_instance_of_the_parents(creates):
    """The parent waits with epoll; a worker it adds later, forked from it, closes that
    fd (it would keep the parent's watch list alive and is never its to wait on)."""

    def epolls(pid: int) -> int:
        fds = os.listdir(f"/proc/{pid}/fd")
        links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in fds]
        return sum(link == "anon_inode:[eventpoll]" for link in links)

    d = Daemon(creates, "--workers", "1")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as held:
            held.connect(d.socket)  # the first worker takes it and waits: a second is forked
            _wait_for(lambda: len(_workers(d.proc.pid)) == 2, "no worker was added")
            assert epolls(d.proc.pid) == 1
            assert [epolls(w) for w in _workers(d.proc.pid)] == [0, 0]
    finally:
        assert d.stop() == 0


def test_containerd_shim_calls_are_served(creates, tmp_path, monkeypatch):
    """The k8s path: containerd's shim calls nvshim-runtime for a pod's sandbox and its
    GPU container; with the daemon in containerd's mount namespace (here a private one,
    on a node the host's) the GPU create is served and the container gets its GPU."""
    from tests.cri_util import cri_session, nvshim_containerd
    from tests.engines.containerd_instance import private_containerd

    image = "nvshim.test/busybox:cri"
    monkeypatch.setenv("NVSHIM_CONFIG", creates.config)  # containerd -> shim -> runtime
    monkeypatch.setenv("NVSHIM_CACHE_DIR", creates.cache_dir)
    rootfs = make_busybox_rootfs(tmp_path / "rootfs")
    os.symlink("busybox", os.path.join(rootfs, "bin", "sleep"))
    config, archive, logs = nvshim_containerd(tmp_path, rootfs, image, creates.runtime)
    log = tmp_path / "nvshim-runtimed.log"
    with private_containerd(tmp_path, config) as ctd:
        ns = ("nsenter", f"--mount=/proc/{ctd.pid}/ns/mnt")
        daemon = start_daemon(creates.bin_dir, creates.env(), log, "--verbose", prefix=ns)
        try:
            assert ctd.ctr("-n", "k8s.io", "images", "import", archive).returncode == 0
            with cri_session(ctd.socket, image) as cri:
                pod = cri.run_pod("served", logs, "nvshim")
                show = ["sh", "-c", "echo CVD=$CUDA_VISIBLE_DEVICES"]
                result = cri.run_container(pod, "gpu", image, show, env=GPU)
        finally:
            daemon.terminate()
            assert daemon.wait(timeout=60) == 0
    assert result.exit_code == 0, result
    assert f"CVD={creates.sim.topology['gpus'][0]['uuid']}" in result.lines
    served = daemon_calls(log)
    assert daemon_calls(log, "declined") == [] and all(s.endswith(" imports=0") for s in served)
    (create,) = [n for n, ln in enumerate(served) if " create " in ln
                 and ln.split()[-2] == result.container_id]  # fmt: skip
    # the sandbox's create warmed the front's cache: the shim's GPU create came through a
    # slot, with no interpreter
    assert served_by(log)[create].startswith("slot "), served_by(log)


def test_a_daemon_that_cannot_make_its_cache_directory_says_why_in_one_line(creates, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    proc = subprocess.run(
        [os.path.join(creates.bin_dir, "nvshim-runtimed")],
        env={**creates.env(), "NVSHIM_CACHE_DIR": str(blocker / "cache")},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"nvshim-runtimed: error: {blocker}: not a directory: ")
    assert len(proc.stderr.splitlines()) == 1
    assert blocker.read_text() == "not a directory\n"
