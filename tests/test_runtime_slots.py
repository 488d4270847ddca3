"""nvshim-runtimed's slots: the sh front hands a GPU create to the daemon through FIFOs,
with no interpreter at all, and falls back to Python whenever the daemon did not take
the call (none running, a decline, busy fds). Real runc, the real front and daemon; a
stand-in daemon (the test, holding a slot directory built by ``Slots``) plays the
answers a daemon gives when it fails."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import threading
import time
from pathlib import Path

import pytest

from nvshim import __version__
from nvshim.runtime.slots import SLOTS, Slots, slots_name
from tests.podman_util import make_busybox_rootfs
from tests.runc_util import make_bundle, served_by
from tests.test_runtime_daemon import GPU, Daemon, _wait_for, _workers, creates  # noqa: F401
from tests.test_runtime_finish import CONF, LIBDIR


def warm(c) -> None:
    """One call through Python, which writes the front's cache: from then on the front
    decides alone (``nvshim.runtime.passthrough``). Interpreters are counted from here.
    The configuration is made a minute old first, as on a node: busybox's ``test -nt``
    compares whole seconds, so a cache written in the config's second would miss."""
    old = time.time() - 60
    os.utime(c.config, (old, old))
    assert c.call("--version", capture_output=True).returncode == 0
    c.baseline = c._starts()


def serve(c, *flags: str) -> Daemon:
    """A warm front (before the daemon: it serves no ``--version``) and the daemon; its
    own interpreter is not counted."""
    warm(c)
    d = Daemon(c, "--workers", "1", *flags)
    c.baseline = c._starts()
    return d


def slot_dir(c) -> str:
    return os.path.join(c.cache_dir, slots_name(__version__, __import__("nvshim").__file__))


def claims(c) -> list[str]:
    return sorted(n for n in os.listdir(slot_dir(c)) if n.endswith(".c"))


@pytest.fixture
def daemon(creates):  # noqa: F811
    d = serve(creates)
    yield d
    assert d.stop() == 0
    assert not os.path.lexists(slot_dir(creates))  # removed on the way out


def bundle_for(c, name: str, env=GPU, args=("/bin/true",)) -> tuple[str, str]:
    rootfs = make_busybox_rootfs(c.tmp / f"rootfs-{name}")
    cid = f"slot-{name}-{os.getpid()}"
    c.ids.append(cid)
    return make_bundle(c.tmp, rootfs, list(args), env=env, name=cid), cid


def create(c, bundle: str, cid: str, *flags: str, **kw) -> subprocess.CompletedProcess:
    with open(c.tmp / f"{cid}.out", "w") as out:  # the container keeps its stdio
        return c.call("create", *flags, "--bundle", bundle, cid, stdout=out, stderr=out, **kw)


def test_a_warm_gpu_create_starts_no_interpreter(creates, daemon):  # noqa: F811
    rootfs = make_busybox_rootfs(creates.tmp / "rootfs")
    cid = f"slot-{os.getpid()}"
    _, status = creates.create(rootfs, cid)
    assert status == 0, creates.output(cid)
    assert creates.python_starts() == 0
    (served,) = daemon.served()
    assert " create --pid-file" in f" {served}" and served.endswith(f"{cid} imports=0"), served
    assert served_by(daemon.err)[0].startswith("slot ")
    state = creates.state(cid)
    inside = f"/proc/{state['pid']}/root"
    assert os.readlink(f"{inside}{LIBDIR}/libcuda.so.1").startswith("libcuda.so.")
    assert Path(f"{inside}{CONF}").read_text().splitlines()[-1] == LIBDIR
    _, _, _, cvd = creates.start_and_wait(cid).splitlines()
    assert cvd == f"CVD={creates.sim.topology['gpus'][0]['uuid']}"
    _wait_for(lambda: claims(creates) == [], "the slot was not freed")
    # the ld-cache step ran the parent's copy of ldconfig: one, shared by the workers
    parent = ldconfig_copies(daemon.proc.pid)
    assert len(parent) == 1
    assert all(ldconfig_copies(pid) == parent for pid in _workers(daemon.proc.pid))


