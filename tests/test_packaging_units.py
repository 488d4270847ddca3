"""The shipped systemd units pass `systemd-analyze verify` (offline, against a staged root
holding the binaries they run), the refresh unit's command works as written, and the udev
rule starts a unit that is shipped."""

from __future__ import annotations

import glob
import os
import re
import shlex
import shutil
import subprocess

import pytest

from tests.conftest import REPO, run_nvshim

UNITS = sorted(glob.glob(os.path.join(REPO, "packaging", "systemd", "*.*")))
RULES = sorted(glob.glob(os.path.join(REPO, "packaging", "udev", "*.rules")))
SYSTEM_UNITS = "/usr/lib/systemd/system"


def unit_lines(path: str, key: str) -> list[str]:
    with open(path, encoding="utf-8") as fh:
        return [line.split("=", 1)[1] for line in fh if line.startswith(f"{key}=")]


def exec_binaries(path: str) -> list[str]:
    """The programs a unit's Exec*= lines run (prefixes such as - @ + ! stripped)."""
    out = []
    for key in ("ExecStart", "ExecStop", "ExecStartPre", "ExecStartPost", "ExecCondition"):
        for value in unit_lines(path, key):
            if value.strip():
                out.append(shlex.split(value)[0].lstrip("-@+!:"))
    return out


def stage_root(tmp_path, units, binaries) -> str:
    """A root with the system's units, ``units`` and executable stand-ins for ``binaries``."""
    root = str(tmp_path / "root")
    shutil.copytree(SYSTEM_UNITS, root + SYSTEM_UNITS, symlinks=True)
    for unit in units:
        shutil.copy(unit, root + SYSTEM_UNITS)
    for binary in binaries:
        os.makedirs(os.path.dirname(root + binary), exist_ok=True)
        with open(root + binary, "w") as fh:
            fh.write("#!/bin/sh\n")
        os.chmod(root + binary, 0o755)
    return root


def verify(root: str, names: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["systemd-analyze", "verify", "--man=no", f"--root={root}", *names],
        capture_output=True,
        text=True,
    )


def test_every_unit_verifies(tmp_path):
    assert {os.path.basename(u) for u in UNITS} >= {
        "nvshim-mps.service",
        "nvshim-cdi-refresh.service",
        "nvshim-cdi-refresh.path",
    }
    binaries = sorted({b for unit in UNITS for b in exec_binaries(unit)})
    assert binaries == ["/usr/bin/nvshim"]  # the package's path, nothing under /usr/local
    root = stage_root(tmp_path, UNITS, binaries)
    proc = verify(root, [os.path.basename(u) for u in UNITS])
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


def test_verify_catches_a_missing_binary(tmp_path):
    """The check above is real: without the staged nvshim, verify fails naming it."""
    root = stage_root(tmp_path, UNITS, [])
    proc = verify(root, ["nvshim-cdi-refresh.service"])
    assert proc.returncode != 0
    assert "/usr/bin/nvshim is not executable" in proc.stderr


def test_path_unit_starts_the_refresh_service():
    path_unit = os.path.join(REPO, "packaging", "systemd", "nvshim-cdi-refresh.path")
    assert unit_lines(path_unit, "Unit") == ["nvshim-cdi-refresh.service\n"]
    watched = [w.strip() for w in unit_lines(path_unit, "PathChanged")]
    assert "/lib/modules/%v/modules.dep" in watched and "/dev/nvidia-caps" in watched


def test_refresh_unit_command_works_as_written(sim_hosts, tmp_path):
    """The unit's ExecStart, with the venv's nvshim for /usr/bin/nvshim and a tmp spec
    path for /var/run/cdi, refreshes a simulated host's spec, then finds it current."""
    unit = os.path.join(REPO, "packaging", "systemd", "nvshim-cdi-refresh.service")
    (command,) = unit_lines(unit, "ExecStart")
    argv = shlex.split(command)
    assert argv[0] == "/usr/bin/nvshim"
    output = argv[argv.index("--output") + 1]
    assert output == "/var/run/cdi/nvidia.yaml"
    assert unit_lines(unit, "RuntimeDirectory") == ["cdi\n"]  # /run/cdi exists for it
    spec = str(tmp_path / "nvidia.yaml")
    sim = sim_hosts("single")
    args = [spec if a == output else a for a in argv[1:]]
    args += ["--driver-root", sim.driver_root, "--dev-root", sim.dev_root]
    first = run_nvshim(*args)
    assert first.returncode == 0 and "refreshed" in first.stderr, first.stderr
    assert run_nvshim("cdi", "validate", spec).returncode == 0
    again = run_nvshim(*args)
    assert again.returncode == 0 and "is current" in again.stderr


RULE_KEY = re.compile(
    r'^(ACTION|SUBSYSTEM|KERNEL|DRIVER|TAG|ENV\{[A-Z_]+\}|RUN)(==|\+=|=)"([^"]*)"$'
)


@pytest.mark.parametrize("rules", RULES, ids=os.path.basename)
def test_udev_rule_is_well_formed_and_starts_a_shipped_unit(rules):
    shipped = {os.path.basename(u) for u in UNITS}
    started = []
    with open(rules, encoding="utf-8") as fh:
        lines = [x.strip() for x in fh if x.strip() and not x.startswith("#")]
    assert lines
    for line in lines:
        pairs = [p.strip() for p in line.split(", ")]
        matches = [RULE_KEY.match(p) for p in pairs]
        assert all(matches), line
        keys = {m.group(1): (m.group(2), m.group(3)) for m in matches}
        assert keys["ACTION"][0] == "=="
        if "ENV{SYSTEMD_WANTS}" in keys:
            assert keys["TAG"] == ("+=", "systemd")
            started.append(keys["ENV{SYSTEMD_WANTS}"][1])
        if "RUN" in keys:
            program = shlex.split(keys["RUN"][1])
            assert program[0] == "/bin/systemctl" and program[1:3] == ["--no-block", "start"]
            started.append(program[3])
    assert started and set(started) <= shipped
