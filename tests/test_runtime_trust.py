"""nvshim-runtimed's trust boundaries and fairness, with real runc, the real front and
daemon (issue 22): the front talks only to slots root keeps, the daemon refuses a cache
directory others can change and callers with fewer privileges than a plain engine's,
serves with the caller's umask, never makes a caller wait on another's call, and the
exec markers go with their containers."""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import stat
import struct
import subprocess
import time

import pytest

from nvshim.runtime.slots import ACK_WAIT
from nvshim.runtimed.pool import QUEUE_WAIT
from tests.podman_util import make_busybox_rootfs
from tests.runc_util import served_by
from tests.test_runtime_daemon import Daemon, _wait_for, creates  # noqa: F401
from tests.test_runtime_finish import RUNC
from tests.test_runtime_slots import (  # noqa: F401
    StandIn,
    bundle_for,
    claims,
    create,
    daemon,
    serve,
    slot_dir,
    use_runtime,
    warm,
    wrapped_runc,
)

# the sh front run by each shell /bin/sh is on nodes, and the compiled front (no shell)
SHELLS = {"dash": ["dash"], "bash-posix": ["bash", "--posix"], "busybox": ["busybox", "sh"],
          "compiled": []}  # fmt: skip


def run_front(c, shell, *argv: str, cid: str, prefix=(), **kw) -> subprocess.CompletedProcess:
    """``nvshim-runtime --root R ARGV`` run by ``shell`` (a list: the sh front; empty:
    the installed front, compiled where built), output in ``<cid>.out``."""
    front = c.sh_runtime if shell else c.runtime
    with open(c.tmp / f"{cid}.out", "a") as out:
        return subprocess.run(
            [*prefix, *shell, front, "--root", c.root, *argv],
            env=kw.pop("env", c.env()), stdin=subprocess.DEVNULL, stdout=out, stderr=out,
            timeout=60, **kw,
        )  # fmt: skip


def marker(c, cid: str) -> str:
    return os.path.join(c.cache_dir, "exec", cid)


# -- the front trusts only its own user's slots --------------------------------------


def _plant(c, how: str, tmp_path) -> None:
    path = slot_dir(c)
    if how == "dir-owner":
        os.chown(path, 1000, 1000)
    elif how == "fifo-owner":
        for name in os.listdir(path):
            os.chown(os.path.join(path, name), 1000, 1000)
    elif how == "dir-mode":
        os.chmod(path, 0o755)
    elif how == "symlink":
        elsewhere = tmp_path / "elsewhere"
        os.rename(path, elsewhere)
        os.symlink(elsewhere, path)
    elif how == "cache-dir-mode":
        os.chmod(c.cache_dir, 0o777)
    elif how == "acl":  # mode 0700 still, but an ACL entry lets uid 1000 in (ls: drwx------+)
        entries = [(0x01, 7, 0xFFFFFFFF), (0x02, 7, 1000), (0x04, 0, 0xFFFFFFFF),
                   (0x10, 7, 0xFFFFFFFF), (0x20, 0, 0xFFFFFFFF)]  # fmt: skip
        blob = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)
        os.setxattr(path, "system.posix_acl_access", blob)


@pytest.mark.parametrize(
    "how, shell",
    [
        ("dir-owner", "dash"),
        ("fifo-owner", "dash"),
        ("dir-mode", "dash"),
        ("dir-mode", "bash-posix"),
        ("dir-mode", "busybox"),
        ("symlink", "dash"),
        ("cache-dir-mode", "dash"),
        ("acl", "dash"),
        ("trusted", "dash"),  # the control: the same stand-in is obeyed when trusted
        *(
            (how, "compiled")
            for how in (
                "dir-owner",
                "fifo-owner",
                "dir-mode",
                "symlink",
                "cache-dir-mode",
                "acl",
                "trusted",
            )
        ),
    ],
)
def test_a_planted_slot_directory_is_never_used(creates, tmp_path, how, shell):  # noqa: F811
    """Issue 22's attack: with no daemon running, a slot directory another user could
    have planted answers ``a`` and ``x PROGRAM``; the root front must not exec PROGRAM,
    nor claim a slot, and Python does the call."""
    warm(creates)
    pwned = tmp_path / "pwned"
    program = tmp_path / "program"
    program.write_text(f'#!/bin/sh\necho "$@" > {pwned}\n')
    program.chmod(0o755)
    stand_in = StandIn(creates)
    _plant(creates, how, tmp_path)
    bundle, cid = bundle_for(creates, f"planted-{how}")
    thread, heard = stand_in.serve(["a", f"x {program}"])
    proc = run_front(creates, SHELLS[shell], "create", "--bundle", bundle, cid, cid=cid)
    if how == "trusted":
        thread.join(timeout=60)
        assert proc.returncode == 0 and pwned.read_text().split()[-1] == cid
        assert creates.python_starts() == 0 and creates.state(cid) is None
        return
    assert proc.returncode == 0, creates.output(cid)
    assert not pwned.exists() and creates.python_starts() == 1
    assert creates.state(cid)["status"] == "created"
    assert claims(creates) == [] and heard == []  # nothing done in the planted directory
    stand_in.stop(thread)


