"""Read-only container roots (``"root": {"readonly": true}``, ``--read-only``,
``readOnlyRootFilesystem``) get a GPU on every path: nvshim-runtime ``create`` in its
own process and served by nvshim-runtimed (socket and slot), ``run`` and ``exec``; the
OCI hook under runc; CDI under podman; a CRI pod through containerd. On each the
container itself sees a read-only root (a write to ``/`` fails, its mountinfo says
``ro``) holding the same links, ld.so.conf entry and ld cache as its writable twin.

``nvshim.rootfs.rwroot`` makes the root's mount writable only while the finishing steps
run: its fallback (a bind remount), a root locked read-only by a user namespace, and a
root that cannot be made read-only again are driven on a process that pivoted into
a root as runc's init does.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import time

import pytest

from tests.podman_util import make_busybox_rootfs, podman_run
from tests.runc_util import daemon_calls, make_bundle, read_log, runc_run, served_by
from tests.test_hook_standalone import gpu_host  # noqa: F401
from tests.test_runtime_daemon import GPU, Daemon, creates  # noqa: F401
from tests.test_runtime_finish import CONF, LIBDIR, RUNC
from tests.test_runtime_slots import serve

ROOT_OPTIONS = (
    "grep -E '^[0-9]+ [0-9]+ [^ ]+ [^ ]+ / ' /proc/self/mountinfo | cut -d' ' -f6 | cut -d, -f1"
)
# what the container itself sees: its root's state first, then what nvshim made in it
PROBE = (
    "if touch /probe 2>/dev/null; then echo root=writable; else echo root=read-only; fi; "
    f"echo mount=$({ROOT_OPTIONS}); "
    'for l in $(find / -xdev -type l | sort); do echo "$l -> $(readlink $l)"; done; '
    f"cat {CONF}; echo cache=$(md5sum /etc/ld.so.cache | cut -d' ' -f1); "
    "echo CVD=$CUDA_VISIBLE_DEVICES"
)
APPLETS = ("touch", "cut", "md5sum", "sort", "sleep")


def probe_rootfs(dest) -> str:
    """A busybox root with the applets ``PROBE`` needs."""
    rootfs = make_busybox_rootfs(dest)
    for applet in APPLETS:
        os.symlink("busybox", os.path.join(rootfs, "bin", applet))
    return rootfs


def check_twins(writable: list[str], readonly: list[str], sim, cvd: bool = True) -> None:
    """The read-only container saw a read-only root and the same as its writable twin."""
    assert writable[:2] == ["root=writable", "mount=rw"], writable
    assert readonly[:2] == ["root=read-only", "mount=ro"], readonly
    assert readonly[2:] == writable[2:]
    assert f"{LIBDIR}/libcuda.so.1 -> libcuda.so.{sim.driver_version}" in readonly
    assert f"{LIBDIR}/libnvidia-ml.so.1 -> libnvidia-ml.so.{sim.driver_version}" in readonly
    assert LIBDIR in readonly  # the ld.so.conf.d entry
    (cache,) = [x for x in readonly if x.startswith("cache=")]
    assert len(cache) == len("cache=") + 32, cache  # an ld cache was written
    if cvd:
        assert f"CVD={sim.topology['gpus'][0]['uuid']}" in readonly


# --- nvshim-runtime: create (in-process, socket, slot), run, exec ---------------------


@pytest.fixture(params=["in-process", "socket", "slot"])
def via(request, creates):  # noqa: F811
    """How nvshim-runtime's Python work is done: here, or by nvshim-runtimed through its
    socket (the front's cache kept cold: the call goes through Python's client) or a
    slot (a warm front: no interpreter at all)."""
    daemon = None
    if request.param == "socket":
        daemon = Daemon(creates, "--workers", "1")
    elif request.param == "slot":
        daemon = serve(creates)
    creates.via = request.param
    yield daemon
    if daemon is not None:
        assert daemon.stop() == 0


def call(c, *argv: str, **kw) -> subprocess.CompletedProcess:
    if c.via == "socket":  # a configuration newer than the front's cache: it asks Python
        future = time.time() + 3600
        os.utime(c.config, (future, future))
    return c.call(*argv, **kw)


def twin_bundles(c, name: str, args: list[str]) -> list[tuple[str, str]]:
    """(bundle, id) of a writable and a read-only 1-GPU container, each on its own root."""
    out = []
    for readonly in (False, True):
        cid = f"ro-{name}-{int(readonly)}-{os.getpid()}"
        rootfs = probe_rootfs(c.tmp / f"rootfs-{cid}")
        out.append((make_bundle(c.tmp, rootfs, args, env=GPU, name=cid, readonly=readonly), cid))
        c.ids.append(cid)
    return out


def check_served(c, daemon, calls: int) -> None:
    """Every call went the way ``via`` says, and a slot-served one started no Python."""
    if daemon is None:
        return
    ways = served_by(daemon.err)
    assert len(ways) == calls, daemon.text()
    want = "slot " if c.via == "slot" else "socket"
    assert all(w.startswith(want) for w in ways), ways
    assert all(s.endswith(" imports=0") for s in daemon.served())
    if c.via == "slot":
        assert c.python_starts() == 0


def test_create_finishes_a_read_only_root(creates, via):  # noqa: F811
    """The steps run after ``runc create`` made the root read-only; it is read-only
    again before create returns, for the container's process and seen from the host."""
    outputs = []
    for bundle, cid in twin_bundles(creates, "create", ["/bin/sh", "-c", PROBE]):
        with open(creates.tmp / f"{cid}.out", "w") as out:
            proc = call(creates, "create", "--pid-file", f"{bundle}/pid", "--bundle", bundle,
                        cid, stdout=out, stderr=out)  # fmt: skip
        assert proc.returncode == 0, creates.output(cid)
        state = creates.state(cid)
        assert state["status"] == "created"
        with open(f"/proc/{state['pid']}/mountinfo") as fh:
            root = [ln.split()[5] for ln in fh if ln.split()[4] == "/"]
        readonly = json.load(open(f"{bundle}/config.json"))["root"]["readonly"]
        assert root[-1].split(",")[0] == ("ro" if readonly else "rw"), root
        outputs.append(creates.start_and_wait(cid).splitlines())
    check_twins(*outputs, creates.sim)
    check_served(creates, via, 2)
    assert [r["id"] for r in read_log(str(creates.log))] == creates.ids


