"""NVIDIA's own CDI spec with nvshim-hook as its hook, end to end: NVIDIA's real
``nvidia-ctk cdi generate`` on the simulated host (as the device plugin writes its spec,
``--nvidia-cdi-hook-path`` naming nvshim-hook), consumed by podman's CDI support and run
by real runc, in both call forms (``nvshim-hook NAME``, ``nvidia-ctk hook NAME``). The
same spec with NVIDIA's real ``nvidia-cdi-hook`` runs on a twin image, and the two
images are compared as tests/test_hook_nvidia_diff.py compares them. The image carries
a newer CUDA compat library: both use it."""

from __future__ import annotations

import os
import subprocess

import pytest
import yaml

from tests.compat_util import build_compat_library
from tests.nvidia_toolkit import toolkit_binary
from tests.podman_util import make_busybox_rootfs, podman_run
from tests.runc_util import write_hook_config
from tests.test_hook_nvidia_diff import cache_entries, normalized

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="podman runs as root here")

SHOW = "ls /dev; cat /etc/nvidia/nvidia-application-profiles-rc.d/10-container.conf"


# NVIDIA's update-ldcache's system folders for an image that is not Debian-like (amd64)
STANDARD = {"/lib", "/usr/lib", "/lib64", "/usr/lib64", "/libx32", "/usr/libx32"}


def first_paths(rootfs: str) -> dict[str, str]:
    """What each name in the image's ld.so cache resolves to (its first entry)."""
    out: dict[str, str] = {}
    for name, path, _ in cache_entries(rootfs):
        out.setdefault(name, path)
    return out


def wrapper(path, launchers: str, config: str) -> str:
    """``path``: a script running nvshim-hook with the test's config (the spec's hooks
    carry no env, and the default config's log is the host's)."""
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(f'#!/bin/sh\nNVSHIM_CONFIG={config} exec {launchers}/nvshim-hook "$@"\n')
    os.chmod(path, 0o755)
    return str(path)


def nvidia_spec(sim, hook_path: str, cdi_dir) -> None:
    """NVIDIA's generator's spec for the simulated host, its hooks running ``hook_path``."""
    cdi_dir.mkdir(parents=True)
    got = subprocess.run(
        [toolkit_binary("nvidia-ctk"), "cdi", "generate", "--driver-root", sim.driver_root,
         "--dev-root", sim.dev_root, "--nvidia-cdi-hook-path", hook_path,
         "--output", str(cdi_dir / "nvidia.yaml")],
        env={"PATH": os.environ["PATH"], **sim.nvml_env()},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert got.returncode == 0, got.stderr


def gpu_image(path) -> str:
    rootfs = make_busybox_rootfs(path)
    build_compat_library(rootfs, "570.86.10", "12.8", [535, 550])
    return rootfs


@pytest.mark.parametrize("name", ["nvshim-hook", "nvidia-ctk"])
def test_nvidia_spec_runs_with_nvshim_hook_as_with_nvidia_cdi_hook(
    sim_hosts, launchers, tmp_path, name
):
    sim = sim_hosts("single")
    config, log = write_hook_config(tmp_path / "cfg", dev_root=sim.dev_root)
    (tmp_path / "bin").mkdir()
    ours = tmp_path / "ours"
    nvidia_spec(sim, wrapper(tmp_path / "bin" / name, launchers, config), ours / "cdi")
    spec = yaml.safe_load((ours / "cdi" / "nvidia.yaml").read_text())
    hooks = [h["args"] for h in spec["containerEdits"]["hooks"]]
    skip = 2 if name == "nvidia-ctk" else 1
    assert all(h[:skip] == ([name, "hook"] if skip == 2 else [name]) for h in hooks)
    assert {"enable-cuda-compat", "update-application-profile"} <= {h[skip] for h in hooks}
    theirs = tmp_path / "theirs"
    nvidia_spec(sim, toolkit_binary("nvidia-cdi-hook"), theirs / "cdi")

    results = {}
    for side in (ours, theirs):
        rootfs = gpu_image(side / "rootfs")
        run = ["--device", "nvidia.com/gpu=0", "--", "/bin/sh", "-c", SHOW]
        got = podman_run(side, rootfs, run, cdi_dir=str(side / "cdi"))
        assert got.returncode == 0, got.stdout + got.stderr
        results[side] = (got.stdout, rootfs)
    out, rootfs = results[ours]
    assert "nvidia0" in out.split() and '"EGLVisibleDGPUDevices",0x1]' in out
    assert out == results[theirs][0]
    first = next(p for n, p, _ in cache_entries(rootfs) if n == "libcuda.so.1")
    assert first == "/usr/local/cuda/compat/libcuda.so.1"
    # a non-Debian image: NVIDIA's update-ldcache also caches the image's standard folders
    # (its zz-nvcr-*.conf); nvshim leaves them to the loader's own search (docs/cdi-hook.md)
    mine, reference = first_paths(rootfs), first_paths(results[theirs][1])
    assert mine == {name: reference[name] for name in mine}
    extra = {path for name, path in reference.items() if name not in mine}
    assert all(os.path.dirname(p) in STANDARD for p in extra), extra
    a, b = normalized(rootfs), normalized(results[theirs][1])
    assert {k for k in set(a) | set(b) if a.get(k) != b.get(k)} == set()
    with open(log, encoding="utf-8") as fh:
        assert "cuda_compat" in fh.read()  # nvshim-hook did the work, and logged it