# -- the daemon refuses a cache directory others can change ------------------------------


@pytest.mark.parametrize("how", ["mode", "owner", "parent", "markers"])
def test_the_daemon_refuses_a_cache_directory_others_can_change(creates, how):  # noqa: F811
    cache = creates.cache_dir
    if how == "mode":
        os.chmod(cache, 0o775)
        bad = cache
    elif how == "owner":
        os.chown(cache, 1000, 1000)
        bad = cache
    elif how == "parent":
        nested = os.path.join(cache, "open", "cache")
        os.makedirs(nested)
        os.chmod(os.path.dirname(nested), 0o777)  # writable by all, not sticky
        creates.cache_dir, cache, bad = nested, nested, os.path.dirname(nested)
    else:
        os.mkdir(os.path.join(cache, "exec"), 0o757)
        os.chmod(os.path.join(cache, "exec"), 0o757)
        bad = os.path.join(cache, "exec")
    before = sorted(os.listdir(cache))
    proc = subprocess.run([os.path.join(creates.bin_dir, "nvshim-runtimed")], env=creates.env(),
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode != 0 and proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"nvshim-runtimed: error: {bad}: ") and "Traceback" not in line
    assert sorted(os.listdir(cache)) == before  # no socket, no slots


def test_a_sticky_world_writable_directory_above_is_accepted(creates, tmp_path):  # noqa: F811
    """/tmp-like: others cannot rename or remove root's entries there."""
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    (sticky / "cache").mkdir()
    creates.cache_dir = str(sticky / "cache")
    d = Daemon(creates, "--workers", "1")
    assert d.stop() == 0


# -- callers with fewer privileges are declined; the caller's umask applies -------------


def _seccomp_allow_all() -> None:
    """A seccomp filter that allows everything (Seccomp: 2), set before exec."""
    libc = ctypes.CDLL(None, use_errno=True)
    allow = (ctypes.c_ubyte * 8)(0x06, 0, 0, 0, 0, 0, 0xFF, 0x7F)  # BPF_RET|K, RET_ALLOW

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = Prog(1, ctypes.cast(allow, ctypes.c_void_p))
    if libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:  # PR_SET_SECCOMP, FILTER
        raise OSError(ctypes.get_errno(), "prctl")


@pytest.mark.parametrize(
    "how, reason",
    [
        (("setpriv", "--no-new-privs"), "NoNewPrivs 1"),
        (("setpriv", "--bounding-set", "-sys_module"), "Cap"),  # CapPrm first
        (("setpriv", "--inh-caps", "+net_admin"), "CapInh"),
        ("seccomp", "Seccomp 2"),
    ],
    ids=["no-new-privs", "bounding-set", "inheritable", "seccomp"],
)
def test_a_caller_with_fewer_privileges_is_done_in_its_own_process(creates, daemon, how, reason):  # noqa: F811
    bundle, cid = bundle_for(creates, "privileges")
    prefix, kw = (how, {}) if how != "seccomp" else ((), {"preexec_fn": _seccomp_allow_all})
    proc = run_front(creates, ["dash"], "create", "--bundle", bundle, cid, cid=cid,
                     prefix=prefix, **kw)  # fmt: skip
    assert proc.returncode == 0, creates.output(cid)
    declined = daemon.declined()
    assert len(declined) == 2 and all(r.startswith(reason) for r in declined), declined
    assert daemon.served() == [] and creates.python_starts() == 1  # slot, then socket
    assert creates.state(cid)["status"] == "created"
    _wait_for(lambda: claims(creates) == [], "the declined slot was not freed")


