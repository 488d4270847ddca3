"""Make the engine pick up its new configuration.

``signal`` sends SIGHUP to the process that owns the configured socket (pinned through
the connection, so with several daemons on a node the right one is signalled); ``systemd``
restarts the engine's unit. Both say what they did.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess

from nvshim.engines.settings import Settings
from nvshim.errors import NvshimError
from nvshim.trusted import peer_credentials, peer_pidfd

# What each engine does with SIGHUP.
ON_SIGHUP = {
    "containerd": "containerd exits on SIGHUP; its service manager starts it again",
    "docker": "dockerd reloads daemon.json on SIGHUP",
    "crio": (
        "CRI-O reloads its configuration on SIGHUP, but does not apply runtime handler or"
        " default_runtime changes until it restarts (1.36, cri-o#10202): restart crio"
    ),
}
# Why an engine is restarted rather than reloaded (said with the restart).
WHY_RESTART = {
    "crio": "CRI-O applies runtime handler changes only on a restart, not on a SIGHUP reload",
}


def _connect(path: str) -> socket.socket:
    """A unix stream socket connected to ``path`` (the engine's socket); clear errors."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise NvshimError(
            f"{path}: socket not found (is the engine running? see --socket)"
        ) from None
    except OSError as err:
        raise NvshimError(f"{path}: {err.strerror}") from None
    if not stat.S_ISSOCK(mode):
        raise NvshimError(f"{path}: not a unix socket")
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except OSError as err:
        conn.close()
        raise NvshimError(f"{path}: cannot connect: {err.strerror}") from None
    return conn


def socket_owner(path: str) -> tuple[int, int, int]:
    """``(pid, uid, gid)`` of the process listening on the unix socket ``path``."""
    with _connect(path) as conn:
        pid, uid, gid = peer_credentials(conn)
    if pid <= 0:
        raise NvshimError(f"{path}: the kernel reported no peer process")
    return pid, uid, gid


def pinned_socket_owner(path: str) -> tuple[int, int]:
    """``(pidfd, pid)`` of the process listening on ``path``, held from the connection
    on: ``SO_PEERPIDFD`` where the kernel has it (Linux 6.5), else a pidfd of
    ``SO_PEERCRED``'s pid opened while still connected. The caller closes the pidfd."""
    with _connect(path) as conn:
        pid = peer_credentials(conn)[0]
        pidfd = peer_pidfd(conn)
        if pidfd is None and pid > 0:
            try:
                pidfd = os.pidfd_open(pid)
            except ProcessLookupError:
                pass
    if pidfd is None or pid <= 0:
        raise NvshimError(f"{path}: its owner (pid {pid}) exited, or the kernel named none")
    return pidfd, pid


def _process_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as fh:
            return fh.read().strip() or "?"
    except OSError:
        return "?"


def ignores_sighup(status: str) -> bool:
    """Whether a ``/proc/PID/status`` text shows SIGHUP ignored (``SigIgn``: a process
    started under ``nohup`` keeps it so, and a SIGHUP then changes nothing)."""
    for line in status.splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGHUP - 1)))
    return False


def send_sighup(s: Settings) -> str:
    """SIGHUP the owner of ``s.socket`` (held through a pidfd from the connection to the
    signal); return a sentence saying so. An owner that ignores SIGHUP is refused: the
    signal would leave the old configuration running."""
    pidfd, pid = pinned_socket_owner(s.socket)
    gone = f"{s.socket}: its owner (pid {pid}) exited before the signal"
    try:
        try:
            name = _process_name(pid)
            with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as fh:
                status = fh.read()
            signal.pidfd_send_signal(pidfd, 0)  # still the process /proc was read of
        except (FileNotFoundError, ProcessLookupError):
            raise NvshimError(gone) from None
        if ignores_sighup(status):
            raise NvshimError(
                f"{name} (pid {pid}), the owner of {s.socket}, ignores SIGHUP (started under"
                " nohup?), so a signal would not apply the change: restart it through its"
                " service manager (--restart systemd) or by hand"
            )
        signal.pidfd_send_signal(pidfd, signal.SIGHUP)
    except ProcessLookupError:
        raise NvshimError(gone) from None
    except PermissionError:
        raise NvshimError(f"cannot signal {name} (pid {pid}): permission denied") from None
    finally:
        os.close(pidfd)
    return f"sent SIGHUP to {name} (pid {pid}), the owner of {s.socket}: {ON_SIGHUP[s.engine]}"


def find_systemctl(host_root: str = "/") -> list[str]:
    """The command running ``systemctl`` (through ``chroot`` into ``host_root`` when that
    is not ``/``: the engine's own systemd); a clear error when there is none."""
    if host_root not in ("", "/"):
        found = [d for d in ("/usr/bin", "/bin") if os.path.exists(f"{host_root}{d}/systemctl")]
        if not found or shutil.which("chroot") is None:
            raise NvshimError(
                f"systemctl not found in {host_root}: use restart mode signal, or restart"
                " the engine"
            )
        return ["chroot", host_root, f"{found[0]}/systemctl"]
    systemctl = shutil.which("systemctl")
    if systemctl is None:
        raise NvshimError("systemctl not found: use --restart signal, or restart the engine")
    return [systemctl]


def systemctl(host_root: str, *args: str, timeout: float = 300) -> str | None:
    """Run ``systemctl ARGS`` (see :func:`find_systemctl`): None when it succeeded, else
    why not, in one line."""
    command = find_systemctl(host_root)
    # chrooted into the host's own root: talk to its systemd (systemctl would otherwise
    # take a chroot for an offline image and ignore start, stop and reload)
    env = {**os.environ, "SYSTEMD_IGNORE_CHROOT": "1"} if command[0] == "chroot" else None
    try:
        done = subprocess.run(
            [*command, *args], capture_output=True, text=True, timeout=timeout, env=env
        )
    except subprocess.TimeoutExpired:
        return f"no answer after {timeout:.0f} s"
    if done.returncode == 0:
        return None
    reason = (done.stderr or done.stdout).strip().splitlines()
    return reason[0] if reason else f"exit status {done.returncode}"


def systemd_restart(s: Settings) -> str:
    """``systemctl restart <unit>``; return a sentence saying so."""
    why = systemctl(s.host_root, "restart", s.unit)
    if why is not None:
        raise NvshimError(
            f"systemctl restart {s.unit} failed: {why}"
            f" (the configuration is written; restart {s.unit} yourself)"
        )
    why = f" ({WHY_RESTART[s.engine]})" if s.engine in WHY_RESTART else ""
    return f"restarted {s.unit} with systemctl{why}"


def restart(s: Settings) -> str:
    """Apply ``s.restart``; return what was done, as a sentence."""
    if s.restart == "signal":
        return send_sighup(s)
    if s.restart == "systemd":
        return systemd_restart(s)
    return f"{s.engine} not restarted (--restart none): restart it to use the new configuration"
