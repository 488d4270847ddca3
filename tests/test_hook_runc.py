"""nvshim-hook through real runc: createContainer finishing steps, the same steps from
prestart (entering the container's mount namespace), the prestart application of
constructed edits, the params override, and the prestart subcommand's own decisions."""

from __future__ import annotations

import json
import os
import stat

import pytest

from nvshim.edits import ContainerEdits, DeviceNode, Mount
from nvshim.hookentries import hook_entry
from nvshim.ldcache import parse_ld_cache
from tests.runc_util import (
    apply_edits_hook,
    build_stub_library,
    hook_env_names,
    make_bundle,
    make_busybox_rootfs,
    read_log,
    run_hook_direct,
    runc_run,
    write_hook_config,
)

LIB = "/usr/lib/x86_64-linux-gnu"
VERSION = "550.90.12"
LIBS = {"libcuda": "libcuda.so.1", "libnvidia-ml": "libnvidia-ml.so.1"}
LIB_OPTS = ["ro", "nosuid", "nodev", "bind"]


@pytest.fixture(scope="session")
def stub_libs(tmp_path_factory) -> str:
    """Host dir with driver-like libraries (real ELF objects with SONAMEs)."""
    d = tmp_path_factory.mktemp("driver-libs")
    for stem, soname in LIBS.items():
        build_stub_library(d / f"{stem}.so.{VERSION}", soname)
    return str(d)


def lib_mounts(stub_libs: str) -> list[dict]:
    return [
        {
            "destination": f"{LIB}/{stem}.so.{VERSION}",
            "type": "bind",
            "source": f"{stub_libs}/{stem}.so.{VERSION}",
            "options": LIB_OPTS,
        }
        for stem in LIBS
    ]


def link_args() -> list[str]:
    args = []
    for stem, soname in LIBS.items():
        args += ["--link", f"{stem}.so.{VERSION}::{LIB}/{soname}"]
    return [*args, "--link", f"libcuda.so.1::{LIB}/libcuda.so"]


def finishing_hooks(hook: str, config: str, stage: str = "createContainer"):
    return [
        hook_entry(hook, stage, "create-symlinks", "--config", config, *link_args()),
        hook_entry(hook, stage, "update-ldcache", "--config", config, "--folder", LIB),
    ]


def cache_of(rootfs) -> dict[str, str]:
    with open(os.path.join(rootfs, "etc/ld.so.cache"), "rb") as fh:
        return {e.name: e.path for e in parse_ld_cache(fh.read())}


def test_create_container_hooks_link_and_cache_then_skip(tmp_path, launchers, stub_libs):
    rootfs = make_busybox_rootfs(tmp_path / "rootfs")
    config, log = write_hook_config(tmp_path)
    hooks = finishing_hooks(f"{launchers}/nvshim-hook", config)
    script = (
        f"for l in libcuda.so libcuda.so.1 libnvidia-ml.so.1; do readlink {LIB}/$l; done;"
        f" head -c 4 {LIB}/libcuda.so | tail -c 3; echo; cat /etc/ld.so.conf.d/00-nvshim.conf"
    )
    bundle = make_bundle(
        tmp_path, rootfs, ["sh", "-c", script], hooks=hooks, mounts=lib_mounts(stub_libs)
    )
    run = runc_run(bundle, "hook-ldcache-1")
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[:3] == ["libcuda.so.1", f"libcuda.so.{VERSION}", f"libnvidia-ml.so.{VERSION}"]
    assert lines[3] == "ELF"  # the link chain reaches the bind-mounted host library
    assert LIB in lines[4:]
    assert cache_of(rootfs) == {
        "libcuda.so.1": f"{LIB}/libcuda.so.1",
        "libnvidia-ml.so.1": f"{LIB}/libnvidia-ml.so.1",
        "libcuda.so": f"{LIB}/libcuda.so",
    }
    first = [r for r in read_log(log) if r["id"] == "hook-ldcache-1"]
    assert [r["step"] for r in first] == ["create-symlinks", "update-ldcache"]
    assert first[0]["links_created"] == "3"
    assert first[1]["ldcache"] == "updated" and first[1]["unreachable"] == "2"
    assert float(first[1]["check_ms"]) >= 0 and float(first[1]["update_ms"]) > 0
    assert first[1]["writer"] == "nvshim"  # the image had no cache: nvshim wrote it
    assert {r["hook_env"] for r in first} == {hook_env_names()}

    cache_before = (tmp_path / "rootfs/etc/ld.so.cache").read_bytes()
    bundle = make_bundle(
        tmp_path, rootfs, ["true"], hooks=hooks, mounts=lib_mounts(stub_libs), name="bundle2"
    )
    run = runc_run(bundle, "hook-ldcache-2")
    assert run.returncode == 0, run.stderr
    second = [r for r in read_log(log) if r["id"] == "hook-ldcache-2"]
    assert second[0]["links_existing"] == "3" and second[0]["links_created"] == "0"
    assert second[1]["ldcache"] == "skipped-reachable" and "update_ms" not in second[1]
    assert (tmp_path / "rootfs/etc/ld.so.cache").read_bytes() == cache_before


