"""kill -9 at every step of a GPU create and of a delete, a full cache file system and an
unwritable log: with real runc, the real sh front and a real nvshim-runtimed.

The create is stopped at a precise step by real mechanisms: the low-level runtime is a
runc wrapper that stops itself (SIGSTOP) before or after running runc, and nvshim's own
steps stop at ``nvshim.defaults.fault_point`` (armed by ``NVSHIM_TEST_PAUSE`` in the
environment the daemon, or the in-process runtime, started with). The test then kills
one process with SIGKILL (the front, the worker serving the call, the daemon's parent or
runc) and lets the stopped one go on. After each fault:

- the engine's call succeeded, or failed with one line (or, its own process killed, the
  engine's ``delete --force`` cleans up as containerd's does);
- ``config.json`` is the original or the fully edited one, never half-written;
- runc lists what the engine expects: the container created and fully prepared after a
  success, nothing after a failure;
- no slot stays claimed, and the daemon (restarted as systemd would, when its parent was
  killed) serves the next GPU create.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.podman_util import make_busybox_rootfs
from tests.runc_util import daemon_calls, make_bundle, start_daemon
from tests.test_runtime_finish import CONF, LIBDIR, RUNC, Creates

GPU = {"NVIDIA_VISIBLE_DEVICES": "0"}
# the wrapper: `create`/`delete` stop before or after runc when $FAULTS/stop-CMD-WHEN
# exists (removed: once); its pid goes to $FAULTS/stopped-CMD-WHEN
WRAPPER = """#!/bin/sh
d={faults}
cmd=
for a do case $a in create|delete|run) cmd=$a; break ;; esac; done
stop() {{
  [ -n "$cmd" ] && rm "$d/stop-$cmd-$1" 2>/dev/null || return 0
  echo $$ >"$d/stopped-$cmd-$1.tmp" && mv "$d/stopped-$cmd-$1.tmp" "$d/stopped-$cmd-$1"
  kill -STOP $$
}}
r() {{ ( exec 2>&9 9>&-; exec "$@" ); }}  # killed: no "Killed" of this shell's own
stop before
r {runc} "$@" 9>&2 2>/dev/null
rc=$?
stop after
exit $rc
"""
# nvshim's own steps (nvshim.defaults.fault_point) and the wrapper's, in a create's order
STEPS = ("rewrite", "runc-before", "runc-during", "runc-after", "finish", "answer")
POINTS = ("rewrite", "finish", "writable", "answer")  # nvshim.defaults.fault_point's
# a createRuntime hook in every bundle: stops runc inside its create when armed
# ($FAULTS/stop-create-during); runc's pid goes to $FAULTS/runc-during
HOOK = """#!/bin/sh
d={faults}
rm "$d/stop-create-during" 2>/dev/null || exit 0
echo $PPID >"$d/runc-during"
echo $$ >"$d/stop.tmp" && mv "$d/stop.tmp" "$d/stopped-create-during"
kill -STOP $$
"""


def _stopped(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (ProcessLookupError, FileNotFoundError):  # gone, or reaped between the two
        return False
    return not stat.rsplit(")", 1)[1].startswith(" Z")


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _until(what, timeout: float = 30.0, message: str = ""):
    deadline = time.monotonic() + timeout
    while not (found := what()):
        assert time.monotonic() < deadline, message or f"timed out waiting for {what}"
        time.sleep(0.02)
    return found


class Faults(Creates):
    """``Creates`` whose low-level runtime is the stopping wrapper, on a cache dir of its
    own, with or without nvshim-runtimed (``mode``: ``in-process``, ``socket`` or
    ``slot``, how the daemon gets the call)."""

    def __init__(self, sim, tmp_path: Path, mode: str) -> None:
        cache = tmp_path / "cache"
        cache.mkdir(mode=0o700, exist_ok=True)  # a tmpfs may be mounted there
        super().__init__(sim, tmp_path, cache_dir=str(cache))
        self.mode = mode
        self.faults = tmp_path / "faults"
        self.faults.mkdir()
        self.wrapper = tmp_path / "runc-wrapper"
        self.wrapper.write_text(WRAPPER.format(faults=self.faults, runc=RUNC))
        self.wrapper.chmod(0o755)
        self.hook = tmp_path / "create-runtime-hook"
        self.hook.write_text(HOOK.format(faults=self.faults))
        self.hook.chmod(0o755)
        text = Path(self.config).read_text()
        Path(self.config).write_text(
            text.replace("[runtime]\n", f'[runtime]\nruntimes = ["{self.wrapper}"]\n', 1)
        )
        self.rootfs = make_busybox_rootfs(tmp_path / "rootfs")
        self.pause = f"{self.faults}:{','.join(POINTS)}"
        self.readonly = False
        self.count = 0
        self.disarm()
        if mode != "in-process":
            self.start_daemon()

    def start_daemon(self, log: Path | None = None) -> None:
        self.daemon_log = log or self.tmp / f"nvshim-runtimed-{self.count}.log"
        env = {**self.env(), "NVSHIM_TEST_PAUSE": self.pause}
        self.daemon = start_daemon(self.bin_dir, env, self.daemon_log, "--verbose",
                                   "--workers", "1")  # fmt: skip

    def call_env(self) -> dict[str, str]:
        env = self.env()
        if self.mode == "in-process":
            env["NVSHIM_TEST_PAUSE"] = self.pause
        return env

    def bundle(self, cid: str) -> tuple[str, bytes]:
        show = ["/bin/sh", "-c", f"readlink {LIBDIR}/libcuda.so.1; cat {CONF}"]
        hook = {"path": str(self.hook), "env": ["PATH=/usr/bin:/bin"]}
        bundle = make_bundle(self.tmp, self.rootfs, show, env=GPU, name=cid,
                             hooks={"createRuntime": [hook]}, readonly=self.readonly)  # fmt: skip
        return bundle, Path(bundle, "config.json").read_bytes()

    def start_create(self, cid: str, bundle: str) -> subprocess.Popen:
        """``create`` as containerd's shim calls it (a pid file; the bundle as its cwd)."""
        if self.mode == "socket":  # a cold front cache: the front starts the client
            Path(self.cache_dir, "runtime-front").unlink(missing_ok=True)
        self.ids.append(cid)
        argv = [self.runtime, "--root", self.root, "create", "--bundle", bundle,
                "--pid-file", os.path.join(bundle, "pid"), cid]  # fmt: skip
        out = open(self.tmp / f"{cid}.out", "w")
        err = open(self.tmp / f"{cid}.err", "w")
        with out, err:
            return subprocess.Popen(argv, env=self.call_env(), cwd=bundle,
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=err)  # fmt: skip

    def stopped_at(self, step: str) -> int:
        """Arm ``step``; the pid of the process stopped there (once it is)."""
        name = f"stopped-create-{step[5:]}" if step.startswith("runc-") else step
        path = self.faults / name
        pid = int(_until(lambda: path.exists() and path.read_text().strip(),
                         message=f"the create never reached {step}"))  # fmt: skip
        _until(lambda: _stopped(pid), message=f"pid {pid} did not stop at {step}")
        return pid

    def arm(self, step: str) -> None:
        for name in POINTS:  # fault points pass once disarmed
            (self.faults / name).write_text("disarmed\n")
        if step.startswith("runc-"):
            (self.faults / f"stop-create-{step[5:]}").write_text("")
        else:
            (self.faults / step).unlink()

    def disarm(self) -> None:
        for name in POINTS:
            (self.faults / name).write_text("disarmed\n")
        for stop in self.faults.glob("stop-*"):
            stop.unlink()

    def worker(self, bundle: str) -> int:
        """The daemon's worker serving the call (it took on the call's cwd, the bundle)."""
        busy = [p for p in _children(self.daemon.pid)
                if os.path.realpath(f"/proc/{p}/cwd") == os.path.realpath(bundle)]  # fmt: skip
        assert len(busy) == 1, (busy, _children(self.daemon.pid))
        return busy[0]

    def prepared(self, cid: str) -> bool:
        """Whether runc's created container ``cid`` has what the finishing steps give."""
        state = self.state(cid)
        assert state is not None and state["status"] == "created", state
        inside = f"/proc/{state['pid']}/root"
        try:
            link = os.readlink(f"{inside}{LIBDIR}/libcuda.so.1")
            conf = Path(f"{inside}{CONF}").read_text().splitlines()
        except OSError:
            return False
        return link.startswith("libcuda.so.") and conf[-1:] == [LIBDIR]

    def claims(self) -> list[str]:
        return sorted(str(p.relative_to(self.cache_dir)) for p in
                      Path(self.cache_dir).glob("runtimed.*/*.c"))  # fmt: skip

    def wrappers(self) -> list[int]:
        """Live processes of the wrapper (a stopped runc the test must not leave)."""
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    cmd = (entry / "cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                if str(self.wrapper).encode() in cmd[:2] and _alive(int(entry.name)):
                    found.append(int(entry.name))
        return found


@pytest.fixture
def faults(request, sim_hosts, tmp_path):
    f = Faults(sim_hosts("single"), tmp_path, request.param)
    yield f
    f.disarm()
    for pid in f.wrappers():
        os.kill(pid, signal.SIGKILL)
    if f.daemon is not None and f.daemon.poll() is None:
        f.daemon.terminate()
        f.daemon.wait(timeout=60)
    for cid in f.ids:
        subprocess.run([RUNC, "--root", f.root, "delete", "--force", cid], capture_output=True)


def _cases():
    for mode in ("in-process", "socket", "slot"):
        for step in STEPS:
            for victim in ("front", "worker", "parent", "runc"):
                daemon_only = victim in ("worker", "parent") or step == "answer"
                if mode == "in-process" and daemon_only:
                    continue
                if victim == "runc" and not step.startswith("runc-"):
                    continue  # runc runs only between those two
                yield pytest.param(mode, step, victim, id=f"{mode}-{step}-{victim}")


def _busy_in(pid: int, bundle: str) -> bool:
    """Whether process ``pid`` lives and still works in ``bundle`` (a worker has its
    call's working directory until the call ends)."""
    try:
        return os.path.realpath(f"/proc/{pid}/cwd") == os.path.realpath(bundle) and _alive(pid)
    except OSError:
        return False


def _marker(f: Faults, cid: str) -> Path:
    return Path(f.cache_dir, "exec", cid)


def _one_line(text: str) -> str:
    lines = text.splitlines()
    assert len(lines) == 1, text
    return lines[0]


def _check_next_create(f: Faults, n: int, served: bool = True) -> None:
    """The next GPU create succeeds, fully prepared, and (``served``) the daemon serves it."""
    f.disarm()
    cid = f"next-{os.getpid()}-{n}"
    bundle, _ = f.bundle(cid)
    proc = f.start_create(cid, bundle)
    assert proc.wait(timeout=60) == 0, (f.tmp / f"{cid}.err").read_text()
    assert f.prepared(cid)
    if served and f.mode != "in-process":
        calls = [c for c in daemon_calls(f.daemon_log) if f" {cid} " in f" {c} "]
        assert calls, Path(f.daemon_log).read_text()
    subprocess.run([RUNC, "--root", f.root, "delete", "--force", cid], check=True)


@pytest.mark.parametrize("faults, step, victim", list(_cases()), indirect=["faults"])
def test_kill_at_each_step_of_a_create(faults, step, victim):
    _kill_during_a_create(faults, step, victim)


@pytest.mark.parametrize("faults, victim", [
    pytest.param(m, v, id=f"{m}-{v}") for m in ("in-process", "socket", "slot")
    for v in ("front", "worker", "parent") if m != "in-process" or v == "front"
], indirect=["faults"])  # fmt: skip
def test_kill_while_a_read_only_root_is_writable(faults, victim):
    """A read-only root is writable while the finishing steps run: a kill then leaves
    no container with a writable root (deleted, or read-only again and prepared)."""
    faults.readonly = True
    _kill_during_a_create(faults, "writable", victim)


def _read_only_root(pid: int) -> bool:
    """Whether the root mount of process ``pid`` is read-only (its mountinfo)."""
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == "/":
            return "ro" in fields[5].split(",")
    raise AssertionError(f"pid {pid}: no root mount")


def _kill_during_a_create(f: Faults, step: str, victim: str) -> None:
    """Stop a GPU create at ``step``, kill ``victim``, let it go on: the engine, the
    bundle, runc, the slots and the next create are as they must be."""
    if f.mode == "slot":  # the front's cache, warm: the next create comes by slot
        assert f.call("list", capture_output=True).returncode == 0
    cid = f"fault-{os.getpid()}"
    bundle, original = f.bundle(cid)
    f.arm(step)
    proc = f.start_create(cid, bundle)
    paused = f.stopped_at(step)
    pids = {"front": proc.pid, "runc": paused if step.startswith("runc-") else None}
    if step == "runc-during":  # the hook stopped; runc waits for it
        pids["runc"] = int((f.faults / "runc-during").read_text())
    if f.mode != "in-process":
        pids["parent"] = f.daemon.pid
        pids["worker"] = f.worker(bundle)
    elif step != "runc-during":
        assert paused in (proc.pid, *_children(proc.pid))
    os.kill(pids[victim], signal.SIGKILL)
    if victim == "parent":
        f.daemon.wait(timeout=30)
    if paused != pids[victim]:
        os.kill(paused, signal.SIGCONT)
    status = proc.wait(timeout=90)
    _until(lambda: not f.wrappers(), message="runc still runs")
    if "worker" in pids:  # a worker left without its caller finishes (or drops) the call
        _until(lambda: not _busy_in(pids["worker"], bundle), message="the worker kept the call")
    err = (f.tmp / f"{cid}.err").read_text()
    # the engine's view
    if victim == "front":
        assert status == -signal.SIGKILL
    elif status == 0:
        assert err == ""
        assert f.prepared(cid), "created but not prepared"
        if f.readonly:
            assert _read_only_root(f.state(cid)["pid"]), "created with a writable root"
        assert _marker(f, cid).exists()  # an exec of it gets the enforced variables
    else:
        if victim == "runc" and step == "runc-during":  # runc init: its parent went; then us
            assert err.startswith("parent closed synchronisation channel\n"), err
            err = err.split("\n", 1)[1]
        line = _one_line(err)
        assert line.startswith("nvshim-runtime: error: "), line
        if victim == "runc":  # it said nothing: nvshim says it (no shell "Killed" line)
            assert line.endswith(f"{f.wrapper} was killed by signal 9, container deleted"), line
        assert f.state(cid) is None, "a failed create left its container"
    if status != 0:  # containerd deletes what a failed create may have left, through us
        delete = f.call("delete", "--force", cid, capture_output=True, text=True)
        assert delete.returncode == 0 or "does not exist" in delete.stderr, delete.stderr
        assert f.state(cid) is None, "the container outlived its delete"
        assert not _marker(f, cid).exists(), "the exec marker outlived its container"
    # config.json: the original, or the edited one, never half-written
    text = Path(bundle, "config.json").read_bytes()
    assert text == original or "nvshim.io/injected" in json.loads(text)["annotations"]
    # no claim outlives its front (the parent frees them; a new parent starts afresh)
    if f.mode != "in-process":
        if victim == "parent":
            assert f.daemon.poll() is not None
            _check_next_create(f, 1, served=False)  # no daemon: done in-process
            f.count += 1
            f.start_daemon()  # as systemd restarts it
        _until(lambda: not f.claims(), 15, f"claims left: {f.claims()}")
    _check_next_create(f, 2)
    if f.mode != "in-process":
        assert not f.claims()


@pytest.mark.parametrize("faults", ["slot"], indirect=True)
@pytest.mark.parametrize("victim", ["front", "runc", "worker", "parent"])
@pytest.mark.parametrize("step", ["runc-before", "runc-after"])
def test_kill_at_each_step_of_a_delete(faults, step, victim):
    """A prepared GPU container's ``delete`` (the front runs runc, then drops the exec
    marker; no worker takes part): whatever is killed, the engine's retry (``delete
    --force``, as containerd's shim does) leaves neither the container nor its marker,
    and the daemon serves on."""
    f = faults
    assert f.call("list", capture_output=True).returncode == 0
    cid = f"gone-{os.getpid()}"
    bundle, _ = f.bundle(cid)
    f.ids.append(cid)
    assert f.start_create(cid, bundle).wait(timeout=60) == 0
    assert f.prepared(cid) and _marker(f, cid).exists()
    (f.faults / f"stop-delete-{step[5:]}").write_text("")
    err = f.tmp / f"{cid}.delete.err"
    with open(err, "w") as fh:
        proc = subprocess.Popen([f.runtime, "--root", f.root, "delete", cid], env=f.env(),
                                stdin=subprocess.DEVNULL, stdout=fh, stderr=fh)  # fmt: skip
    path = f.faults / f"stopped-delete-{step[5:]}"
    paused = int(_until(lambda: path.exists() and path.read_text().strip()))
    _until(lambda: _stopped(paused))
    pids = {"front": proc.pid, "runc": paused, "parent": f.daemon.pid,
            "worker": _children(f.daemon.pid)[0]}  # idle: a delete needs none  # fmt: skip
    os.kill(pids[victim], signal.SIGKILL)
    if paused != pids[victim]:
        os.kill(paused, signal.SIGCONT)
    status = proc.wait(timeout=60)
    _until(lambda: not f.wrappers(), message="runc still runs")
    if status not in (0, -signal.SIGKILL):
        assert len(err.read_text().splitlines()) <= 1, err.read_text()
    retry = f.call("delete", "--force", cid, capture_output=True, text=True)
    assert retry.returncode == 0 or "does not exist" in retry.stderr, retry.stderr
    assert f.state(cid) is None
    assert not _marker(f, cid).exists(), "the exec marker outlived its container"
    if victim == "parent":
        f.daemon.wait(timeout=30)
        f.count += 1
        f.start_daemon()
    _until(lambda: not f.claims(), 15, f"claims left: {f.claims()}")
    _check_next_create(f, 3)


@pytest.fixture
def tiny_fs(tmp_path):
    """A 1 MiB tmpfs of 400 inodes at ``tmp_path/cache`` (unmounted afterwards); call it
    to fill it up (every block and inode), again with False to free it."""
    mount = tmp_path / "cache"
    mount.mkdir()
    opts = "size=1m,nr_inodes=400,mode=0700"  # the daemon's slots need 257
    subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "nvshim-test", str(mount)], check=True)
    filler = mount / "filler"

    def fill(full: bool = True) -> None:
        if not full:
            shutil.rmtree(filler)
            return
        filler.mkdir()
        with open(filler / "blocks", "wb") as fh:
            try:
                while True:
                    fh.write(b"\0" * 65536)
                    fh.flush()
            except OSError as err:
                assert err.errno == errno.ENOSPC
        for n in range(1000):
            try:
                (filler / str(n)).touch()
            except OSError as err:
                assert err.errno == errno.ENOSPC
                break
        else:
            raise AssertionError("the tmpfs never ran out of inodes")

    yield fill
    subprocess.run(["umount", "-l", str(mount)], check=True)


