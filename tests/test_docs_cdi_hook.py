"""docs/cdi-hook.md's examples and docs/commands.md's ``nvshim-hook`` examples, run as
written (one shell, in order, ``state.json`` in its working directory naming a bundle
whose image carries driver libraries, a GPU node and a newer CUDA compat library), then
what each did is checked in the image."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from nvshim.hook.cudacompat import CONF_FILE
from nvshim.ldcache import parse_ld_cache
from tests.compat_util import build_compat_library
from tests.conftest import REPO
from tests.docs_commands import page_commands
from tests.podman_util import make_busybox_rootfs
from tests.runc_util import (
    HOOK_TEST_ENV,
    build_stub_library,
    make_bundle,
    read_log,
    write_hook_config,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="hooks run as root")

LIB = "usr/lib/x86_64-linux-gnu"


def hook_lines(page: str) -> list[str]:
    """The ``nvshim-hook`` commands of the page, as tests/docs_commands.py reads them."""
    path = os.path.join(REPO, "docs", page)
    return [c.text for c in page_commands(path) if c.text.startswith("nvshim-hook ")]


def test_the_examples_run_as_written(tmp_path, launchers):
    page, commands = hook_lines("cdi-hook.md"), hook_lines("commands.md")
    assert len(page) == 6 and len(commands) == 3
    rootfs = make_busybox_rootfs(tmp_path / "rootfs")
    build_stub_library(os.path.join(rootfs, LIB, "libcuda.so.550.90.12"), "libcuda.so.1")
    build_compat_library(rootfs, "570.86.10", "12.8", [550])
    os.mknod(os.path.join(rootfs, "dev/nvidia0"), 0o666 | 0o020000, os.makedev(195, 0))
    os.makedirs(os.path.join(rootfs, "dev/dri"), mode=0o700)
    os.chmod(os.path.join(rootfs, "dev/dri"), 0o700)
    bundle = make_bundle(tmp_path, rootfs, ["true"])
    config, log = write_hook_config(tmp_path / "cfg")
    work = tmp_path / "work"
    work.mkdir()
    state = f'{{"ociVersion":"1.0.2","id":"docs","status":"creating","bundle":"{bundle}","pid":'
    script = [f"printf '%s%s}}' '{state}' \"$$\" > state.json"]
    script += [f'{line}; echo "rc=$?"' for line in page + commands]
    env = {**HOOK_TEST_ENV, "NVSHIM_CONFIG": config}
    env["PATH"] = f"{launchers}:{env['PATH']}"
    got = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", "\n".join(script)],
        cwd=work, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert re.findall(r"rc=(\d+)", got.stdout) == ["0"] * 9, got.stdout + got.stderr
    assert os.readlink(os.path.join(rootfs, LIB, "libcuda.so")) == "libcuda.so.1"
    with open(os.path.join(rootfs, CONF_FILE.lstrip("/"))) as fh:
        assert fh.read() == "/usr/local/cuda/compat\n"
    with open(os.path.join(rootfs, "etc/ld.so.cache"), "rb") as fh:
        entries = parse_ld_cache(fh.read())
    first = next(e.path for e in entries if e.name == "libcuda.so.1")
    assert first == "/usr/local/cuda/compat/libcuda.so.1"
    assert os.stat(os.path.join(rootfs, "dev/dri")).st_mode & 0o7777 == 0o755
    profile = "etc/nvidia/nvidia-application-profiles-rc.d/10-container.conf"
    with open(os.path.join(rootfs, profile)) as fh:
        assert '"EGLVisibleDGPUDevices",0x1]' in fh.read()
    records = read_log(log)
    compat = [r["cuda_compat"] for r in records if r.get("step") == "enable-cuda-compat"]
    assert compat == ["570.86.10", "570.86.10"]
    ldcache = [r["ldcache"] for r in records if r.get("step") == "update-ldcache"]
    assert ldcache == ["updated", "skipped-reachable"]  # the second finds it done
