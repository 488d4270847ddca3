"""A private, supervised containerd for tests (FACTS §9).

containerd 1.6 puts shim sockets under ``/run/containerd`` whatever its ``state`` says, so the
daemon runs inside ``unshare --mount --propagation private`` with a scratch directory bound on
``/run``. A small shell loop restarts it whenever it exits (containerd exits on SIGHUP), the
way systemd's ``Restart=always`` would, until the context manager ends.

Paths on the object are host paths (outside the mount namespace)::

    with private_containerd(tmp_path, Path("config.toml")) as ctd:
        ctd.socket, ctd.pid, ctd.root, ctd.state, ctd.config_path
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

# Paths as containerd sees them inside its namespace; /run there is <tmp>/run outside.
_INNER_RUN = "/run"
_INNER_SOCKET = "/run/containerd/containerd.sock"
_INNER_STATE = "/run/containerd"

# Run containerd again each time it exits, until the stop file exists; stop it when the
# test process that started it ($owner) is gone, so a killed test run leaves nothing behind.
_SUPERVISOR = r"""
set -u
mount --bind "$1" /run || exit 97
stop=$2; log=$3; owner=$4
shift 4
while :; do
    "$@" >>"$log" 2>&1 &
    child=$!
    while kill -0 "$child" 2>/dev/null; do
        if ! kill -0 "$owner" 2>/dev/null; then
            kill -TERM "$child"; wait "$child"; exit 0
        fi
        sleep 0.1
    done
    wait "$child"
    [ -e "$stop" ] && exit 0
    echo "supervisor: containerd exited, restarting" >>"$log"
done
"""


def _bind_lines(binds: dict[str, str]) -> str:
    import shlex

    return "".join(
        f"mount --bind {shlex.quote(os.fspath(src))} {shlex.quote(os.fspath(dst))} || exit 96\n"
        for src, dst in binds.items()
    )


def peer_pid(sock_path: str | os.PathLike) -> int:
    """PID of the process listening on the unix socket ``sock_path`` (SO_PEERCRED)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(os.fspath(sock_path))
        raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, _uid, _gid = struct.unpack("3i", raw)
    return pid


@dataclass
class PrivateContainerd:
    """A running private containerd: host paths of its socket, dirs and config."""

    socket: str
    root: str
    state: str
    config_path: str
    log_path: str
    _proc: subprocess.Popen = field(repr=False)
    _stop_file: str = field(repr=False)

    @property
    def pid(self) -> int:
        """PID of the containerd serving the socket now (changes when it restarts)."""
        return peer_pid(self.socket)

    def wait_ready(self, timeout: float = 30.0, not_pid: int | None = None) -> int:
        """Wait until the socket answers (from a PID other than ``not_pid``); return the PID."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"containerd supervisor exited:\n{self.log()}")
            try:
                pid = peer_pid(self.socket)
            except OSError:
                pid = None
            if pid is not None and pid != not_pid:
                return pid
            time.sleep(0.05)
        raise TimeoutError(f"containerd did not come up on {self.socket}:\n{self.log()}")

    def wait_restarted(self, old_pid: int, timeout: float = 30.0) -> int:
        """Wait for a containerd other than ``old_pid`` to serve the socket; return its PID."""
        return self.wait_ready(timeout, not_pid=old_pid)

    def log(self) -> str:
        """The daemon's combined output so far."""
        try:
            return Path(self.log_path).read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def cri_config(self, timeout: float = 10.0) -> dict:
        """The CRI plugin's configuration as the running daemon loaded it (CRI ``Status``
        with ``verbose``; needs the ``container-runtime-interface-api`` package)."""
        import json

        import grpc
        from cri_api.v1 import api_pb2, api_pb2_grpc

        with grpc.insecure_channel(f"unix://{self.socket}") as channel:
            stub = api_pb2_grpc.RuntimeServiceStub(channel)
            reply = stub.Status(api_pb2.StatusRequest(verbose=True), timeout=timeout)
        return json.loads(reply.info["config"])

    def ctr(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
        """Run ``ctr --address <socket> <args>`` against this instance."""
        return subprocess.run(
            ["ctr", "--address", self.socket, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def _stop(self) -> None:
        Path(self._stop_file).touch()
        with contextlib.suppress(OSError):
            os.kill(self.pid, signal.SIGTERM)
        try:
            self._proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


@contextlib.contextmanager
def private_containerd(
    tmp_path: str | os.PathLike,
    config_text_or_path: str | os.PathLike,
    binds: dict[str, str] | None = None,
) -> Iterator[PrivateContainerd]:
    """Start a supervised containerd on ``config_text_or_path``; stop it on exit.

    A ``str`` is configuration text (written to ``<tmp>/containerd/config.toml``); a
    ``pathlib.Path`` is a file used in place, so a test can edit it and restart the daemon.
    Root, state and socket are private to ``tmp_path`` (given as command-line flags, so the
    file itself is never rewritten). ``binds`` (source -> target) are bind-mounted in the
    daemon's mount namespace, so it sees a scratch host's directory at a host path.
    """
    if shutil.which("containerd") is None or shutil.which("unshare") is None:
        raise RuntimeError("containerd and unshare are needed (tests/setup.sh installs them)")
    base = Path(tmp_path) / "containerd"
    run_dir = base / "run"
    root = base / "root"
    for d in (run_dir / "containerd", root):
        d.mkdir(parents=True, exist_ok=True)
    if isinstance(config_text_or_path, str):
        config_path = base / "config.toml"
        config_path.write_text(config_text_or_path)
    else:
        config_path = Path(config_text_or_path).resolve()
    log_path = base / "containerd.log"
    stop_file = base / "stop"
    stop_file.unlink(missing_ok=True)
    daemon = [
        "containerd",
        "--config",
        str(config_path),
        "--root",
        str(root),
        "--state",
        _INNER_STATE,
        "--address",
        _INNER_SOCKET,
    ]
    proc = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c"]
        + [_bind_lines(binds or {}) + _SUPERVISOR, "sh"]
        + [str(run_dir), str(stop_file), str(log_path), str(os.getpid()), *daemon],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    inst = PrivateContainerd(
        socket=str(run_dir / os.path.relpath(_INNER_SOCKET, _INNER_RUN)),
        root=str(root),
        state=str(run_dir / os.path.relpath(_INNER_STATE, _INNER_RUN)),
        config_path=str(config_path),
        log_path=str(log_path),
        _proc=proc,
        _stop_file=str(stop_file),
    )
    try:
        inst.wait_ready()
        yield inst
    finally:
        inst._stop()
