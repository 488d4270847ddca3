"""nvshim-hook against NVIDIA's real ``nvidia-cdi-hook`` (../shared/nvidia), hook by
hook: both run on twin container roots with real OCI state on stdin (the hook's parent
is the container's init, in a private mount namespace), then the roots are compared:
every file, link target, mode, owner and device number, and the ld.so cache entries in
lookup order. The differences docs/coming-from-nvidia-toolkit.md argues are normalized
here, each by name: the random names of NVIDIA's ld.so.conf.d drop-ins (compared by
content or through the cache), its scratch folder for the params copy, and ldconfig's
aux cache (inode numbers)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from nvshim.hook.appprofile import PROFILE_FILE as PROFILE
from nvshim.ldcache import parse_ld_cache
from tests.compat_util import build_compat_library
from tests.nvidia_toolkit import toolkit_binary
from tests.podman_util import make_busybox_rootfs
from tests.runc_util import (
    HOOK_TEST_ENV,
    build_stub_library,
    make_bundle,
    run_hook_direct,
    tree_snapshot,
    write_hook_config,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="hooks run as root")

LIB = "usr/lib/x86_64-linux-gnu"
EXTRA = "usr/local/nvidia/lib64"
DRIVER = "550.54.15"


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> str:
    """A Debian-like image root with a glibc loader, an ld.so.conf including its
    drop-ins, and driver libraries as the mounts would place them."""
    root = str(tmp_path_factory.mktemp("image") / "rootfs")
    make_busybox_rootfs(root)
    etc = os.path.join(root, "etc")
    os.makedirs(os.path.join(etc, "ld.so.conf.d"))
    for name, text in (
        ("debian_version", "12.0\n"),
        ("ld.so.conf", "include /etc/ld.so.conf.d/*.conf\n"),
        ("ld.so.conf.d/x86_64-linux-gnu.conf", f"/{LIB}\n/lib/x86_64-linux-gnu\n"),
    ):
        with open(os.path.join(etc, name), "w", encoding="utf-8") as fh:
            fh.write(text)
    for folder, name, soname in (
        (LIB, "libcuda", "libcuda.so.1"),
        (LIB, "libnvidia-ml", "libnvidia-ml.so.1"),
        (EXTRA, "libnvidia-extra", "libnvidia-extra.so.1"),
    ):
        build_stub_library(os.path.join(root, folder, f"{name}.so.{DRIVER}"), soname)
    os.makedirs(os.path.join(root, "proc/driver/nvidia"))
    open(os.path.join(root, "proc/driver/nvidia/params"), "w").close()
    return root


class Twin:
    """One side of a comparison: its bundle, root and the hook's result."""

    def __init__(self, base: str, image: str, name: str) -> None:
        self.root = os.path.join(base, name, "rootfs")
        shutil.copytree(image, self.root, symlinks=True)
        self.bundle = make_bundle(os.path.join(base, name), self.root, ["true"])


@pytest.fixture
def twins(tmp_path, image):
    config, log = write_hook_config(tmp_path / "nvshim")
    ours, theirs = Twin(str(tmp_path), image, "ours"), Twin(str(tmp_path), image, "theirs")
    return ours, theirs, {**HOOK_TEST_ENV, "NVSHIM_CONFIG": config}


def run_pair(launchers, twins, argv: list[str], *, form: str = "cdi-hook"):
    """Run NVIDIA's hook on one twin and nvshim-hook on the other with the same hook
    line (``form``: ``cdi-hook`` or ``ctk``, NVIDIA's ``nvidia-ctk hook NAME``)."""
    ours, theirs, env = twins
    ctk = ["hook"] if form == "ctk" else []
    nvidia = toolkit_binary("nvidia-ctk" if form == "ctk" else "nvidia-cdi-hook")
    got_theirs = run_hook_direct([*as_mounted(theirs), nvidia, *ctk, *argv], theirs.bundle)
    got_ours = run_hook_direct(
        [*as_mounted(ours), f"{launchers}/nvshim-hook", *ctk, *argv], ours.bundle, env=env
    )
    return got_ours, got_theirs


def as_mounted(twin: Twin) -> list[str]:
    """A command prefix that bind-mounts the root on itself first, as runc has it when
    hooks run (NVIDIA's update-ldcache pivots into it: only a mount point will do)."""
    return ["/bin/sh", "-c", 'mount --bind "$0" "$0" && exec "$@"', twin.root]


def normalized(root: str) -> dict[str, tuple]:
    """The root's snapshot with the argued differences taken out (module docstring)."""
    out = {}
    for rel, (mode, uid, gid, size, rdev, _dev, extra) in tree_snapshot(root).items():
        folder, name = os.path.split(rel)
        if rel == "run" or rel.startswith("run/nvidia-ctk-hook"):
            continue  # NVIDIA's scratch folders (the image has no /run)
        if rel == "var/cache/ldconfig/aux-cache":
            continue
        if folder == "etc/ld.so.conf.d" and (
            name.startswith(("00-nvcr-", "zz-nvcr-")) or name == "00-nvshim.conf"
        ):
            continue  # what they make visible is compared through the cache
        if rel == "etc/ld.so.cache":
            continue
        if folder == "etc/ld.so.conf.d" and name.startswith("00-compat-"):
            rel = "etc/ld.so.conf.d/00-compat-*.conf"
        out[rel] = (mode, uid, gid, size, rdev, extra)
    return out


