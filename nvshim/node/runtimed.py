"""``nvshim-runtimed`` on the host: the package's unit (packaging/systemd, shipped in this
package) with ExecStart naming the prefix's ``nvshim-runtimed``, placed in the host's
``/etc/systemd/system`` like the installer's other files (:mod:`nvshim.node.placed`),
enabled and (re)started with the host's systemctl, and taken back on uninstall.

The daemon is optional (``nvshim-runtime`` does its work in-process without it), so a
host that does not run systemd gets no unit, and a unit that does not start is a
warning, not a failed install.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from importlib.resources import files

from nvshim.errors import NvshimError
from nvshim.node import placed
from nvshim.node.env import NodeSettings

UNIT = "nvshim-runtimed.service"
UNIT_DIR = "/etc/systemd/system"  # host path
PACKAGE_EXEC = "/usr/bin/nvshim-runtimed"  # the packaged unit's ExecStart
SYSTEMD_BOOTED = "/run/systemd/system"  # sd_booted(3): the host runs systemd
SAFE_PATH = re.compile(r"[A-Za-z0-9/._+@:-]+")  # no quoting or %-specifier in ExecStart
START_TIMEOUT = 120.0

Say = Callable[[str], None]


def unit_path() -> str:
    """Host path of the unit the installer writes."""
    return os.path.join(UNIT_DIR, UNIT)


def unit_text(exec_path: str) -> str:
    """The packaged unit, its ExecStart naming ``exec_path``."""
    text = files("nvshim.node").joinpath(UNIT).read_text(encoding="utf-8")
    line = f"ExecStart={PACKAGE_EXEC}\n"
    if text.count(line) != 1:
        raise NvshimError(f"{UNIT} (package data): no line {line.strip()}")
    if not SAFE_PATH.fullmatch(exec_path):
        raise NvshimError(
            f"{exec_path}: a path {UNIT} cannot name as written (letters, digits and"
            " /._+@:- only): choose another prefix, or set NVSHIM_RUNTIMED=false"
        )
    header = "# Written by the nvshim node installer (nvshim node); its uninstall removes it.\n"
    return header + text.replace(line, f"ExecStart={exec_path}\n")


def wanted(s: NodeSettings) -> bool:
    """Whether this run installs the daemon: on (NVSHIM_RUNTIMED) and the host runs systemd."""
    return s.runtimed and os.path.isdir(s.here(SYSTEMD_BOOTED))


def preflight(s: NodeSettings) -> None:
    """Refuse, before any change, a daemon that could not be managed."""
    from nvshim.engines.restart import find_systemctl

    if not wanted(s):
        return
    unit_text(os.path.join(s.bin_dir, "nvshim-runtimed"))
    try:
        find_systemctl(s.host_root)
    except NvshimError:
        raise NvshimError(
            f"the host runs systemd but no systemctl can be run in {s.host_root}:"
            " set NVSHIM_RUNTIMED=false to go without nvshim-runtimed"
        ) from None


def install(s: NodeSettings, say: Say) -> None:
    """Place the unit, reload, enable and restart it (a restart, so a daemon left by an
    earlier install never runs older code than the files). Off or no systemd: take back
    a unit an earlier run placed."""
    if not wanted(s):
        why = "NVSHIM_RUNTIMED=false" if not s.runtimed else "the host does not run systemd"
        say(f"nvshim-runtimed not installed ({why}): nvshim-runtime works in-process")
        remove(s, say)
        return
    text = unit_text(os.path.join(s.bin_dir, "nvshim-runtimed"))
    say(placed.place(s.here(unit_path()), text.encode()))
    for args in (("daemon-reload",), ("enable", UNIT), ("restart", UNIT)):
        why = _systemctl(s, *args)
        if why is not None:
            say(
                f"warning: systemctl {' '.join(args)} failed: {why}"
                " (nvshim-runtime works in-process without nvshim-runtimed)"
            )
            return
    say(f"{UNIT} enabled and started")


def remove(s: NodeSettings, say: Say) -> None:
    """Stop, disable and take back the unit an install placed (nothing when none was).
    Every step runs; a failed systemctl call raises NvshimError at the end."""
    from nvshim.engines.common import state_path

    path = s.here(unit_path())
    if not os.path.exists(state_path(path)):
        return
    failed = []
    why = _systemctl(s, "disable", "--now", UNIT)
    if why is None:
        say(f"{UNIT} stopped and disabled")
    else:
        failed.append(f"systemctl disable --now {UNIT} failed: {why}")
    line = placed.take_back(path)
    if line:
        say(line)
    why = _systemctl(s, "daemon-reload")
    if why is not None:
        failed.append(f"systemctl daemon-reload failed: {why}")
    if failed:
        raise NvshimError("; ".join(failed))


def _systemctl(s: NodeSettings, *args: str) -> str | None:
    """``systemctl ARGS`` on the host: None, or why it failed (no systemctl included)."""
    from nvshim.engines.restart import systemctl

    try:
        return systemctl(s.host_root, *args, timeout=START_TIMEOUT)
    except NvshimError as err:
        return str(err)
