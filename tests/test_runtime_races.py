"""Issue 28's attacks on nvshim-runtime and nvshim-runtimed, tried as the review tried
them, with real runc, the real front and daemon and a real unprivileged user
(``nobody`` through ``setpriv``): a cache directory another user can swap, pid reuse on
the daemon's socket, a FIFO behind a library name in an image. Each test failed before
the fix."""

from __future__ import annotations

import os
import pathlib
import shutil
import stat
import subprocess
import sys
import tempfile
import time

import pytest

from nvshim import __version__
from nvshim.ldcache import parse_ld_cache
from tests.podman_util import make_busybox_rootfs
from tests.runc_util import make_bundle
from tests.test_runtime_daemon import Daemon, creates  # noqa: F401
from tests.test_runtime_slots import bundle_for, create, warm

NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
SYSTEM_PYTHON = "/usr/bin/python3"  # nobody cannot reach the test's .venv

# renameat2(RENAME_EXCHANGE) of two names in the current directory, as fast as it goes,
# for argv[3] seconds: the swap of issue 28
SWAP = r"""
import ctypes, sys, time
libc = ctypes.CDLL(None, use_errno=True)
a, b, until = sys.argv[1].encode(), sys.argv[2].encode(), time.monotonic() + float(sys.argv[3])
while time.monotonic() < until:
    libc.renameat2(-100, a, -100, b, 2)
"""


@pytest.fixture
def open_dir():
    """A directory like ``/tmp`` (root's, 1777) that ``nobody`` can reach, removed after."""
    path = tempfile.mkdtemp(prefix="nvshim-i28-", dir="/tmp")
    os.chmod(path, 0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def as_nobody(*argv: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*NOBODY, *argv], check=True, timeout=60, **kw)


def pwn_program(where: str) -> tuple[str, str]:
    """A program ``nobody`` owns that records the uid it ran as: (program, record)."""
    program, record = os.path.join(where, "prog"), os.path.join(where, "ran-as")
    as_nobody("sh", "-c", f'printf \'#!/bin/sh\\nid -u >> {record}\\n\' > {program}; '
              f"chmod 755 {program}")  # fmt: skip
    return program, record


# -- (a) the cache directory: checked and used through what was opened -----------------


def test_a_swapped_symlinked_cache_directory_never_runs_another_users_program(creates, open_dir):  # noqa: F811
    """Issue 28 (1): ``nobody`` names root's cache directory through a symlink of theirs
    and swaps it (``RENAME_EXCHANGE``) with a directory holding a forged front cache that
    names their program as the runtime; root's calls never run it."""
    real = os.path.join(open_dir, "real")
    os.mkdir(real, 0o755)
    creates.cache_dir = real
    warm(creates)  # root's genuine front cache in `real`
    genuine = pathlib.Path(real, "runtime-front").read_text()
    program, record = pwn_program(open_dir)
    runtime = genuine.splitlines()[4]  # the first pair's (passthrough: the layout)
    forged = genuine.replace(f"\n{runtime}\n", f"\n{program}\n")
    assert forged != genuine
    as_nobody("sh", "-c", f"cd {open_dir} && mkdir evil && ln -s {real} cache && "
              f"cat > evil/runtime-front", input=forged.encode())  # fmt: skip
    creates.cache_dir = os.path.join(open_dir, "cache")
    swapper = subprocess.Popen([*NOBODY, SYSTEM_PYTHON, "-c", SWAP, "cache", "evil", "60"],
                               cwd=open_dir)  # fmt: skip
    try:
        for n in range(150):
            proc = creates.call("state", f"none-{n}", capture_output=True, text=True)
            assert proc.returncode != 0  # no such container, whoever answers
            assert not os.path.exists(record), f"nobody's program ran as root at call {n}"
    finally:
        swapper.kill()
        swapper.wait()
    (theirs,) = [n for n in ("cache", "evil") if not os.path.islink(os.path.join(open_dir, n))]
    assert os.listdir(os.path.join(open_dir, theirs)) == ["runtime-front"]  # root wrote nothing


@pytest.mark.parametrize("owner", ["root", "nobody"])
def test_the_daemon_refuses_a_cache_directory_reached_through_a_symlink(creates, open_dir, owner):  # noqa: F811
    """Whoever owns the link: the path could lead elsewhere tomorrow (or, in a sticky
    directory, was planted); the daemon names the link and starts nothing."""
    real = os.path.join(open_dir, "real")
    os.mkdir(real, 0o755)
    link = os.path.join(open_dir, "cache")
    if owner == "root":
        os.symlink(real, link)
    else:
        as_nobody("ln", "-s", real, link)
    creates.cache_dir = os.path.join(link, "below")
    proc = subprocess.run([os.path.join(creates.bin_dir, "nvshim-runtimed")], env=creates.env(),
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 1 and proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"nvshim-runtimed: error: {link}: a symbolic link"), line
    assert os.listdir(real) == []  # nothing made through it