def cache_entries(root: str) -> list[tuple[str, str, int]]:
    path = os.path.join(root, "etc/ld.so.cache")
    if not os.path.exists(path):
        return []
    with open(path, "rb") as fh:
        return [(e.name, e.path, e.flags) for e in parse_ld_cache(fh.read())]


def assert_same(twins) -> None:
    ours, theirs, _ = twins
    a, b = normalized(ours.root), normalized(theirs.root)
    diff = {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}
    assert not diff, diff
    assert cache_entries(ours.root) == cache_entries(theirs.root)


def both_ok(got_ours, got_theirs) -> None:
    assert got_theirs.returncode == 0, got_theirs.stderr
    assert got_ours.returncode == 0, got_ours.stderr


@pytest.mark.parametrize("form", ["cdi-hook", "ctk"])
def test_create_symlinks(launchers, twins, form):
    ours, theirs, _ = twins
    for twin in (ours, theirs):  # what an image may already hold at the link paths
        os.symlink("elsewhere", os.path.join(twin.root, LIB, "libnvidia-ml.so"))
        with open(os.path.join(twin.root, LIB, "libcuda.so.1"), "w") as fh:
            fh.write("an image's own file\n")
        os.symlink(f"libcuda.so.{DRIVER}", os.path.join(twin.root, LIB, "libcuda.so.2"))
    links = [
        f"libcuda.so.{DRIVER}::/{LIB}/libcuda.so.1",
        f"libcuda.so.{DRIVER}::/{LIB}/libcuda.so.2",
        f"libnvidia-ml.so.{DRIVER}::/{LIB}/libnvidia-ml.so",
        "libcuda.so.1::/usr/lib/new/deeper/libcuda.so",
        f"/{LIB}/libcuda.so.1::/usr/lib/absolute.so",
        "libcuda.so.1::/usr/lib/new/deeper/libcuda.so",
    ]
    argv = ["create-symlinks", *[w for link in links for w in ("--link", link)]]
    both_ok(*run_pair(launchers, twins, argv, form=form))
    assert os.readlink(os.path.join(ours.root, LIB, "libcuda.so.1")) == f"libcuda.so.{DRIVER}"
    assert_same(twins)


def test_chmod(launchers, twins):
    ours, theirs, _ = twins
    for twin in (ours, theirs):
        os.makedirs(os.path.join(twin.root, "dev/dri"), mode=0o700)
        os.chmod(os.path.join(twin.root, "dev/dri"), 0o700)
        os.chmod(os.path.join(twin.root, "etc/passwd"), 0o600)
    argv = ["chmod", "--mode", "755", "--path", "/dev/dri", "--path", "etc/passwd"]
    argv += ["--path", "/no/such/path", "--path", "/bin"]
    both_ok(*run_pair(launchers, twins, argv))
    assert os.stat(os.path.join(ours.root, "dev/dri")).st_mode & 0o7777 == 0o755
    assert_same(twins)


@pytest.mark.parametrize("form", ["cdi-hook", "ctk"])
def test_update_ldcache(launchers, twins, form):
    argv = ["update-ldcache", "--folder", f"/{LIB}", "--folder", f"/{EXTRA}"]
    both_ok(*run_pair(launchers, twins, argv, form=form))
    ours = twins[0]
    names = {name: path for name, path, _ in cache_entries(ours.root)}
    assert names["libnvidia-extra.so.1"] == f"/{EXTRA}/libnvidia-extra.so.1"
    assert names["libcuda.so.1"] == f"/{LIB}/libcuda.so.1"
    assert_same(twins)


# (compat library version, note: (CUDA, driver majors) or None, hook flags, used)
HOST = f"--host-driver-version={DRIVER}"
COMPAT_CASES = [
    ("570.86.10", ("12.8", [535, 550]), [HOST], True),  # newer, host major listed
    ("570.86.10", ("12.8", [535, 560]), [HOST], False),  # host major not listed
    ("535.104.05", ("12.2", [535, 550]), [HOST], False),  # older than the host's
    ("570.86.10", None, [HOST], True),  # no note: a newer major
    ("550.90.07", None, [HOST], False),  # no note: the same major
    ("570.86.10", ("12.8", [550]), ["--host-cuda-version=12.4"], True),  # CUDA only
    ("570.86.10", ("12.8", [550]), ["--host-cuda-version=12.8"], False),
    ("570.86.10", None, [HOST, "--host-cuda-version=12.4"], False),  # no note, CUDA given
]


