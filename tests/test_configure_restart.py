"""`--restart signal|systemd`: the right daemon is told, and the run says what it did."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cri_util import cri_ready_config
from tests.engines.containerd_instance import private_containerd
from tests.engines.corpus_cases import CORPUS, clear_engine_env, run_cli, tree

V16 = (CORPUS / "containerd-1.6-default" / "input" / "config.toml").read_text()
needs_containerd = pytest.mark.skipif(
    shutil.which("containerd") is None or shutil.which("unshare") is None,
    reason="containerd and unshare needed",
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    clear_engine_env(monkeypatch, "1.6.20")


nvshim = run_cli


@needs_containerd
def test_signal_restarts_the_daemon_on_the_socket_and_no_other(tmp_path, capsys):
    config_a = tmp_path / "a" / "config.toml"
    config_b = tmp_path / "b" / "config.toml"
    # the stock 1.6 config with its CNI and opt directories kept under tmp_path
    stock = cri_ready_config(V16, tmp_path / "scratch", "registry.k8s.io/pause:3.6")
    for config in (config_a, config_b):
        config.parent.mkdir()
        config.write_text(stock)
    with (
        private_containerd(tmp_path / "a", config_a) as a,
        private_containerd(tmp_path / "b", config_b) as b,
    ):
        pid_a, pid_b = a.pid, b.pid
        assert "nvshim" not in a.cri_config()["containerd"]["runtimes"]
        code, out, err = nvshim(
            capsys,
            "configure",
            "--engine",
            "containerd",
            "--engine-config",
            str(config_a),
            "--set-as-default",
            "--restart",
            "signal",
            "--socket",
            a.socket,
        )
        assert code == 0, err
        assert f"sent SIGHUP to containerd (pid {pid_a}), the owner of {a.socket}" in out
        new_a = a.wait_restarted(pid_a)
        loaded = a.cri_config()["containerd"]
        assert loaded["defaultRuntimeName"] == "nvshim"
        assert loaded["runtimes"]["nvshim"]["options"]["BinaryName"] == "/usr/bin/nvshim-runtime"
        assert loaded["runtimes"]["nvshim"]["runtimeType"] == "io.containerd.runc.v2"
        # The other daemon was left alone.
        assert b.pid == pid_b
        assert "nvshim" not in b.cri_config()["containerd"]["runtimes"]
        # And back: unconfigure restores the file and restarts only A again.
        code, out, _ = nvshim(
            capsys,
            "unconfigure",
            "--engine",
            "containerd",
            "--engine-config",
            str(config_a),
            "--restart",
            "signal",
            "--socket",
            a.socket,
        )
        assert code == 0 and config_a.read_text() == stock
        a.wait_restarted(new_a)
        assert "nvshim" not in a.cri_config()["containerd"]["runtimes"]
        assert b.pid == pid_b


@needs_containerd
def test_signal_refuses_a_daemon_that_ignores_sighup(tmp_path, capsys):
    """A containerd started under nohup ignores SIGHUP: the signal would leave the old
    configuration running, so the restart says so and points at the service manager."""
    config = tmp_path / "config.toml"
    config.write_text(cri_ready_config(V16, tmp_path / "scratch", "registry.k8s.io/pause:3.6"))
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # what nohup does
    try:
        daemon = private_containerd(tmp_path, config)
        ctd = daemon.__enter__()
    finally:
        signal.signal(signal.SIGHUP, previous)
    try:
        pid = ctd.pid
        code, out, err = nvshim(
            capsys, "configure", "--engine", "containerd", "--engine-config", str(config),
            "--restart", "signal", "--socket", ctd.socket,
        )  # fmt: skip
        assert code == 1, out
        assert f"containerd (pid {pid}), the owner of {ctd.socket}, ignores SIGHUP" in err
        assert "--restart systemd" in err and err.count("\n") == 1
        assert ctd.pid == pid  # not signalled, still serving
        assert "nvshim" not in ctd.cri_config()["containerd"]["runtimes"]
    finally:
        daemon.__exit__(None, None, None)


_FAKE_DAEMON = """
import os, signal, socket, sys, time
path, log = sys.argv[1], sys.argv[2]
def hup(*_):
    # Written whole, then renamed: the test polls for the file and reads it at once.
    with open(log + ".part", "a") as fh:
        fh.write("HUP\\n")
    os.replace(log + ".part", log)
signal.signal(signal.SIGHUP, hup)
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind(path + ".tmp")
srv.listen(8)
os.rename(path + ".tmp", path)  # appears only once it accepts connections
srv.settimeout(0.2)
while True:
    try:
        conn, _ = srv.accept()
        conn.close()
    except (socket.timeout, InterruptedError):
        pass