def test_run_finishes_a_read_only_root(creates, via):  # noqa: F811
    """``run`` keeps the ``createContainer`` hook, which runs before runc's remount."""
    outputs = []
    for bundle, cid in twin_bundles(creates, "run", ["/bin/sh", "-c", PROBE]):
        proc = call(creates, "run", "--bundle", bundle, cid, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        outputs.append(proc.stdout.splitlines())
    check_twins(*outputs, creates.sim)
    if via is not None:
        assert len(served_by(via.err)) == 2


def test_exec_in_a_read_only_root(creates, via):  # noqa: F811
    """An exec into a prepared read-only container gets the enforced variables and
    finds the root still read-only."""
    outputs = []
    for bundle, cid in twin_bundles(creates, "exec", ["/bin/sleep", "60"]):
        with open(creates.tmp / f"{cid}.out", "w") as out:
            proc = call(creates, "create", "--bundle", bundle, cid, stdout=out, stderr=out)
        assert proc.returncode == 0, creates.output(cid)
        assert creates.call("start", cid, runtime=RUNC).returncode == 0
        proc = call(creates, "exec", "--env", "CUDA_VISIBLE_DEVICES=all", cid, "/bin/sh", "-c",
                    PROBE, capture_output=True, text=True)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        outputs.append(proc.stdout.splitlines())
    check_twins(*outputs, creates.sim)
    if via is not None:
        kinds = [s.split()[2] for s in via.served()]
        assert kinds == ["create", "exec", "create", "exec"], kinds


def test_a_failed_step_on_a_read_only_root_deletes_the_container(creates):  # noqa: F811
    """As on a writable root: one line, and runc no longer knows the container."""
    rootfs = probe_rootfs(creates.tmp / "rootfs-fail")
    with open(os.path.join(rootfs, "etc/ld.so.conf.d"), "w") as fh:
        fh.write("a file where the image should have a folder\n")
    cid = f"ro-fail-{os.getpid()}"
    bundle = make_bundle(creates.tmp, rootfs, ["/bin/true"], env=GPU, name=cid, readonly=True)
    creates.ids.append(cid)
    proc = creates.call("create", "--bundle", bundle, cid, capture_output=True, text=True)
    assert proc.returncode == 1
    (line,) = proc.stderr.splitlines()
    assert line.startswith("nvshim-runtime: error: finishing steps failed, container deleted:")
    assert CONF in line and creates.state(cid) is None


# --- the OCI hook under runc, CDI under podman, a CRI pod -------------------------------


def test_the_prestart_hook_finishes_a_read_only_root(tmp_path, launchers, gpu_host):  # noqa: F811
    """The standalone OCI hook (``nvshim-hook prestart``) from a runc bundle."""
    from nvshim.hookentries import hook_entry
    from tests.test_hook_standalone import _config

    host, _ = gpu_host
    config, log = _config(tmp_path, gpu_host)
    entry = hook_entry(f"{launchers}/nvshim-hook", "prestart", "prestart", "--config", config)
    admin = ["CAP_SYS_ADMIN", "CAP_KILL", "CAP_AUDIT_WRITE"]  # privileged: env honoured
    outputs = []
    for readonly in (False, True):
        rootfs = probe_rootfs(tmp_path / f"rootfs-{int(readonly)}")
        bundle = make_bundle(tmp_path, rootfs, ["sh", "-c", PROBE], env=GPU, hooks=[entry],
                             capabilities=admin, name=f"hook-{int(readonly)}",
                             readonly=readonly)  # fmt: skip
        run = runc_run(bundle, f"ro-hook-{int(readonly)}-{os.getpid()}")
        assert run.returncode == 0, run.stderr
        outputs.append(run.stdout.splitlines())
    # a prestart hook cannot set the container's environment: no CUDA_VISIBLE_DEVICES
    check_twins(*outputs, host, cvd=False)
    assert [r["ldcache"] for r in read_log(log)] == ["updated", "updated"]


def test_podman_read_only_gets_its_cdi_device(sim_hosts, launchers, tmp_path):
    """``podman run --read-only --device nvidia.com/gpu=0``: the CDI spec's hooks."""
    from tests.test_cdi_generate import generate_for_podman

    sim = sim_hosts("single")
    cdi_dir = tmp_path / "cdi"
    cdi_dir.mkdir()
    generate_for_podman(sim, cdi_dir / "nvidia.yaml", launchers, tmp_path)
    outputs = []
    for readonly in (False, True):
        rootfs = probe_rootfs(tmp_path / f"rootfs-{int(readonly)}")
        flags = ["--read-only"] if readonly else []
        args = [*flags, "--device", "nvidia.com/gpu=0", "--", "/bin/sh", "-c", PROBE]
        proc = podman_run(tmp_path, rootfs, args, cdi_dir=str(cdi_dir))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        outputs.append(proc.stdout.splitlines())
    check_twins(*outputs, sim, cvd=False)  # CDI sets no CUDA_VISIBLE_DEVICES


@pytest.mark.parametrize("served", [False, True], ids=["in-process", "nvshim-runtimed"])
def test_a_cri_pod_with_a_read_only_root_filesystem_gets_its_gpu(
    creates,  # noqa: F811
    tmp_path,
    monkeypatch,
    served,
):
    """containerd's CRI with ``readOnlyRootFilesystem: true`` on the nvshim handler: the
    kubelet's path, ``create`` then ``start``; with nvshim-runtimed in containerd's mount
    namespace the read-only GPU create comes through a slot, with no interpreter."""
    from tests.cri_util import cri_session, nvshim_containerd
    from tests.engines.containerd_instance import private_containerd
    from tests.runc_util import start_daemon

    image = "nvshim.test/busybox:ro"
    monkeypatch.setenv("NVSHIM_CONFIG", creates.config)  # containerd -> shim -> runtime
    monkeypatch.setenv("NVSHIM_CACHE_DIR", creates.cache_dir)
    rootfs = probe_rootfs(tmp_path / "rootfs")
    config, archive, logs = nvshim_containerd(tmp_path, rootfs, image, creates.runtime)
    daemon_log = tmp_path / "nvshim-runtimed.log"
    with private_containerd(tmp_path, config) as ctd:
        daemon = None
        if served:
            ns = ("nsenter", f"--mount=/proc/{ctd.pid}/ns/mnt")
            env = creates.env()
            daemon = start_daemon(creates.bin_dir, env, daemon_log, "--verbose", prefix=ns)
        try:
            assert ctd.ctr("-n", "k8s.io", "images", "import", archive).returncode == 0
            with cri_session(ctd.socket, image) as cri:
                pod = cri.run_pod("readonly", logs, "nvshim")
                results = [
                    cri.run_container(
                        pod,
                        f"gpu-{int(ro)}",
                        image,
                        ["/bin/sh", "-c", PROBE],
                        env=GPU,
                        read_only=ro,
                    )  # fmt: skip
                    for ro in (False, True)
                ]
        finally:
            if daemon is not None:
                daemon.terminate()
                assert daemon.wait(timeout=60) == 0
    for result in results:
        assert result.exit_code == 0, result
    check_twins(*(r.lines for r in results), creates.sim)
    ids = [r["id"] for r in read_log(str(creates.log)) if r.get("devices")]
    assert ids == [r.container_id for r in results]
    if served:  # the sandbox's create warmed the front's cache
        calls = daemon_calls(daemon_log)
        assert all(c.endswith(" imports=0") for c in calls), calls
        ways = dict(zip([c.split()[-2] for c in calls], served_by(daemon_log), strict=True))
        assert ways[results[1].container_id].startswith("slot "), ways


# --- nvshim.rootfs.rwroot on a pivoted process --------------------------------------------


def _pivoted(rootfs: str, outer: str, inner: str) -> subprocess.Popen:
    """A process that pivoted into ``rootfs`` in a private mount namespace: ``outer``
    runs first on the host path ``$1``, ``inner`` (or nothing) wraps the pivot."""
    os.makedirs(os.path.join(rootfs, "old"), exist_ok=True)
    # bound again on the inside: a mount copied into a new user namespace cannot be pivoted to
    pivot = (
        'mount --bind "$1" "$1" && cd "$1" && pivot_root . old && '
        'exec /bin/sh -c "echo ready && exec sleep 120"'
    )
    script = f'mount --bind "$1" "$1" && {outer} && exec {inner} /bin/sh -c \'{pivot}\' sh "$1"'
    proc = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", script, "sh", rootfs],
        stdout=subprocess.PIPE,
        text=True,
    )
    if proc.stdout.readline() != "ready\n":
        proc.kill()
        proc.wait()
        raise AssertionError("the pivoted process did not start")
    return proc


