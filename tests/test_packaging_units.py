"""The shipped systemd units pass `systemd-analyze verify` (offline, against a staged root
holding the binaries they run), the refresh unit's command works as written, the daemon
unit's command keeps systemd's Type=notify and KillMode=mixed contract, and the udev rule
starts a unit that is shipped."""

from __future__ import annotations

import glob
import os
import re
import shlex
import shutil
import signal
import socket
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
        "nvshim-runtimed.service",
    }
    binaries = sorted({b for unit in UNITS for b in exec_binaries(unit)})
    # the package's paths, nothing under /usr/local
    assert binaries == ["/usr/bin/nvshim", "/usr/bin/nvshim-runtimed"]
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


RUNTIMED = os.path.join(REPO, "packaging", "systemd", "nvshim-runtimed.service")
# Options that give a service its own view of mounts, processes, users, the network or
# the root (systemd.exec(5) "Sandboxing" and "Paths"), and RuntimeDirectory, which
# would remove /run/nvshim (caches, MPS state) when the unit stops.
NAMESPACING = {
    "RootDirectory", "RootImage", "MountAPIVFS", "PrivateTmp", "PrivateMounts",
    "PrivateDevices", "PrivateNetwork", "NetworkNamespacePath", "PrivateUsers", "PrivateIPC",
    "IPCNamespacePath", "ProtectSystem", "ProtectHome", "ProtectProc", "ProcSubset",
    "ProtectKernelTunables", "ProtectKernelModules", "ProtectKernelLogs",
    "ProtectControlGroups", "ProtectClock", "ProtectHostname", "ReadOnlyPaths",
    "ReadWritePaths", "InaccessiblePaths", "ExecPaths", "NoExecPaths", "BindPaths",
    "BindReadOnlyPaths", "TemporaryFileSystem", "MountImages", "ExtensionImages",
    "ExtensionDirectories", "MountFlags", "DynamicUser", "User", "Group",
    "RestrictNamespaces", "RuntimeDirectory", "JoinsNamespaceOf",
}  # fmt: skip
ENGINE_UNITS = {"containerd.service", "docker.service", "crio.service", "k3s.service",
                "k3s-agent.service", "rke2-server.service", "rke2-agent.service"}  # fmt: skip


def unit_keys(path: str) -> dict[str, list[str]]:
    """Every key of a unit file with its values (all sections; comments skipped)."""
    keys: dict[str, list[str]] = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if "=" in line and not line.startswith(("#", ";", "[")):
                key, value = line.split("=", 1)
                keys.setdefault(key.strip(), []).extend(value.split())
    return keys


def test_runtimed_unit_runs_in_the_hosts_namespaces_before_the_engines():
    keys = unit_keys(RUNTIMED)
    assert not NAMESPACING & set(keys), NAMESPACING & set(keys)
    assert keys["Type"] == ["notify"] and keys["ExecStart"] == ["/usr/bin/nvshim-runtimed"]
    assert keys["Restart"] == ["always"] and int(keys["RestartSec"][0]) <= 2
    assert keys["KillMode"] == ["mixed"]  # SIGTERM to the daemon; its workers finish
    # ordered before every engine, needed by none, wanted by the boot target only
    assert set(keys["Before"]) == ENGINE_UNITS
    for key in ("RequiredBy", "UpheldBy", "Wants", "Requires", "BindsTo", "PartOf",
                "Requisite", "Upholds", "After"):  # fmt: skip
        assert key not in keys, key
    assert keys["WantedBy"] == ["multi-user.target"]


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as fh:
        return [int(p) for p in fh.read().split()]


def test_runtimed_command_keeps_the_units_contract(tmp_path):
    """The unit's ExecStart (the launcher `nvshim install` writes for /usr/bin) sends
    READY=1 to systemd's NOTIFY_SOCKET once its socket is live, and on SIGTERM to it
    alone (KillMode=mixed) removes the socket, ends its workers and exits 0."""
    from nvshim.launch import write_launchers
    from nvshim.runtime import DAEMON_SOCKET

    (command,) = unit_lines(RUNTIMED, "ExecStart")
    assert shlex.split(command) == ["/usr/bin/nvshim-runtimed"]
    bin_dir, cache = tmp_path / "bin", tmp_path / "cache"
    write_launchers(str(bin_dir))
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    notify.settimeout(60)
    env = {"PATH": os.environ["PATH"], "NVSHIM_CACHE_DIR": str(cache),
           "NOTIFY_SOCKET": str(tmp_path / "notify")}  # fmt: skip
    proc = subprocess.Popen([str(bin_dir / "nvshim-runtimed")], env=env,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert notify.recv(4096) == b"READY=1"
        assert os.path.exists(cache / DAEMON_SOCKET)  # live before it says so
        workers = _children(proc.pid)
        assert workers
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        notify.close()
    assert not os.path.exists(cache / DAEMON_SOCKET)
    for pid in workers:
        assert not os.path.exists(f"/proc/{pid}"), pid


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


# In a private mount namespace with tmpfs over /run, /var/log and /etc/nvshim when there
# is one (the host's stay as they are): an MPS daemon's shm tmpfs mounted below
# /run/nvshim, then the package's postrm purge; prints its status, what /run holds and
# whether the shm is still mounted.
PURGE = r"""
set -e
for dir in /run /var/log; do mount -t tmpfs nvshim-test "$dir"; done
[ ! -d /etc/nvshim ] || mount -t tmpfs nvshim-test /etc/nvshim
shm=/run/nvshim/mps/GPU-0/shm
mkdir -p "$shm" /run/cdi
mount -t tmpfs nvshim-test "$shm"
echo segment > "$shm/seg"
set +e
sh "$POSTRM" purge
echo "rc=$?"
echo "run:" $(ls -A /run | grep -v '^mount$')  # mount(8)'s utab
echo "mounts:" $(grep -o " $shm " /proc/self/mountinfo)
"""


def test_postrm_purge_detaches_a_mount_below_run_nvshim():
    """``rm -rf /run/nvshim`` under ``set -e`` failed the purge when an MPS daemon's shm
    tmpfs was still mounted below it (after emptying it): now detached first."""
    from tests.conftest import sh_in_private_mounts

    postrm = os.path.join(REPO, "packaging", "debian", "nvshim.postrm")
    done = sh_in_private_mounts(PURGE, POSTRM=postrm)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["rc=0", "run:", "mounts:"], done.stdout + done.stderr
    assert done.stderr == "", done.stderr