def _refused(f: Faults, cid: str, original: bytes, bundle: str, status: int) -> str:
    """The create failed cleanly: one line, config.json untouched, no container."""
    assert status != 0
    line = _one_line((f.tmp / f"{cid}.err").read_text())
    assert Path(bundle, "config.json").read_bytes() == original
    assert f.state(cid) is None
    return line


@pytest.mark.parametrize("faults", ["in-process", "slot"], indirect=True)
def test_a_full_cache_file_system(tiny_fs, faults):
    """The cache directory's file system full (ENOSPC, blocks and inodes): a GPU create
    fails in one line before it changed anything (no exec marker, no enforcement: no
    GPU), other calls go on, and once there is room again the daemon serves creates."""
    f = faults
    assert f.call("list", capture_output=True).returncode == 0  # the front's cache, warm
    tiny_fs()
    cid = f"full-{os.getpid()}"
    bundle, original = f.bundle(cid)
    line = _refused(f, cid, original, bundle, f.start_create(cid, bundle).wait(timeout=60))
    assert line.endswith("cannot write the exec marker: No space left on device"), line
    # a container that asks for no GPU, and runc's other calls, pass through as ever
    plain = make_bundle(f.tmp, f.rootfs, ["true"], name="plain")
    f.ids.append("plain")
    with open(f.tmp / "plain.err", "w") as err:  # the container's init keeps its stdio
        out = f.call("create", "--bundle", plain, "plain", stdout=err, stderr=err)
    assert out.returncode == 0 and (f.tmp / "plain.err").read_text() == ""
    assert f.call("delete", "plain", capture_output=True).returncode == 0
    if f.mode != "in-process":
        _until(lambda: not f.claims(), 15, f"claims left: {f.claims()}")
    tiny_fs(False)
    _check_next_create(f, 4)