@pytest.fixture
def pivot(tmp_path):
    """``pivot(outer, inner)``: (rootfs, pid) of a pivoted process (killed at the end)."""
    procs = []

    def make(outer: str = "true", inner: str = "") -> tuple[str, int]:
        rootfs = probe_rootfs(tmp_path / f"rootfs-{len(procs)}")
        procs.append(_pivoted(rootfs, outer, inner))
        return rootfs, procs[-1].pid

    yield make
    for proc in procs:
        proc.kill()
        proc.wait()


def root_options(pid: int) -> list[str]:
    with open(f"/proc/{pid}/mountinfo") as fh:
        (line,) = [ln for ln in fh if ln.split()[4] == "/"]
    return line.split()[5].split(",")


def make_link(pid: int, rootfs: str) -> None:
    """The ``create-symlinks`` step (``/bin/made-here -> busybox``) on the container
    ``pid`` whose root is ``rootfs``, as nvshim-runtime runs it after ``runc create``."""
    from nvshim.config import load_config
    from nvshim.hook.args import parse_step
    from nvshim.hook.steps import Context, run_steps

    ctx = Context(load_config(None))
    try:
        step = parse_step(["create-symlinks", "--link", "busybox::/bin/made-here"])
        run_steps(pid, rootfs, [step], ctx, pivoted=True)
    finally:
        ctx.close()