@pytest.mark.parametrize("compat, note, flags, used", COMPAT_CASES)
def test_enable_cuda_compat_then_update_ldcache(launchers, twins, compat, note, flags, used):
    """The hooks as a spec lists them: enable-cuda-compat, then update-ldcache; the
    image's /usr/local/cuda is a link to the versioned folder, as in CUDA images."""
    ours, theirs, _ = twins
    for twin in (ours, theirs):
        cuda, drivers = note or (None, None)
        build_compat_library(twin.root, compat, cuda, drivers, folder="usr/local/cuda-12.8/compat")
        os.symlink("cuda-12.8", os.path.join(twin.root, "usr/local/cuda"))
    both_ok(*run_pair(launchers, twins, ["enable-cuda-compat", *flags]))
    argv = ["update-ldcache", "--folder", f"/{LIB}", "--folder", f"/{EXTRA}"]
    both_ok(*run_pair(launchers, twins, argv))
    first = next(path for name, path, _ in cache_entries(ours.root) if name == "libcuda.so.1")
    assert first == ("/usr/local/cuda-12.8/compat/libcuda.so.1" if used else f"/{LIB}/libcuda.so.1")
    assert_same(twins)


def test_enable_cuda_compat_needs_exactly_one_library(launchers, twins):
    ours, theirs, _ = twins
    for twin in (ours, theirs):
        build_compat_library(twin.root, "570.86.10", "12.8", [550])
        build_compat_library(twin.root, "575.51.03", "12.9", [550])
    both_ok(*run_pair(launchers, twins, ["enable-cuda-compat", HOST]))
    assert not [n for n in os.listdir(os.path.join(ours.root, "etc/ld.so.conf.d")) if "compat" in n]
    assert_same(twins)


def test_enable_cuda_compat_is_a_no_op_without_versions(launchers, twins):
    ours, theirs, _ = twins
    for twin in (ours, theirs):
        build_compat_library(twin.root, "570.86.10", "12.8", [550])
    both_ok(*run_pair(launchers, twins, ["enable-cuda-compat"]))
    assert not [n for n in os.listdir(os.path.join(ours.root, "etc/ld.so.conf.d")) if "compat" in n]
    assert_same(twins)


def test_update_application_profile(launchers, twins):
    ours, theirs, _ = twins
    for twin in (ours, theirs):
        dev = os.path.join(twin.root, "dev")
        for name, minor in (("nvidia0", 0), ("nvidia3", 3), ("nvidiactl", 255)):
            os.mknod(os.path.join(dev, name), 0o666 | 0o020000, os.makedev(195, minor))
        os.symlink("nvidia3", os.path.join(dev, "nvidia5"))
        open(os.path.join(dev, "nvidia7"), "w").close()
    both_ok(*run_pair(launchers, twins, ["update-application-profile"]))
    profile = os.path.join(ours.root, PROFILE.lstrip("/"))
    with open(profile, encoding="utf-8") as fh:
        assert '"EGLVisibleDGPUDevices",0x9]' in fh.read()
    assert_same(twins)


@pytest.mark.parametrize("modify", ["1", "0"])
def test_disable_device_node_modification(launchers, twins, tmp_path, modify):
    """Both read the host's /proc/driver/nvidia/params: a tmpfs over /proc/driver in the
    private mount namespace the hooks run in holds a driver's file there."""
    ours, theirs, env = twins
    host_params = tmp_path / "params"
    host_params.write_text(f"ResmanDebugLevel: 4294967295\nModifyDeviceFiles: {modify}\n")
    seen = {}
    for twin, binary in ((theirs, toolkit_binary("nvidia-cdi-hook")), (ours, None)):
        setup = (
            "mount -t tmpfs tmpfs /proc/driver && mkdir /proc/driver/nvidia && "
            f"cp {host_params} /proc/driver/nvidia/params && "
        )
        hook = binary or f"{launchers}/nvshim-hook"
        script = setup + f'"$@"; rc=$?; cat {twin.root}/proc/driver/nvidia/params; exit $rc'
        got = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", script, "sh"]
            + ["/bin/sh", "-c", _state_pipe(twin.bundle), "sh", hook]
            + ["disable-device-node-modification"],
            env=env if binary is None else HOOK_TEST_ENV,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert got.returncode == 0, got.stderr
        seen[binary is None] = got.stdout
    assert seen[True] == seen[False]
    want = "ModifyDeviceFiles: 0" if modify == "1" else ""
    assert (want in seen[True]) if want else seen[True] == ""
    assert_same(twins)


def _state_pipe(bundle: str) -> str:
    """Shell that pipes the OCI state naming the shell itself as init into ``$@``."""
    head = f'{{"ociVersion":"1.0.2","id":"diff","status":"creating","bundle":"{bundle}","pid":'
    return f"printf '%s%s}}' '{head}' \"$$\" | \"$@\""
