"""`nvshim mps start|stop|status` with real processes: the fake nvidia-cuda-mps-control in a
simulated driver root, compute modes through the fake NVML and real pynvml, real tmpfs."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import time
from dataclasses import dataclass

import pytest
import yaml

from nvshim.host.discover import discover_host
from nvshim.host.model import Host
from nvshim.mps import compute
from tests.conftest import NVSHIM, run_nvshim
from tests.sim import fake_mps_control
from tests.sim.simhost import SimHost, build_host
from tests.test_runtime_races import NOBODY, SYSTEM_PYTHON, as_nobody, open_dir  # noqa: F401

GPU0 = "GPU-92e91e7d-ffd7-601c-459e-d7fde767a1c6"
GPU1 = "GPU-9d9231cf-dcd5-4b0e-0f9d-e8a86f92f3cc"
GPU6 = "GPU-f73b3dbf-c113-9b90-fdd9-8529c42fd596"  # index 2 on the host below, MIG mode
SHARED = {GPU0: ("0", 81559 // 4), GPU1: ("1", 81559 // 4)}
# mixed: the two whole GPUs are nvidia.com/gpu and MPS-shared; the MIG-mode GPU is not
SHARING = """version: v1
flags:
  migStrategy: mixed
sharing:
  mps:
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""


def _topology() -> dict:
    """h100x8-mig cut to GPUs 0 and 1 (whole) and GPU 6 (MIG mode) as index 2."""
    with open(os.path.join(os.path.dirname(__file__), "sim", "hosts", "h100x8-mig.yaml")) as fh:
        data = yaml.safe_load(fh)
    gpus = [data["gpus"][0], data["gpus"][1], {**data["gpus"][6], "index": 2}]
    return {**data, "name": "h100x3-mig", "gpus": gpus}