def test_without_mount_setattr_a_bind_remount_keeps_the_other_flags(pivot, monkeypatch):
    """Linux before 5.12 has no mount_setattr (ENOSYS, which this kernel cannot give):
    the root is remounted writable and back, nosuid and nodev kept."""
    from nvshim.rootfs import kernel

    rootfs, pid = pivot('mount -o remount,bind,ro,nosuid,nodev "$1"')
    assert root_options(pid)[0] == "ro"

    def old_kernel(fd, attr_set, attr_clr=0):
        raise OSError(errno.ENOSYS, "mount_setattr: Function not implemented")

    monkeypatch.setattr(kernel, "mount_setattr", old_kernel)
    make_link(pid, rootfs)
    assert os.readlink(f"/proc/{pid}/root/bin/made-here") == "busybox"
    options = root_options(pid)
    assert options[0] == "ro" and {"nosuid", "nodev"} <= set(options), options


def test_a_failed_step_leaves_the_root_read_only(pivot):
    """The flag goes back whatever the steps did."""
    from nvshim.config import load_config
    from nvshim.errors import NvshimError
    from nvshim.hook.args import parse_step
    from nvshim.hook.steps import Context, run_steps

    rootfs, pid = pivot('mount -o remount,bind,ro "$1"')
    ctx = Context(load_config(None))
    steps = [parse_step(["create-symlinks", "--link", "busybox::/bin/one", "--link",
                         "busybox::/etc/passwd/not-a-folder"])]  # fmt: skip
    try:
        with pytest.raises(NvshimError, match="/etc/passwd/not-a-folder"):
            run_steps(pid, rootfs, steps, ctx, pivoted=True)
    finally:
        ctx.close()
    assert os.readlink(f"/proc/{pid}/root/bin/one") == "busybox"  # it was writable
    assert root_options(pid)[0] == "ro"


