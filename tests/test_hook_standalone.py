"""The standalone mode end to end: ``nvshim-hook prestart`` on a simulated GPU host,
from a runc prestart hook entry and from podman's hooks directory (the shipped
``hooks/oci-nvshim-hook.json``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from nvshim.hookentries import HOOK_ENV, hook_entry
from nvshim.ldcache import parse_ld_cache
from tests.podman_util import podman_run
from tests.runc_util import (
    hook_env_names,
    make_bundle,
    make_busybox_rootfs,
    read_log,
    runc_run,
    write_hook_config,
)

LIB = "/usr/lib/x86_64-linux-gnu"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOOK_JSON = os.path.join(REPO, "hooks", "oci-nvshim-hook.json")
LOOK = (
    "ls /dev | grep nvidia | tr '\\n' ' '; echo;"
    f" echo $(readlink {LIB}/libcuda.so) $(readlink {LIB}/libcuda.so.1);"
    " test -x /usr/bin/nvidia-smi && echo smi;"
    " grep -c ' 195:' /sys/fs/cgroup/devices/devices.list"
)


@pytest.fixture(scope="module")
def gpu_host(sim_hosts, tmp_path_factory):
    """The single-GPU simulated host with its inventory cached in a state dir (the hook
    reads the cache; it never initialises NVML)."""
    host = sim_hosts("single")
    state = str(tmp_path_factory.mktemp("inventory") / "state")
    code = (
        "import sys; from nvshim.host.inventory import load_host;"
        " load_host(sys.argv[1], sys.argv[2], sys.argv[3])"
    )
    subprocess.run(
        [sys.executable, "-c", code, host.driver_root, host.dev_root, state],
        env={**os.environ, **host.nvml_env()},
        check=True,
        capture_output=True,
    )
    return host, state


def _config(tmp_path, gpu_host, **policy) -> tuple[str, str]:
    host, state = gpu_host
    config, log = write_hook_config(
        tmp_path, dev_root=host.dev_root, driver_root=host.driver_root, **policy
    )
    with open(config, encoding="utf-8") as fh:
        text = fh.read()
    text = text.replace(f'inventory-dir = "{tmp_path}/state"', f'inventory-dir = "{state}"')
    with open(config, "w", encoding="utf-8") as fh:
        fh.write(text)
    return config, log


def _check_gpu_container(out: list[str], rootfs: str, host) -> None:
    nodes = set(out[0].split())
    assert nodes == {"nvidia0", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"}
    assert out[1].split() == ["libcuda.so.1", f"libcuda.so.{host.driver_version}"]
    assert out[2] == "smi"
    assert int(out[3]) == 2  # 195:0 and 195:255 allowed in the devices cgroup
    with open(os.path.join(rootfs, "etc/ld.so.cache"), "rb") as fh:
        names = {e.name for e in parse_ld_cache(fh.read())}
    assert {"libcuda.so.1", "libnvidia-ml.so.1"} <= names


def test_prestart_injects_a_requested_gpu_through_runc(tmp_path, launchers, gpu_host):
    host, _ = gpu_host
    rootfs = make_busybox_rootfs(tmp_path / "rootfs")
    config, log = _config(tmp_path, gpu_host)
    entry = hook_entry(f"{launchers}/nvshim-hook", "prestart", "prestart", "--config", config)
    admin = ["CAP_SYS_ADMIN", "CAP_KILL", "CAP_AUDIT_WRITE"]  # privileged: env honoured
    bundle = make_bundle(
        tmp_path,
        rootfs,
        ["sh", "-c", LOOK],
        env={"NVIDIA_VISIBLE_DEVICES": "0"},
        hooks=[entry],
        capabilities=admin,
    )
    run = runc_run(bundle, "standalone-runc")
    assert run.returncode == 0, run.stderr
    _check_gpu_container(run.stdout.splitlines(), rootfs, host)
    (record,) = read_log(log)
    assert record["step"] == "prestart" and record["devices"] == host.gpu_uuids()[0]
    assert record["env_not_applied"] == "CUDA_VISIBLE_DEVICES"
    assert record["ldcache"] == "updated" and record["hook_env"] == hook_env_names()


def test_shipped_hooks_json_runs_prestart_under_podman(tmp_path, launchers, gpu_host):
    host, _ = gpu_host
    with open(HOOK_JSON, encoding="utf-8") as fh:
        shipped = json.load(fh)
    assert shipped["version"] == "1.0.0" and shipped["stages"] == ["prestart"]
    assert shipped["hook"]["args"] == ["nvshim-hook", "prestart"]
    assert shipped["hook"]["env"] == list(HOOK_ENV)
    assert shipped["when"] == {"always": True}  # podman cannot match on env
    config, log = _config(tmp_path, gpu_host, accept_env_unprivileged=True)
    hooks_dir = tmp_path / "hooks.d"
    hooks_dir.mkdir()
    shipped["hook"]["path"] = f"{launchers}/nvshim-hook"
    shipped["hook"]["args"] += ["--config", config]
    (hooks_dir / "oci-nvshim-hook.json").write_text(json.dumps(shipped))
    rootfs = make_busybox_rootfs(tmp_path / "rootfs")
    gpu = podman_run(
        tmp_path,
        rootfs,
        ["-e", "NVIDIA_VISIBLE_DEVICES=0", "--", "sh", "-c", LOOK],
        hooks_dir=str(hooks_dir),
    )
    assert gpu.returncode == 0, gpu.stderr
    _check_gpu_container(gpu.stdout.splitlines(), rootfs, host)
    plain = podman_run(
        tmp_path, rootfs, ["--", "sh", "-c", "ls /dev | grep -c nvidia"], hooks_dir=str(hooks_dir)
    )
    assert plain.stdout.strip() == "0"
    records = read_log(log)
    assert len(records) == 1  # the non-GPU container was let through without a decision
    assert records[0]["devices"] == host.gpu_uuids()[0]