def ldconfig_copies(pid: int) -> set[tuple[int, int]]:
    """The ld-cache step's tmpfs copies of ldconfig process ``pid`` holds (fds on a
    directory holding only ``ldconfig``), by device and inode."""
    found = set()
    for name in os.listdir(f"/proc/{pid}/fd"):
        path = f"/proc/{pid}/fd/{name}"
        try:
            if os.path.isdir(path) and os.listdir(path) == ["ldconfig"]:
                st = os.stat(path)
                found.add((st.st_dev, st.st_ino))
        except OSError:
            continue
    return found


def test_a_refusal_reaches_the_callers_stderr_and_relative_log(creates, daemon, tmp_path):  # noqa: F811
    """The worker writes through the caller's own stderr (``pidfd_getfd``) and resolves
    ``--log`` in the caller's working directory."""
    bundle, cid = bundle_for(creates, "refused", env={"NVIDIA_VISIBLE_DEVICES": "7"})
    calls = tmp_path / "calls"
    calls.mkdir()
    proc = creates.call("--log", "rel.log", "create", "--bundle", bundle, cid,
                        capture_output=True, text=True, cwd=calls)  # fmt: skip
    assert proc.returncode == 1 and creates.python_starts() == 0
    (line,) = proc.stderr.splitlines()
    assert line.startswith("nvshim-runtime: error: ") and "7" in line
    assert (calls / "rel.log").read_text().startswith("nvshim-runtime: ")
    assert len(daemon.served()) == 1 and creates.state(cid) is None


def test_concurrent_creates_each_get_a_slot(creates, daemon):  # noqa: F811
    procs = []
    for n in range(5):
        bundle, cid = bundle_for(creates, f"many{n}")
        with open(creates.tmp / f"{cid}.out", "w") as out:
            argv = [creates.runtime, "--root", creates.root, "create", "--bundle", bundle, cid]
            procs.append((cid, subprocess.Popen(argv, env=creates.env(), stdout=out, stderr=out,
                                                stdin=subprocess.DEVNULL)))  # fmt: skip
    for cid, proc in procs:
        assert proc.wait(timeout=120) == 0, creates.output(cid)
        assert creates.state(cid)["status"] == "created"
    assert creates.python_starts() == 0 and len(daemon.served()) == 5
    assert len({how for how in served_by(daemon.err)}) == 5  # five slots
    _wait_for(lambda: claims(creates) == [], "a slot was not freed")


def test_busy_fds_send_the_call_to_python(creates, daemon):  # noqa: F811
    """fds 4 to 7 are the front's while it talks: a caller that has one open (to pass on
    with runc's ``--preserve-fds``) is served over the socket, through the client."""
    bundle, cid = bundle_for(creates, "fds")
    with open(creates.tmp / f"{cid}.out", "w") as out:
        proc = subprocess.run(
            ["sh", "-c", 'exec "$@" 5</dev/null', "sh", creates.runtime, "--root", creates.root,
             "create", "--bundle", bundle, cid],
            env=creates.env(), stdin=subprocess.DEVNULL, stdout=out, stderr=out, timeout=60,
        )  # fmt: skip
    assert proc.returncode == 0, creates.output(cid)
    assert creates.python_starts() == 1 and served_by(daemon.err) == ["socket"]


def test_a_caller_in_another_mount_namespace_is_declined_twice_then_done_in_process(
    creates,  # noqa: F811
    daemon,
):
    bundle, cid = bundle_for(creates, "ns")
    with open(creates.tmp / f"{cid}.out", "w") as out:
        proc = subprocess.run(
            ["unshare", "--mount", "--propagation", "unchanged", creates.runtime, "--root",
             creates.root, "create", "--bundle", bundle, cid],
            env=creates.env(), stdin=subprocess.DEVNULL, stdout=out, stderr=out, timeout=60,
        )  # fmt: skip
    assert proc.returncode == 0, creates.output(cid)
    # the slot's worker, then the socket's: the client does the call itself
    assert daemon.declined() == ["another mnt namespace"] * 2 and daemon.served() == []
    assert creates.python_starts() == 1
    _wait_for(lambda: claims(creates) == [], "the declined slot was not freed")


