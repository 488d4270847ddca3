"""Unit tests for the parsers discovery relies on: ld.so.cache, /proc/devices, mig-minors,
CUDA versions, MIG profile names, root-relative paths, runc argv."""

import os
import re
import struct
import subprocess

import pytest

from nvshim.host.nvml import cuda_version_text, mig_profile
from nvshim.host.procfs import parse_mig_minors, parse_proc_devices
from nvshim.host.rootpath import container_path, host_path, resolve_in_root
from nvshim.ldcache import LdCacheError, parse_ld_cache
from nvshim.runtime.args import parse_runc_args

MIB = 1024 * 1024


def _stub(tmp_path, directory, soname, filename):
    src = tmp_path / "stub.c"
    src.write_text("int nvshim_stub_symbol(void) { return 0; }\n")
    os.makedirs(directory, exist_ok=True)
    subprocess.run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            "-nostdlib",
            f"-Wl,-soname,{soname}",
            "-o",
            os.path.join(directory, filename),
            str(src),
        ],
        check=True,
    )


@pytest.fixture(scope="module")
def ld_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("ldroot")
    libdir = root / "usr/lib/x86_64-linux-gnu"
    _stub(root, libdir, "libcuda.so.1", "libcuda.so.550.90.12")
    _stub(root, libdir, "libnvidia-ml.so.1", "libnvidia-ml.so.550.90.12")
    (root / "etc").mkdir()
    (root / "etc/ld.so.conf").write_text("/usr/lib/x86_64-linux-gnu\n")
    subprocess.run(["ldconfig", "-r", str(root)], check=True)
    return root


def test_ld_cache_matches_real_ldconfig(ld_root):
    cache = ld_root / "etc/ld.so.cache"
    entries = parse_ld_cache(cache.read_bytes())
    listed = subprocess.run(
        ["ldconfig", "-p", "-C", str(cache)], check=True, capture_output=True, text=True
    ).stdout
    expected = re.findall(r"^\s+(\S+) \(.*\) => (\S+)$", listed, re.M)
    assert [(e.name, e.path) for e in entries] == expected
    assert ("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1") in expected
    assert {e.arch for e in entries} == {"x86_64"}


def test_ld_cache_of_this_machine_points_at_existing_files():
    entries = parse_ld_cache(open("/etc/ld.so.cache", "rb").read())
    assert len(entries) > 10
    assert all(os.path.exists(e.path) for e in entries)


@pytest.mark.parametrize(
    "data, message",
    [
        (b"", "bad magic"),
        (b"not a cache at all, really not", "bad magic"),
        (b"glibc-ld.so.cache1.1" + struct.pack("<II", 5, 0), "truncated header"),
        (b"glibc-ld.so.cache1.1" + struct.pack("<IIB3xI12x", 1000, 0, 0, 0), "file too short"),
    ],
)
def test_ld_cache_rejects_garbage(data, message):
    with pytest.raises(LdCacheError, match=message):
        parse_ld_cache(data)


def test_ld_cache_string_offset_out_of_range(ld_root):
    data = bytearray((ld_root / "etc/ld.so.cache").read_bytes())
    # first entry's key offset (header 48 bytes, then flags) -> far beyond the file
    struct.pack_into("<I", data, 48 + 4, 10**8)
    with pytest.raises(LdCacheError, match="out of range"):
        parse_ld_cache(bytes(data))


PROC_DEVICES = """Character devices:
  1 mem
  4 /dev/vc/0
195 nvidia-frontend
195 nvidia
508 nvidia-uvm
509 nvidia-caps

Block devices:
  8 sd
259 blkext
"""


def test_proc_devices():
    majors = parse_proc_devices(PROC_DEVICES)
    assert majors["nvidia-uvm"] == 508
    assert majors["nvidia-caps"] == 509
    assert majors["nvidia-frontend"] == 195
    assert "sd" not in majors  # block devices are not char majors


def test_proc_devices_bad_line():
    with pytest.raises(ValueError, match="bad /proc/devices line"):
        parse_proc_devices("Character devices:\n  x nvidia\n")


def test_mig_minors():
    text = "config 1\nmonitor 2\ngpu0/gi0/access 3\ngpu0/gi0/ci0/access 4\ngpu1/gi2/access 156\n"
    text += "gpu1/gi2/ci0/access 157\n"
    mm = parse_mig_minors(text)
    assert (mm.config, mm.monitor) == (1, 2)
    assert mm.gi[(1, 2)] == 156
    assert mm.ci[(1, 2, 0)] == 157
    assert mm.gi[(0, 0)] == 3 and mm.ci[(0, 0, 0)] == 4


