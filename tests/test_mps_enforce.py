"""MPS enforcement: containers through nvshim-runtime and real runc on a simulated host
whose MPS daemons are the fake control binary; policy decisions through ``select``."""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass

import pytest

from nvshim.config import load_config
from nvshim.errors import NvshimError
from nvshim.host.discover import discover_host
from nvshim.host.model import Host
from nvshim.memo import Last
from nvshim.policy import select as select_module
from nvshim.policy.request import request_from_spec
from nvshim.policy.select import select
from tests.conftest import run_nvshim
from tests.runc_util import make_bundle, make_busybox_rootfs, runc_run
from tests.sim import fake_mps_control
from tests.sim.simhost import build_host

# MPS under migStrategy mixed: GPUs 0-5 are nvidia.com/gpu, each MPS-shared x4
GPU0 = "GPU-92e91e7d-ffd7-601c-459e-d7fde767a1c6"  # MPS-shared, daemon never started
GPU1 = "GPU-9d9231cf-dcd5-4b0e-0f9d-e8a86f92f3cc"  # MPS-shared x4, daemon running
GPU2 = "GPU-f2af56f9-8248-ff94-8cb3-7bd99c962855"  # MPS-shared x4, daemon never started
GPU3 = "GPU-4998f9d2-f279-514d-1035-17bd5c4caca3"  # time-sliced (second config)
MIG_6_1 = "MIG-446df19c-d260-2572-7f36-b52f3b5f1262"  # 2g.20gb: not shared
SHARE_MIB = 81559 // 4

MPS_SHARING = """version: v1
flags:
  migStrategy: mixed
sharing:
  mps:
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""
TIME_SLICING = """version: v1
sharing:
  timeSlicing:
    failRequestsGreaterThanOne: true
    resources:
    - {name: nvidia.com/gpu, replicas: 8}
