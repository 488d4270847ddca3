"""End to end through the CRI (issue 4): `nvshim configure` registers nvshim with a real
containerd 1.6, `--restart signal` makes it reload, and pods on ``runtime_handler =
"nvshim"`` get the GPU of the simulated host they ask for, and nothing more.

containerd 1.6 copies a container's annotations into its OCI spec only where the
runtime's ``container_annotations`` allows (``--enable-cdi`` sets ``cdi.k8s.io/*``), and a
pod's only where ``pod_annotations`` allows (nvshim leaves that empty).
"""

from __future__ import annotations

import os
import re
import shutil
import time

import pytest

from tests.conftest import run_nvshim, write_config
from tests.cri_util import (
    cri_ready_config,
    cri_session,
    image_archive,
    mounts_under,
    processes_in_mount_ns,
)
from tests.engines.containerd_instance import private_containerd
from tests.engines.corpus_cases import CORPUS
from tests.podman_util import make_busybox_rootfs
from tests.runc_util import read_log

V16 = (CORPUS / "containerd-1.6-default" / "input" / "config.toml").read_text()
IMAGE = "nvshim.test/busybox:cri"
PAUSE = "nvshim.test/pause:cri"
SHOW = ["sh", "-c", "ls /dev; echo CVD=$CUDA_VISIBLE_DEVICES"]
CONTROL_NODES = {"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"}
TOOLS = ("containerd", "containerd-shim-runc-v2", "ctr", "runc", "unshare")

pytestmark = pytest.mark.skipif(
    any(shutil.which(t) is None for t in TOOLS),
    reason=f"needs {', '.join(TOOLS)} (tests/setup.sh installs them)",
)


def container_view(lines: list[str]) -> tuple[set[str], set[str], str | None]:
    """(GPU nodes, other nvidia nodes, CUDA_VISIBLE_DEVICES) from the container's output."""
    cvd = next((x[len("CVD=") :] for x in lines if x.startswith("CVD=")), None)
    names = {x for x in lines if x.startswith("nvidia")}
    gpus = {x for x in names if re.fullmatch(r"nvidia\d+", x)}
    return gpus, names - gpus, cvd


def leave_no_process(ns: str, timeout: float = 15.0) -> list[int]:
    """Wait for every process of the daemon's mount namespace to end; kill the rest
    (all started by this test) and return their PIDs."""
    deadline = time.monotonic() + timeout
    while (left := processes_in_mount_ns(ns)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    return left


def test_pod_on_nvshim_handler_gets_requested_gpu(tmp_path, sim_hosts, launchers, monkeypatch):
    sim = sim_hosts("h100x8-mig")
    gpus = sim.topology["gpus"]
    nv_log = tmp_path / "nvshim.log"
    nv_config = tmp_path / "nvshim.toml"
    state = tmp_path / "nvshim-state"
    write_config(nv_config, sim, launchers, state, nv_log, accept_env_unprivileged=True)
    # containerd hands its environment to the shim, the shim to nvshim-runtime.
    monkeypatch.setenv("NVSHIM_CONFIG", str(nv_config))
    runtime_path = os.path.join(launchers, "nvshim-runtime")

    rootfs = make_busybox_rootfs(tmp_path / "rootfs")
    os.symlink("busybox", os.path.join(rootfs, "bin", "sleep"))
    archive = image_archive(rootfs, tmp_path / "image.tar", [IMAGE, PAUSE])
    config = tmp_path / "containerd.toml"
    config.write_text(cri_ready_config(V16, tmp_path / "scratch", PAUSE))
    pod_logs = tmp_path / "pod-logs"
    pod_logs.mkdir()

    daemon_ns = None
    try:
        with private_containerd(tmp_path, config) as ctd:
            old_pid = ctd.pid
            daemon_ns = os.readlink(f"/proc/{old_pid}/ns/mnt")
            assert "nvshim" not in ctd.cri_config()["containerd"]["runtimes"]
            done = run_nvshim(
                "configure",
                "--engine",
                "containerd",
                "--engine-config",
                str(config),
                "--runtime-path",
                runtime_path,
                "--enable-cdi",
                "--restart",
                "signal",
                "--socket",
                ctd.socket,
            )
            assert done.returncode == 0, done.stderr
            assert f"sent SIGHUP to containerd (pid {old_pid}), the owner of {ctd.socket}" in (
                done.stdout
            )
            ctd.wait_restarted(old_pid)
            loaded = ctd.cri_config()["containerd"]["runtimes"]["nvshim"]
            assert loaded["options"]["BinaryName"] == runtime_path
            assert loaded["ContainerAnnotations"] == ["cdi.k8s.io/*"]
            assert loaded["PodAnnotations"] == []
            imported = ctd.ctr("-n", "k8s.io", "images", "import", archive)
            assert imported.returncode == 0, imported.stderr

            with cri_session(ctd.socket, IMAGE) as cri:
                # A pod annotation is not passed on (pod_annotations is empty): no GPU 2 anywhere.
                pod = cri.run_pod("gpu", pod_logs, "nvshim", {"cdi.k8s.io/pod": "nvidia.com/gpu=2"})
                by_env = cri.run_container(
                    pod, "by-env", IMAGE, SHOW, env={"NVIDIA_VISIBLE_DEVICES": "1"}
                )
                # Default policy from here on: env requests of unprivileged containers refused.
                write_config(nv_config, sim, launchers, state, nv_log)
                by_cdi = cri.run_container(
                    pod, "by-cdi", IMAGE, SHOW, annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=0"}
                )
                # "all" (what CUDA base images set for every container): no GPU, logged
                denied = cri.run_container(
                    pod, "denied", IMAGE, SHOW, env={"NVIDIA_VISIBLE_DEVICES": "all"}
                )
            daemon_log = ctd.log()
    finally:
        left = leave_no_process(daemon_ns) if daemon_ns else []

    assert left == [], "processes left in containerd's namespace"
    assert mounts_under(tmp_path) == []

    for result in (by_env, by_cdi, denied):
        assert result.exit_code == 0, (result, daemon_log)
    gpu_nodes, others, cvd = container_view(by_env.lines)
    assert gpu_nodes == {f"nvidia{gpus[1]['minor']}"}
    assert CONTROL_NODES <= others
    assert cvd == gpus[1]["uuid"]

    gpu_nodes, others, cvd = container_view(by_cdi.lines)
    assert gpu_nodes == {f"nvidia{gpus[0]['minor']}"}
    assert CONTROL_NODES <= others
    assert cvd == gpus[0]["uuid"]

    gpu_nodes, others, cvd = container_view(denied.lines)
    assert gpu_nodes == set() and others == set()
    assert cvd == ""

    # One decision line per GPU container, none for the sandbox.
    records = [r for r in read_log(str(nv_log)) if r["tool"] == "nvshim-runtime"]
    assert [r["id"] for r in records] == [
        by_env.container_id,
        by_cdi.container_id,
        denied.container_id,
    ]
    assert records[0]["source"] == "env" and records[0]["devices"] == gpus[1]["uuid"]
    assert records[1]["source"] == "cdi" and records[1]["devices"] == gpus[0]["uuid"]
    assert records[2]["source"] == "env" and "denied" in records[2]