def test_a_killed_daemons_slots_read_as_no_daemon(creates):  # noqa: F811
    """Its FIFOs are still there, nobody holds them: the front reads end of file and
    Python does the call, without waiting."""
    d = serve(creates)
    workers = _workers(d.proc.pid)
    d.proc.kill()
    d.proc.wait()
    _wait_for(lambda: not any(os.path.exists(f"/proc/{w}") for w in workers), "workers stayed")
    assert os.path.isdir(slot_dir(creates))
    bundle, cid = bundle_for(creates, "killed")
    assert create(creates, bundle, cid).returncode == 0, creates.output(cid)
    assert creates.python_starts() == 1 and creates.state(cid)["status"] == "created"


def test_a_worker_killed_after_runc_created_the_container_has_it_deleted(creates, tmp_path):  # noqa: F811
    """The watchdog kills a worker while the front's runc still runs: the parent tells the
    front the call was lost; once runc is done the front has Python delete the container,
    and the call fails with one line."""
    use_runtime(creates, wrapped_runc(tmp_path / "slow-runc", "sleep 2"))
    d = serve(creates, "--call-timeout", "0.5")
    try:
        bundle, cid = bundle_for(creates, "lost")
        proc = create(creates, bundle, cid)
        assert proc.returncode == 1
        assert creates.output(cid) == (
            "nvshim-runtime: error: nvshim-runtimed stopped answering (no answer); "
            "the container it had created was deleted\n"
        )
        assert creates.state(cid) is None and "killed" in d.text()
        assert creates.python_starts() == 1  # the deletion only
        _wait_for(lambda: claims(creates) == [], "the lost slot was not freed")
    finally:
        assert d.stop() == 0


def wrapped_runc(path, before: str) -> str:
    """A runc at ``path`` that runs the sh line ``before`` first."""
    from tests.test_runtime_finish import RUNC

    path.write_text(f'#!/bin/sh\n{before}\nexec {RUNC} "$@"\n')
    path.chmod(0o755)
    return str(path)


def use_runtime(c, runtime: str) -> None:
    """Have ``c``'s configuration name ``runtime`` as its only low-level runtime."""
    config = Path(c.config)
    line = f'[runtime]\nruntimes = ["{runtime}"]\n'
    config.write_text(config.read_text().replace("[runtime]\n", line))


class StandIn:
    """The test as the daemon: a slot directory where the real one would be, the answers
    its own."""

    def __init__(self, c) -> None:
        self.slots = Slots(slot_dir(c))
        self.stopped = False  # stop(): the thread gives up waiting for a request

    def serve(self, answers, hold: float = 0.0):
        """A thread that waits for one request and writes ``answers`` to its slot (then
        holds the FIFOs ``hold`` seconds, or closes them at once: end of file)."""
        heard: list[str] = []

        def run() -> None:
            deadline = time.monotonic() + 30
            while not heard and not self.stopped and time.monotonic() < deadline:
                for k in range(SLOTS):
                    request = self.slots.request(k)
                    if request is not None:
                        heard.append(f"{k} {request[0]} {request[1]}")
                        for line in answers:
                            self.slots.say(k, line)
                        break
                time.sleep(0.01)
            time.sleep(hold)
            self.slots.close()

        thread = threading.Thread(target=run)
        thread.start()
        return thread, heard

    def stop(self, thread) -> None:
        self.stopped = True
        thread.join(timeout=60)


@pytest.mark.parametrize(
    "answers, code, message, starts",
    [
        ([], 0, "", 1),  # end of file before "a": nothing was done, Python does it
        (["l"], 0, "", 1),  # lost before "a": the same
        (["f"], 0, "", 1),  # declined
        (["a", "l"], 1, "nvshim-runtime: error: nvshim-runtimed stopped answering\n", 0),
        (["a"], 1, "nvshim-runtime: error: nvshim-runtimed stopped answering\n", 0),
        (["a", "e 3"], 3, "", 0),
    ],
    ids=["eof", "lost-first", "declined", "lost", "eof-after-a", "exit"],
)
def test_the_front_follows_the_answers(creates, answers, code, message, starts):  # noqa: F811
    """Before ``a`` anything but an answer of the protocol hands the call to Python (here
    with no daemon on the socket: in-process); after it, the call fails unless told how it
    ended."""
    stand_in = StandIn(creates)
    warm(creates)  # no daemon on the socket: the client does the call in-process
    bundle, cid = bundle_for(creates, "stand-in")
    thread, heard = stand_in.serve(answers)
    proc = create(creates, bundle, cid)
    thread.join(timeout=60)
    (request,) = heard
    k, pid, nargs = map(int, request.split())
    assert nargs == 6 and 0 <= k < SLOTS and pid > 0  # --root R create --bundle B ID
    assert proc.returncode == code, creates.output(cid)
    assert creates.python_starts() == starts
    if starts:
        assert creates.state(cid)["status"] == "created"
    else:
        assert creates.output(cid) == message and creates.state(cid) is None