def test_a_root_locked_read_only_by_a_user_namespace_is_one_clear_error(pivot):
    from nvshim.errors import NvshimError

    rootfs, pid = pivot('mount -o remount,bind,ro "$1"',
                        "unshare --user --map-root-user --mount --propagation private")  # fmt: skip
    with pytest.raises(NvshimError, match="read-only root is locked by another user namespace"):
        make_link(pid, rootfs)
    assert not os.path.lexists(f"/proc/{pid}/root/bin/made-here")
    assert root_options(pid)[0] == "ro"


def test_a_root_that_cannot_be_made_read_only_again_fails_the_steps(pivot, monkeypatch):
    """The kernel refusing the way back (which this kernel never does) is an error: the
    runtime then deletes the container rather than hand out a writable root."""
    from nvshim.errors import NvshimError
    from nvshim.rootfs import kernel

    rootfs, pid = pivot('mount -o remount,bind,ro "$1"')
    real = kernel.mount_setattr

    def no_way_back(fd, attr_set, attr_clr=0):
        if attr_set & kernel.MOUNT_ATTR_RDONLY:
            raise OSError(errno.EBUSY, "mount_setattr: Device or resource busy")
        real(fd, attr_set, attr_clr)

    monkeypatch.setattr(kernel, "mount_setattr", no_way_back)
    with pytest.raises(NvshimError, match="cannot make the root read-only again"):
        make_link(pid, rootfs)


def test_a_read_only_file_system_under_the_root_is_one_clear_error(tmp_path):
    """Only the mount's flag is nvshim's to change: a file system mounted read-only
    itself stays so, and nothing is run on it."""
    from nvshim.rootfs import kernel
    from nvshim.rootfs.rwroot import is_readonly, while_writable
    from tests.runc_util import in_private_mount_ns

    root = str(tmp_path / "root")
    os.mkdir(root)

    def attempt() -> list:
        kernel.mount("nvshim-ro", root, "tmpfs", 0, "size=64k")
        kernel.mount(None, root, None, kernel.MS_REMOUNT | kernel.MS_RDONLY)
        fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
        ran = []
        try:
            while_writable(fd, root, "the-root", lambda: ran.append("ran"))
        except Exception as err:  # noqa: BLE001 - the message is the result
            return [str(err), ran, is_readonly(fd)]
        return ["no error", ran, is_readonly(fd)]

    result = in_private_mount_ns(attempt)
    message, ran, readonly = result["ok"]
    assert message.startswith("the-root: the container root's file system is itself read-only")
    assert ran == [] and readonly
