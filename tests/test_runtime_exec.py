"""Enforcement on exec: a process started by ``runc exec`` (arguments and ``--env``, or a
process file) or ``podman exec`` in a container nvshim prepared gets the variables its
first process got; a container nvshim did not prepare is handed on untouched."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess

import pytest

from tests.crun_util import CRUN, crun_namespace
from tests.podman_util import in_podman_namespace, podman_command
from tests.runc_util import RUNC_ENV, daemon_calls, make_bundle, start_daemon
from tests.test_mps_enforce import GPU1, MIG_6_1, shared_host  # noqa: F401 - fixture

SLEEP = ["/bin/busybox", "sleep", "120"]
PIPE = "/run/nvidia-mps"


def _env_of(stdout: str) -> dict[str, str]:
    """``env`` output; HOME left out (runc adds it when the process has none)."""
    env = dict(line.split("=", 1) for line in stdout.splitlines() if "=" in line)
    env.pop("HOME", None)
    return env


class Containers:
    """Containers created through nvshim-runtime and real runc (or the low-level runtime
    ``config`` names, its calls under ``prefix``), removed at the end."""

    def __init__(self, host, tmp_path, config: str | None = None, prefix: tuple = ()):
        self.host = host
        self.tmp = tmp_path
        self.root = str(tmp_path / "runc-root")
        self.runtime = os.path.join(host.launchers, "nvshim-runtime")
        self.config = config or host.config()
        self.prefix = prefix
        self.ids: list[str] = []

    def call(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        env = {**RUNC_ENV, "NVSHIM_CONFIG": self.config}
        proc = subprocess.run(
            [*self.prefix, self.runtime, "--root", self.root, *argv],
            env=env,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=60,
        )
        assert not check or proc.returncode == 0, (argv, proc.stdout, proc.stderr)
        return proc

    def start(self, env: dict[str, str], annotations: dict[str, str] | None = None) -> str:
        cid = f"exec-{os.getpid()}-{len(self.ids)}"
        bundle = make_bundle(self.tmp, self.host.rootfs, SLEEP, env, annotations, name=cid)
        log = open(self.tmp / f"{cid}.out", "w")
        created = subprocess.run(
            [*self.prefix, self.runtime, "--root", self.root, "create", "--bundle", bundle, cid],
            env={**RUNC_ENV, "NVSHIM_CONFIG": self.config},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            timeout=60,
        )
        assert created.returncode == 0, (self.tmp / f"{cid}.out").read_text()
        self.ids.append(cid)
        self.call("start", cid)
        return cid

    def exec_env(self, cid: str, *flags: str) -> dict[str, str]:
        return _env_of(self.call("exec", *flags, cid, "/bin/busybox", "env").stdout)

    def process_file(self, env: list[str]) -> str:
        path = self.tmp / f"process-{len(os.listdir(self.tmp))}.json"
        process = {"args": ["/bin/busybox", "env"], "cwd": "/", "env": env, "user": {"uid": 0}}
        path.write_text(json.dumps(process, indent=2))
        return str(path)

    def cleanup(self) -> None:
        for cid in self.ids:
            self.call("delete", "--force", cid, check=False)


@contextlib.contextmanager
def _containers(host, tmp_path, served: bool, config: str | None = None, prefix: tuple = ()):
    """Containers through nvshim-runtime alone, or with nvshim-runtimed doing its work
    (the same cache dir: stopped, and its socket gone, before the next test)."""
    daemon = None
    c = Containers(host, tmp_path, config, prefix)
    if served:
        env = {**RUNC_ENV, "NVSHIM_CONFIG": c.config}
        log = tmp_path / "nvshim-runtimed.log"
        daemon = start_daemon(host.launchers, env, log, "--verbose", prefix=prefix)
    yield c
    c.cleanup()
    if daemon is not None:
        daemon.terminate()
        assert daemon.wait(timeout=60) == 0
        assert any(" exec " in f" {s}" for s in daemon_calls(log))
        assert daemon_calls(log, "declined") == []


@pytest.fixture(params=["in-process", "daemon"])
def containers(shared_host, tmp_path, request):  # noqa: F811 - the imported fixture
    with _containers(shared_host, tmp_path, request.param == "daemon") as c:
        yield c


@pytest.fixture(params=["in-process", "daemon"])
def crun_containers(shared_host, tmp_path, request):  # noqa: F811 - the imported fixture
    """The same with crun as nvshim's low-level runtime (crun keeps no labels: nvshim
    reads the annotations of the spec it created the container from)."""
    config = tmp_path / "crun.toml"
    text = open(shared_host.config()).read()
    config.write_text(text.replace('runtimes = ["runc"]', f"runtimes = [{CRUN!r}]"))
    assert config.read_text().count(CRUN) == 1
    served = request.param == "daemon"
    with (
        crun_namespace() as prefix,
        _containers(shared_host, tmp_path, served, str(config), prefix) as c,
    ):
        yield c


@pytest.mark.parametrize("gpu, shared", [(GPU1, True), (MIG_6_1, False)])
def test_runc_exec_gets_the_first_process_variables(containers, gpu, shared):
    cid = containers.start({"NVIDIA_VISIBLE_DEVICES": gpu})
    first = containers.exec_env(cid)  # exec with arguments inherits config.json's env
    assert first["CUDA_VISIBLE_DEVICES"] == gpu
    mps = {k: v for k, v in first.items() if k.startswith("CUDA_MPS_")}
    assert bool(mps) == shared
    if shared:
        assert mps["CUDA_MPS_PIPE_DIRECTORY"] == PIPE

    # --env cannot widen or escape: CVD replaced unless it names injected devices
    want_pipe = PIPE if shared else "/tmp/own"
    for form in ("-e", "--env", "-env"):  # runc refuses two forms: ours follow the caller's
        escaped = containers.exec_env(
            cid, form, "CUDA_VISIBLE_DEVICES=all", f"{form}=CUDA_MPS_PIPE_DIRECTORY=/tmp/own"
        )
        assert escaped["CUDA_VISIBLE_DEVICES"] == gpu
        assert escaped["CUDA_MPS_PIPE_DIRECTORY"] == want_pipe
    assert containers.exec_env(cid, "-e", "CUDA_VISIBLE_DEVICES=0")["CUDA_VISIBLE_DEVICES"] == "0"

    # a process file (what podman, containerd and CRI-O hand runc) gets them too
    path = containers.process_file(["PATH=/bin", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100"])
    before = open(path, "rb").read()
    for flags in (
        ["--process", path],
        ["-p", path],
        ["--process=/nonexistent", f"-process={path}"],
    ):
        env = _env_of(containers.call("exec", *flags, cid).stdout)
        assert env["CUDA_VISIBLE_DEVICES"] == gpu and env["PATH"] == "/bin"
        assert {k: v for k, v in env.items() if k.startswith("CUDA_MPS_")} == (
            mps if shared else {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100"}
        )
    assert open(path, "rb").read() == before  # the engine's file is never written


def test_exec_is_enforced_after_the_marker_is_lost(containers):
    """The exec marker is a cache entry: a cache directory emptied under a running GPU
    container (an uninstall racing a reinstall) must not let its execs escape. The front
    finds nvshim's label in runc's state instead; a container nvshim did not prepare
    still execs untouched."""
    cid = containers.start({"NVIDIA_VISIBLE_DEVICES": GPU1})
    plain = containers.start({"PATH": "/bin"})
    marker = os.path.join(os.environ["NVSHIM_CACHE_DIR"], "exec", cid)
    os.unlink(marker)
    assert containers.exec_env(cid)["CUDA_VISIBLE_DEVICES"] == GPU1
    escaped = containers.exec_env(cid, "-e", "CUDA_VISIBLE_DEVICES=all")
    assert escaped["CUDA_VISIBLE_DEVICES"] == GPU1
    path = containers.process_file(["PATH=/bin", "CUDA_VISIBLE_DEVICES=all"])
    env = _env_of(containers.call("exec", "--process", path, cid).stdout)
    assert env["CUDA_VISIBLE_DEVICES"] == GPU1 and env["PATH"] == "/bin"
    assert "CUDA_VISIBLE_DEVICES" not in containers.exec_env(plain)
    assert not os.path.exists(marker)  # an exec writes no marker back


def test_crun_exec_gets_the_first_process_variables(crun_containers):
    """With crun under nvshim, an exec's --env and process file (what CRI-O and podman
    hand crun) cannot widen CUDA_VISIBLE_DEVICES or move the MPS pipe, with its marker
    or without it, and a container nvshim did not prepare execs untouched."""
    c = crun_containers
    cid = c.start({"NVIDIA_VISIBLE_DEVICES": GPU1})
    plain = c.start({"PATH": "/bin"})
    state = os.path.join(c.root, cid)
    assert sorted(os.listdir(state)) == ["config.json", "status"]  # crun's, not runc's
    marker = os.path.join(os.environ["NVSHIM_CACHE_DIR"], "exec", cid)
    for lost in (False, True):
        if lost:
            os.unlink(marker)
        escaped = c.exec_env(cid, "-e", "CUDA_VISIBLE_DEVICES=all")
        assert escaped["CUDA_VISIBLE_DEVICES"] == GPU1
        assert escaped["CUDA_MPS_PIPE_DIRECTORY"] == PIPE
        path = c.process_file(["PATH=/bin", "CUDA_VISIBLE_DEVICES=all"])
        env = _env_of(c.call("exec", "--process", path, cid).stdout)
        assert env["CUDA_VISIBLE_DEVICES"] == GPU1 and env["PATH"] == "/bin"
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == PIPE
    path = c.process_file(["PATH=/bin", "CUDA_VISIBLE_DEVICES=7"])
    assert _env_of(c.call("exec", "-p", path, plain).stdout) == {
        "PATH": "/bin",
        "CUDA_VISIBLE_DEVICES": "7",
    }


@pytest.mark.parametrize(
    "hostile, why",
    [
        (b',"pad":"' + b"x" * (4 << 20) + b'"}', b"larger than"),  # Go reads any size
        (b',"pad":"\xff"}', b"invalid JSON"),  # Go's decoder takes invalid UTF-8
        (b',"Env":["CUDA_VISIBLE_DEVICES=all"]}', b"'Env' is the env field"),  # Go: the last wins
    ],
    ids=["oversize", "not-utf8", "env-case"],
)
def test_process_file_runc_reads_otherwise_is_refused(containers, hostile, why):
    """A process file nvshim cannot edit exactly as runc reads it was handed on as it
    was: the exec ran with the caller's CUDA_VISIBLE_DEVICES and no CUDA_MPS_* at all."""
    cid = containers.start({"NVIDIA_VISIBLE_DEVICES": GPU1})
    path = containers.process_file(["PATH=/bin", "CUDA_VISIBLE_DEVICES=all"])
    data = open(path, "rb").read().rstrip()
    open(path, "wb").write(data[:-1] + hostile)
    proc = containers.call("exec", "-p", path, cid, check=False)
    assert proc.returncode != 0 and "CUDA_VISIBLE_DEVICES=all" not in proc.stdout
    assert f"{path}: {why.decode()}" in proc.stderr