def test_a_cache_directory_in_another_users_directory_is_never_trusted(creates, open_dir):  # noqa: F811
    """``nobody``'s directory above root's cache directory: the daemon refuses, no Python
    writes a cache or a marker there, and the front starts Python for every call, never
    reading the front cache ``nobody`` left there."""
    theirs = os.path.join(open_dir, "theirs")
    program, record = pwn_program(open_dir)
    as_nobody("mkdir", "-m", "0755", theirs)
    cache = os.path.join(theirs, "cache")
    os.mkdir(cache, 0o755)  # root's, in nobody's directory (they can rename it away)
    creates.cache_dir = cache
    proc = subprocess.run([os.path.join(creates.bin_dir, "nvshim-runtimed")], env=creates.env(),
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 1 and f"{theirs}: owned by uid 65534" in proc.stderr
    warm(creates)
    assert os.listdir(cache) == []  # no front cache written there
    # one the front would use, were the directory trusted: this nvshim's, this call's PATH
    lines = [f"nvshim {__version__}", creates.config, "present", creates.env()["PATH"], program,
             "", "NVIDIA_"]  # fmt: skip
    forged = "".join(f"{line}\n" for line in lines)
    as_nobody("sh", "-c", f"cat > {theirs}/front && mv {cache} {theirs}/moved && mkdir {cache} && "
              f"mv {theirs}/front {cache}/runtime-front", input=forged.encode())  # fmt: skip
    for n in range(3):
        assert creates.call("state", f"none-{n}", capture_output=True).returncode != 0
    assert not os.path.exists(record) and creates.python_starts() == 3
    bundle, cid = bundle_for(creates, "under-theirs")
    assert create(creates, bundle, cid).returncode == 0, creates.output(cid)
    assert creates.state(cid)["status"] == "created"
    assert not os.path.exists(os.path.join(cache, "exec"))  # no marker there either


# -- (c) a FIFO behind a library name in the image -------------------------------------


@pytest.mark.parametrize(
    "where",
    ["/usr/lib/x86_64-linux-gnu/libzz.so.1", "/lib/libzz.so", "/opt/lib/libzz.so.2",
     "/lib/tls/x86_64/haswell/libzz.so.1"],
    ids=["multiarch", "trusted-dir", "conf-dir", "deep-hwcap"],
)  # fmt: skip
def test_a_fifo_behind_a_library_name_fails_its_create_at_once(creates, where):  # noqa: F811
    """Issue 28 (3): ``libzz.so.1 -> /fifo`` in a directory the host ldconfig scans
    (the multiarch and trusted directories, one an image conf names, hwcap directories
    three deep: ldconfig descends at any depth, the prescan stopped at two) held a
    worker for 60 s; the create now fails at once, naming the file, and the daemon
    serves on."""
    rootfs = make_busybox_rootfs(creates.tmp / "rootfs-libfifo")
    os.makedirs(os.path.dirname(f"{rootfs}{where}"), exist_ok=True)
    os.mkfifo(f"{rootfs}/fifo")
    os.symlink("/fifo", f"{rootfs}{where}")
    os.makedirs(f"{rootfs}/etc/ld.so.conf.d", exist_ok=True)
    with open(f"{rootfs}/etc/ld.so.conf.d/opt.conf", "w") as fh:
        fh.write("/opt/lib\n")
    _refused_at_once(creates, rootfs, where)


@pytest.mark.parametrize(
    "where, kind",
    [("/var/cache/ldconfig/aux-cache", "fifo"), ("/var/cache/ldconfig/aux-cache~", "fifo"),
     ("/etc/ld.so.cache~", "device")],
    ids=["aux-cache-fifo", "aux-cache-temp-fifo", "cache-temp-device"],
)  # fmt: skip
def test_a_special_file_where_ldconfig_keeps_its_caches_fails_its_create_at_once(
    creates,  # noqa: F811
    where,
    kind,
):
    """ldconfig reads ``/var/cache/ldconfig/aux-cache`` and writes both caches through
    ``NAME~`` (``O_CREAT``, which opens what is there): a FIFO held a worker 20 s, and
    root's ldconfig wrote the ld cache into a device node (a host disk's, through a loop
    device, got its first bytes overwritten; here /dev/null's numbers: ldconfig failed
    on it only after writing). The create fails at once, naming the file."""
    rootfs = make_busybox_rootfs(creates.tmp / "rootfs-cachefifo")
    os.makedirs(os.path.dirname(f"{rootfs}{where}"), exist_ok=True)
    if kind == "fifo":
        os.mkfifo(f"{rootfs}{where}")
    else:
        os.mknod(f"{rootfs}{where}", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    _refused_at_once(creates, rootfs, where)


@pytest.mark.parametrize("fan", [0, 25], ids=["itself", "fan-out"])
def test_an_include_cycle_in_the_images_ld_so_conf_fails_its_create_at_once(creates, fan):  # noqa: F811
    """An ld.so.conf that includes itself: ldconfig follows the cycle until its deadline
    (20 s), and the prescan, which followed includes four deep without remembering a
    file, looked at 25 files including each other 25^4 times (the time grew as N^4,
    unbounded by that deadline). Each file is now looked at once, and the cycle fails
    the create at once, naming the file met again."""
    rootfs = make_busybox_rootfs(creates.tmp / "rootfs-cycle")
    os.makedirs(f"{rootfs}/etc/c", exist_ok=True)
    where = "/etc/ld.so.conf" if fan == 0 else "/etc/c/0.conf"
    with open(f"{rootfs}/etc/ld.so.conf", "w") as fh:
        fh.write("include /etc/ld.so.conf\n" if fan == 0 else "include /etc/c/*.conf\n")
    for n in range(fan):
        with open(f"{rootfs}/etc/c/{n}.conf", "w") as fh:
            fh.write("include /etc/c/*.conf\n/opt/lib\n")
    _refused_at_once(creates, rootfs, where, "includes itself")


def test_include_lines_naming_too_many_files_fail_the_create_at_once(creates):  # noqa: F811
    """1,200 configuration files each including 1,200 others (no cycle): the prescan
    looked at each of the 1.44 million names (the create took 25 s; 1,000 by 1,000 took
    the prescan alone 10 s, outside ldconfig's deadline); past 200,000 the create fails
    at once."""
    rootfs = make_busybox_rootfs(creates.tmp / "rootfs-wide")
    with open(f"{rootfs}/etc/ld.so.conf", "w") as fh:
        fh.write("include /etc/one/*.conf\n")
    for layer, then in (("one", "include /etc/two/*.conf"), ("two", "/opt/lib")):
        os.makedirs(f"{rootfs}/etc/{layer}")
        for n in range(1200):
            with open(f"{rootfs}/etc/{layer}/{n}.conf", "w") as fh:
                fh.write(f"{then}\n")
    _refused_at_once(creates, rootfs, "/etc/ld.so.conf", "name more than 200000 files")


def test_an_ld_so_configuration_past_16_mib_fails_its_create_at_once(creates):  # noqa: F811
    """30 files in /etc/ld.so.conf.d naming 90,000 directories each (a 28 MB image,
    gzip makes it small): the prescan parsed each line and looked at each of the 2.7
    million directories (the create took 34 s, past ldconfig's 20 s deadline and more
    with each file: ldconfig itself takes 3 s; a file over 1 MiB it did not parse at
    all). Past 16 MiB of configuration the create fails at once."""
    rootfs = make_busybox_rootfs(creates.tmp / "rootfs-dirs")
    os.makedirs(f"{rootfs}/etc/ld.so.conf.d", exist_ok=True)
    for n in range(30):
        with open(f"{rootfs}/etc/ld.so.conf.d/{n:02d}.conf", "w") as fh:
            fh.write("".join(f"/d{n}x{i}\n" for i in range(90_000)))
    _refused_at_once(creates, rootfs, "/etc/ld.so.conf.d/18.conf", "passes 16 MiB")


def _refused_at_once(creates, rootfs, where: str, why: str = "not a regular file") -> None:  # noqa: F811
    """A served GPU create of glibc image ``rootfs`` fails within 10 s with one line
    naming ``where`` and ``why``; the daemon's only worker serves the next. The image's
    ``/etc/ld.so.cache`` is not a cache: nvshim cannot add to it, so the host ldconfig
    would run (``test_without_ldconfig_the_same_images_are_served_at_once``: where nvshim
    adds to the cache itself)."""
    d = Daemon(creates, "--workers", "1")
    try:
        with open(f"{rootfs}/etc/ld.so.cache", "wb") as fh:
            fh.write(b"not a cache")
        cid, proc, took = _gpu_create(creates, rootfs, "libfifo")
        assert proc.returncode == 1 and took < 10, creates.output(cid)
        (line,) = creates.output(cid).splitlines()
        assert line.startswith("nvshim-runtime: error: ") and where in line, line
        assert why in line and creates.state(cid) is None
        bundle, cid = bundle_for(creates, "after-libfifo")
        assert create(creates, bundle, cid).returncode == 0, creates.output(cid)
    finally:
        assert d.stop() == 0


@pytest.mark.parametrize(
    "shape",
    ["libfifo", "aux-cache-fifo", "cache-temp-device", "include-cycle"],
)
def test_without_ldconfig_the_same_images_are_served_at_once(creates, shape):  # noqa: F811
    """Where nvshim adds the libraries to the image's cache itself, what held ldconfig
    is never opened: a FIFO behind a library name in the injected folder, a FIFO as
    ldconfig's auxiliary cache, a device node as its temporary cache file, an include
    cycle. The create succeeds at once and the cache leads to the driver libraries."""
    rootfs = make_busybox_rootfs(creates.tmp / f"rootfs-{shape}")
    os.makedirs(f"{rootfs}/usr/lib/x86_64-linux-gnu", exist_ok=True)
    os.makedirs(f"{rootfs}/var/cache/ldconfig", exist_ok=True)
    if shape == "libfifo":
        os.mkfifo(f"{rootfs}/fifo")
        os.symlink("/fifo", f"{rootfs}/usr/lib/x86_64-linux-gnu/libzz.so.1")
    elif shape == "aux-cache-fifo":
        os.mkfifo(f"{rootfs}/var/cache/ldconfig/aux-cache")
    elif shape == "cache-temp-device":
        os.mknod(f"{rootfs}/etc/ld.so.cache~", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    else:
        with open(f"{rootfs}/etc/ld.so.conf", "w") as fh:
            fh.write("include /etc/ld.so.conf\n")
    d = Daemon(creates, "--workers", "1")
    try:
        cid, proc, took = _gpu_create(creates, rootfs, shape)
        assert proc.returncode == 0 and took < 10, creates.output(cid)
        assert creates.state(cid)["status"] == "created"
        with open(f"{rootfs}/etc/ld.so.cache", "rb") as fh:
            cached = {e.name for e in parse_ld_cache(fh.read())}
        assert {"libcuda.so.1", "libnvidia-ml.so.1"} <= cached
    finally:
        assert d.stop() == 0


def _gpu_create(creates, rootfs, name: str) -> tuple[str, subprocess.CompletedProcess, float]:  # noqa: F811
    """A 1-GPU create of ``rootfs`` made a glibc image (container ``NAME-PID``): its id,
    the finished call and the seconds it took."""
    _glibc_loader(rootfs)
    cid = f"{name}-{os.getpid()}"
    creates.ids.append(cid)
    bundle = make_bundle(creates.tmp, rootfs, ["/bin/true"],
                         env={"NVIDIA_VISIBLE_DEVICES": "0"}, name=cid)  # fmt: skip
    began = time.monotonic()
    proc = create(creates, bundle, cid)
    return cid, proc, time.monotonic() - began


def _glibc_loader(rootfs) -> None:
    """Make the image look like a glibc one (the ld cache step runs only for those)."""
    loader = f"{rootfs}/lib64/ld-linux-x86-64.so.2"
    os.makedirs(os.path.dirname(loader), exist_ok=True)
    if not os.path.exists(loader):
        shutil.copy(sys.executable, loader)  # any regular file: only its presence counts


# -- (b) pid reuse on the daemon's socket ----------------------------------------------

# connects to the daemon, forks a child that keeps the connection, prints its pid and
# exits; the child waits for argv[2] to exist, then asks for `state` (its result in argv[3])
HANDOFF = r"""
import os, sys, time
from nvshim.runtime import client
sock = client.connect(sys.argv[1])
assert sock is not None, "no daemon"
if os.fork() == 0:
    null = os.open(os.devnull, os.O_RDWR)
    for n in (0, 1, 2):
        os.dup2(null, n)
    os.close(null)
    while not os.path.exists(sys.argv[2]):
        time.sleep(0.01)
    code = client.served(sock, ["--root", sys.argv[4], "state", "none"])
    with open(sys.argv[3], "w") as fh:
        fh.write(f"{code}\n")
    os._exit(0)
print(os.getpid(), flush=True)
"""


def _reuse(pid: int) -> subprocess.Popen:
    """An unconfined process of root's at ``pid`` (``ns_last_pid``: a few tries, other
    processes may take it first)."""
    for _ in range(20):
        with open("/proc/sys/kernel/ns_last_pid", "w") as fh:
            fh.write(str(pid - 1))
        proc = subprocess.Popen(["sleep", "60"])
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
    pytest.fail(f"pid {pid} could not be reused")


def test_a_confined_caller_that_hands_its_connection_on_and_exits_is_declined(creates, tmp_path):  # noqa: F811
    """Issue 28 (2): a ``no_new_privs`` caller connects, hands the connection to a child
    and exits; an unconfined process gets its pid; the child's request is declined (it
    was served with the daemon's full privileges), and done by the child itself."""
    d = Daemon(creates, "--workers", "1")
    go, result = tmp_path / "go", tmp_path / "result"
    reused = None
    try:
        proc = subprocess.run(
            ["setpriv", "--no-new-privs", sys.executable, "-c", HANDOFF, d.socket, str(go),
             str(result), creates.root],
            env={**creates.env(), "PYTHONPATH": os.getcwd()}, capture_output=True, text=True,
            timeout=60, check=True,
        )  # fmt: skip
        reused = _reuse(int(proc.stdout))
        go.touch()
        deadline = time.monotonic() + 30
        while not (d.served() or d.declined()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert d.served() == []  # served, the child was exec'd into runc as root's own call
        assert d.declined() == [f"pid {int(proc.stdout)} exited"]
        while not result.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert result.read_text() == "None\n"  # declined: the child does the call itself
    finally:
        if reused is not None:
            reused.kill()
            reused.wait()
        assert d.stop() == 0


# -- the log: checked and used through the one open file ---------------------------------


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_a_log_path_that_is_a_fifo_or_a_symlink_is_not_written(creates, tmp_path, kind):  # noqa: F811
    """``--log`` naming a FIFO no one reads (an open for writing waited forever) or a
    symlink (followed, root appended to its target): the call goes on with one warning
    and the target is left as it was."""
    warm(creates)
    log = tmp_path / "runtime.log"
    target = tmp_path / "target"
    target.write_text("untouched\n")
    if kind == "fifo":
        os.mkfifo(log)
    else:
        os.symlink(target, log)
    bundle, cid = bundle_for(creates, f"log-{kind}", env={"NVIDIA_VISIBLE_DEVICES": "7"})
    proc = creates.call("--log", str(log), "create", "--bundle", bundle, cid,
                        capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 1 and creates.state(cid) is None  # GPU 7: refused
    (line,) = proc.stderr.splitlines()  # the error, to the engine; not to the log
    assert line.startswith("nvshim-runtime: error: ") and "'7'" in line
    assert target.read_text() == "untouched\n"
    assert os.path.islink(log) if kind == "symlink" else stat.S_ISFIFO(os.lstat(log).st_mode)


def test_without_so_peerpidfd_every_socket_caller_is_declined(monkeypatch):
    """A kernel before 6.5 cannot pin the caller: declined (its own process does the
    call) rather than judged by a pid that may be another process's by then."""
    import socket

    from nvshim.runtimed import trust

    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with a, b:
        assert trust.decline_reason(a) == (None, os.umask(os.umask(0o022)))  # this kernel
        monkeypatch.setattr(trust, "peer_pidfd", lambda sock: None)
        why, _ = trust.decline_reason(a)
        assert why is not None and "SO_PEERPIDFD" in why


def test_a_caller_is_matched_on_the_daemons_namespaces_as_read_at_start(monkeypatch):
    """The daemon reads its own namespaces and root once, at start: a caller in them is
    served; one whose namespaces cannot be read is declined, even if the daemon's own
    could not be read either (unknown is never the same)."""
    from nvshim.runtimed import trust

    monkeypatch.setattr(trust, "_places", [])
    monkeypatch.setattr(trust, "_plain", [])
    trust.remember_own()
    assert trust.caller_decline_reason(os.getpid())[0] is None
    unknown = (None,) * (len(trust.NAMESPACES) + 1)
    monkeypatch.setattr(trust, "_places", [unknown])
    assert trust.caller_decline_reason(os.getpid())[0] == "another mnt namespace"
    monkeypatch.setattr(trust, "file_identity", lambda path: None)
    assert trust.caller_decline_reason(os.getpid())[0] == "another mnt namespace"