@pytest.mark.parametrize(
    "line", ["gpu0/gi0/access", "gpuX/gi0/access 3", "gpu0/gi0/ci0/foo 4", "gpu0/xx/access 3"]
)
def test_mig_minors_bad(line):
    with pytest.raises(ValueError, match="bad mig-minors line"):
        parse_mig_minors(line)


@pytest.mark.parametrize("value, text", [(12040, "12.4"), (11080, "11.8"), (13000, "13.0")])
def test_cuda_version_text(value, text):
    assert cuda_version_text(value) == text


@pytest.mark.parametrize(
    "gi, ci, mib, parent_mib, name",
    [
        (1, 1, 4864, 40960, "1g.5gb"),  # A100 40GB all-1g.5gb
        (1, 1, 9856, 81559, "1g.10gb"),  # H100 80GB
        (2, 2, 19968, 81559, "2g.20gb"),
        (3, 3, 40192, 81559, "3g.40gb"),
        (7, 7, 80896, 81559, "7g.80gb"),
        (2, 1, 19968, 81559, "1c.2g.20gb"),
    ],
)
def test_mig_profile(gi, ci, mib, parent_mib, name):
    assert mig_profile(gi, ci, mib, parent_mib * MIB) == name


def test_root_paths(tmp_path):
    root = str(tmp_path)
    assert host_path("/", "/usr/lib/x") == "/usr/lib/x"
    assert host_path(root, "/usr/lib/x") == f"{root}/usr/lib/x"
    assert container_path(root, f"{root}/usr/lib/x") == "/usr/lib/x"
    with pytest.raises(ValueError):
        container_path(root, "/elsewhere/x")


def test_resolve_in_root_keeps_absolute_links_inside(tmp_path):
    (tmp_path / "usr/lib").mkdir(parents=True)
    (tmp_path / "usr/lib/libreal.so.1.2").write_text("x")
    os.symlink("/usr/lib/libreal.so.1.2", tmp_path / "usr/lib/libabs.so.1")
    os.symlink("libabs.so.1", tmp_path / "usr/lib/librel.so")
    os.symlink("/etc/passwd", tmp_path / "usr/lib/escape")
    assert resolve_in_root(str(tmp_path), "/usr/lib/librel.so") == "/usr/lib/libreal.so.1.2"
    # an absolute target means the root's /etc/passwd, not the host's
    assert resolve_in_root(str(tmp_path), "/usr/lib/escape") == "/etc/passwd"
    os.symlink("loop2", tmp_path / "loop1")
    os.symlink("loop1", tmp_path / "loop2")
    with pytest.raises(OSError):
        resolve_in_root(str(tmp_path), "/loop1")
    # with a memo shared between calls (one discovery): the same answers, each path read once
    seen: dict = {}
    for _ in range(2):
        assert resolve_in_root(str(tmp_path), "/usr/lib/librel.so", seen) == (
            "/usr/lib/libreal.so.1.2"
        )
        assert resolve_in_root(str(tmp_path), "/usr/lib/escape", seen) == "/etc/passwd"
        with pytest.raises(OSError):
            resolve_in_root(str(tmp_path), "/loop1", seen)
    assert seen["/usr/lib"] is None
    assert seen["/usr/lib/librel.so"] == "libabs.so.1"


@pytest.mark.parametrize(
    "argv, command, bundle, cid, log",
    [
        (
            [
                "--root",
                "/r",
                "--log",
                "/l.json",
                "--log-format",
                "json",
                "create",
                "--bundle",
                "/b",
                "--pid-file",
                "/p",
                "c1",
            ],
            "create",
            "/b",
            "c1",
            "/l.json",
        ),
        (["--root=/r", "run", "-b", "/b", "--detach", "c2"], "run", "/b", "c2", None),
        (["--systemd-cgroup", "create", "--bundle=/b", "c3"], "create", "/b", "c3", None),
        (["--root", "create", "state", "c4"], "state", None, None, None),  # a value named create
        (["delete", "--force", "c5"], "delete", None, "c5", None),  # delete names its container
        (["--version"], None, None, None, None),
    ],
)
def test_runc_args(argv, command, bundle, cid, log):
    args = parse_runc_args(argv)
    assert (args.command, args.bundle, args.container_id, args.log) == (command, bundle, cid, log)
