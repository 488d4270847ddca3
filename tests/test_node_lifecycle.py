"""`nvshim node run` over its whole life on a scratch host root: SIGTERM takes everything
back (the engine config's exact bytes), kill -9 between any two steps and a pod restart
after it never lose the original, two installers on one node take turns, and the MPS
daemons of a mounted sharing config are supervised (a dead one restarted and logged)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import yaml

from tests.node_util import Scratch, start_node, wait_for
from tests.sim import fake_mps_control


def files_of(snap: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in snap.items() if v != "dir"}


def lines(log) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def stop(proc: subprocess.Popen, log) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0, log.read_text()


def test_sigterm_gives_back_the_exact_original(scratch, tmp_path):
    before = scratch.snapshot()
    log = tmp_path / "log"
    env = scratch.env(CDI_ENABLED="true")
    proc = start_node(env, log)
    wait_for(scratch.ready.exists, proc=proc, log=log)
    assert scratch.config.read_bytes() != scratch.original
    assert scratch.path("/var/run/cdi/nvshim.yaml").exists()
    assert scratch.path("/etc/nvshim/config.toml").exists()
    stop(proc, log)
    assert not scratch.ready.exists()
    assert scratch.config.read_bytes() == scratch.original
    assert files_of(scratch.snapshot()) == files_of(before)
    assert "uninstalled" in log.read_text()


def test_keep_installed_keeps_files_and_spec_but_unconfigures(scratch, tmp_path):
    log = tmp_path / "log"
    proc = start_node(scratch.env(CDI_ENABLED="true", NVSHIM_KEEP_INSTALLED="true"), log)
    wait_for(scratch.ready.exists, proc=proc, log=log)
    stop(proc, log)
    assert scratch.config.read_bytes() == scratch.original
    assert scratch.path("/var/run/cdi/nvshim.yaml").exists()
    assert scratch.path("/usr/local/nvshim/bin/nvshim-runtime").exists()


def test_kill_9_between_steps_then_a_pod_restart_recovers(scratch, tmp_path):
    """Kill the installer right after each line it logs (each one ends a step), start it
    again as a restarted pod would, and check the original comes back byte for byte."""
    before = scratch.snapshot()
    env = scratch.env(CDI_ENABLED="true")
    log = tmp_path / "first"
    proc = start_node(env, log)
    wait_for(scratch.ready.exists, proc=proc, log=log)
    stop(proc, log)
    # one line per step up to and including "ready"
    steps = next(i for i, line in enumerate(lines(log)) if "nvshim node: ready" in line) + 1
    assert steps >= 6, lines(log)
    for n in range(1, steps + 1):
        scratch.ready.unlink(missing_ok=True)
        log = tmp_path / f"kill-{n}"
        proc = start_node(env, log)
        wait_for(lambda n=n, log=log, p=proc: len(lines(log)) >= n or p.poll() is not None, log=log)
        proc.kill()
        proc.wait()
        # the pod comes back: install again, then be deleted
        scratch.ready.unlink(missing_ok=True)
        again = tmp_path / f"restart-{n}"
        proc = start_node(env, again)
        wait_for(scratch.ready.exists, proc=proc, log=again)
        assert b"nvshim" in scratch.config.read_bytes()
        stop(proc, again)
        assert scratch.config.read_bytes() == scratch.original, (n, again.read_text())
        assert files_of(scratch.snapshot()) == files_of(before), n


def test_crash_after_ready_twice_then_delete(scratch, tmp_path):
    before = scratch.snapshot()
    env = scratch.env(CDI_ENABLED="true")
    for n in range(2):
        log = tmp_path / f"crash-{n}"
        scratch.ready.unlink(missing_ok=True)
        proc = start_node(env, log)
        wait_for(scratch.ready.exists, proc=proc, log=log)
        proc.kill()
        proc.wait()
        assert scratch.path("/etc/containerd/config.toml.nvshim.bak").read_bytes() == (
            scratch.original
        )
    log = tmp_path / "last"
    scratch.ready.unlink(missing_ok=True)
    proc = start_node(env, log)
    wait_for(scratch.ready.exists, proc=proc, log=log)
    assert "no change" in log.read_text()  # the config was already right: nothing rewritten
    stop(proc, log)
    assert scratch.config.read_bytes() == scratch.original
    assert files_of(scratch.snapshot()) == files_of(before)


def test_two_installers_on_one_node_take_turns(scratch, tmp_path):
    before = scratch.snapshot()
    env = scratch.env(CDI_ENABLED="true")
    logs = [tmp_path / "a", tmp_path / "b"]
    procs = [start_node(env, log) for log in logs]
    try:
        wait_for(scratch.ready.exists, log=logs[0])
        time.sleep(0.5)
        waiting = [i for i, log in enumerate(logs) if "waiting for it" in log.read_text()]
        assert len(waiting) == 1, [log.read_text() for log in logs]
        second = waiting[0]
        first = 1 - second
        assert "ready" not in logs[second].read_text()
        # the old pod is deleted while the new one waits: it undoes, then the new one installs
        scratch.ready.unlink()
        stop(procs[first], logs[first])
        wait_for(scratch.ready.exists, proc=procs[second], log=logs[second])
        assert b"nvshim" in scratch.config.read_bytes()
        stop(procs[second], logs[second])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert scratch.config.read_bytes() == scratch.original
    assert files_of(scratch.snapshot()) == files_of(before)


SHARING = """version: v1
sharing:
  mps:
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""


