"""fd-based container-root primitives (nvshim.rootfs.fsroot) on real files, with both the
openat2(RESOLVE_IN_ROOT) path and the O_NOFOLLOW walk used where openat2 is missing."""

from __future__ import annotations

import errno
import os
import stat
import threading

import pytest

from nvshim.rootfs import fsroot, kernel
from nvshim.rootfs.fsroot import RootFS, RootPathError, normalize
from tests.runc_util import in_private_mount_ns, tree_snapshot


@pytest.fixture(params=["openat2", "walk"])
def resolver(request, monkeypatch):
    """Run the test once through openat2 and once through the fallback walk."""
    monkeypatch.setattr(fsroot, "_openat2_works", None if request.param == "openat2" else False)
    yield request.param
    if request.param == "openat2":
        assert fsroot._openat2_works is not False  # the kernel has openat2: no fallback


@pytest.fixture
def layout(tmp_path):
    """A root with hostile links, and a host canary directory they point at."""
    root = tmp_path / "rootfs"
    canary = tmp_path / "canary"
    (canary / "sub").mkdir(parents=True)
    (canary / "file").write_text("host data\n")
    (root / "usr/lib").mkdir(parents=True)
    (root / "etc").mkdir()
    os.symlink("/", root / "usr/lib/x86_64-linux-gnu")  # FACTS §8 shape
    os.symlink(str(canary), root / "etc/ld.so.conf.d")  # absolute link to a host dir
    os.symlink("../../../../../../" + str(canary), root / "up")  # climbs with ..
    os.symlink("loop2", root / "loop1")
    os.symlink("loop1", root / "loop2")
    return root, canary


def test_paths_are_checked_before_use():
    assert normalize("/usr//lib/./x/../y") == "/usr/lib/y"
    assert normalize("/../../etc") == "/etc"
    for bad in ("relative/path", "/a\0b", "/" + "x" * 5000, None):
        with pytest.raises(RootPathError):
            normalize(bad)


def test_absolute_link_to_host_root_resolves_inside(layout, resolver):
    root, canary = layout
    before = tree_snapshot(canary)
    with RootFS(str(root)) as fs:
        assert fs.symlink("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so") == "created"
        fs.write_file("/etc/ld.so.conf.d/00-nvshim.conf", b"/usr/lib\n")
        fd = fs.open_dir("/up/sub/new", create=True)
        os.close(fd)
    # "/" in the root is the root: the link landed at its top level.
    assert os.readlink(root / "libcuda.so") == "libcuda.so.1"
    inside = root / str(canary).lstrip("/")
    assert (inside / "00-nvshim.conf").read_bytes() == b"/usr/lib\n"
    assert (inside / "sub/new").is_dir()
    assert tree_snapshot(canary) == before


def test_link_loops_fail_cleanly(layout, resolver):
    root, _ = layout
    with RootFS(str(root)) as fs, pytest.raises(OSError) as err:
        fs.open("/loop1/x", os.O_PATH)
    assert err.value.errno == errno.ELOOP


def test_write_replaces_a_final_symlink_instead_of_following_it(tmp_path, resolver):
    root = tmp_path / "rootfs"
    (root / "etc").mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    os.symlink(str(victim), root / "etc/ld.so.cache")
    with RootFS(str(root)) as fs:
        fs.write_file("/etc/ld.so.cache", b"new\n", mode=0o644)
        assert fs.create_exclusive("/etc/ld.so.cache", b"again") is False
    assert victim.read_text() == "keep\n"
    assert (root / "etc/ld.so.cache").read_bytes() == b"new\n"
    assert not (root / "etc/ld.so.cache").is_symlink()
    assert [p for p in os.listdir(root / "etc") if p.endswith(".tmp")] == []