def test_a_daemon_on_a_full_cache_file_system_says_why(tiny_fs, sim_hosts, tmp_path):
    """nvshim-runtimed started on a full cache file system: one line, exit 1, nothing
    left there; GPU creates are done in-process meanwhile."""
    tiny_fs()
    f = Faults(sim_hosts("single"), tmp_path, "in-process")
    before = sorted(os.listdir(f.cache_dir))
    proc = subprocess.run([os.path.join(f.bin_dir, "nvshim-runtimed")], env=f.env(),
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 1
    line = _one_line(proc.stderr)
    assert line.startswith("nvshim-runtimed: error: ") and "No space left on device" in line
    assert sorted(os.listdir(f.cache_dir)) == before
    tiny_fs(False)
    _check_next_create(f, 5)


@pytest.mark.parametrize("faults", ["in-process", "slot"], indirect=True)
def test_an_unwritable_log(faults):
    """nvshim's log unwritable: a GPU create still succeeds, fully prepared (one warning
    line), and a refused one fails with its own line only."""
    f = faults
    blocker = f.tmp / "not-a-dir"
    blocker.write_text("a file where the log's directory should be\n")
    text = Path(f.config).read_text().replace(str(f.log), str(blocker / "nvshim.log"))
    Path(f.config).write_text(text)
    assert f.call("list", capture_output=True).returncode == 0
    cid = f"nolog-{os.getpid()}"
    bundle, _ = f.bundle(cid)
    assert f.start_create(cid, bundle).wait(timeout=60) == 0
    assert f.prepared(cid)
    warning = _one_line((f.tmp / f"{cid}.err").read_text())
    assert (
        warning
        == f"nvshim-runtime: warning: cannot write log {blocker}/nvshim.log: Not a directory"
    )
    bad = f"nolog-bad-{os.getpid()}"
    show = ["true"]
    bundle = make_bundle(f.tmp, f.rootfs, show, env={"NVIDIA_VISIBLE_DEVICES": "42"}, name=bad)
    original = Path(bundle, "config.json").read_bytes()
    line = _refused(f, bad, original, bundle, f.start_create(bad, bundle).wait(timeout=60))
    assert line.startswith("nvshim-runtime: error: ") and "42" in line, line
    if f.mode != "in-process":
        _until(lambda: not f.claims(), 15, f"claims left: {f.claims()}")
    _check_next_create(f, 6)


def test_an_unwritable_daemon_log(sim_hosts, tmp_path):
    """nvshim-runtimed --verbose whose own log (stderr) cannot be written (/dev/full:
    ENOSPC): its lines are lost, its calls are not."""
    f = Faults(sim_hosts("single"), tmp_path, "in-process")
    f.mode = "slot"
    with open("/dev/full", "w") as full:
        f.daemon = subprocess.Popen([os.path.join(f.bin_dir, "nvshim-runtimed"), "--verbose"],
                                    env=f.env(), stdin=subprocess.DEVNULL, stdout=full,
                                    stderr=full)  # fmt: skip
    try:
        _until(lambda: list(Path(f.cache_dir).glob("runtimed.*/0.r")))
        assert f.call("list", capture_output=True).returncode == 0
        for n in range(3):
            cid = f"mute-{os.getpid()}-{n}"
            bundle, _ = f.bundle(cid)
            proc = f.start_create(cid, bundle)
            assert proc.wait(timeout=60) == 0, (f.tmp / f"{cid}.err").read_text()
            assert (f.tmp / f"{cid}.err").read_text() == ""
            assert f.prepared(cid)
        assert f.daemon.poll() is None
        _until(lambda: not f.claims(), 15, f"claims left: {f.claims()}")
    finally:
        f.daemon.terminate()
        f.daemon.wait(timeout=60)
        for cid in f.ids:
            subprocess.run([RUNC, "--root", f.root, "delete", "--force", cid], capture_output=True)


@pytest.mark.parametrize("module, armed", [("nvshim.runtime.create", True),
                                           ("nvshim.runtimed.main", True),
                                           ("nvshim.hook.main", False)])  # fmt: skip
def test_the_fault_points_are_never_armed_in_nvshim_hook(tmp_path, module, armed):
    """NVSHIM_TEST_PAUSE arms nvshim-runtime and nvshim-runtimed only: nvshim-hook, which
    a hook entry without an env would start with a container's environment, ignores it."""
    code = f"import {module}, nvshim.defaults as r; print(r._PAUSE_DIR >= 0)"
    env = {"PATH": "/usr/bin:/bin", "NVSHIM_TEST_PAUSE": f"{tmp_path}:writable"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True,
                          text=True)  # fmt: skip
    assert proc.stdout == f"{armed}\n", proc.stderr