def test_finishing_steps_from_prestart_enter_the_container_namespace(
    tmp_path, launchers, stub_libs
):
    """As prestart hooks (host mount namespace) the steps must act on the container's
    mounts: the libraries bind-mounted by runc and its private /dev tmpfs."""
    rootfs = make_busybox_rootfs(tmp_path / "rootfs")
    config, log = write_hook_config(tmp_path)
    hook = f"{launchers}/nvshim-hook"
    hooks = [
        *finishing_hooks(hook, config, "prestart"),
        hook_entry(
            hook,
            "prestart",
            "create-symlinks",
            "--config",
            config,
            "--link",
            "/proc/self/fd::/dev/nvshim-fd",
        ),
    ]
    bundle = make_bundle(
        tmp_path, rootfs, ["readlink", "/dev/nvshim-fd"], hooks=hooks, mounts=lib_mounts(stub_libs)
    )
    run = runc_run(bundle, "hook-prestart-steps")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "/proc/self/fd"
    assert not os.path.lexists(tmp_path / "rootfs/dev/nvshim-fd")  # it went to the tmpfs
    assert "libcuda.so.1" in cache_of(rootfs)  # ldconfig saw the runc bind mounts
    steps = [r for r in read_log(log) if r["id"] == "hook-prestart-steps"]
    assert [r.get("error") for r in steps] == [None, None, None]
    assert steps[1]["ldcache"] == "updated"


def test_prestart_applies_constructed_edits(tmp_path, launchers, stub_libs):
    rootfs = make_busybox_rootfs(tmp_path / "rootfs")
    config, log = write_hook_config(tmp_path)
    hook = f"{launchers}/nvshim-hook"
    share = tmp_path / "host-share"
    share.mkdir()
    (share / "data").write_text("host data\n")
    os.mknod(tmp_path / "rootfs/nvidia7", stat.S_IFCHR | 0o666, os.makedev(195, 7))
    edits = ContainerEdits(
        env=["CUDA_VISIBLE_DEVICES=GPU-0"],
        device_nodes=[
            DeviceNode("/dev/nvidia0", type="c", major=195, minor=0, file_mode=0o666),
            DeviceNode("/dev/nvidiactl", type="c", major=195, minor=255, file_mode=0o666),
            DeviceNode(
                "/dev/nvidia-caps/nvidia-cap1", type="c", major=509, minor=1, file_mode=0o400
            ),
        ],
        mounts=[
            *(
                Mount(f"{stub_libs}/{s}.so.{VERSION}", f"{LIB}/{s}.so.{VERSION}", tuple(LIB_OPTS))
                for s in LIBS
            ),
            Mount(str(share), "/run/nvidia-share", ("nosuid", "nodev", "noexec", "bind")),
        ],
        hooks=[
            *finishing_hooks(hook, config),
            hook_entry(hook, "createContainer", "disable-device-node-modification"),
        ],
    )
    entry, result = apply_edits_hook(tmp_path / "apply", edits, config)
    script = (
        "stat -c '%n %t %T %a' /dev/nvidia0 /dev/nvidiactl /dev/nvidia-caps/nvidia-cap1;"
        " cat /dev/nvidia0; cat /nvidia7;"
        " grep -E ' 195:| 509:' /sys/fs/cgroup/devices/devices.list;"
        f" readlink {LIB}/libcuda.so.1; cat /run/nvidia-share/data;"
        " touch /run/nvidia-share/new; touch /usr/lib/x86_64-linux-gnu/new;"
        " grep -E 'nvidia-share|libcuda' /proc/self/mountinfo | cut -d' ' -f5,6"
    )
    bundle = make_bundle(tmp_path, rootfs, ["sh", "-c", script], hooks={"prestart": [entry]})
    run = runc_run(bundle, "hook-apply")
    out, err = run.stdout.splitlines(), run.stderr
    assert out[:3] == [
        "/dev/nvidia0 c3 0 666",
        "/dev/nvidiactl c3 ff 666",
        "/dev/nvidia-caps/nvidia-cap1 1fd 1 400",
    ]
    # The cgroup lets the container reach our nodes (ENXIO: no driver behind 195:0),
    # and only those (EPERM for a 195:7 node it was not given).
    assert "can't open '/dev/nvidia0': No such device or address" in err
    assert "can't open '/nvidia7': Operation not permitted" in err
    assert {"c 195:0 rwm", "c 195:255 rwm", "c 509:1 rwm"} <= set(out)
    assert f"libcuda.so.{VERSION}" in out and "host data" in out
    assert "touch: /run/nvidia-share/new: Read-only file system" in err
    assert "touch: /usr/lib/x86_64-linux-gnu/new: Read-only file system" not in err
    mounts = dict(line.split(" ", 1) for line in out if line.startswith("/"))
    assert mounts["/run/nvidia-share"].split(",")[:3] == ["ro", "nosuid", "nodev"]
    assert "noexec" in mounts["/run/nvidia-share"]
    assert mounts[f"{LIB}/libcuda.so.{VERSION}"].split(",")[:3] == ["ro", "nosuid", "nodev"]
    assert not (share / "new").exists()
    assert os.path.getsize(tmp_path / f"rootfs{LIB}/libcuda.so.{VERSION}") == 0  # host view
    assert not os.path.lexists(tmp_path / "rootfs/dev/nvidia0")
    with open(result) as fh:
        fields = json.load(fh)
    assert fields["mounts"] == 3 and fields["device_nodes"] == 3
    assert fields["devices_allowed"] == "195:0,195:255,509:1"
    assert fields["env_not_applied"] == "CUDA_VISIBLE_DEVICES"
    assert fields["ldcache"] == "updated" and fields["params"] == "absent-on-host"
    assert "libcuda.so.1" in cache_of(rootfs)