@dataclass
class MpsHost:
    sim: SimHost
    host: Host
    config: str
    root: str

    def nvshim(self, *args: str):
        return run_nvshim(*args, env={"NVSHIM_CONFIG": self.config})

    def dirs(self, uuid: str) -> tuple[str, str, str]:
        base = os.path.join(self.root, uuid)
        return tuple(os.path.join(base, d) for d in ("pipe", "log", "shm"))

    def pid(self, uuid: str) -> int | None:
        try:
            with open(os.path.join(self.dirs(uuid)[0], "nvidia-cuda-mps-control.pid")) as fh:
                return int(fh.read())
        except FileNotFoundError:
            return None

    def log(self, uuid: str) -> list[str]:
        with open(os.path.join(self.dirs(uuid)[1], "control.log")) as fh:
            return fh.read().splitlines()

    def mode(self, uuid: str) -> int:
        with compute.nvml_session(self.host) as nvml:
            return compute.get_compute_mode(nvml, uuid)

    def set_mode(self, uuid: str, mode: int) -> None:
        with compute.nvml_session(self.host) as nvml:
            compute.set_compute_mode(nvml, uuid, mode)

    def client(self, uuid: str, commands: str) -> str:
        """Talk to a daemon with the driver root's client form, as an operator would."""
        pipe, log, _ = self.dirs(uuid)
        env = {
            "PATH": "/usr/bin:/bin",
            "CUDA_MPS_PIPE_DIRECTORY": pipe,
            "CUDA_MPS_LOG_DIRECTORY": log,
        }
        binary = self.sim.host_path("/usr/bin/nvidia-cuda-mps-control")
        return subprocess.run(
            [binary],
            input=commands,
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout


def _alive(pid: int) -> bool:
    """Exists and is not a zombie (this sandbox's init may not reap orphans)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _mounted(path: str) -> str | None:
    """The fs type and super options of the mount at ``path``, None when not a mountpoint."""
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            fields = line.split()
            if fields[4] == path:
                after = fields[fields.index("-") + 1 :]
                return f"{after[0]} {after[2]}"
    return None


def _build(root, extra_files) -> MpsHost:
    sim = build_host(_topology(), str(root / "host"), extra_files=extra_files)
    (root / "sharing.yaml").write_text(SHARING)
    mps_root = str(root / "mps")
    config = root / "config.toml"
    config.write_text(
        f'[host]\ndriver-root = "{sim.driver_root}"\ndev-root = "{sim.dev_root}"\n'
        f'[sharing]\nconfig = "{root / "sharing.yaml"}"\nmps-root = "{mps_root}"\n'
    )
    return MpsHost(sim, discover_host(sim.driver_root, sim.dev_root), str(config), mps_root)


def _cleanup(ctx: MpsHost) -> None:
    """Stop what the test started; kill only daemons whose pid files our fake wrote."""
    ctx.nvshim("mps", "stop")
    for uuid in os.listdir(ctx.root) if os.path.isdir(ctx.root) else ():
        pid = ctx.pid(uuid)
        if pid and _alive(pid):
            os.kill(pid, signal.SIGKILL)
        shm = ctx.dirs(uuid)[2]
        if _mounted(shm):
            subprocess.run(["umount", "-l", shm], check=False)


@pytest.fixture
def mps(tmp_path):
    ctx = _build(tmp_path, fake_mps_control.extra_files())
    yield ctx
    _cleanup(ctx)


def test_start_runs_one_daemon_per_shared_device_then_stop_undoes_it(mps):
    assert mps.mode(GPU1) == compute.DEFAULT
    proc = mps.nvshim("mps", "start", "--json")
    assert proc.returncode == 0, proc.stderr
    report = {d["uuid"]: d for d in json.loads(proc.stdout)["daemons"]}
    assert set(report) == set(SHARED)
    for uuid, (name, memory_mib) in SHARED.items():
        pipe, log, shm = mps.dirs(uuid)
        pid = mps.pid(uuid)
        assert report[uuid]["action"] == "started" and report[uuid]["pid"] == pid
        assert report[uuid]["healthy"] and report[uuid]["name"] == name
        assert _alive(pid)
        start = json.loads(mps.log(uuid)[0].split(" ", 1)[1])
        env = start["env"]
        assert start["argv"][1:] == ["-d"] and start["uid"] == 0
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == pipe
        assert env["CUDA_MPS_LOG_DIRECTORY"] == log
        assert env["CUDA_VISIBLE_DEVICES"] == uuid
        assert set(env) <= {
            "PATH",
            "LD_LIBRARY_PATH",
            "CUDA_MPS_PIPE_DIRECTORY",
            "CUDA_MPS_LOG_DIRECTORY",
            "CUDA_VISIBLE_DEVICES",
            "LC_CTYPE",
        }
        assert mps.log(uuid)[1:] == [
            "cmd set_default_active_thread_percentage 25",
            f"cmd set_default_device_pinned_mem_limit 0 {memory_mib}M",
            "cmd get_default_active_thread_percentage",
        ]
        # the daemon's /dev/shm is the device's own tmpfs, not the host's
        marker = os.path.basename(start["shm_marker"])
        assert os.path.exists(os.path.join(shm, marker))
        assert not os.path.exists(os.path.join("/dev/shm", marker))
        assert _mounted(shm).startswith("tmpfs ") and "size=65536k" in _mounted(shm)
    assert (mps.mode(GPU0), mps.mode(GPU1)) == (compute.EXCLUSIVE_PROCESS,) * 2
    assert mps.mode(GPU6) == compute.DEFAULT

    pids = {u: mps.pid(u) for u in SHARED}
    again = mps.nvshim("mps", "start", "--json")
    assert again.returncode == 0, again.stderr
    assert {d["uuid"]: (d["action"], d["pid"]) for d in json.loads(again.stdout)["daemons"]} == {
        u: ("already running", pids[u]) for u in SHARED
    }
    assert sum(line.startswith("start ") for line in mps.log(GPU0)) == 1

    stop = mps.nvshim("mps", "stop")
    assert stop.returncode == 0, stop.stderr
    for uuid, pid in pids.items():
        assert not _alive(pid)
        assert mps.pid(uuid) is None
        assert "cmd quit" in mps.log(uuid) and mps.log(uuid)[-1] == "quit"
        assert _mounted(mps.dirs(uuid)[2]) is None
        assert not os.path.exists(os.path.join(mps.root, uuid, "state.json"))
    assert (mps.mode(GPU0), mps.mode(GPU1)) == (compute.DEFAULT,) * 2


def test_stop_restores_the_compute_mode_found_at_start(mps):
    mps.set_mode(GPU1, compute.PROHIBITED)
    assert mps.nvshim("mps", "start", "--gpu", "1").returncode == 0
    assert mps.mode(GPU1) == compute.EXCLUSIVE_PROCESS
    assert mps.pid(GPU0) is None  # only the device asked for
    proc = mps.nvshim("mps", "stop", "--gpu", GPU1)
    assert proc.returncode == 0, proc.stderr
    assert "Prohibited" in proc.stdout
    assert mps.mode(GPU1) == compute.PROHIBITED


def test_status_shows_limits_and_catches_drift_and_dead_daemons(mps):
    assert mps.nvshim("mps", "start").returncode == 0
    proc = mps.nvshim("mps", "status", "--json")
    assert proc.returncode == 0, proc.stderr
    status = {d["uuid"]: d for d in json.loads(proc.stdout)["daemons"]}
    assert all(d["healthy"] and d["running"] for d in status.values())
    assert (status[GPU0]["thread_percentage"], status[GPU0]["memory_limit_mib"]) == (25, 20389)
    assert status[GPU0]["compute_mode"] == "Exclusive_Process"

    # someone loosened GPU 1's default share behind nvshim's back
    assert mps.client(GPU1, "set_default_active_thread_percentage 100\n").strip() == "100.0"
    # and GPU 0's daemon died
    os.kill(mps.pid(GPU0), signal.SIGKILL)
    proc = mps.nvshim("mps", "status", "--json")
    assert proc.returncode == 1
    assert proc.stderr.strip().count("\n") == 0
    assert "2 of 2 MPS daemon(s) not running or unhealthy: 0, 1" in proc.stderr
    status = {d["uuid"]: d for d in json.loads(proc.stdout)["daemons"]}
    assert status[GPU1]["running"] and not status[GPU1]["healthy"]
    assert status[GPU1]["reported_thread_percentage"] == 100.0
    assert not status[GPU0]["running"] and "stale pid file" in status[GPU0]["problem"]

    table = mps.nvshim("mps", "status").stdout
    assert "25% (daemon 100%)" in table and "unhealthy" in table
    assert (
        "the daemon's default active thread percentage is 100%, the sharing config wants 25%"
        in (table)
    )

    stop = mps.nvshim("mps", "stop")
    assert stop.returncode == 0, stop.stderr
    assert mps.mode(GPU0) == compute.DEFAULT  # restored although its daemon had died


def _control_clients(binary: str) -> set[int]:
    """Pids of the control binary's client form (no argument) running now."""
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                argv = fh.read().split(b"\0")[:-1]
        except OSError:
            continue
        if argv and argv[-1] == binary.encode() and b"-d" not in argv:
            found.add(int(pid))
    return found


@pytest.mark.parametrize(
    "argv",
    [("mps", "status", "--json"), ("doctor", "--only", "mps-daemons", "--json")],
    ids=["mps-status", "doctor"],
)
def test_hung_daemons_are_queried_at_once(mps, argv):
    """Each daemon's health query waits up to 10 s for an answer: hung daemons are
    queried at once (one wait in all, not one per device). Both daemons stopped
    (SIGSTOP) get their clients at the same time; continued, both answer."""
    assert mps.nvshim("mps", "start").returncode == 0
    pids = [mps.pid(GPU0), mps.pid(GPU1)]
    binary = mps.sim.host_path("/usr/bin/nvidia-cuda-mps-control")
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        env = {**os.environ, "NVSHIM_CONFIG": mps.config}
        call = subprocess.Popen([NVSHIM, *argv], env=env, stdout=subprocess.PIPE, text=True)
        most, deadline = 0, time.monotonic() + 8  # under the 10 s a query waits
        while most < len(pids) and time.monotonic() < deadline and call.poll() is None:
            most = max(most, len(_control_clients(binary)))
            time.sleep(0.01)
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    out, _ = call.communicate(timeout=60)
    assert most == len(pids)
    assert call.returncode == 0, out
    assert "not answering" not in out and "no answer" not in out


def test_unknown_or_unshared_gpu_is_a_usage_error(mps):
    proc = mps.nvshim("mps", "start", "--gpu", "2")
    assert proc.returncode == 2
    assert "--gpu 2: not an MPS-shared device (those are: 0, 1)" in proc.stderr
    assert not os.path.exists(os.path.join(mps.root, GPU6))


FAILING_CONTROL = '#!/bin/sh\n[ "$1" = -d ] && { echo "cannot open /dev/nvidiactl" >&2; exit 1; }\n'


def test_a_failed_start_is_undone(tmp_path):
    ctx = _build(tmp_path, {"usr/bin/nvidia-cuda-mps-control": FAILING_CONTROL})
    try:
        proc = ctx.nvshim("mps", "start", "--gpu", "1")
        assert proc.returncode == 1
        line = proc.stderr.strip()
        assert "\n" not in line and "Traceback" not in line
        assert "device 1 (" + GPU1 + ")" in line and "cannot open /dev/nvidiactl" in line
        assert ctx.mode(GPU1) == compute.DEFAULT
        assert _mounted(ctx.dirs(GPU1)[2]) is None
        assert not os.path.exists(os.path.join(ctx.root, GPU1, "state.json"))

        binary = ctx.sim.host_path("/usr/bin/nvidia-cuda-mps-control")
        os.chmod(binary, 0o777)
        proc = ctx.nvshim("mps", "start", "--gpu", "0")
        assert proc.returncode == 1
        assert "refusing to run a binary not owned by root or writable by group/others" in (
            proc.stderr
        )
        assert ctx.mode(GPU0) == compute.DEFAULT
    finally:
        _cleanup(ctx)


# a container's process in the pipe directory (its cwd), named like the control daemon: it
# puts its pid in the pid file (argv[1] "forge"), and prints it (the host's: NSpid's first)
FORGE = r"""
import os, sys, time
with open("/proc/self/comm", "w") as fh:
    fh.write("nvidia-cuda-mps")
with open("/proc/self/status") as fh:
    pid = next(line.split()[1] for line in fh if line.startswith("NSpid:"))
if sys.argv[1] == "forge":
    try:
        os.unlink("nvidia-cuda-mps-control.pid")
    except FileNotFoundError:
        pass
    with open("nvidia-cuda-mps-control.pid", "w") as fh:
        fh.write(pid + "\n")
print(pid, flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("how", ["forge", "reuse", "container"])
def test_a_pid_file_from_the_pipe_directory_names_only_roots_daemon(open_dir, how):  # noqa: F811
    """The pipe directory is bind-mounted into client containers: ``nobody`` there, in a
    process named like the daemon, forges the pid file (``forge``), or takes the pid a
    dead daemon's stale pid file names (``reuse``); so does root in its own PID namespace
    (``container``: a root container writes root's files). It was taken for the daemon:
    containers were admitted with the daemon down, ``status`` showed it running, and
    ``stop`` failed, the GPU left in EXCLUSIVE_PROCESS."""
    from nvshim.mps.enforce import SharingError, check_daemon

    ctx = _build(pathlib.Path(open_dir), fake_mps_control.extra_files())
    forger = None
    try:
        assert ctx.nvshim("mps", "start", "--gpu", "0").returncode == 0
        pipe = ctx.dirs(GPU0)[0]
        os.chown(pipe, 65534, 65534)  # the container's process may write here
        os.kill(ctx.pid(GPU0), signal.SIGKILL)  # the daemon died
        who = ["unshare", "--pid", "--fork", "--kill-child"] if how == "container" else NOBODY
        forger = subprocess.Popen(
            [*who, SYSTEM_PYTHON, "-c", FORGE, how], cwd=pipe, stdout=subprocess.PIPE
        )
        pid = int(forger.stdout.readline())
        if how != "forge":  # root's stale pid file: the dead daemon's pid is theirs now
            pathlib.Path(pipe, "nvidia-cuda-mps-control.pid").write_text(f"{pid}\n")
        assert ctx.pid(GPU0) == pid
        with pytest.raises(SharingError, match="its MPS control daemon is not running"):
            check_daemon(ctx.root, GPU0, "fail")
        status = json.loads(ctx.nvshim("mps", "status", "--json", "--gpu", "0").stdout)
        assert [(d["running"], d["pid"]) for d in status["daemons"]] == [(False, None)]
        stop = ctx.nvshim("mps", "stop", "--gpu", "0")
        assert stop.returncode == 0, stop.stderr
        assert ctx.mode(GPU0) == compute.DEFAULT
        assert _alive(pid)
    finally:
        if forger is not None:
            forger.kill()
            forger.wait()
        _cleanup(ctx)


def test_commands_reach_only_the_socket_in_the_pipe_directory_never_a_symlink(open_dir):  # noqa: F811
    """``nobody`` in GPU 0's clients swaps the daemon's control socket for a symlink to GPU
    1's: ``nvshim mps status`` and ``stop`` of GPU 0 sent their commands (``quit``) to
    GPU 1's daemon, another tenant's."""
    ctx = _build(pathlib.Path(open_dir), fake_mps_control.extra_files())
    try:
        assert ctx.nvshim("mps", "start").returncode == 0
        pipe0, pipe1 = ctx.dirs(GPU0)[0], ctx.dirs(GPU1)[0]
        os.chown(pipe0, 65534, 65534)  # the container's process may write here
        subprocess.run(
            [*NOBODY, "sh", "-c", f"mv control was && ln -s {pipe1}/control control"],
            cwd=pipe0, check=True,
        )  # fmt: skip
        sent = len(ctx.log(GPU1))
        status = json.loads(ctx.nvshim("mps", "status", "--json", "--gpu", "0").stdout)
        assert not status["daemons"][0]["healthy"]
        stop = ctx.nvshim("mps", "stop", "--gpu", "0")
        assert ctx.log(GPU1)[sent:] == []
        assert _alive(ctx.pid(GPU1))
        assert stop.returncode == 1 and "quit" in stop.stderr
    finally:
        _cleanup(ctx)


def test_a_daemon_starts_in_a_pipe_directory_no_container_wrote_in(open_dir):  # noqa: F811
    """Containers keep the pipe directory after their daemon stopped (``on-daemon-down =
    "warn"`` mounts it too): ``nobody`` there leaves the pid file as a symlink to a host
    file, and a socket of theirs as ``control``. Root's daemon, started there, wrote its
    pid through the symlink: the host file was rewritten."""
    ctx = _build(pathlib.Path(open_dir), fake_mps_control.extra_files())
    victim = pathlib.Path(open_dir, "victim")
    victim.write_text("host file\n")
    try:
        assert ctx.nvshim("mps", "start", "--gpu", "0").returncode == 0
        assert ctx.nvshim("mps", "stop", "--gpu", "0").returncode == 0
        pipe = ctx.dirs(GPU0)[0]
        os.chown(pipe, 65534, 65534)  # the container's process may write here
        as_nobody("ln", "-s", str(victim), os.path.join(pipe, "nvidia-cuda-mps-control.pid"))
        as_nobody(SYSTEM_PYTHON, "-c", "import socket; socket.socket(1).bind('control')", cwd=pipe)
        inode = os.stat(pipe).st_ino
        start = ctx.nvshim("mps", "start", "--gpu", "0")
        assert victim.read_text() == "host file\n"
        assert start.returncode == 0, start.stderr
        assert sorted(os.listdir(pipe)) == ["control", "nvidia-cuda-mps-control.pid"]
        assert os.stat(os.path.join(pipe, "control")).st_uid == 0
        assert os.stat(pipe).st_ino == inode  # the containers' mounts reach the new daemon
    finally:
        _cleanup(ctx)