"""
# What the container prints: its CUDA_ variables, then its MPS-related mounts, then files.
PROBE = (
    "env | grep '^CUDA_'; echo ---; "
    "grep -E ' /(run/nvidia-mps|dev/shm|tmp/nvidia-mps) ' /proc/self/mountinfo; echo ---; "
    "ls /run/nvidia-mps /dev/shm 2>&1"
)


@dataclass
class Env:
    host: Host
    root: str
    mps_root: str
    launchers: str
    rootfs: str
    configs: dict[str, str]
    ids = itertools.count()

    def config(self, name: str = "mps") -> str:
        return self.configs[name]

    def run(self, tmp_path, env: dict[str, str], config: str = "mps"):
        """Run PROBE in a container asking for GPUs by env; the runc result."""
        n = next(self.ids)
        bundle = make_bundle(tmp_path, self.rootfs, ["sh", "-c", PROBE], env=env, name=f"b{n}")
        return runc_run(
            bundle,
            f"mps-{os.getpid()}-{n}",
            runtime=os.path.join(self.launchers, "nvshim-runtime"),
            env={"NVSHIM_CONFIG": self.configs[config]},
        )


def _write_config(
    path: str, sim, sharing: str, mps_root: str, log: str, state: str, on_down: str = "fail"
) -> str:
    with open(path, "w") as fh:
        fh.write(
            f'[host]\ndriver-root = "{sim.driver_root}"\ndev-root = "{sim.dev_root}"\n'
            f'[runtime]\nruntimes = ["runc"]\nlog-file = "{log}"\nhook-path = "/bin/true"\n'
            f'inventory-dir = "{state}"\n'
            "[policy]\naccept-env-unprivileged = true\n"
            f'[sharing]\nconfig = "{sharing}"\nmps-root = "{mps_root}"\n'
            f'on-daemon-down = "{on_down}"\n'
        )
    return path


@pytest.fixture(scope="module")
def shared_host(tmp_path_factory, launchers):
    root = tmp_path_factory.mktemp("mps-enforce")
    sim = build_host("h100x8-mig", str(root / "host"), extra_files=fake_mps_control.extra_files())
    mps_root = str(root / "mps")
    (root / "mps.yaml").write_text(MPS_SHARING)
    (root / "ts.yaml").write_text(TIME_SLICING)
    log, state = str(root / "nvshim.log"), str(root / "state")
    configs = {
        "mps": _write_config(str(root / "mps.toml"), sim, root / "mps.yaml", mps_root, log, state),
        "warn": _write_config(
            str(root / "warn.toml"), sim, root / "mps.yaml", mps_root, log, state, on_down="warn"
        ),
        "ts": _write_config(str(root / "ts.toml"), sim, root / "ts.yaml", mps_root, log, state),
    }
    started = run_nvshim("mps", "start", "--gpu", "1", env={"NVSHIM_CONFIG": configs["mps"]})
    assert started.returncode == 0, started.stderr
    rootfs = make_busybox_rootfs(root / "rootfs")
    env = Env(
        discover_host(sim.driver_root, sim.dev_root),
        str(root),
        mps_root,
        launchers,
        rootfs,
        configs,
    )
    yield env
    run_nvshim("mps", "stop", env={"NVSHIM_CONFIG": configs["mps"]})


def _sections(stdout: str) -> tuple[dict[str, str], list[str], str]:
    env_part, mounts_part, files = (stdout.split("---\n") + ["", ""])[:3]
    env = dict(line.split("=", 1) for line in env_part.splitlines() if "=" in line)
    return env, mounts_part.splitlines(), files


def _mount_points(mounts: list[str]) -> list[tuple[str, str]]:
    """(mount point, root of the mount inside its filesystem) per mountinfo line."""
    return [(line.split()[4], line.split()[3]) for line in mounts]


def _error_lines(stderr: str) -> list[str]:
    """Distinct non-empty stderr lines (the runtime logs its one error line and reports it)."""
    return sorted({line for line in stderr.splitlines() if line.strip()})


def _marker(uuid: str, mps_root: str) -> str:
    shm = os.path.join(mps_root, uuid, "shm")
    return next(n for n in os.listdir(shm) if n.startswith("fake-mps-control."))


def test_shared_gpu_gets_its_pipe_dir_shm_and_share(shared_host, tmp_path):
    proc = shared_host.run(tmp_path, {"NVIDIA_VISIBLE_DEVICES": f"{GPU1}::2"})
    assert proc.returncode == 0, proc.stderr
    env, mounts, files = _sections(proc.stdout)
    assert env["CUDA_VISIBLE_DEVICES"] == GPU1
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/nvidia-mps"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{GPU1}={SHARE_MIB}M"
    points = _mount_points(mounts)
    pipes = [r for p, r in points if p == "/run/nvidia-mps"]
    assert len(pipes) == 1 and pipes[0].endswith(f"/mps/{GPU1}/pipe")
    assert not any(p == "/tmp/nvidia-mps" for p, _ in points)
    # the pipe dir is the running daemon's, and /dev/shm is the tmpfs the daemon writes to
    assert "nvidia-cuda-mps-control.pid" in files and "control" in files
    assert _marker(GPU1, shared_host.mps_root) in files


@pytest.mark.parametrize(
    "threads,memory,want_threads,want_memory",
    [
        ("80", f"{GPU1}=40G", "25", f"{GPU1}={SHARE_MIB}M"),  # looser: replaced
        ("10", "0=1G", "10", f"{GPU1}=1G"),  # stricter (ordinal 0 is the only GPU): kept
        ("12.5", f"{GPU1.lower()}=2048M", "12.5", f"{GPU1}=2048M"),
        ("0", "0=1024", "25", f"{GPU1}={SHARE_MIB}M"),  # invalid, unitless: replaced
        ("25", f"0=1G,{GPU1}=30G", "25", f"{GPU1}={SHARE_MIB}M"),  # loosest entry counts
    ],
)
def test_user_values_kept_only_when_stricter(
    shared_host, tmp_path, threads, memory, want_threads, want_memory
):
    proc = shared_host.run(
        tmp_path,
        {
            "NVIDIA_VISIBLE_DEVICES": GPU1,
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": threads,
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": memory,
            "CUDA_MPS_PIPE_DIRECTORY": "/tmp/elsewhere",
        },
    )
    assert proc.returncode == 0, proc.stderr
    env, _, _ = _sections(proc.stdout)
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == want_threads
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == want_memory
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/nvidia-mps"


def test_non_shared_gpu_gets_nothing_mps_whatever_it_sets(shared_host, tmp_path):
    proc = shared_host.run(
        tmp_path,
        {
            "NVIDIA_VISIBLE_DEVICES": "6:1",
            "CUDA_MPS_PIPE_DIRECTORY": f"{shared_host.mps_root}/{GPU1}/pipe",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100",
            "CUDA_MPS_LOG_DIRECTORY": "/tmp/log",
        },
    )
    assert proc.returncode == 0, proc.stderr
    env, mounts, files = _sections(proc.stdout)
    assert env["CUDA_VISIBLE_DEVICES"] == MIG_6_1
    mps_env = {k: v for k, v in env.items() if k.startswith("CUDA_MPS_")}
    assert mps_env == {
        "CUDA_MPS_PIPE_DIRECTORY": "",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "",
        "CUDA_MPS_LOG_DIRECTORY": "",
    }
    points = [p for p, _ in _mount_points(mounts)]
    assert "/run/nvidia-mps" not in points and "/tmp/nvidia-mps" not in points
    assert not any(n.startswith("fake-mps-control.") for n in files.split())
    with open(os.path.join(shared_host.root, "nvshim.log")) as fh:
        assert "mps_env_cleared=CUDA_MPS_ACTIVE_THREAD_PERCENTAGE,CUDA_MPS_LOG_DIRECTORY," in (
            fh.read()
        )


def test_daemon_down_refuses_the_container_or_warns(shared_host, tmp_path):
    proc = shared_host.run(tmp_path, {"NVIDIA_VISIBLE_DEVICES": "0"})
    assert proc.returncode != 0
    assert proc.stdout == ""
    errors = _error_lines(proc.stderr)
    assert len(errors) == 1 and "Traceback" not in proc.stderr
    assert f"device 0 ({GPU0}) is MPS-shared but its MPS control daemon is not running" in errors[0]
    assert "nvshim mps start" in errors[0]

    # warn: the container runs; its daemon never ran, so there is no directory to mount yet
    proc = shared_host.run(tmp_path, {"NVIDIA_VISIBLE_DEVICES": "0"}, config="warn")
    assert proc.returncode == 0, proc.stderr
    env, mounts, _ = _sections(proc.stdout)
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/nvidia-mps"
    assert "/run/nvidia-mps" not in [p for p, _ in _mount_points(mounts)]
    with open(os.path.join(shared_host.root, "nvshim.log")) as fh:
        lines = fh.read().splitlines()
    assert "mps_warning=" in lines[-1] and GPU0 in lines[-1]


@pytest.mark.parametrize(
    "visible,expect",
    [
        (
            f"{GPU1}::0,{GPU1}::1",
            f"device 1 ({GPU1}) is shared (mps x4) with "
            "failRequestsGreaterThanOne: 2 replicas requested, at most 1 allowed",
        ),
        (f"1,{GPU1}::3", "2 replicas requested"),
        ("1,2", "2 shared devices requested"),
    ],
)
def test_more_than_one_replica_is_refused(shared_host, tmp_path, visible, expect):
    proc = shared_host.run(tmp_path, {"NVIDIA_VISIBLE_DEVICES": visible})
    assert proc.returncode != 0 and proc.stdout == ""
    errors = _error_lines(proc.stderr)
    assert len(errors) == 1 and expect in errors[0]


def test_time_slicing_replica_resolves_to_its_gpu_and_nothing_else(shared_host, tmp_path):
    proc = shared_host.run(
        tmp_path,
        {"NVIDIA_VISIBLE_DEVICES": f"{GPU3}::5", "CUDA_MPS_PIPE_DIRECTORY": "/x"},
        config="ts",
    )
    assert proc.returncode == 0, proc.stderr
    env, mounts, _ = _sections(proc.stdout)
    assert env["CUDA_VISIBLE_DEVICES"] == GPU3
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == ""
    assert "/run/nvidia-mps" not in [p for p, _ in _mount_points(mounts)]
    refused = shared_host.run(
        tmp_path, {"NVIDIA_VISIBLE_DEVICES": f"{GPU3}::1,{GPU3}::2"}, config="ts"
    )
    assert refused.returncode != 0 and "(time-slicing x8)" in refused.stderr


# ---- policy decisions without a container --------------------------------------------------


def _select(shared_host, env: dict[str, str], config: str = "mps"):
    spec = {"process": {"env": [f"{k}={v}" for k, v in env.items()]}}
    cfg = load_config(shared_host.config(config))
    request = request_from_spec(spec, cfg.policy)
    return select(request, shared_host.host, cfg)


def test_a_process_makes_a_hosts_common_edits_once_and_never_shares_them(shared_host, monkeypatch):
    """A worker selects for one host object many times: the edits every container gets
    are made once per host, capabilities and hook, and each selection's edits are its
    own (one container's changes never reach the next one's)."""
    from nvshim.host import edits as host_edits

    made = []
    real = host_edits.common_edits
    monkeypatch.setattr(host_edits, "common_edits", lambda *a: made.append(a[1:]) or real(*a))
    monkeypatch.setattr(select_module, "_common", Last())
    monkeypatch.setattr(select_module, "_merged", Last())
    fresh = _select(shared_host, {"NVIDIA_VISIBLE_DEVICES": "0"}, "ts").edits
    first = _select(shared_host, {"NVIDIA_VISIBLE_DEVICES": "0"}, "ts").edits
    first.mounts.clear(), first.hooks.clear(), first.device_nodes.append(None)
    again = _select(shared_host, {"NVIDIA_VISIBLE_DEVICES": "0"}, "ts").edits
    assert again == fresh and again.mounts and again.hooks and None not in again.device_nodes
    assert len(made) == 1
    utility = {"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_DRIVER_CAPABILITIES": "utility"}
    assert _select(shared_host, utility, "ts").edits.mounts != fresh.mounts
    assert made[1:] == [(("utility",), made[0][1])]


def test_a_host_parsed_again_is_compared_field_by_field_once(shared_host, monkeypatch):
    """A worker parses the inventory again (another Host object, equal to the first):
    its common edits are those already made, after one comparison of the two hosts; the
    selections after it find the new object by identity, with no comparison at all."""
    from nvshim.host import edits as host_edits
    from nvshim.host.model import Host

    made, compared = [], []
    real_edits, real_eq = host_edits.common_edits, Host.__eq__
    monkeypatch.setattr(host_edits, "common_edits", lambda *a: made.append(a) or real_edits(*a))
    monkeypatch.setattr(Host, "__eq__", lambda a, b: compared.append(1) or real_eq(a, b))
    monkeypatch.setattr(select_module, "_common", Last())
    monkeypatch.setattr(select_module, "_merged", Last())
    cfg = load_config(shared_host.config("ts"))
    request = request_from_spec({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=0"]}}, cfg.policy)
    first = select(request, shared_host.host, cfg).edits
    again = Host.from_dict(shared_host.host.to_dict())
    assert again is not shared_host.host
    for _ in range(3):
        assert select(request, again, cfg).edits == first
    assert len(made) == 1 and len(compared) == 1


def test_a_worker_gives_each_shape_of_request_what_a_fresh_process_gives_it(
    shared_host, monkeypatch
):
    """A worker keeps the last shape's merged edits and parsed finishing steps: requests
    that change devices and capabilities from one create to the next, and come back, get
    exactly what a process with nothing kept gives them, each its own lists and steps."""
    from nvshim.runtime import create as create_module
    from nvshim.runtime.create import split_finishers

    shapes = [{"NVIDIA_VISIBLE_DEVICES": "3"}, {"NVIDIA_VISIBLE_DEVICES": "3"},
              {"NVIDIA_VISIBLE_DEVICES": "6:1"},
              {"NVIDIA_VISIBLE_DEVICES": "3", "NVIDIA_DRIVER_CAPABILITIES": "utility"},
              {"NVIDIA_VISIBLE_DEVICES": "3"}, {"NVIDIA_VISIBLE_DEVICES": "3,6:1"}]  # fmt: skip

    def chosen(env):
        edits, steps = split_finishers(_select(shared_host, env, "ts").edits)
        return edits, [vars(step) for step in steps], steps

    def fresh(env):
        for name in ("_common", "_merged"):
            monkeypatch.setattr(select_module, name, Last())
        monkeypatch.setattr(create_module, "_split", Last())
        edits, described, _ = chosen(env)
        assert described  # the finishing steps were split off
        return repr((edits, described))

    expected = [fresh(env) for env in shapes]
    assert len(set(expected)) == 4  # four shapes, the repeats alike
    got = []
    for env in shapes:
        edits, described, steps = chosen(env)
        got.append(repr((edits, described)))
        edits.mounts.clear(), edits.env.clear(), steps.clear()  # the container's own
    assert got == expected


def test_mps_device_cannot_be_combined_with_a_non_shared_one(shared_host):
    with pytest.raises(NvshimError) as info:
        _select(shared_host, {"NVIDIA_VISIBLE_DEVICES": "1,6:1"})
    assert str(info.value) == (
        f"device 1 ({GPU1}) is MPS-shared and cannot be combined with other devices "
        f"(6:1 ({MIG_6_1})): an MPS client reaches only its own daemon's device"
    )


def test_no_compute_capability_means_no_mps_client(shared_host):
    selection = _select(
        shared_host,
        {
            "NVIDIA_VISIBLE_DEVICES": "1,6:1",
            "NVIDIA_DRIVER_CAPABILITIES": "utility",
            "CUDA_MPS_PIPE_DIRECTORY": "/run/nvidia-mps",
        },
    )
    env = selection.edits.env_dict()
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == ""
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env
    assert not any(m.container_path == "/run/nvidia-mps" for m in selection.edits.mounts)


def test_a_bad_sharing_config_refuses_gpu_containers(shared_host, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: v1\nsharing:\n  mps:\n    resources: []\n")
    config = tmp_path / "bad.toml"
    text = (
        open(shared_host.config())
        .read()
        .replace(str(os.path.join(shared_host.root, "mps.yaml")), str(bad))
    )
    config.write_text(text)
    shared_host.configs["bad"] = str(config)
    proc = shared_host.run(tmp_path, {"NVIDIA_VISIBLE_DEVICES": "2"}, config="bad")
    assert proc.returncode != 0
    assert f"{bad}: sharing.mps.resources: must be a non-empty list" in proc.stderr