def _params_run(tmp_path, launchers, dev_root, params_text, container_id):
    """Run the params step on a root whose params file is a plain file (a container's
    procfs cannot be given one), then show what the same mount namespace sees."""
    rootfs = make_busybox_rootfs(tmp_path / "rootfs")
    target = tmp_path / "rootfs/proc/driver/nvidia/params"
    target.parent.mkdir(parents=True)
    target.write_text(params_text)
    config, log = write_hook_config(tmp_path, dev_root=dev_root)
    bundle = make_bundle(tmp_path, rootfs, ["true"])
    argv = [f"{launchers}/nvshim-hook", "disable-device-node-modification", "--config", config]
    run = run_hook_direct(
        argv, bundle, container_id=container_id, then=f"cat {target}; echo x > {target}"
    )
    (record,) = [r for r in read_log(log) if r["id"] == container_id]
    return run, target, record


def test_params_override_mounts_a_private_copy(tmp_path, launchers):
    dev_root = tmp_path / "devroot"
    (dev_root / "proc/driver/nvidia").mkdir(parents=True)
    (dev_root / "proc/driver/nvidia/params").write_text(
        "ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 1\nEnableMSI: 1\n"
    )
    run, target, record = _params_run(tmp_path, launchers, str(dev_root), "orig\n", "params")
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == [
        "ResmanDebugLevel: 4294967295",
        "ModifyDeviceFiles: 0",
        "EnableMSI: 1",
    ]
    assert "Read-only file system" in run.stderr
    assert target.read_text() == "orig\n"  # outside that namespace: untouched
    assert not (tmp_path / "state").exists()  # no host file was needed for the copy
    assert record["params"] == "ModifyDeviceFiles=0"


def test_params_override_is_a_no_op_without_a_host_file(tmp_path, launchers):
    run, target, record = _params_run(tmp_path, launchers, str(tmp_path / "x"), "orig\n", "p2")
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["orig"]
    assert target.read_text() == "x\n"  # no mount: the write went to the file itself
    assert record["params"] == "absent-on-host"


def test_params_override_is_a_no_op_in_a_container_without_the_file(tmp_path, launchers):
    """Through runc, the container's real procfs has no NVIDIA driver directory."""
    dev_root = tmp_path / "devroot"
    (dev_root / "proc/driver/nvidia").mkdir(parents=True)
    (dev_root / "proc/driver/nvidia/params").write_text("ModifyDeviceFiles: 1\n")
    rootfs = make_busybox_rootfs(tmp_path / "rootfs")
    config, log = write_hook_config(tmp_path, dev_root=str(dev_root))
    hooks = [
        hook_entry(
            f"{launchers}/nvshim-hook",
            "createContainer",
            "disable-device-node-modification",
            "--config",
            config,
        )
    ]
    bundle = make_bundle(tmp_path, rootfs, ["true"], hooks=hooks)
    run = runc_run(bundle, "hook-params-runc")
    assert run.returncode == 0, run.stderr
    (record,) = read_log(log)
    assert record["params"] == "absent-in-container"


