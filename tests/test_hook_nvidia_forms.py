"""NVIDIA's CDI hook command lines as nvshim-hook reads them: the ``nvidia-ctk hook
NAME`` form, NVIDIA's global flags, its flag spellings, ``--container-spec``, the
``.real`` ldconfig rule, and where nvshim-hook differs on purpose (an unknown hook name
fails; chmod stays inside the root where NVIDIA's follows a link out of it)."""

from __future__ import annotations

import os

import pytest

from nvshim.errors import NvshimError
from nvshim.hook import ldconfig
from nvshim.hook.args import parse_args
from nvshim.hook.steps import real_ldconfig
from tests.nvidia_toolkit import toolkit_binary
from tests.podman_util import make_busybox_rootfs
from tests.runc_util import (
    HOOK_TEST_ENV,
    make_bundle,
    read_log,
    run_hook_direct,
    write_hook_config,
)


@pytest.mark.parametrize(
    "argv",
    [
        ["hook", "update-ldcache", "--ldconfig-path", "/sbin/ldconfig", "--folder", "/a"],
        ["-d", "update-ldcache", "--ldconfig-path=/sbin/ldconfig", "--folder=/a"],
        [
            "--quiet",
            "hook",
            "update-ldcache",
            "--debug",
            "--ldconfig",
            "/sbin/ldconfig",
            "--folder",
            "/a",
        ],  # noqa: E501
    ],
)
def test_nvidia_forms_parse_to_the_same_step(argv):
    args = parse_args(argv)
    assert (args.command, args.folder, args.ldconfig) == (
        "update-ldcache",
        ["/a"],
        "/sbin/ldconfig",
    )


def test_nvidia_flags_of_the_new_hooks():
    compat = ["--cuda-compat-container-root", "/opt/compat", "--container-spec", "-"]
    args = parse_args(["enable-cuda-compat", "--host-driver-version=550.90.12", *compat])
    assert args.host_driver_version == "550.90.12" and args.container_spec == "-"
    assert args.cuda_compat_container_root == "/opt/compat"
    args = parse_args(["chmod", "--mode", "755", "--path", "/dev/dri", "--path=/x"])
    assert (args.mode, args.path) == ("755", ["/dev/dri", "/x"])


def test_an_unknown_hook_name_fails_closed():
    with pytest.raises(NvshimError, match="no such step 'future-hook'"):
        parse_args(["hook", "future-hook"])


def test_real_ldconfig_rule(tmp_path, monkeypatch):
    plain = tmp_path / "ldconfig"
    plain.write_text("")
    assert real_ldconfig(str(plain)) == str(plain)
    (tmp_path / "ldconfig.real").write_text("")
    assert real_ldconfig(str(plain)) == str(plain) + ".real"
    assert real_ldconfig(str(plain) + ".real") == str(plain) + ".real"
    monkeypatch.setattr(ldconfig, "HOST_LDCONFIG", (str(tmp_path / "none"), str(plain)))
    assert real_ldconfig(None) == str(plain) + ".real"  # the first default with one
    monkeypatch.setattr(ldconfig, "HOST_LDCONFIG", (str(tmp_path / "none"),))
    assert real_ldconfig(None) is None  # the defaults as they are


def test_container_spec_file_instead_of_stdin(tmp_path, launchers):
    config, _ = write_hook_config(tmp_path / "cfg")
    rootfs = make_busybox_rootfs(tmp_path / "rootfs")
    bundle = make_bundle(tmp_path, rootfs, ["true"])
    state = tmp_path / "state.json"
    state.write_text(f'{{"id":"spec","pid":{os.getpid()},"bundle":"{bundle}"}}')
    argv = [f"{launchers}/nvshim-hook", "create-symlinks", "--config", config,
            "--container-spec", str(state), "--link", "busybox::/bin/from-spec"]  # fmt: skip
    got = run_hook_direct(["/bin/sh", "-c", 'exec "$@" </dev/null', "sh", *argv], bundle)
    assert got.returncode == 0, got.stderr
    assert os.readlink(os.path.join(rootfs, "bin/from-spec")) == "busybox"


@pytest.mark.skipif(os.geteuid() != 0, reason="hooks run as root")
def test_chmod_never_follows_a_link_out_of_the_root(tmp_path, launchers):
    """The image links /dev/dri to a host path: NVIDIA's chmod changes the host file,
    nvshim-hook resolves the link inside the root (nothing there: skipped)."""
    config, _ = write_hook_config(tmp_path / "cfg")
    rootfs = make_busybox_rootfs(tmp_path / "rootfs")
    canary = tmp_path / "host-canary"
    canary.mkdir(mode=0o700)
    os.chmod(canary, 0o700)
    os.symlink(str(canary), os.path.join(rootfs, "dev/dri"))
    bundle = make_bundle(tmp_path, rootfs, ["true"])
    line = ["chmod", "--mode", "755", "--path", "/dev/dri"]
    ours = run_hook_direct(
        [f"{launchers}/nvshim-hook", *line], bundle, env={**HOOK_TEST_ENV, "NVSHIM_CONFIG": config}
    )
    assert ours.returncode == 0, ours.stderr
    assert os.stat(canary).st_mode & 0o7777 == 0o700
    theirs = run_hook_direct([toolkit_binary("nvidia-cdi-hook"), *line], bundle)
    assert theirs.returncode == 0, theirs.stderr
    assert os.stat(canary).st_mode & 0o7777 == 0o755  # the reference's escape


@pytest.mark.skipif(os.geteuid() != 0, reason="hooks run as root")
def test_enable_cuda_compat_writes_nothing_to_an_image_without_compat(tmp_path, launchers):
    """Every GPU container runs the step: on a read-only root without compat libraries
    (and without nvshim's drop-in) it succeeds, writes nothing and says so."""
    config, log = write_hook_config(tmp_path / "cfg")
    rootfs = make_busybox_rootfs(tmp_path / "rootfs")
    os.makedirs(os.path.join(rootfs, "etc/ld.so.conf.d"))
    bundle = make_bundle(tmp_path, rootfs, ["true"])
    readonly = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'
    argv = ["/bin/sh", "-c", readonly, rootfs, f"{launchers}/nvshim-hook", "--config", config]
    got = run_hook_direct([*argv, "enable-cuda-compat", "--host-driver-version=550.90.12"], bundle)
    assert got.returncode == 0, got.stderr
    (record,) = read_log(log)
    assert record["cuda_compat"] == "not-used"
    assert os.listdir(os.path.join(rootfs, "etc/ld.so.conf.d")) == []
