"""Attack shapes of FACTS §8 against nvshim-hook: rootfs symlinks pointing out, a
symlink swapped while the hook runs, a library path through procfs magic links, and
the container's environment. After each, nothing outside the root has changed and the
container got nothing it did not ask for."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from nvshim.edits import ContainerEdits, DeviceNode, Mount
from nvshim.hookentries import hook_entry
from tests.runc_util import (
    apply_edits_hook,
    build_stub_library,
    hook_env_names,
    make_bundle,
    make_busybox_rootfs,
    read_log,
    run_hook_direct,
    runc_run,
    tree_snapshot,
    write_hook_config,
)

LIB = "/usr/lib/x86_64-linux-gnu"
OPTS = ["ro", "nosuid", "nodev", "bind"]


@pytest.fixture(scope="module")
def driver_lib(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("attack-lib")
    return build_stub_library(d / "libcuda.so.550.90.12", "libcuda.so.1")


@pytest.fixture
def host_state():
    """Host files the shapes aim at; compared before and after each test."""

    def snap():
        with open("/etc/ld.so.cache", "rb") as fh:
            cache = fh.read()
        return (tree_snapshot("/etc/cron.d"), cache, sorted(os.listdir("/")))

    before = snap()
    yield
    assert snap() == before


def make_canary(path) -> str:
    """A host directory holding a library whose SONAME link is missing (any ldconfig
    that scans it would create ``libcanary.so.1``)."""
    os.makedirs(path, exist_ok=True)
    build_stub_library(os.path.join(path, "libcanary.so.1.0"), "libcanary.so.1")
    with open(os.path.join(path, "note"), "w") as fh:
        fh.write("host file\n")
    return os.fspath(path)


def test_rootfs_links_out_stay_inside(tmp_path, launchers, driver_lib, host_state):
    """``usr/lib/x86_64-linux-gnu -> /``, ``etc/ld.so.conf.d -> /etc/cron.d`` and an
    ld.so.conf naming ``/proc/1/root/<host dir>`` (pid 1 of the container is runc init,
    whose root is the host's until pivot_root), through runc createContainer hooks."""
    rootfs = make_busybox_rootfs(tmp_path / "rootfs")
    canary = make_canary(tmp_path / "canary")
    before = tree_snapshot(canary)
    os.makedirs(tmp_path / "rootfs/usr/lib")
    os.symlink("/", tmp_path / "rootfs/usr/lib/x86_64-linux-gnu")
    os.symlink("/etc/cron.d", tmp_path / "rootfs/etc/ld.so.conf.d")
    (tmp_path / "rootfs/etc/ld.so.conf").write_text(f"/proc/1/root{canary}\n")
    name = f"libnvshim-{uuid.uuid4().hex[:8]}.so"  # would show up in the host's /
    config, log = write_hook_config(tmp_path)
    hook = f"{launchers}/nvshim-hook"
    hooks = [
        hook_entry(
            hook,
            "createContainer",
            "create-symlinks",
            "--config",
            config,
            "--link",
            f"libcuda.so.1::{LIB}/{name}",
        ),
        hook_entry(hook, "createContainer", "update-ldcache", "--config", config, "--folder", LIB),
    ]
    mounts = [
        {
            "destination": f"{LIB}/libcuda.so.550.90.12",
            "type": "bind",
            "source": driver_lib,
            "options": OPTS,
        }
    ]
    bundle = make_bundle(tmp_path, rootfs, ["ls", "/", "/etc/cron.d"], hooks=hooks, mounts=mounts)
    run = runc_run(bundle, "attack-links")
    assert run.returncode == 0, run.stderr
    assert not os.path.lexists(f"/{name}")
    assert os.readlink(tmp_path / "rootfs" / name) == "libcuda.so.1"  # in the root's "/"
    assert (tmp_path / "rootfs/etc/cron.d/00-nvshim.conf").read_text().endswith(f"{LIB}\n")
    assert tree_snapshot(canary) == before  # ldconfig never reached the host dir
    records = read_log(log)
    assert [r.get("error") for r in records] == [None, None]
    assert records[1]["ldcache"] == "updated"
    listing = run.stdout.split()
    assert "00-nvshim.conf" in listing and name in listing


def test_ldconfig_escape_is_real_without_the_seal(tmp_path, host_state):
    """Control for the test above: the same ld.so.conf makes a plainly chrooted ldconfig
    (a createContainer hook) write into the host directory through /proc/1/root."""
    rootfs = make_busybox_rootfs(tmp_path / "rootfs")
    canary = make_canary(tmp_path / "canary")
    (tmp_path / "rootfs/etc/ld.so.conf").write_text(f"/proc/1/root{canary}\n")
    os.makedirs(tmp_path / "rootfs/sbin")
    shutil.copy2("/sbin/ldconfig", tmp_path / "rootfs/sbin/ldconfig")
    hooks = {
        "createContainer": [
            {"path": shutil.which("chroot"), "args": ["chroot", rootfs, "/sbin/ldconfig"]}
        ]
    }
    bundle = make_bundle(tmp_path, rootfs, ["true"], hooks=hooks)
    run = runc_run(bundle, "attack-control")
    assert run.returncode == 0, run.stderr
    assert os.readlink(os.path.join(canary, "libcanary.so.1")) == "libcanary.so.1.0"


def test_ldconfig_opens_no_device_node_the_prescan_did_not_see(tmp_path, host_state):
    """A device node in the image that the prescan did not see (put there after it,
    through a volume another container shares, or past its SCAN_LIMIT): the sealed
    ldconfig's root is nodev in its private mount namespace, so it cannot open it. It
    wrote the ld cache into one (a loop device's disk got it at offset 0); now the open
    is refused."""
    from nvshim.errors import NvshimError
    from nvshim.hook.ldconfig import open_host_ldconfig, run_ldconfig
    from nvshim.rootfs.fsroot import RootFS

    rootfs = make_busybox_rootfs(tmp_path / "rootfs")
    os.mknod(f"{rootfs}/etc/ld.so.cache~", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    fd = open_host_ldconfig()
    try:
        with RootFS(rootfs) as root, pytest.raises(NvshimError) as caught:
            run_ldconfig(root, fd, ["/lib"])  # the prescan's callers are update_ldcache's
    finally:
        os.close(fd)
    assert str(caught.value).endswith("/etc/ld.so.cache~: Permission denied"), caught.value


def test_proc_and_dev_links_out_stay_inside(tmp_path, launchers, driver_lib, host_state):
    """``proc -> <host dir>`` and ``dev -> /``: runc itself refuses these roots, so the
    hook steps run directly (as a prestart hook of another runtime would)."""
    rootfs = make_busybox_rootfs(tmp_path / "rootfs")
    host_proc = tmp_path / "host-proc"
    (host_proc / "driver/nvidia").mkdir(parents=True)
    (host_proc / "driver/nvidia/params").write_text("host params\n")
    before = tree_snapshot(host_proc)
    shutil.rmtree(tmp_path / "rootfs/proc")
    shutil.rmtree(tmp_path / "rootfs/dev")
    os.symlink(str(host_proc), tmp_path / "rootfs/proc")
    os.symlink("/", tmp_path / "rootfs/dev")
    inner = tmp_path / "rootfs" / str(host_proc).lstrip("/") / "driver/nvidia/params"
    inner.parent.mkdir(parents=True)
    inner.write_text("image params\n")
    dev_root = tmp_path / "devroot"
    (dev_root / "proc/driver/nvidia").mkdir(parents=True)
    (dev_root / "proc/driver/nvidia/params").write_text("ModifyDeviceFiles: 1\n")
    config, log = write_hook_config(tmp_path, dev_root=str(dev_root))
    node = f"nvidia{uuid.uuid4().hex[:6]}"
    edits = ContainerEdits(
        device_nodes=[DeviceNode(f"/dev/{node}", type="c", major=195, minor=0)],
        mounts=[Mount(driver_lib, f"/dev/{node}-lib", tuple(OPTS))],
        hooks=[hook_entry("nvshim-hook", "createContainer", "disable-device-node-modification")],
    )
    entry, result = apply_edits_hook(tmp_path / "apply", edits, config, cgroup=False)
    bundle = make_bundle(tmp_path, rootfs, ["true"])
    look = (
        f"cat {host_proc}/driver/nvidia/params {inner};"
        f" head -c 4 {tmp_path}/rootfs/{node}-lib | tail -c 3"
    )
    run = run_hook_direct(entry["args"], bundle, then=look)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["host params", "ModifyDeviceFiles: 0", "ELF"]
    assert not os.path.lexists(f"/{node}") and not os.path.lexists(f"/{node}-lib")
    st = os.lstat(tmp_path / "rootfs" / node)
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(195, 0)
    assert tree_snapshot(host_proc) == before
    assert inner.read_text() == "image params\n"  # the mount lived in the private namespace


FLIPPER = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
a, b = os.fsencode(sys.argv[1]), os.fsencode(sys.argv[2])
print("ready", flush=True)
while True:
    libc.renameat2(-100, a, -100, b, 2)  # RENAME_EXCHANGE
"""


def hit_both_ways(lib: Path, swap: Path, twin: Path) -> bool:
    """Whether links were made both in the library folder itself and, through the swapped
    symlink, in the canary's in-root twin (the folder and the link trade names)."""
    real = next((p for p in (lib, swap) if not p.is_symlink()), None)
    return real is not None and all(
        any(n.startswith("sub") for n in os.listdir(d)) for d in (real, twin)
    )


def test_symlink_swapped_while_the_hook_runs(tmp_path, launchers, host_state):
    """The library folder is exchanged with a symlink to a host directory in a tight
    loop by another process while the hook runs again and again."""
    rootfs = make_busybox_rootfs(tmp_path / "rootfs")
    canary = make_canary(tmp_path / "canary")
    before = tree_snapshot(canary)
    lib = tmp_path / f"rootfs{LIB}"
    lib.mkdir(parents=True)
    build_stub_library(lib / "libcuda.so.550.90.12", "libcuda.so.1")
    swap = tmp_path / "rootfs/usr/lib/swap"
    os.symlink(canary, swap)
    twin = tmp_path / "rootfs" / canary.lstrip("/")
    twin.mkdir(parents=True)  # the canary's in-root twin
    config, log = write_hook_config(tmp_path)
    hook = f"{launchers}/nvshim-hook"
    bundle = make_bundle(tmp_path, rootfs, ["true"])
    flipper = subprocess.Popen(
        [sys.executable, "-c", FLIPPER, str(lib), str(swap)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert flipper.stdout.readline().strip() == "ready"
        runs = []
        # at least 12 rounds, more (up to 60) until the swap was seen both ways
        for i in range(60):
            if i >= 12 and hit_both_ways(lib, swap, twin):
                break
            for argv in (
                [
                    hook,
                    "create-symlinks",
                    "--config",
                    config,
                    "--link",
                    f"libcuda.so.550.90.12::{LIB}/libcuda.so.1",
                    "--link",
                    f"libcuda.so.1::{LIB}/sub{i}/libcuda.so",
                ],
                [hook, "update-ldcache", "--config", config, "--folder", LIB],
            ):
                runs.append(run_hook_direct(argv, bundle, container_id=f"swap{i}"))
    finally:
        flipper.kill()
        flipper.wait()
    # The swap was hit both ways: links went to the directory and, through the symlink,
    # to its in-root twin; never to the host directory.
    assert hit_both_ways(lib, swap, twin)
    assert tree_snapshot(canary) == before
    for run in runs:
        assert "Traceback" not in run.stderr
        assert run.returncode == 0 or len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert sum(run.returncode == 0 for run in runs) > 0
    assert any(r.get("ldcache") == "updated" for r in read_log(log))


@pytest.fixture(scope="module")
def preload_marker(tmp_path_factory):
    """An LD_PRELOAD library that writes a marker file when loaded into any process."""
    d = tmp_path_factory.mktemp("preload")
    marker = d / "preloaded"
    body = (
        "#include <fcntl.h>\n#include <unistd.h>\n"
        "__attribute__((constructor)) static void mark(void) {"
        f' int fd = open("{marker}", O_WRONLY | O_CREAT | O_APPEND, 0644);'
        ' if (fd >= 0) { write(fd, "x", 1); close(fd); } }\n'
    )
    lib = build_stub_library(d / "libpreload.so", "libpreload.so", body)
    subprocess.run(["/bin/true"], env={"LD_PRELOAD": lib}, check=True)
    assert marker.exists()  # the canary works: it fires in any dynamically linked process
    marker.unlink()
    return lib, marker


def python_traps(directory) -> tuple[dict[str, str], list[str]]:
    """Container env entries that would run code in a Python hook that honoured them,
    and the marker files that code would write."""
    d = os.fspath(directory)
    os.makedirs(d, exist_ok=True)
    markers = [os.path.join(d, n) for n in ("site", "shadow", "startup")]
    for module, marker in (("sitecustomize", markers[0]), ("argparse", markers[1])):
        with open(os.path.join(d, f"{module}.py"), "w") as fh:
            fh.write(f"open({marker!r}, 'w').write('ran')\n")
    with open(os.path.join(d, "startup.py"), "w") as fh:
        fh.write(f"open({markers[2]!r}, 'w').write('ran')\n")
    env = {
        "PYTHONPATH": d,
        "PYTHONSTARTUP": os.path.join(d, "startup.py"),
        "PYTHONINSPECT": "1",
        "PYTHONHOME": "/nonexistent",  # honoured, it would stop Python from starting
    }
    return env, markers


def test_container_env_never_reaches_the_hook(tmp_path, launchers, preload_marker, host_state):
    lib, marker = preload_marker
    env, markers = python_traps(tmp_path / "traps")
    env["LD_PRELOAD"] = lib
    rootfs = make_busybox_rootfs(tmp_path / "rootfs")
    config, log = write_hook_config(tmp_path)
    hook = f"{launchers}/nvshim-hook"
    hooks = [
        hook_entry(
            hook, "createContainer", "create-symlinks", "--config", config, "--link", "a::/opt/a"
        ),
        hook_entry(hook, "prestart", "create-symlinks", "--config", config, "--link", "b::/opt/b"),
    ]
    bundle = make_bundle(tmp_path, rootfs, ["readlink", "/opt/a"], env=env, hooks=hooks)
    run = runc_run(bundle, "attack-env")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "a"
    assert not marker.exists() and not any(os.path.exists(m) for m in markers)
    records = read_log(log)
    assert len(records) == 2
    assert {r["hook_env"] for r in records} == {hook_env_names()}
    assert all("unsafe_hook_env" not in r for r in records)


def test_python_isolation_holds_for_entries_without_env(tmp_path, launchers, host_state):
    """An engine that writes a hook entry without ``env`` hands runc's createContainer
    hook the container's variables: the isolated launcher still ignores them."""
    env, markers = python_traps(tmp_path / "traps")
    rootfs = make_busybox_rootfs(tmp_path / "rootfs")
    config, log = write_hook_config(tmp_path)
    entry = {
        "path": f"{launchers}/nvshim-hook",
        "args": ["nvshim-hook", "create-symlinks", "--config", config, "--link", "a::/opt/a"],
    }
    bundle = make_bundle(
        tmp_path, rootfs, ["readlink", "/opt/a"], env=env, hooks={"createContainer": [entry]}
    )
    run = runc_run(bundle, "attack-env-bare")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "a"
    assert not any(os.path.exists(m) for m in markers)
    (record,) = read_log(log)
    assert record["unsafe_hook_env"] == "PYTHONHOME,PYTHONINSPECT,PYTHONPATH,PYTHONSTARTUP"