def test_prestart_leaves_non_gpu_and_runtime_handled_containers_alone(tmp_path, launchers):
    rootfs = make_busybox_rootfs(tmp_path / "rootfs")
    config, log = write_hook_config(tmp_path)
    entry = hook_entry(f"{launchers}/nvshim-hook", "prestart", "prestart", "--config", config)
    cases = {
        "plain": ({}, {}),
        "injected": ({"NVIDIA_VISIBLE_DEVICES": "all"}, {"nvshim.io/injected": "GPU-1"}),
    }
    for name, (env, notes) in cases.items():
        bundle = make_bundle(
            tmp_path, rootfs, ["ls", "/dev"], env=env, annotations=notes, hooks=[entry], name=name
        )
        run = runc_run(bundle, f"hook-skip-{name}")
        assert run.returncode == 0, run.stderr
        assert "nvidia" not in run.stdout
    assert read_log(log) == []


def test_prestart_denies_unprivileged_env_requests_by_default(tmp_path, launchers):
    rootfs = make_busybox_rootfs(tmp_path / "rootfs")
    config, log = write_hook_config(tmp_path)
    entry = hook_entry(f"{launchers}/nvshim-hook", "prestart", "prestart", "--config", config)
    bundle = make_bundle(
        tmp_path, rootfs, ["ls", "/dev"], env={"NVIDIA_VISIBLE_DEVICES": "all"}, hooks=[entry]
    )
    run = runc_run(bundle, "hook-unprivileged")
    assert run.returncode == 0, run.stderr
    assert "nvidia" not in run.stdout
    (record,) = read_log(log)
    assert record["id"] == "hook-unprivileged" and "denied" in record
    assert "mounts" not in record and "device_nodes" not in record


def test_prestart_refuses_malformed_device_ids(tmp_path, launchers):
    rootfs = make_busybox_rootfs(tmp_path / "rootfs")
    config, log = write_hook_config(tmp_path)
    entry = hook_entry(f"{launchers}/nvshim-hook", "prestart", "prestart", "--config", config)
    admin = ["CAP_SYS_ADMIN", "CAP_KILL"]
    bundle = make_bundle(
        tmp_path,
        rootfs,
        ["true"],
        env={"NVIDIA_VISIBLE_DEVICES": "../../etc"},
        hooks=[entry],
        capabilities=admin,
    )
    run = runc_run(bundle, "hook-bad-id")
    assert run.returncode != 0
    assert "invalid device id '../../etc'" in run.stderr
    (record,) = read_log(log)
    assert "invalid device id" in record["error"] and record["step"] == "prestart"


def test_cli_errors_are_one_line(tmp_path, launchers):
    hook = f"{launchers}/nvshim-hook"
    config, log = write_hook_config(tmp_path)
    rootfs = make_busybox_rootfs(tmp_path / "rootfs")
    bundle = make_bundle(tmp_path, rootfs, ["true"])
    helped = run_hook_direct([hook, "--help"], bundle, private_ns=False)
    assert helped.returncode == 0 and "create-symlinks" in helped.stdout
    cases = [
        ([hook, "no-such-step"], 2, "nvshim-hook: error: no such step 'no-such-step'"),
        (
            [hook, "create-symlinks", "--config", config, "--link", "no-separator"],
            1,
            "expected TARGET::LINK",
        ),
        (
            [
                hook,
                "update-ldcache",
                "--config",
                config,
                "--folder",
                "/lib",
                "--ldconfig",
                "/bin/ls",
            ],
            1,
            "/bin/ls: not a statically linked executable",
        ),
        (
            [hook, "update-ldcache", "--config", config, "--folder", "relative"],
            1,
            "not an absolute container path",
        ),
        (
            [hook, "create-symlinks", "--config", str(tmp_path / "missing.toml")],
            1,
            "configuration file not found",
        ),
    ]
    for argv, code, text in cases:
        run = run_hook_direct(argv, bundle)
        assert run.returncode == code, (argv, run.stderr)
        assert len(run.stderr.strip().splitlines()) == 1 and text in run.stderr, run.stderr
        assert "Traceback" not in run.stderr
    garbage = run_hook_direct(
        [hook, "create-symlinks", "--config", config], bundle, container_id=""
    )
    assert garbage.returncode == 1 and "id must be a non-empty string" in garbage.stderr
    assert [r.get("error", "")[:20] for r in read_log(log)] == [
        "--link 'no-separator",
        "/bin/ls: not a stati",
        "--folder: 'relative'",
        "OCI state on stdin: ",
    ]
