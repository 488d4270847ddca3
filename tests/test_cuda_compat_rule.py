"""The forward-compat rule's parts on their own: versions as NVIDIA's hook parses them,
the decision table of its cudacompat package, the ELF note (real libraries built with
gcc), and which files in the image's compat folder count (regular files only; a FIFO or
a link is never opened)."""

from __future__ import annotations

import os

import pytest

from nvshim.hook.cudacompat import (
    CompatNote,
    find_library,
    parse_version,
    read_note,
    use_compat,
)
from nvshim.rootfs.fsroot import RootFS
from tests.compat_util import build_compat_library
from tests.runc_util import build_stub_library


@pytest.mark.parametrize(
    "text, want",
    [
        ("550.90.12", (550, 90, 12, ())),
        ("535.104.05", (535, 104, 5, ())),
        ("v12.8", (12, 8, 0, ())),
        ("570", (570, 0, 0, ())),
        ("1.2.3-rc1+meta", (1, 2, 3, ("rc1",))),
        ("550.90.12.1", None),
        ("", None),
        ("abc", None),
        ("1.-2", None),
    ],
)
def test_parse_version(text, want):
    assert parse_version(text) == want


NOTE = CompatNote("12.8", (535, 550))


@pytest.mark.parametrize(
    "compat, note, driver, cuda, used",
    [
        ("570.86.10", NOTE, "550.90.12", "", True),
        ("570.86.10", NOTE, "560.28.03", "", False),  # 560 not listed
        ("550.90.07", NOTE, "550.90.12", "", False),  # not newer
        ("570.86.10", NOTE, "", "12.4", True),  # no driver: the note's CUDA against the host's
        ("570.86.10", NOTE, "", "12.8", False),
        ("570.86.10", NOTE, "550.90.12.1", "12.4", True),  # unparsable driver: CUDA decides
        ("570.86.10", None, "550.90.12", "", True),  # no note: a newer major
        ("570.86.10", None, "550.90.12", "12.4", False),  # no note, a CUDA version given
        ("550.99.99", None, "550.90.12", "", False),  # no note, the same major
        ("570.86.10", NOTE, "", "", False),  # nothing to compare with
    ],
)
def test_the_decision_table(compat, note, driver, cuda, used):
    assert use_compat(compat, note, driver, cuda) is used


def test_the_note_of_a_real_library(tmp_path):
    noted = build_compat_library(tmp_path, "570.86.10", "12.8", [535, 550])
    plain = build_compat_library(tmp_path / "plain", "570.86.10")
    for path, want in ((noted, NOTE), (plain, None)):
        fd = os.open(path, os.O_RDONLY)
        try:
            assert read_note(fd) == want
        finally:
            os.close(fd)


def test_only_one_regular_library_counts(tmp_path):
    root = tmp_path / "root"
    compat = root / "usr/local/cuda/compat"
    build_compat_library(root, "570.86.10", "12.8", [535, 550])
    os.symlink("libcuda.so.570.86.10", compat / "libcuda.so.1")  # not *.*: ignored
    os.symlink("libcuda.so.570.86.10", compat / "libcuda.so.570.86")  # a link: ignored
    os.mkfifo(compat / "libcuda.so.575.1")  # a FIFO: ignored, never opened
    with RootFS(str(root)) as fs:
        found = find_library(fs, "/usr/local/cuda/compat")
        assert found is not None and (found.version, found.note) == ("570.86.10", NOTE)
        assert found.folder == "/usr/local/cuda/compat"
    build_stub_library(compat / "libcuda.so.575.51.03", "libcuda.so.1")
    with RootFS(str(root)) as fs:
        assert find_library(fs, "/usr/local/cuda/compat") is None  # two: NVIDIA uses neither


def test_the_folder_resolves_inside_the_root(tmp_path):
    root = tmp_path / "root"
    build_compat_library(root, "570.86.10", "12.8", [550], folder="usr/local/cuda-12.8/compat")
    os.symlink("/usr/local/cuda-12.8", root / "usr/local/cuda")  # absolute: within the root
    with RootFS(str(root)) as fs:
        found = find_library(fs, "/usr/local/cuda/compat")
    assert found is not None and found.folder == "/usr/local/cuda-12.8/compat"