def test_the_callers_umask_applies_and_the_workers_comes_back(creates, daemon):  # noqa: F811
    """The exec marker the worker writes gets the caller's umask, call after call."""
    modes = []
    for mask in ("077", "022", "027"):
        bundle, cid = bundle_for(creates, f"umask{mask}")
        proc = run_front(creates, ["sh", "-c", f'umask {mask}; exec "$@"', "sh"],
                         "create", "--bundle", bundle, cid, cid=cid)  # fmt: skip
        assert proc.returncode == 0, creates.output(cid)
        modes.append(stat.S_IMODE(os.stat(marker(creates, cid)).st_mode))
    assert modes == [0o600, 0o644, 0o640]
    assert served_by(daemon.err) == ["slot " + h.split()[-1] for h in served_by(daemon.err)]
    assert len(daemon.served()) == 3 and creates.python_starts() == 0


# -- no caller waits on another's call ----------------------------------------------------


@pytest.mark.parametrize("shell", [*SHELLS, "another-sh"])
def test_a_silent_daemon_costs_the_front_its_deadline_then_python(creates, shell, tmp_path):  # noqa: F811
    """A stand-in that takes the request and never answers: the front gives up after
    ACK_WAIT seconds, says so (``n``), and Python does the call. Each shell's deadline:
    bash's ``read -t``, a sleep's SIGCHLD for dash and busybox, a watchdog subshell for a
    shell the front does not know (``another-sh``: dash at another path)."""
    if shell == "another-sh":
        argv = [shutil.copy(shutil.which("dash"), tmp_path / "another-sh")]
    else:
        argv = SHELLS[shell]
    stand_in = StandIn(creates)
    warm(creates)
    bundle, cid = bundle_for(creates, "silent")
    thread, heard = stand_in.serve([], hold=ACK_WAIT + 8)
    began = time.monotonic()
    proc = run_front(creates, argv, "create", "--bundle", bundle, cid, cid=cid)
    took = time.monotonic() - began
    k = int(heard[0].split()[0])
    said = os.read(stand_in.slots.fds[k][1], 64)
    thread.join(timeout=60)
    assert proc.returncode == 0, creates.output(cid)
    assert ACK_WAIT <= took < ACK_WAIT + 6 and creates.python_starts() == 1
    assert said == b"n\n" and creates.state(cid)["status"] == "created"
    # the watchdog and its sleep went with the front: nothing else holds the slot's FIFO
    _wait_for(lambda: holders(f"{slot_dir(creates)}/{k}.r") == [], "the watchdog stayed")


def holders(path: str) -> list[int]:
    """Processes other than this one with ``path`` open."""
    st, found = os.stat(path), []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid():
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                other = os.stat(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino):
                found.append(int(pid))
    return found


def test_a_stopped_daemon_parent_does_not_hold_a_create(creates):  # noqa: F811
    d = serve(creates)
    try:
        os.kill(d.proc.pid, signal.SIGSTOP)
        bundle, cid = bundle_for(creates, "stopped")
        began = time.monotonic()
        proc = create(creates, bundle, cid)
        took = time.monotonic() - began
        assert proc.returncode == 0, creates.output(cid)
        assert took < ACK_WAIT + 6 and creates.state(cid)["status"] == "created"
        assert creates.python_starts() == 1  # its worker (not stopped) took the socket call
        os.kill(d.proc.pid, signal.SIGCONT)
        _wait_for(lambda: claims(creates) == [], "the abandoned slot was not freed")
        bundle, cid = bundle_for(creates, "resumed")
        assert create(creates, bundle, cid).returncode == 0, creates.output(cid)
        assert served_by(d.err)[-1].startswith("slot ") and creates.python_starts() == 1
    finally:
        os.kill(d.proc.pid, signal.SIGCONT)
        assert d.stop() == 0


