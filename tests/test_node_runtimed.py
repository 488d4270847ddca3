"""`nvshim node` and nvshim-runtimed on a systemd host (a scratch host root with
/run/systemd/system and a stand-in systemctl run chrooted there, as the installer runs the
host's own): the packaged unit, naming the prefix's launcher, is placed, reloaded, enabled
and restarted; SIGTERM stops, disables and removes it, leaving the root as it was;
NVSHIM_RUNTIMED=false and a host without systemd get none; a unit that does not start is
a warning; a systemd host without systemctl is refused before any change."""

from __future__ import annotations

import os
import shutil

import pytest

from nvshim.node.runtimed import PACKAGE_EXEC, UNIT
from tests.conftest import REPO
from tests.node_util import Scratch, node, start_node, wait_for
from tests.test_node_lifecycle import files_of, stop
from tests.test_packaging_units import stage_root, verify

UNIT_FILE = f"/etc/systemd/system/{UNIT}"
CALLS = "/tmp/systemctl.calls"


def systemd_host(scratch: Scratch, fail: str = "", systemctl: bool = True) -> None:
    """Make the scratch root look booted with systemd; its systemctl logs each call (with
    SYSTEMD_IGNORE_CHROOT) to ``CALLS`` and fails the verb ``fail``."""
    for d in ("bin", "usr/bin", "tmp", "run/systemd/system"):
        scratch.path("/" + d).mkdir(parents=True, exist_ok=True)
    if not systemctl:
        return
    shutil.copy(shutil.which("busybox"), scratch.path("/bin/sh"))
    script = scratch.path("/usr/bin/systemctl")
    script.write_text(
        "#!/bin/sh\n"
        f'echo "${{SYSTEMD_IGNORE_CHROOT:-unset}} $*" >> {CALLS}\n'
        f'if [ "$1" = "{fail}" ]; then echo "Failed to $1: Access denied" >&2; exit 1; fi\n'
    )
    script.chmod(0o755)


def calls(scratch: Scratch) -> list[str]:
    path = scratch.path(CALLS)
    return path.read_text().splitlines() if path.exists() else []


def without_calls(snap: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in files_of(snap).items() if k != CALLS.lstrip("/")}


def test_run_installs_the_packaged_unit_and_sigterm_takes_it_back(scratch, tmp_path):
    systemd_host(scratch)
    before = scratch.snapshot()
    log = tmp_path / "log"
    proc = start_node(scratch.env(), log)
    wait_for(scratch.ready.exists, proc=proc, log=log)
    # the package's unit, byte for byte, but for a first comment line and ExecStart
    launcher = "/usr/local/nvshim/bin/nvshim-runtimed"
    with open(os.path.join(REPO, "packaging", "systemd", UNIT)) as fh:
        packaged = fh.read()
    written = scratch.path(UNIT_FILE).read_text()
    assert written.startswith("# Written by the nvshim node installer")
    assert written.split("\n", 1)[1] == packaged.replace(
        f"ExecStart={PACKAGE_EXEC}\n", f"ExecStart={launcher}\n"
    )
    assert f"ExecStart={launcher}\n" in written
    assert os.access(scratch.path(launcher), os.X_OK)
    staged = stage_root(tmp_path, [str(scratch.path(UNIT_FILE))], [launcher])
    proc_verify = verify(staged, [UNIT])
    assert proc_verify.returncode == 0 and proc_verify.stderr == "", proc_verify.stderr
    assert calls(scratch) == [
        "1 daemon-reload",
        f"1 enable {UNIT}",
        f"1 restart {UNIT}",  # a restart: a daemon an earlier install left runs new code
    ]
    assert f"{UNIT} enabled and started" in log.read_text()
    stop(proc, log)
    assert calls(scratch)[3:] == [f"1 disable --now {UNIT}", "1 daemon-reload"]
    assert without_calls(scratch.snapshot()) == without_calls(before)


def test_a_unit_of_the_operators_own_comes_back(scratch):
    systemd_host(scratch)
    own = b"[Service]\nExecStart=/opt/mine/nvshim-runtimed\n"
    scratch.path(UNIT_FILE).parent.mkdir(parents=True)
    scratch.path(UNIT_FILE).write_bytes(own)
    assert node("install", env=scratch.env()).returncode == 0
    assert scratch.path(UNIT_FILE).read_bytes() != own
    done = node("uninstall", env=scratch.env())
    assert done.returncode == 0, done.stderr
    assert scratch.path(UNIT_FILE).read_bytes() == own
    assert sorted(os.listdir(scratch.path("/etc/systemd/system"))) == [UNIT]