"""


def _fake_daemon(sock: Path, log: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", _FAKE_DAEMON, str(sock), str(log)])
    deadline = time.monotonic() + 20
    while not sock.exists():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.02)
    return proc


def test_signal_docker_among_several_daemons(tmp_path, capsys):
    daemons = []
    try:
        for name in ("one", "two"):
            daemons.append(_fake_daemon(tmp_path / f"{name}.sock", tmp_path / f"{name}.log"))
        config = tmp_path / "daemon.json"
        sock = tmp_path / "two.sock"
        code, out, err = nvshim(
            capsys,
            "configure",
            "--engine",
            "docker",
            "--engine-config",
            str(config),
            "--restart",
            "signal",
            "--socket",
            str(sock),
        )
        assert code == 0, err
        assert f"(pid {daemons[1].pid}), the owner of {sock}" in out
        assert "dockerd reloads daemon.json on SIGHUP" in out
        deadline = time.monotonic() + 20
        while not (tmp_path / "two.log").exists():
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert (tmp_path / "two.log").read_text() == "HUP\n"
        assert not (tmp_path / "one.log").exists()
    finally:
        for proc in daemons:
            proc.kill()
            proc.wait()


def test_signal_with_a_missing_socket_fails_before_writing(tmp_path, capsys):
    config = tmp_path / "config.toml"
    config.write_text(V16)
    sock = tmp_path / "nothing.sock"
    code, _, err = nvshim(
        capsys,
        "configure",
        "--engine",
        "containerd",
        "--engine-config",
        str(config),
        "--restart",
        "signal",
        "--socket",
        str(sock),
    )
    assert code == 1
    assert err == f"nvshim: error: {sock}: socket not found (is the engine running? see --socket)\n"
    assert tree(tmp_path) == {"config.toml": V16.encode()}


def test_signal_refuses_a_path_that_is_not_a_socket(tmp_path, capsys):
    config = tmp_path / "config.toml"
    code, _, err = nvshim(
        capsys,
        "configure",
        "--engine",
        "containerd",
        "--engine-config",
        str(config),
        "--restart",
        "signal",
        "--socket",
        str(tmp_path),
    )
    assert code == 1 and err.strip().endswith("not a unix socket")
    assert not config.exists()


def test_signal_to_a_socket_nobody_listens_on(tmp_path, capsys):
    path = tmp_path / "stale.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()  # the file stays, nobody listens
    code, _, err = nvshim(
        capsys,
        "configure",
        "--engine",
        "crio",
        "--engine-config",
        str(tmp_path / "crio.conf.d" / "99-nvshim.toml"),
        "--restart",
        "signal",
        "--socket",
        str(path),
    )
    assert code == 1 and "cannot connect" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stale.sock"]  # nothing written


def _fake_systemctl(tmp_path: Path, monkeypatch, body: str) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "systemctl.args"
    script = bindir / "systemctl"
    script.write_text(f'#!/bin/sh\necho "$@" >> {log}\n{body}\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    return log


@pytest.mark.parametrize("engine, unit", [("containerd", "containerd"), ("docker", "docker")])
def test_systemd_restarts_the_unit(tmp_path, capsys, monkeypatch, engine, unit):
    log = _fake_systemctl(tmp_path, monkeypatch, "exit 0")
    config = tmp_path / ("config.toml" if engine == "containerd" else "daemon.json")
    argv = ["configure", "--engine", engine, "--engine-config", str(config)]
    code, out, err = nvshim(capsys, *argv, "--restart", "systemd")
    assert code == 0, err
    assert log.read_text() == f"restart {unit}\n"
    assert out.splitlines()[-1] == f"restarted {unit} with systemctl"
    # A run that changes nothing restarts nothing.
    nvshim(capsys, *argv, "--restart", "systemd")
    assert log.read_text() == f"restart {unit}\n"


def test_systemd_failure_is_one_line(tmp_path, capsys, monkeypatch):
    _fake_systemctl(
        tmp_path, monkeypatch, "echo 'Failed to restart crio.service: Unit not found.' >&2; exit 5"
    )
    config = tmp_path / "crio.conf.d" / "99-nvshim.toml"
    code, _, err = nvshim(
        capsys,
        "configure",
        "--engine",
        "crio",
        "--engine-config",
        str(config),
        "--restart",
        "systemd",
    )
    assert code == 1
    assert err == (
        "nvshim: error: systemctl restart crio failed: Failed to restart crio.service:"
        " Unit not found. (the configuration is written; restart crio yourself)\n"
    )
    assert "runtimes.nvshim" in config.read_text()


def test_restart_none_says_what_to_do(tmp_path, capsys):
    code, out, _ = nvshim(
        capsys, "configure", "--engine", "docker", "--engine-config", str(tmp_path / "daemon.json")
    )
    assert code == 0
    assert out.splitlines()[-1] == (
        "docker not restarted (--restart none): restart it to use the new configuration"
    )


def test_signal_reaches_only_the_socket_owner_process(tmp_path):
    """The signalled PID is the socket's peer, not a process found by name."""
    from nvshim.engines.restart import socket_owner

    proc = _fake_daemon(tmp_path / "d.sock", tmp_path / "d.log")
    try:
        pid, uid, _ = socket_owner(str(tmp_path / "d.sock"))
        assert (pid, uid) == (proc.pid, os.getuid())
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