def test_a_saturated_pool_queues_briefly_then_declines(creates, tmp_path):  # noqa: F811
    """One worker, busy with a create whose runc takes 4 s: the next create waits
    ``QUEUE_WAIT`` on its slot, is declined there and at once on the socket (the pool
    has been saturated that long), and is done in its own process, long before."""
    started = tmp_path / "slow-started"
    line = f'case "$*" in *slow*) : > {started}; sleep 4 ;; esac'
    use_runtime(creates, wrapped_runc(tmp_path / "slow-runc", line))
    d = serve(creates, "--max-workers", "1")
    try:
        bundle, slow_id = bundle_for(creates, "slow")
        out = open(creates.tmp / f"{slow_id}.out", "w")
        first = subprocess.Popen([creates.runtime, "--root", creates.root, "create", "--bundle",
                                  bundle, slow_id], env=creates.env(), stdin=subprocess.DEVNULL,
                                 stdout=out, stderr=out)  # fmt: skip
        _wait_for(started.exists, "the slow create did not start")
        bundle, cid = bundle_for(creates, "quick")
        began = time.monotonic()
        proc = create(creates, bundle, cid)
        took = time.monotonic() - began
        assert proc.returncode == 0 and first.poll() is None, creates.output(cid)
        assert QUEUE_WAIT <= took < 3.5 and creates.state(cid)["status"] == "created"
        assert d.declined()[-2:] == [d.declined()[-2], "all 1 workers busy (socket)"]
        assert d.declined()[-2].startswith("all 1 workers busy (slot ")
        assert first.wait(timeout=60) == 0 and creates.state(slow_id)["status"] == "created"
        out.close()
    finally:
        assert d.stop() == 0


def test_a_burst_waits_for_a_busy_worker_instead_of_starting_python(creates, tmp_path):  # noqa: F811
    """Issue 28: one worker and no more, two creates at once whose runc takes 0.3 s: the
    second waits for the worker (it was declined at once, and started an interpreter)."""
    line = 'case "$*" in *create*) sleep 0.3 ;; esac'
    use_runtime(creates, wrapped_runc(tmp_path / "slowish-runc", line))
    d = serve(creates, "--max-workers", "1")
    try:
        procs = []
        for n in range(2):
            bundle, cid = bundle_for(creates, f"burst{n}")
            out = open(creates.tmp / f"{cid}.out", "w")
            argv = [creates.runtime, "--root", creates.root, "create", "--bundle", bundle, cid]
            procs.append((cid, subprocess.Popen(argv, env=creates.env(), stdin=subprocess.DEVNULL,
                                                stdout=out, stderr=out)))  # fmt: skip
        for cid, proc in procs:
            assert proc.wait(timeout=60) == 0, creates.output(cid)
            assert creates.state(cid)["status"] == "created"
        assert d.declined() == [] and creates.python_starts() == 0
        assert len(d.served()) == 2
    finally:
        assert d.stop() == 0


@pytest.mark.parametrize(
    "fifo, conf",
    [
        ("/etc/ld.so.conf.d/evil.conf", None),
        ("/opt/conf.d/evil.conf", "include /opt/conf.d/*.conf"),
        ("/etc/more.d/evil.conf", "include more.d/*.conf"),  # relative to /etc
    ],
    ids=["ld.so.conf.d", "include", "relative-include"],
)
def test_a_fifo_in_the_images_ld_so_conf_d_fails_its_create_at_once(creates, daemon, fifo, conf):  # noqa: F811
    """Issue 22: ldconfig opening a FIFO blocked a worker for 60 s; it is refused, in
    /etc/ld.so.conf.d or wherever an include line of the image's /etc/ld.so.conf names,
    where the host ldconfig would run (the image's ld.so.cache is not one nvshim can add
    to; where it is, nothing reads the configuration: test_runtime_races.py)."""
    rootfs = make_busybox_rootfs(creates.tmp / "rootfs-fifo")
    os.makedirs(os.path.dirname(f"{rootfs}{fifo}"), exist_ok=True)
    os.mkfifo(f"{rootfs}{fifo}")
    with open(f"{rootfs}/etc/ld.so.cache", "wb") as fh:
        fh.write(b"not a cache")
    if conf:
        with open(f"{rootfs}/etc/ld.so.conf", "w") as fh:
            fh.write(f"# the image's\n{conf}\n")
    from tests.runc_util import make_bundle

    cid = f"fifo-{os.getpid()}"
    creates.ids.append(cid)
    bundle = make_bundle(creates.tmp, rootfs, ["/bin/true"], env={"NVIDIA_VISIBLE_DEVICES": "0"},
                         name=cid)  # fmt: skip
    began = time.monotonic()
    proc = create(creates, bundle, cid)
    assert proc.returncode == 1 and time.monotonic() - began < 10
    (line,) = creates.output(cid).splitlines()
    assert line.startswith("nvshim-runtime: error: ") and "not a regular file" in line, line
    assert line.count(fifo) == 1
    assert creates.state(cid) is None and creates.python_starts() == 0
    bundle, cid = bundle_for(creates, "after-fifo")  # the daemon serves the next one
    assert create(creates, bundle, cid).returncode == 0, creates.output(cid)