@pytest.mark.parametrize("case", ["toggle-off", "no-systemd"])
def test_no_unit_when_off_or_without_systemd(scratch, case):
    systemd_host(scratch, systemctl=True)
    env = scratch.env()
    if case == "toggle-off":
        env["NVSHIM_RUNTIMED"] = "false"
    else:
        scratch.path("/run/systemd/system").rmdir()
    done = node("install", env=env)
    assert done.returncode == 0, done.stderr
    why = "NVSHIM_RUNTIMED=false" if case == "toggle-off" else "the host does not run systemd"
    assert f"nvshim-runtimed not installed ({why})" in done.stderr
    assert not scratch.path(UNIT_FILE).exists()
    assert calls(scratch) == []


def test_turning_it_off_takes_back_an_earlier_unit(scratch):
    systemd_host(scratch)
    before = scratch.snapshot()
    assert node("install", env=scratch.env()).returncode == 0
    assert scratch.path(UNIT_FILE).exists()
    done = node("install", env=scratch.env(NVSHIM_RUNTIMED="0"))
    assert done.returncode == 0, done.stderr
    assert not scratch.path(UNIT_FILE).exists()
    assert calls(scratch)[3:] == [f"1 disable --now {UNIT}", "1 daemon-reload"]
    # its uninstall has no unit left to remove
    assert node("uninstall", env=scratch.env(NVSHIM_RUNTIMED="0")).returncode == 0
    assert len(calls(scratch)) == 5
    assert without_calls(scratch.snapshot()) == without_calls(before)


def test_a_unit_that_does_not_start_is_a_warning(scratch):
    systemd_host(scratch, fail="restart")
    done = node("install", env=scratch.env())
    assert done.returncode == 0, done.stderr
    assert (
        f"warning: systemctl restart {UNIT} failed: Failed to restart: Access denied"
        " (nvshim-runtime works in-process without nvshim-runtimed)"
    ) in done.stderr
    assert node("uninstall", env=scratch.env()).returncode == 0
    assert not scratch.path(UNIT_FILE).exists()


def test_a_failed_disable_is_reported_and_the_unit_still_removed(scratch):
    systemd_host(scratch, fail="disable")
    assert node("install", env=scratch.env()).returncode == 0
    done = node("uninstall", env=scratch.env())
    assert done.returncode == 1
    assert (
        f"error: systemctl disable --now {UNIT} failed: Failed to disable: Access denied"
        in done.stderr
    )
    assert not scratch.path(UNIT_FILE).exists()
    assert calls(scratch)[-1] == "1 daemon-reload"
    # the rest of the uninstall ran too
    assert scratch.config.read_bytes() == scratch.original


def test_systemd_without_systemctl_is_refused_before_any_change(scratch):
    systemd_host(scratch, systemctl=False)
    before = scratch.snapshot()
    done = node("install", env=scratch.env())
    assert done.returncode != 0
    errors = [x for x in done.stderr.splitlines() if "error" in x]
    assert errors == [
        f"nvshim: error: the host runs systemd but no systemctl can be run in {scratch.root}:"
        " set NVSHIM_RUNTIMED=false to go without nvshim-runtimed"
    ], done.stderr
    assert scratch.snapshot() == before
    done = node("install", env=scratch.env(NVSHIM_RUNTIMED="false"))
    assert done.returncode == 0, done.stderr


def test_a_prefix_the_unit_cannot_name_is_refused_before_any_change(scratch):
    systemd_host(scratch)
    before = scratch.snapshot()
    done = node("install", env=scratch.env(TOOLKIT_INSTALL_DIR="/opt/gpu tools/nvshim"))
    assert done.returncode != 0
    assert done.stderr.splitlines() == [
        f"nvshim: error: /opt/gpu tools/nvshim/bin/nvshim-runtimed: a path {UNIT} cannot name"
        " as written (letters, digits and /._+@:- only): choose another prefix, or set"
        " NVSHIM_RUNTIMED=false"
    ]
    assert scratch.snapshot() == before
