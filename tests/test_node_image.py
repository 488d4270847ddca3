"""The node installer image end to end (issue 9): built from a Debian root plus the host
bundle, run with podman (privileged, host PID) on a scratch host root mounted at /host
that holds a private containerd's config and socket. The config gets the runtime and
containerd reloads; the CDI spec and the readiness file appear; a CRI pod on handler
``nvshim`` gets exactly its GPU through the runtime the installer put on the scratch host
(containerd sees the scratch host's /usr/local at /usr/local); ``podman stop`` gives the
config back byte for byte and removes everything installed."""

from __future__ import annotations

import os
import shutil
import time
import tomllib

import pytest
import yaml

from tests.cri_util import cri_ready_config, cri_session, image_archive
from tests.engines.containerd_instance import private_containerd
from tests.node_image import NodeContainer, node_image
from tests.node_util import CONTAINERD_16, snapshot, wait_for
from tests.podman_util import make_busybox_rootfs
from tests.test_configure_cri import CONTROL_NODES, container_view, leave_no_process

IMAGE = "nvshim.test/busybox:node"
PAUSE = "nvshim.test/pause:node"
SHOW = ["sh", "-c", "ls /dev; echo CVD=$CUDA_VISIBLE_DEVICES"]
TOOLS = ("podman", "containerd", "ctr", "runc", "unshare", "mmdebstrap", "patchelf")

pytestmark = pytest.mark.skipif(
    any(shutil.which(t) is None for t in TOOLS), reason=f"needs {', '.join(TOOLS)}"
)


