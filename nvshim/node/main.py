"""The installer's life: install, report ready, supervise the MPS daemons, follow host
changes (``nvshim.node.follow``: MIG layout, driver upgrade), and on SIGTERM
or SIGINT take everything back and exit 0.

Signals only set a flag: a step in progress (a config write, a restart) always finishes,
and the undo runs after it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time

from nvshim.config import amended
from nvshim.errors import NvshimError
from nvshim.node import steps
from nvshim.node.env import NodeSettings

SUPERVISE_INTERVAL = 5.0  # seconds between MPS daemon checks


def say(line: str) -> None:
    """One log line on stderr (the pod's log), timestamped to the millisecond."""
    now = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"
    sys.stderr.write(f"{stamp} nvshim node: {line}\n")
    sys.stderr.flush()


def write_ready(path: str) -> None:
    from nvshim.fsutil import atomic_write

    os.makedirs(os.path.dirname(path), exist_ok=True)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    atomic_write(path, f"ready {stamp} pid {os.getpid()}\n".encode(), mode=0o644)
    say(f"ready ({path})")


def remove_ready(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


class MpsSupervisor:
    """The MPS daemons of the mounted sharing config (``nvshim mps``'s code), kept running."""

    def __init__(self, s: NodeSettings, host) -> None:
        config = steps.host_side_config(s)  # its MPS root reached from here:
        self.config = amended(config, "sharing", mps_root=s.here(config.sharing.mps_root))
        self.host = host
        self.started = False

    def check(self) -> None:
        """Start every daemon not running; a restart after the first round is logged."""
        from nvshim.mps.service import start_all

        outcome = start_all(self.config, self.host)
        for d in outcome.daemons:
            if d.action == "started":
                what = "restarted (it had died)" if self.started else "started"
                say(f"MPS daemon of {d.name} ({d.uuid}) {what}, pid {d.pid}")
        for error in outcome.errors:
            say(f"error: MPS: {error}")
        if not self.started and outcome.errors:
            outcome.raise_for_errors("start")
        self.started = True

    def stop(self) -> None:
        from nvshim.mps.service import stop_all

        outcome = stop_all(self.config, self.host)
        for d in outcome.daemons:
            say(f"MPS daemon of {d.name} ({d.uuid}): {d.action or 'stopped'}")
        for error in outcome.errors:
            say(f"error: MPS: {error}")


def _interval(watch, mps) -> float:
    """Seconds until the loop looks again: the host watch's, the MPS check's, or idle."""
    if watch is not None:
        from nvshim.node.follow import INTERVAL

        return INTERVAL
    return SUPERVISE_INTERVAL if mps is not None else 3600


def run(s: NodeSettings, daemon: bool = True) -> int:
    """Install; with ``daemon`` stay up (supervising) until SIGTERM/SIGINT, then uninstall."""
    stop = threading.Event()

    def on_signal(signum, _frame) -> None:
        if not stop.is_set():
            say(f"{signal.Signals(signum).name} received: uninstalling")
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    for warning in s.warnings:
        say(f"warning: {warning}")
    if s.debug:
        from nvshim.node.env import describe

        say(f"settings: {describe(s)}")
    steps.preflight(s)  # a bad input is the one line printed
    from nvshim import __version__

    say(f"nvshim {__version__} starting (pid {os.getpid()}, engine {s.engine_name})")
    with steps.node_lock(s, say, stop.is_set) as got:
        if not got:
            say("stopped before the other installer finished; nothing changed")
            return 0
        watch = None
        if daemon and (s.cdi_enabled or s.sharing_config):
            from nvshim.node.follow import HostWatch

            watch = HostWatch(s, say)  # the key before discovery: a change now is seen
        host = steps.install(s, say)
        mps = MpsSupervisor(s, host) if s.sharing_config and daemon else None

        def restart_mps(new_host) -> None:
            nonlocal mps
            mps.stop()
            mps = MpsSupervisor(s, new_host)
            mps.check()

        try:
            if mps is not None:
                mps.check()
            write_ready(s.ready_file)
            if not daemon:
                return 0
            checked = time.monotonic()
            while not stop.wait(_interval(watch, mps)):
                if watch is not None:
                    watch.look(restart_mps if mps is not None else None)
                if mps is not None and time.monotonic() - checked >= SUPERVISE_INTERVAL:
                    checked = time.monotonic()
                    try:
                        mps.check()
                    except NvshimError as err:
                        say(f"error: MPS: {err}")
        finally:
            if daemon:
                remove_ready(s.ready_file)
                if mps is not None:
                    mps.stop()
        failures = steps.uninstall(s, say)
    if failures:
        say(f"uninstalled with {len(failures)} error(s)")
        return 1
    say("uninstalled")
    return 0


def uninstall(s: NodeSettings) -> int:
    """Undo an install (another installer on the node is waited for first)."""
    with steps.node_lock(s, say):
        remove_ready(s.ready_file)
        failures = steps.uninstall(s, say)
    return 1 if failures else 0