def _mps_pid(pipe: str) -> int | None:
    try:
        with open(os.path.join(pipe, "nvidia-cuda-mps-control.pid")) as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None


def test_mps_daemons_are_supervised_and_stopped(tmp_path):
    scratch = Scratch(tmp_path, "single", fake_mps_control.extra_files())
    sharing = tmp_path / "sharing.yaml"
    sharing.write_text(SHARING)
    env = scratch.env(NVSHIM_SHARING_CONFIG=str(sharing), CDI_ENABLED="true")
    uuid = scratch.sim.gpu_uuids()[0]
    pipe = scratch.path(f"/run/nvshim/mps/{uuid}/pipe")
    log = tmp_path / "log"
    proc = start_node(env, log)
    try:
        wait_for(scratch.ready.exists, proc=proc, log=log)
        first = _mps_pid(str(pipe))
        assert first is not None and f"MPS daemon of 0 ({uuid}) started" in log.read_text()
        placed = scratch.path("/etc/nvshim/sharing.yaml").read_text()
        assert placed == SHARING
        shared = yaml.safe_load(scratch.path("/var/run/cdi/nvshim-shared.yaml").read_text())
        assert shared["kind"] == "nvidia.com/gpu.shared"
        assert [d["name"] for d in shared["devices"]] == ["0", uuid]
        mounts = shared["devices"][0]["containerEdits"]["mounts"]
        assert f"/run/nvshim/mps/{uuid}/pipe" in [m["hostPath"] for m in mounts]  # host path
        os.kill(first, signal.SIGKILL)
        wait_for(
            lambda: "restarted (it had died)" in log.read_text(), timeout=30, proc=proc, log=log
        )
        second = _mps_pid(str(pipe))
        assert second is not None and second != first
        stop(proc, log)
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in {_mps_pid(str(pipe))} - {None}:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        subprocess.run(["umount", "-l", str(pipe.parent / "shm")], capture_output=True)
    assert _mps_pid(str(pipe)) is None
    assert f"MPS daemon of 0 ({uuid}): stopped" in log.read_text()
    # the MPS root and every cache under the host's /run/nvshim went with the uninstall
    assert not scratch.path("/run/nvshim").exists(), os.listdir(scratch.path("/run/nvshim"))
    assert not scratch.path("/etc/nvshim/sharing.yaml").exists()
    assert not scratch.path("/var/run/cdi/nvshim-shared.yaml").exists()
    assert scratch.config.read_bytes() == scratch.original


def test_temp_files_of_a_writer_killed_mid_write_are_cleaned(scratch, tmp_path):
    """What atomic_write leaves when killed between creating its temp file and the rename."""
    stale = [
        scratch.config.parent / ".config.toml.4242.0badf00d.tmp",
        scratch.config.parent / ".config.toml.nvshim.state.4242.0badf00d.tmp",
    ]
    for path in stale:
        path.write_text("half written")
    log = tmp_path / "log"
    proc = start_node(scratch.env(), log)
    wait_for(scratch.ready.exists, proc=proc, log=log)
    assert not any(p.exists() for p in stale)
    stop(proc, log)
    assert sorted(os.listdir(scratch.config.parent)) == ["config.toml"]
    assert scratch.config.read_bytes() == scratch.original