def test_read_refuses_fifos_and_devices_without_opening_them(tmp_path, resolver):
    root = tmp_path / "rootfs"
    (root / "etc").mkdir(parents=True)
    os.mkfifo(root / "etc/fifo")  # opening it for reading would block forever
    os.mknod(root / "etc/dev", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    (root / "etc/big").write_bytes(b"x" * 100)
    with RootFS(str(root)) as fs:
        assert fs.read("/etc/missing", 10) is None
        assert fs.read("/missing/dir/file", 10) is None
        for name in ("fifo", "dev"):
            with pytest.raises(OSError) as err:
                fs.read(f"/etc/{name}", 1 << 20)
            assert err.value.errno == errno.EINVAL
        with pytest.raises(OSError) as err:
            fs.read("/etc/big", 99)
        assert err.value.errno == errno.EFBIG
        assert fs.read("/etc/big", 100) == b"x" * 100


def test_symlink_outcomes(tmp_path, resolver):
    root = tmp_path / "rootfs"
    (root / "lib").mkdir(parents=True)
    (root / "lib/regular").write_text("image file\n")
    with RootFS(str(root)) as fs:
        assert fs.symlink("a.so.1", "/lib/deep/er/a.so") == "created"
        assert fs.symlink("a.so.1", "/lib/deep/er/a.so") == "exists"
        assert fs.symlink("other", "/lib/deep/er/a.so") == "kept"
        assert fs.symlink("x", "/lib/regular") == "kept"
        with pytest.raises(RootPathError):
            fs.symlink("x", "/")
    assert os.readlink(root / "lib/deep/er/a.so") == "a.so.1"
    assert (root / "lib/regular").read_text() == "image file\n"


def test_create_symlinks_opens_each_directory_once_and_stays_in_the_root(
    tmp_path, resolver, monkeypatch
):
    """Several links in one directory: it is opened once (one walk, not one per link),
    every link lands where the walk from the root puts it (an image's symlinked
    directory is followed inside the root, never to the host), a link whose directory is
    an image's file fails naming the link, and no fd is left open, also when a link
    fails."""
    from nvshim.errors import NvshimError
    from nvshim.hook.symlinks import create_symlinks

    root = tmp_path / "rootfs"
    (root / "usr/lib64").mkdir(parents=True)
    (root / "usr/lib64/libz.so").write_text("image file\n")
    (root / "lib").symlink_to("/usr/lib64")  # the image's: absolute, inside the root
    (root / "usr/lib64/plain").write_text("image file\n")
    walks, real_open_dir = [], RootFS.open_dir

    def open_dir(self, path, *args, **kwargs):
        walks.append(path)
        return real_open_dir(self, path, *args, **kwargs)

    monkeypatch.setattr(RootFS, "open_dir", open_dir)
    before = sorted(os.listdir("/proc/self/fd"))
    specs = [
        "libcuda.so.550::/lib/libcuda.so.1",
        "libcuda.so.1::/lib/libcuda.so",
        "libz.so.1::/lib/libz.so",
        "x.so.1::/lib/x.so",
        "x.so.1::/opt/nv/x.so",
        "libnvidia-ml.so.1::/usr/lib64/libnvidia-ml.so",
    ]
    with RootFS(str(root)) as fs:
        fields = create_symlinks(fs, specs)
        # /lib: once for its four links, once more to swap the image's file out
        assert walks.count("/lib") == 2 and walks.count("/opt/nv") == 1
        with pytest.raises(NvshimError, match="--link y::/lib/plain/y: Not a directory"):
            create_symlinks(fs, ["a::/lib/a", "y::/lib/plain/y"])
    assert sorted(os.listdir("/proc/self/fd")) == before
    assert fields == {"links_created": 5, "links_existing": 0, "links_replaced": "/lib/libz.so"}
    assert os.readlink(root / "usr/lib64/libcuda.so.1") == "libcuda.so.550"
    assert os.readlink(root / "usr/lib64/libcuda.so") == "libcuda.so.1"
    assert os.readlink(root / "usr/lib64/libz.so") == "libz.so.1"
    assert os.readlink(root / "opt/nv/x.so") == "x.so.1"
    assert os.readlink(root / "usr/lib64/libnvidia-ml.so") == "libnvidia-ml.so.1"
    host = "/usr/lib64/libcuda.so.1"
    assert not (os.path.islink(host) and os.readlink(host) == "libcuda.so.550")


def test_mknod_creates_keeps_and_replaces(tmp_path, resolver):
    root = tmp_path / "rootfs"
    (root / "dev").mkdir(parents=True)
    (root / "dev/nvidia1").write_text("planted by the image\n")
    with RootFS(str(root)) as fs:
        assert fs.mknod("/dev/nvidia0", "c", 195, 0, 0o666, 0, 0) == "created"
        assert fs.mknod("/dev/nvidia0", "c", 195, 0, 0o666, 0, 0) == "exists"
        assert fs.mknod("/dev/nvidia1", "c", 195, 1, 0o660, 0, 44) == "replaced"
        assert fs.mknod("/dev/nvidia-caps/nvidia-cap1", "c", 509, 1, 0o400, 0, 0) == "created"
        with pytest.raises(ValueError):
            fs.mknod("/dev/x", "p", 1, 1, 0o600, 0, 0)
    for name, minor, mode, gid in (("nvidia0", 0, 0o666, 0), ("nvidia1", 1, 0o660, 44)):
        st = os.lstat(root / "dev" / name)
        assert stat.S_ISCHR(st.st_mode) and stat.S_IMODE(st.st_mode) == mode
        assert (os.major(st.st_rdev), os.minor(st.st_rdev), st.st_gid) == (195, minor, gid)
    cap = os.lstat(root / "dev/nvidia-caps/nvidia-cap1")
    assert (os.major(cap.st_rdev), os.minor(cap.st_rdev)) == (509, 1)


def test_mountpoint_is_created_with_the_right_type(tmp_path, resolver):
    root = tmp_path / "rootfs"
    root.mkdir()
    (root / "afile").write_text("")
    with RootFS(str(root)) as fs:
        os.close(fs.mountpoint("/usr/lib/libx.so.1", directory=False))
        os.close(fs.mountpoint("/run/nvidia-persistenced", directory=True))
        with pytest.raises(OSError):
            fs.mountpoint("/afile", directory=True)
    assert (root / "usr/lib/libx.so.1").is_file()
    assert (root / "run/nvidia-persistenced").is_dir()


@pytest.mark.parametrize("batch", [False, True], ids=["alone", "directories-kept"])
def test_a_mountpoint_behind_an_image_link_stays_in_the_root(tmp_path, resolver, batch):
    """An image's link at the mount point itself is followed inside the root (as runc's
    own resolution does): to the root's file, never to the host's file of that name."""
    root = tmp_path / "rootfs"
    (root / "usr/lib").mkdir(parents=True)
    (root / "target").mkdir()
    (root / "target/real.so").write_text("")
    host_file = tmp_path / "target/real.so"
    host_file.parent.mkdir()
    host_file.write_text("host\n")
    os.symlink("../../../target/real.so", root / "usr/lib/libclimb.so")  # host: host_file
    os.symlink("/target/real.so", root / "usr/lib/libabs.so")
    opened: dict[str, int] = {}
    with RootFS(str(root)) as fs:
        for name in ("libclimb.so", "libabs.so"):
            fd = fs.mountpoint(f"/usr/lib/{name}", False, opened if batch else None)
            st = os.fstat(fd)
            os.close(fd)
            assert (st.st_dev, st.st_ino) == _identity(root / "target/real.so"), name
        assert len(opened) == int(batch)
        fs.close_opened(opened)
    assert opened == {} and host_file.read_text() == "host\n"


def _identity(path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def test_a_bind_below_a_directory_bound_earlier_lands_in_it(tmp_path):
    """``attach_mounts`` keeps the mount points' directories open from bind to bind,
    but looks them up again once it bound a directory: a later bind below that one goes
    into the bound directory, as runc's would, not under it where nothing sees it."""
    from nvshim.edits import Mount
    from nvshim.hook.apply import attach_mounts, close_mounts, plan_mounts

    root, shared = tmp_path / "rootfs", tmp_path / "host-dir"
    (root / "opt/a").mkdir(parents=True)
    shared.mkdir()
    lib = tmp_path / "libx.so"
    lib.write_text("driver\n")
    binds = [
        Mount(str(lib), "/opt/a/first.so", ("ro", "bind")),
        Mount(str(shared), "/opt/a", ("rw", "bind")),
        Mount(str(lib), "/opt/a/second.so", ("ro", "bind")),
    ]

    def attach():
        planned = plan_mounts(binds)
        try:
            with RootFS(str(root)) as fs:
                assert attach_mounts(fs, planned) == 3
            return sorted(os.listdir(root / "opt/a")), open(root / "opt/a/second.so").read()
        finally:
            close_mounts(planned)

    assert in_private_mount_ns(attach) == {"ok": [["second.so"], "driver\n"]}
    assert sorted(os.listdir(root / "opt/a")) == ["first.so"]  # the image's directory
    assert sorted(os.listdir(shared)) == ["second.so"]  # its mount point, as runc makes it


def test_procfs_magic_links_inside_the_root_are_not_followed(tmp_path, resolver):
    """With a real procfs mounted in the root, ``/proc/self/root`` is a magic link to the
    host's root: openat2 refuses it, the walk reads it as the string "/" (in-root)."""
    root = tmp_path / "rootfs"
    (root / "proc").mkdir(parents=True)
    canary = tmp_path / "canary"
    canary.mkdir()
    before = tree_snapshot(canary)
    os.symlink(f"/proc/self/root{canary}", root / "escape")

    def attempt():
        kernel.mount("proc", str(root / "proc"), "proc", 0)
        outcomes = []
        with RootFS(str(root)) as fs:
            for path in ("/escape/planted", f"/proc/self/root{canary}/planted"):
                try:
                    fs.write_file(path, b"x")
                    outcomes.append("written")
                except OSError as err:
                    outcomes.append(errno.errorcode[err.errno])
        return outcomes

    result = in_private_mount_ns(attempt)
    assert "error" not in result, result
    if resolver == "openat2":
        assert set(result["ok"]) <= {"ELOOP", "EXDEV"}
    else:  # resolved as plain strings inside the root
        assert (root / str(canary).lstrip("/") / "planted").read_bytes() == b"x"
    assert tree_snapshot(canary) == before


def test_swapped_directory_never_leads_outside(tmp_path, resolver):
    """A directory and a symlink to a host canary exchanged in a loop (renameat2
    RENAME_EXCHANGE, another thread) while links and files are written through it."""
    import ctypes

    root = tmp_path / "rootfs"
    lib = root / "usr/lib"
    lib.mkdir(parents=True)
    canary = tmp_path / "canary"
    canary.mkdir()
    (canary / "host-file").write_text("host\n")
    before = tree_snapshot(canary)
    inside = root / str(canary).lstrip("/")
    inside.mkdir(parents=True)
    (root / "usr/lib/gnu").mkdir()
    os.symlink(str(canary), root / "usr/lib/swap")

    libc = ctypes.CDLL(None, use_errno=True)
    stop = threading.Event()
    flips = [0]

    def flipper():
        a, b = os.fsencode(lib / "gnu"), os.fsencode(lib / "swap")
        while not stop.is_set():
            if libc.renameat2(-100, a, -100, b, 2) == 0:  # RENAME_EXCHANGE
                flips[0] += 1

    thread = threading.Thread(target=flipper, daemon=True)
    thread.start()
    try:
        with RootFS(str(root)) as fs:
            for i in range(400):
                for call, arg in (
                    (lambda p: fs.symlink("libcuda.so.1", p), f"/usr/lib/gnu/libcuda{i}.so"),
                    (lambda p: fs.write_file(p, b"x"), f"/usr/lib/gnu/conf{i}"),
                    (lambda p: os.close(fs.open_dir(p, create=True)), f"/usr/lib/gnu/d{i}"),
                ):
                    try:
                        call(arg)
                    except OSError:
                        pass  # a swap in the middle of a walk may fail an operation
    finally:
        stop.set()
        thread.join()
    assert flips[0] > 0
    assert tree_snapshot(canary) == before
    # Both states of the swap were hit: some writes went to the directory, some through
    # the symlink, and those stayed inside the root.
    real = next(p for p in (lib / "gnu", lib / "swap") if not p.is_symlink())
    assert any(n.startswith("libcuda") for n in os.listdir(real))
    assert any(n.startswith("libcuda") for n in os.listdir(inside))