def test_the_parent_answers_what_is_not_a_request_and_sweeps_dead_claims(creates, daemon):  # noqa: F811
    """A malformed request and one from a process that does not hold the slot are
    declined; a claim whose pid is gone (older than ten seconds) is removed, a live
    one kept."""
    path = slot_dir(creates)
    reply = [os.open(f"{path}/{k}.r", os.O_RDONLY | os.O_NONBLOCK) for k in (1, 2)]
    try:
        with open(f"{path}/1.u", "w") as up:
            up.write("not a request\n")
        with open(f"{path}/2.u", "w") as up:
            up.write(f"{os.getpid()} 1\n")  # this process holds no slot at fd 5
        for fd in reply:
            _wait_for(lambda fd=fd: _read(fd), "no answer")
    finally:
        for fd in reply:
            os.close(fd)
    assert daemon.declined() == [f"pid {os.getpid()} does not hold slot 2"]
    gone = subprocess.Popen(["true"])
    gone.wait()
    old = time.time() - 20
    for k, pid in ((7, gone.pid), (8, os.getpid())):
        with open(f"{path}/{k}.c", "w") as claim:
            claim.write(f"{pid}\n")
        os.utime(f"{path}/{k}.c", (old, old))
    _wait_for(lambda: "7.c" not in claims(creates), "the dead claim stayed")
    assert "8.c" in claims(creates)
    os.unlink(f"{path}/8.c")


def _read(fd: int) -> bytes:
    try:
        data = os.read(fd, 64)
    except BlockingIOError:
        return b""
    assert data == b"f\n"
    return data


def test_sigterm_removes_the_slots_and_a_new_daemon_makes_fresh_ones(creates):  # noqa: F811
    d = Daemon(creates, "--workers", "1")
    d.proc.send_signal(signal.SIGTERM)
    assert d.proc.wait(timeout=30) == 0 and not os.path.lexists(slot_dir(creates))
    os.makedirs(slot_dir(creates))  # a killed daemon's, with a claim left
    open(os.path.join(slot_dir(creates), "3.c"), "w").close()
    d = Daemon(creates, "--workers", "1")
    try:
        names = os.listdir(slot_dir(creates))
        assert len(names) == 2 * SLOTS and claims(creates) == []
        assert stat.S_ISFIFO(os.stat(os.path.join(slot_dir(creates), "0.r")).st_mode)
    finally:
        assert d.stop() == 0


@pytest.mark.parametrize("shell", [["dash"], ["bash", "--posix"], ["busybox", "sh"], []])
def test_every_posix_sh_talks_to_the_slots(creates, daemon, shell):  # noqa: F811
    """The front's exchange works under the shells /bin/sh is on nodes (Debian's dash,
    bash elsewhere, busybox's ash; tests/setup.sh installs busybox)."""
    bundle, cid = bundle_for(creates, "shell")
    with open(creates.tmp / f"{cid}.out", "w") as out:
        proc = subprocess.run(
            [*shell, creates.sh_runtime if shell else creates.runtime, "--root", creates.root,
             "create", "--bundle", bundle, cid],
            env=creates.env(), stdin=subprocess.DEVNULL, stdout=out, stderr=out, timeout=60,
        )  # fmt: skip
    assert proc.returncode == 0, creates.output(cid)
    assert creates.python_starts() == 0 and len(daemon.served()) == 1
    assert creates.state(cid)["status"] == "created"
    # the front's watchdog (a subshell and its sleep) was killed at the first answer:
    # only the daemon's processes hold the slot's FIFO now
    from tests.test_runtime_trust import holders

    (how,) = served_by(daemon.err)
    ours = {daemon.proc.pid, *_workers(daemon.proc.pid)}
    reply = os.path.join(slot_dir(creates), f"{how.split()[1]}.r")
    _wait_for(lambda: set(holders(reply)) <= ours, "the watchdog outlived the front", 0.5)