# -- relative runtime paths; markers go with their containers ------------------------------


def test_a_runtime_found_through_a_relative_path_entry_is_run_by_a_slot(creates, daemon, tmp_path):  # noqa: F811
    work = tmp_path / "work"
    (work / "rel").mkdir(parents=True)
    os.symlink(RUNC, work / "rel" / "runc")
    use_runtime(creates, "runc")
    env = {**creates.env(), "PATH": "rel"}
    warm_proc = subprocess.run([creates.runtime, "--version"], env=env, cwd=work,
                               capture_output=True, timeout=60)  # fmt: skip
    assert warm_proc.returncode == 0
    creates.baseline = creates._starts()
    bundle, cid = bundle_for(creates, "relative")
    proc = run_front(creates, [], "create", "--bundle", bundle, cid, cid=cid, env=env,
                     cwd=work)  # fmt: skip
    assert proc.returncode == 0, creates.output(cid)
    assert creates.state(cid)["status"] == "created" and creates.python_starts() == 0
    assert served_by(daemon.err)[-1].startswith("slot ")


@pytest.mark.parametrize("shell", list(SHELLS))
def test_delete_leaves_the_marker_to_the_sweep_then_a_slot_takes_the_id(creates, daemon, shell):  # noqa: F811
    """With the daemon's slots in place a GPU container's delete is exec'd: its marker
    (young: a create in flight could own it) waits for the daemon's sweep, and a create
    of the same id still goes to a slot (tests/test_runtime_markers.py: the sweep)."""
    bundle, cid = bundle_for(creates, "reused")
    for round_ in range(2):
        proc = run_front(creates, SHELLS[shell], "create", "--bundle", bundle, cid, cid=cid)
        assert proc.returncode == 0, creates.output(cid)
        assert os.path.exists(marker(creates, cid)), round_
        proc = run_front(creates, SHELLS[shell], "delete", "--force", cid, cid=cid)
        assert proc.returncode == 0 and creates.state(cid) is None, creates.output(cid)
        assert os.path.exists(marker(creates, cid))
    assert len(served_by(daemon.err)) == 2 and all(
        how.startswith("slot ") for how in served_by(daemon.err)
    )
    assert creates.python_starts() == 0


def test_a_failed_delete_keeps_the_marker_and_its_status(creates, daemon):  # noqa: F811
    """runc's answer is the front's: a delete that fails (the id is not runc's) keeps
    the marker; a non-GPU create of that id has Python drop it."""
    bundle, cid = bundle_for(creates, "stale")
    os.makedirs(os.path.dirname(marker(creates, cid)), exist_ok=True)
    open(marker(creates, cid), "w").close()
    proc = run_front(creates, ["dash"], "delete", cid, cid=cid)
    assert proc.returncode == 1 and os.path.exists(marker(creates, cid))
    assert "does not exist" in creates.output(cid) and creates.python_starts() == 0
    plain, _ = bundle_for(creates, "plain", env={})
    proc = run_front(creates, ["dash"], "create", "--bundle", plain, cid, cid=cid)
    assert proc.returncode == 0, creates.output(cid)
    assert not os.path.exists(marker(creates, cid)) and creates.python_starts() == 1