def test_annotation_forging_a_label_refuses_exec(containers):
    """runc keeps annotations as ``KEY=VALUE`` labels in Go's random map order: keys
    holding ``=`` forge ``nvshim.io/exec-env`` labels, and the last one read won (30 of
    them: nvshim's own came last 1 time in 31), the exec then without the enforced
    variables."""
    forged = {f'nvshim.io/exec-env=["A{i}': '1"]' for i in range(30)}
    cid = containers.start({"NVIDIA_VISIBLE_DEVICES": GPU1}, forged)
    path = containers.process_file(["PATH=/bin", "CUDA_VISIBLE_DEVICES=all"])
    proc = containers.call("exec", "-p", path, cid, check=False)
    assert proc.returncode != 0 and "CUDA_VISIBLE_DEVICES=all" not in proc.stdout
    assert "annotation nvshim.io/exec-env given twice" in proc.stderr


def test_unprepared_container_process_file_untouched(containers):
    cid = containers.start({"CUDA_VISIBLE_DEVICES": "all"})  # asks for no GPU
    assert not os.path.exists(os.path.join(os.environ["NVSHIM_CACHE_DIR"], "exec", cid))
    env = ["PATH=/bin", "CUDA_VISIBLE_DEVICES=7", "CUDA_MPS_PIPE_DIRECTORY=/x"]
    path = containers.process_file(env)
    got = _env_of(containers.call("exec", "-p", path, cid).stdout)
    assert got == dict(e.split("=", 1) for e in env)
    # a stale marker (an earlier GPU container of the same id) only costs a Python start
    marker = os.path.join(os.environ["NVSHIM_CACHE_DIR"], "exec", cid)
    os.makedirs(os.path.dirname(marker), exist_ok=True)
    open(marker, "w").close()
    got = _env_of(containers.call("exec", "-p", path, cid).stdout)
    assert got == dict(e.split("=", 1) for e in env)