def test_image_end_to_end(tmp_path, sim_hosts, monkeypatch):
    rootfs_tar = node_image()
    sim = sim_hosts("single")
    gpu = sim.topology["gpus"][0]
    host = tmp_path / "h"  # short: the socket path below it must fit in sun_path
    config = host / "etc/containerd/config.toml"
    config.parent.mkdir(parents=True)
    (host / "usr/local").mkdir(parents=True)
    original = cri_ready_config(CONTAINERD_16.read_text(), tmp_path / "scratch", PAUSE).encode()
    config.write_bytes(original)
    # nvshim's settings for the host (a ConfigMap in a cluster): keep its log in tmp
    node_config = tmp_path / "node-config"
    node_config.mkdir()
    nv_log = tmp_path / "nvshim.log"
    (node_config / "config.toml").write_text(
        f'[runtime]\nlog-file = "{nv_log}"\ninventory-dir = "{tmp_path / "state"}"\n'
        '[policy]\ndefault-capabilities = "utility,compute"\n'
    )
    ready_dir = tmp_path / "ready"
    ready_dir.mkdir()
    rootfs = make_busybox_rootfs(tmp_path / "rootfs")
    os.symlink("busybox", os.path.join(rootfs, "bin", "sleep"))
    archive = image_archive(rootfs, tmp_path / "image.tar", [IMAGE, PAUSE])
    pod_logs = tmp_path / "pod-logs"
    pod_logs.mkdir()
    # what containerd's shim hands nvshim-runtime: the host config the installer writes
    monkeypatch.setenv("NVSHIM_CONFIG", str(host / "etc/nvshim/config.toml"))

    daemon_ns = None
    node = None
    try:
        with private_containerd(host, config, binds={host / "usr/local": "/usr/local"}) as ctd:
            daemon_ns = os.readlink(f"/proc/{ctd.pid}/ns/mnt")
            before = snapshot(host, skip=host / "containerd")
            old_pid = ctd.pid
            socket = "/" + os.path.relpath(ctd.socket, host)
            env = {
                "RUNTIME": "containerd",
                "CONTAINERD_SOCKET": socket,
                "CONTAINERD_SET_AS_DEFAULT": "false",
                "RUNTIME_ENABLE_CDI": "true",
                "CDI_ENABLED": "true",
                "NVIDIA_DRIVER_ROOT": sim.driver_root,
                "DRIVER_ROOT_CTR_PATH": sim.driver_root,
                "NVIDIA_DEV_ROOT": sim.dev_root,
                "DEV_ROOT_CTR_PATH": sim.dev_root,
                "NVSHIM_NODE_CONFIG": "/etc/nvshim-node/config.toml",
                "NVSHIM_READY_FILE": "/run/nvshim-ready/ready",
                "NVSHIM_CONTAINERD_VERSION": "1.6.20",
            }
            # as the DaemonSet runs it: read-only root (podman mounts tmpfs on /run, /tmp)
            args = ["--privileged", "--pid=host", "--network=none", "--read-only"]
            args += ["-v", f"{host}:/host", "-v", f"{sim.root}:{sim.root}"]
            args += ["-v", f"{node_config}:/etc/nvshim-node:ro"]
            args += ["-v", f"{ready_dir}:/run/nvshim-ready"]
            args += [a for k, v in env.items() for a in ("-e", f"{k}={v}")]
            started = time.monotonic()
            node = NodeContainer(rootfs_tar, args, str(tmp_path / "node.log"), str(tmp_path))
            wait_for((ready_dir / "ready").exists, timeout=120)
            ready_after = time.monotonic() - started

            ctd.wait_restarted(old_pid)
            loaded = ctd.cri_config()["containerd"]["runtimes"]["nvshim"]
            assert loaded["options"]["BinaryName"] == "/usr/local/nvshim/bin/nvshim-runtime"
            assert os.path.isfile(host / "usr/local/nvshim/nvshim-bundle.json")
            spec = yaml.safe_load((host / "var/run/cdi/nvshim.yaml").read_text())
            assert [d["name"] for d in spec["devices"]] == ["0", gpu["uuid"], "all"]
            node0 = spec["devices"][0]["containerEdits"]["deviceNodes"][0]
            assert node0["hostPath"] == os.path.join(sim.dev_root, f"dev/nvidia{gpu['minor']}")
            host_config = tomllib.loads((host / "etc/nvshim/config.toml").read_text())
            assert host_config["host"]["driver-root"] == sim.driver_root
            assert host_config["runtime"]["log-file"] == str(nv_log)

            imported = ctd.ctr("-n", "k8s.io", "images", "import", archive)
            assert imported.returncode == 0, imported.stderr
            with cri_session(ctd.socket, IMAGE) as cri:
                pod = cri.run_pod("gpu", pod_logs, "nvshim")
                result = cri.run_container(
                    pod, "by-cdi", IMAGE, SHOW, annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=0"}
                )

            restarted_pid = ctd.pid
            code = node.stop()
            node = None
            log = (tmp_path / "node.log").read_text()
            assert code == 0, log
            ctd.wait_restarted(restarted_pid)  # the uninstall made containerd reload
            assert "nvshim" not in ctd.cri_config()["containerd"]["runtimes"]
            after = snapshot(host, skip=host / "containerd")
    finally:
        if node is not None:
            node.kill()
        left = leave_no_process(daemon_ns) if daemon_ns else []
    assert left == []

    assert result.exit_code == 0, result
    gpu_nodes, others, cvd = container_view(result.lines)
    assert gpu_nodes == {f"nvidia{gpu['minor']}"}
    assert CONTROL_NODES <= others
    assert cvd == gpu["uuid"]
    runtime_lines = [line for line in nv_log.read_text().splitlines() if "nvshim-runtime" in line]
    assert runtime_lines, "the installed runtime logged nothing"

    assert config.read_bytes() == original
    assert "uninstalled" in log
    assert not (ready_dir / "ready").exists()
    assert {k: v for k, v in after.items() if v != "dir"} == {
        k: v for k, v in before.items() if v != "dir"
    }
    print(f"installer ready after {ready_after:.1f} s")


def test_build_without_its_tools_is_one_line_naming_them(tmp_path):
    """docs/kubernetes.md's build command, as written (its archive put in the test's
    directory), on a machine without mmdebstrap: one line naming the package (and the
    flag that does without it), before any work."""
    import shlex
    import subprocess
    import sys

    from tests.conftest import REPO
    from tests.docs_commands import documented

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("tar", "podman", "patchelf"):  # everything but mmdebstrap
        os.symlink(shutil.which(tool, path="/usr/bin:/bin:/usr/sbin:/sbin"), bin_dir / tool)
    os.symlink(sys.executable, bin_dir / "python3")
    line = documented("docs/kubernetes.md", "python3 packaging/container/build.py")
    argv = [str(tmp_path / "x.tar") if w.endswith(".oci.tar") else w for w in shlex.split(line)]
    proc = subprocess.run(
        argv, cwd=REPO, env={"PATH": str(bin_dir)}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr == (
        "build: not installed: mmdebstrap (or pass --base-tar ROOT.tar) "
        "(apt-get install the Debian packages)\n"
    )
    assert os.listdir(tmp_path) == ["bin"]
