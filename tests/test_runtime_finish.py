"""``create`` through nvshim-runtime runs the finishing steps (symlinks, ld cache,
params) itself, after runc created the container and before its process starts: one
interpreter per GPU create, the container sees the same as with the hook, and a failed
step deletes the container and fails the create. Each case runs twice: in
nvshim-runtime's own process, and served by nvshim-runtimed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from nvshim.launch import write_launchers
from tests.conftest import write_config
from tests.podman_util import make_busybox_rootfs
from tests.runc_util import (
    RUNC_ENV,
    counting_interpreter,
    daemon_calls,
    make_bundle,
    read_log,
    start_daemon,
)

RUNC = shutil.which("runc") or "/usr/sbin/runc"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIBDIR = "/usr/lib/x86_64-linux-gnu"
CONF = "/etc/ld.so.conf.d/00-nvshim.conf"
SHOW = f"readlink {LIBDIR}/libcuda.so.1; cat {CONF}; echo CVD=$CUDA_VISIBLE_DEVICES"


class Creates:
    """Launchers whose interpreter counts its starts, a config for a simulated host, and
    containers created through nvshim-runtime with real runc (deleted at the end)."""

    def __init__(self, sim, tmp_path, cache_dir: str | None = None):
        self.sim, self.tmp = sim, tmp_path
        self.cache_dir = cache_dir or os.environ["NVSHIM_CACHE_DIR"]
        self.starts = tmp_path / "python-starts"
        interpreter = counting_interpreter(tmp_path / "python", self.starts)
        self.bin_dir = bin_dir = str(tmp_path / "bin")
        write_launchers(bin_dir, interpreter=interpreter, cache_dir=self.cache_dir)
        self.runtime = os.path.join(bin_dir, "nvshim-runtime")
        # the sh front too, for tests that run it with one shell or another
        sh_dir = str(tmp_path / "sh-bin")
        write_launchers(sh_dir, interpreter=interpreter, cache_dir=self.cache_dir, compiled=False)
        self.sh_runtime = os.path.join(sh_dir, "nvshim-runtime")
        self.log = tmp_path / "nvshim.log"
        self.config = write_config(
            tmp_path / "config.toml", sim, bin_dir, tmp_path / "state", self.log,
            accept_env_unprivileged=True,
        )  # fmt: skip
        self.root = str(tmp_path / "runc-root")
        self.ids: list[str] = []
        self.daemon: subprocess.Popen | None = None
        self.baseline = 0

    def call(self, *argv: str, runtime: str | None = None, **kw) -> subprocess.CompletedProcess:
        """``argv`` through nvshim-runtime (or ``runtime``)."""
        return subprocess.run(
            [runtime or self.runtime, "--root", self.root, *argv],
            env=self.env(),
            stdin=subprocess.DEVNULL,
            timeout=60,
            **kw,
        )

    def env(self) -> dict[str, str]:
        """The environment engines would call nvshim-runtime with."""
        return {**RUNC_ENV, "NVSHIM_CONFIG": self.config, "NVSHIM_CACHE_DIR": self.cache_dir}

    def create(self, rootfs: str, cid: str, pid_file: bool = True, *extra: str) -> tuple[str, int]:
        """(bundle, exit status); the container's output goes to ``<cid>.out``;
        ``extra``: more create flags."""
        bundle = make_bundle(self.tmp, rootfs, ["/bin/sh", "-c", SHOW],
                             env={"NVIDIA_VISIBLE_DEVICES": "0"}, name=cid)  # fmt: skip
        flags = ["--pid-file", os.path.join(bundle, "pid")] if pid_file else []
        flags += extra
        self.ids.append(cid)
        with open(self.tmp / f"{cid}.out", "w") as out:
            proc = self.call("create", *flags, "--bundle", bundle, cid, stdout=out, stderr=out)
        return bundle, proc.returncode

    # the test's own look-ups go to runc: through the front, the first one would start
    # Python to cache the low-level runtime and blur the count

    def state(self, cid: str) -> dict | None:
        proc = self.call("state", cid, runtime=RUNC, capture_output=True, text=True)
        return json.loads(proc.stdout) if proc.returncode == 0 else None

    def output(self, cid: str) -> str:
        return (self.tmp / f"{cid}.out").read_text()

    def start_and_wait(self, cid: str) -> str:
        assert self.call("start", cid, runtime=RUNC).returncode == 0
        deadline = time.monotonic() + 30
        while self.state(cid)["status"] != "stopped":
            assert time.monotonic() < deadline, "the container did not stop"
            time.sleep(0.05)
        return self.output(cid)

    def python_starts(self) -> int:
        """Interpreters started since ``__init__`` or ``serve`` (the daemon's excluded)."""
        return self._starts() - self.baseline

    def _starts(self) -> int:
        return len(self.starts.read_text().splitlines()) if self.starts.exists() else 0

    def serve(self) -> None:
        """Have ``nvshim-runtimed --verbose`` do the runtime's work from now on."""
        self.daemon_log = self.tmp / "nvshim-runtimed.log"
        self.daemon = start_daemon(self.bin_dir, self.env(), self.daemon_log, "--verbose")
        self.baseline = self._starts()

    def served(self) -> list[str]:
        """The calls the daemon served (its ``--verbose`` lines), none without it."""
        if self.daemon is None:
            return []
        return daemon_calls(self.daemon_log)

    def cleanup(self) -> None:
        for cid in self.ids:
            self.call("delete", "--force", cid, runtime=RUNC, capture_output=True)
        if self.daemon is not None:
            self.daemon.terminate()
            assert self.daemon.wait(timeout=60) == 0


@pytest.fixture(params=["in-process", "daemon"])
def creates(sim_hosts, tmp_path, request):
    """Creates through nvshim-runtime alone, or served by nvshim-runtimed (on a cache dir
    of its own)."""
    cache = None
    if request.param == "daemon":
        cache = tmp_path / "cache"
        cache.mkdir()
    c = Creates(sim_hosts("single"), tmp_path, cache_dir=cache and str(cache))
    if request.param == "daemon":
        c.serve()
    yield c
    c.cleanup()
    if request.param == "daemon":  # and every call went to the daemon
        assert c.served() and all(s.endswith(" imports=0") for s in c.served())


@pytest.mark.parametrize(
    "pid_file, extra",
    [(True, ()), (False, ()), (True, ("--no-pivot",))],
    ids=["pid-file", "runc-state", "no-pivot"],
)
def test_create_finishes_the_container_in_one_interpreter(creates, pid_file, extra):
    """From the pid file engines pass, else ``runc state``; with ``--no-pivot`` runc
    moves the root instead of pivoting: the steps find the same root."""
    rootfs = make_busybox_rootfs(creates.tmp / "rootfs")
    cid = f"finish-{os.getpid()}-{int(pid_file)}-{len(extra)}"
    bundle, status = creates.create(rootfs, cid, pid_file, *extra)
    assert status == 0, creates.output(cid)
    spec = json.load(open(os.path.join(bundle, "config.json")))
    hooks = [h for stage in spec.get("hooks", {}).values() for h in stage]
    assert not any("nvshim-hook" in h.get("args", [])[:1] for h in hooks), hooks
    # done before create returned: the created (not started) container already has them
    state = creates.state(cid)
    assert state["status"] == "created"
    inside = f"/proc/{state['pid']}/root"
    assert os.readlink(f"{inside}{LIBDIR}/libcuda.so.1").startswith("libcuda.so.")
    assert open(f"{inside}{CONF}").read().splitlines()[-1] == LIBDIR
    assert creates.python_starts() == 1  # the runtime's; no hook ran
    link, conf_head, conf_dir, cvd = creates.start_and_wait(cid).splitlines()
    assert link == f"libcuda.so.{creates.sim.driver_version}"
    assert conf_dir == LIBDIR and conf_head.startswith("# nvshim-hook update-ldcache")
    assert cvd == f"CVD={creates.sim.topology['gpus'][0]['uuid']}"
    assert creates.python_starts() == 1
    (line,) = read_log(str(creates.log))  # one line per container, as with the hook
    assert line["id"] == cid and line["devices"] == creates.sim.topology["gpus"][0]["uuid"]


def test_a_failed_step_deletes_the_container(creates):
    rootfs = make_busybox_rootfs(creates.tmp / "rootfs")
    os.makedirs(os.path.join(rootfs, "etc"), exist_ok=True)
    with open(os.path.join(rootfs, "etc/ld.so.conf.d"), "w") as fh:
        fh.write("a file where the image should have a folder\n")
    cid = f"finish-fail-{os.getpid()}"
    _, status = creates.create(rootfs, cid)
    assert status == 1
    (message,) = creates.output(cid).splitlines()
    assert message.startswith("nvshim-runtime: error: finishing steps failed, container deleted:")
    assert CONF in message
    assert creates.state(cid) is None  # runc no longer knows it
    decision, error = read_log(str(creates.log))
    assert decision["id"] == error["id"] == cid
    assert error["step"] == "finish" and "container deleted" in error["error"]


def test_run_keeps_the_hook(creates):
    """``run`` starts the process at once: the finishing steps stay a hook."""
    rootfs = make_busybox_rootfs(creates.tmp / "rootfs")
    bundle = make_bundle(creates.tmp, rootfs, ["/bin/sh", "-c", SHOW],
                         env={"NVIDIA_VISIBLE_DEVICES": "0"}, name="run")  # fmt: skip
    cid = f"finish-run-{os.getpid()}"
    creates.ids.append(cid)
    proc = creates.call("run", "--bundle", bundle, cid, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == f"libcuda.so.{creates.sim.driver_version}"
    spec = json.load(open(os.path.join(bundle, "config.json")))
    (hook,) = spec["hooks"]["createContainer"]
    assert hook["args"][:2] == ["nvshim-hook", "finish"]
    assert creates.python_starts() == 2  # the runtime, then the hook


PARAMS = "proc/driver/nvidia/params"


@pytest.fixture
def pivoted(tmp_path):
    """A process that pivoted into a fresh root (as runc's init has when ``create``
    returns) with a plain file as its ``/proc/driver/nvidia/params``: the real one needs
    the NVIDIA driver. Yields (rootfs, pid)."""
    rootfs = make_busybox_rootfs(tmp_path / "rootfs")
    os.makedirs(os.path.join(rootfs, os.path.dirname(PARAMS)))
    with open(os.path.join(rootfs, PARAMS), "w") as fh:
        fh.write("image params\n")
    os.makedirs(os.path.join(rootfs, "old"))
    inside = "umount -l /old && echo ready && exec /bin/busybox sleep 120"
    script = f'mount --bind "$1" "$1" && cd "$1" && pivot_root . old && exec /bin/sh -c "{inside}"'
    proc = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", script, "sh", rootfs],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline() == "ready\n"
        yield rootfs, proc.pid
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("detached_tmpfs", [True, False], ids=["tmpfs", "inventory-dir"])
def test_params_copy_reaches_a_pivoted_container(pivoted, tmp_path, monkeypatch, detached_tmpfs):
    """Both of the private copy's sources are made on the host before entering: after
    pivot_root neither the host's params file nor the state dir is in reach."""
    from nvshim.config import load_config
    from nvshim.hook.args import parse_step
    from nvshim.hook.steps import Context, run_steps
    from nvshim.rootfs import bind

    rootfs, pid = pivoted
    monkeypatch.setattr(bind, "_clone_detached_works", detached_tmpfs)
    dev_root = tmp_path / "devroot"
    (dev_root / os.path.dirname(PARAMS)).mkdir(parents=True)
    (dev_root / PARAMS).write_text("ModifyDeviceFiles: 1\n")
    config = tmp_path / "params.toml"
    config.write_text(
        f'[host]\ndev-root = "{dev_root}"\n[runtime]\ninventory-dir = "{tmp_path}/st"\n'
    )
    ctx = Context(load_config(str(config)))
    try:
        step = parse_step(["disable-device-node-modification"])
        fields = run_steps(pid, rootfs, [step], ctx, pivoted=True)
    finally:
        ctx.close()
    assert fields == {"params": "ModifyDeviceFiles=0"}
    assert open(f"/proc/{pid}/root/{PARAMS}").read() == "ModifyDeviceFiles: 0\n"
    assert open(os.path.join(rootfs, PARAMS)).read() == "image params\n"  # host view
    assert not os.path.exists(tmp_path / "st") or os.listdir(tmp_path / "st") == []


def test_pivoted_steps_refuse_another_root(pivoted, tmp_path):
    """The root entered must be the directory the spec names, seen from the host."""
    from nvshim.config import load_config
    from nvshim.errors import NvshimError
    from nvshim.hook.args import parse_step
    from nvshim.hook.steps import Context, run_steps

    _, pid = pivoted
    other = make_busybox_rootfs(tmp_path / "other")
    ctx = Context(load_config(None))
    step = parse_step(["create-symlinks", "--link", "x::/made-here"])
    with pytest.raises(NvshimError, match="not the root of container process"):
        run_steps(pid, other, [step], ctx, pivoted=True)
    assert not os.path.lexists(f"/proc/{pid}/root/made-here")
    assert not os.path.lexists(os.path.join(other, "made-here"))


def _spec_mounts(bundle: str) -> list[dict]:
    with open(os.path.join(bundle, "config.json")) as fh:
        return json.load(fh)["mounts"]


def _driver_binds(creates, rootfs: str) -> list[dict]:
    """The binds a GPU container's edits ask for: what ``run`` hands runc in the spec."""
    bundle = make_bundle(creates.tmp, rootfs, ["true"],
                         env={"NVIDIA_VISIBLE_DEVICES": "0"}, name="binds")  # fmt: skip
    before = len(_spec_mounts(bundle))
    code = "import sys; from nvshim.runtime.create import prepare_bundle as p; p(*sys.argv[1:])"
    env = {**creates.env(), "PYTHONPATH": REPO}
    subprocess.run([sys.executable, "-c", code, bundle, "binds"], env=env, check=True)
    return _spec_mounts(bundle)[before:]


def _mounted(pid: int) -> dict[str, list[set[str]]]:
    """The mount points of ``pid``'s namespace, each with the per-mount options of every
    mount stacked there."""
    found: dict[str, list[set[str]]] = {}
    with open(f"/proc/{pid}/mountinfo") as fh:
        for line in fh:
            fields = line.split()
            found.setdefault(fields[4], []).append(set(fields[5].split(",")))
    return found


def test_create_attaches_the_driver_binds_with_runcs_attributes(creates):
    """runc is handed none of the driver's binds: nvshim-runtime attaches each in the
    created container, read-only or not, nosuid, nodev and noexec as the edit says."""
    rootfs = make_busybox_rootfs(creates.tmp / "rootfs")
    binds = _driver_binds(creates, rootfs)
    assert len(binds) > 10 and {"ro", "rw"} & {o for b in binds for o in b["options"]} == {"ro"}
    cid = f"binds-{os.getpid()}"
    bundle, status = creates.create(rootfs, cid)
    assert status == 0, creates.output(cid)
    handed = {m["destination"] for m in _spec_mounts(bundle)}
    assert not handed & {b["destination"] for b in binds}
    mounted = _mounted(creates.state(cid)["pid"])
    for b in binds:
        (options,) = mounted[b["destination"]]  # one mount there, not two stacked
        want = {"ro" if "ro" in b["options"] else "rw"} | {"nosuid", "nodev"}
        assert want <= options, (b, options)
        assert ("noexec" in options) == ("noexec" in b["options"]), (b, options)
    inside = f"/proc/{creates.state(cid)['pid']}/root"
    lib = next(b for b in binds if "/libcuda.so." in b["destination"])
    assert open(inside + lib["destination"], "rb").read() == open(lib["source"], "rb").read()
    out = creates.start_and_wait(cid).splitlines()
    assert out[0] == f"libcuda.so.{creates.sim.driver_version}"  # linked and cached


def test_a_bind_the_engine_made_stays_with_runc(creates):
    """A bind the spec holds already (the engine applied nvshim's CDI spec) is runc's:
    it is neither attached a second time nor dropped."""
    rootfs = make_busybox_rootfs(creates.tmp / "rootfs")
    lib = next(b for b in _driver_binds(creates, rootfs) if "/libcuda.so." in b["destination"])
    cid = f"engine-bind-{os.getpid()}"
    bundle = make_bundle(creates.tmp, rootfs, ["/bin/sh", "-c", SHOW], mounts=[lib],
                         env={"NVIDIA_VISIBLE_DEVICES": "0"}, name=cid)  # fmt: skip
    creates.ids.append(cid)
    with open(creates.tmp / f"{cid}.out", "w") as out:
        proc = creates.call("create", "--bundle", bundle, cid, stdout=out, stderr=out)
    assert proc.returncode == 0, creates.output(cid)
    assert [m for m in _spec_mounts(bundle) if m["destination"] == lib["destination"]] == [lib]
    assert len(_mounted(creates.state(cid)["pid"])[lib["destination"]]) == 1


def test_a_bind_whose_source_went_deletes_the_container(creates):
    """A driver file gone since the inventory was taken: the create fails with one line
    naming it, and runc no longer knows the container."""
    rootfs = make_busybox_rootfs(creates.tmp / "rootfs")
    lib = next(b for b in _driver_binds(creates, rootfs) if "/libcuda.so." in b["destination"])
    aside = lib["source"] + ".aside"
    os.rename(lib["source"], aside)
    try:
        cid = f"bind-gone-{os.getpid()}"
        _, status = creates.create(make_busybox_rootfs(creates.tmp / "rootfs2"), cid)
    finally:
        os.rename(aside, lib["source"])
    assert status == 1
    (message,) = creates.output(cid).splitlines()
    assert message.startswith("nvshim-runtime: error: finishing steps failed, container deleted:")
    assert f"{lib['source']}: cannot" in message
    assert creates.state(cid) is None


def test_split_mounts_leaves_runc_what_it_cannot_reproduce(monkeypatch):
    """Only plain binds with options whose attributes nvshim sets as runc would are taken
    from the spec; one the spec holds already, an ``rbind``, a propagation option and
    every bind on a kernel without the new mount API stay runc's."""
    from nvshim.edits import ContainerEdits, Mount
    from nvshim.rootfs import bind
    from nvshim.runtime.create import split_mounts

    lib = Mount("/host/lib.so", "/usr/lib/lib.so", ("ro", "nosuid", "nodev", "bind"))
    sock = Mount("/host/socket", "/run/x/socket", ("nosuid", "nodev", "noexec", "bind"))
    made = Mount("/host/made.so", "/usr/lib/made.so", ("ro", "bind"))
    kept = [
        made,
        Mount("/host/dir", "/opt/dir", ("rbind",)),
        Mount("/host/dir2", "/opt/dir2", ("bind", "rslave")),
        Mount("/host/t", "/opt/t", ("ro",), type="tmpfs"),
    ]
    edits = ContainerEdits(mounts=[lib, *kept, sock])
    spec = {"mounts": [{"destination": made.container_path, "source": made.host_path}]}
    monkeypatch.setattr(bind, "_mount_api", True)
    rest, ours = split_mounts(edits, spec)
    assert ours == [lib, sock] and rest.mounts == kept
    assert [bind.runc_attrs(m.options) for m in ours] == [
        bind.kernel.MOUNT_ATTR_RDONLY | bind.BASE_ATTRS,
        bind.BASE_ATTRS | bind.kernel.MOUNT_ATTR_NOEXEC,
    ]
    assert bind.runc_attrs(("ro", "rw", "bind")) == 0  # runc: the last one wins
    monkeypatch.setattr(bind, "_mount_api", False)
    assert split_mounts(edits, spec) == (edits, [])