@pytest.mark.parametrize("gpu, shared", [(GPU1, True), (MIG_6_1, False)])
def test_podman_exec(shared_host, tmp_path, gpu, shared):  # noqa: F811
    # podman hands its runtime a clean environment: name nvshim's config in a wrapper
    wrapper = tmp_path / "nvshim-runtime"
    wrapper.write_text(
        f"#!/bin/sh\nNVSHIM_CONFIG={shared_host.config()}"
        f" NVSHIM_CACHE_DIR={os.environ['NVSHIM_CACHE_DIR']}"
        f' exec {shared_host.launchers}/nvshim-runtime "$@"\n'
    )
    wrapper.chmod(0o755)
    podman = shlex.join(podman_command(tmp_path, runtime=str(wrapper)))
    name = f"nvx{os.getpid()}"
    script = (
        f"{podman} run -d --name {name} --network none --ulimit nofile=1024:1024"
        f" --ulimit nproc=1024:1024 -e NVIDIA_VISIBLE_DEVICES={gpu}"
        f" --rootfs {shared_host.rootfs} {shlex.join(SLEEP)} >/dev/null && "
        f"{podman} exec {name} /bin/busybox env; echo ---; "
        f"{podman} exec -e CUDA_VISIBLE_DEVICES=all -e CUDA_MPS_PIPE_DIRECTORY=/tmp/own"
        f" {name} /bin/busybox env; rc=$?; {podman} rm -f -t 0 {name} >/dev/null; exit $rc"
    )
    proc = in_podman_namespace(tmp_path, ["/bin/sh", "-c", script])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    plain, widened = (_env_of(part) for part in proc.stdout.split("---\n"))
    for env in (plain, widened):
        assert env["CUDA_VISIBLE_DEVICES"] == gpu
    if shared:
        assert plain["CUDA_MPS_PIPE_DIRECTORY"] == widened["CUDA_MPS_PIPE_DIRECTORY"] == PIPE
    else:
        assert "CUDA_MPS_PIPE_DIRECTORY" not in plain
        assert widened["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/own"
