#!/usr/bin/python3 -IS
"""A stand-in for ``nvidia-cuda-mps-control`` on simulated hosts (standard library only).

Install it as ``usr/bin/nvidia-cuda-mps-control`` of a simulated driver root
(``build_host(..., extra_files=fake_mps_control.extra_files())``). It behaves like the real
one for what nvshim uses:

- ``-d``: daemonizes (double fork, setsid), listens on ``$CUDA_MPS_PIPE_DIRECTORY/control``
  (a unix socket; default pipe dir ``/tmp/nvidia-mps``), writes
  ``nvidia-cuda-mps-control.pid`` there, and exits 0 once the daemon is ready. A second
  ``-d`` on a pipe dir whose daemon is alive fails as the real one does.
- no argument: the client form. Reads commands on stdin, sends them to the daemon of
  ``$CUDA_MPS_PIPE_DIRECTORY`` and prints the answers; exits 1 when no daemon is running.
- Commands: ``set_default_active_thread_percentage N`` (answers the value),
  ``get_default_active_thread_percentage``, ``set_default_device_pinned_mem_limit DEV
  VALUE``, ``get_default_device_pinned_mem_limit DEV``, ``get_server_list``, ``quit``
  (stops the daemon and removes the pid file).
- ``new_client``: what a (fake) CUDA client sends on its connection; logged as the real
  daemon logs a client, ``NEW CLIENT <pid> from user <uid>: ...`` (the peer's credentials).

Records, one line each, in ``$CUDA_MPS_LOG_DIRECTORY/control.log`` (default
``/var/log/nvidia-mps``): ``start {json}`` (pid, uid, argv, the whole env, the /dev/shm
marker it wrote), ``cmd <command>`` for every command, ``quit``. The daemon also writes a
marker file ``/dev/shm/fake-mps-control.<pid>`` (removed on quit) so tests can see which
/dev/shm it was given.
"""

import json
import os
import socket
import struct
import sys
import time

PID_FILE = "nvidia-cuda-mps-control.pid"
SOCKET = "control"


def _dirs():
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps"
    log = os.environ.get("CUDA_MPS_LOG_DIRECTORY") or "/var/log/nvidia-mps"
    return pipe, log


def _log(log_dir, line):
    with open(os.path.join(log_dir, "control.log"), "a", encoding="utf-8") as fh:
        fh.write(line + "\n")


def _live_pid(pipe_dir):
    try:
        with open(os.path.join(pipe_dir, PID_FILE), encoding="ascii") as fh:
            pid = int(fh.read().strip())
    except (OSError, ValueError):
        return None
    # a killed daemon left as a zombie (an init that does not reap orphans) is gone, as the
    # real one's lock is
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            state = fh.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return None
    return None if state in ("Z", "X", "x") else pid


def _socket_path(dir_fd):
    # Through the directory's fd: deep test paths exceed sun_path's 108 bytes.
    return f"/proc/self/fd/{dir_fd}/{SOCKET}"


class Daemon:
    def __init__(self, pipe_dir, log_dir):
        self.pipe_dir, self.log_dir = pipe_dir, log_dir
        self.thread_percentage = 100.0
        self.mem_limits = {}
        self.running = True

    def answer(self, line, peer=(0, 0, 0)):
        words = line.split()
        if not words:
            return ""
        cmd, args = words[0], words[1:]
        if cmd == "set_default_active_thread_percentage" and len(args) == 1:
            try:
                value = float(args[0])
            except ValueError:
                return "Invalid value"
            if not 0 < value <= 100:
                return "Invalid value"
            self.thread_percentage = value
            return f"{value:.1f}"
        if cmd == "get_default_active_thread_percentage" and not args:
            return f"{self.thread_percentage:.1f}"
        if cmd == "set_default_device_pinned_mem_limit" and len(args) == 2:
            self.mem_limits[args[0]] = args[1]
            return ""
        if cmd == "get_default_device_pinned_mem_limit" and len(args) == 1:
            return self.mem_limits.get(args[0], "Unlimited")
        if cmd == "new_client" and not args:
            pid, uid, _ = peer
            _log(self.log_dir, f"NEW CLIENT {pid} from user {uid}: Server already exists")
            return "ok"
        if cmd == "get_server_list" and not args:
            return ""
        if cmd == "quit" and not args:
            self.running = False
            return ""
        return f"Unrecognized command: {line}"

    def serve(self, listener):
        while self.running:
            conn, _ = listener.accept()
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            peer = struct.unpack("3i", creds)
            with conn, conn.makefile("rwb") as stream:
                for raw in stream:
                    line = raw.decode("utf-8", "replace").strip()
                    _log(self.log_dir, f"cmd {line}")
                    stream.write((self.answer(line, peer) + "\n").encode())
                    stream.flush()


def start_daemon():
    pipe_dir, log_dir = _dirs()
    if _live_pid(pipe_dir):
        print("An instance of this daemon is already running", file=sys.stderr)
        return 1
    for d in (pipe_dir, log_dir):
        os.makedirs(d, exist_ok=True)
    ready_r, ready_w = os.pipe()
    child = os.fork()
    if child > 0:  # the caller's process: wait until the daemon is ready
        os.close(ready_w)
        with os.fdopen(ready_r, "rb") as fh:
            status = fh.read()
        os.waitpid(child, 0)  # the intermediate process (it exits at once)
        if status != b"ok":
            print(status.decode("utf-8", "replace") or "daemon failed to start", file=sys.stderr)
            return 1
        return 0
    os.close(ready_r)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    try:
        # the real daemon's name, however this script was started (a launcher that runs
        # python on it names the process python3)
        with open("/proc/self/comm", "w", encoding="ascii") as fh:
            fh.write("nvidia-cuda-mps")
        os.chdir("/")
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        dir_fd = os.open(pipe_dir, os.O_PATH | os.O_DIRECTORY)
        path = _socket_path(dir_fd)
        if os.path.lexists(path):
            os.unlink(path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(16)
        pid = os.getpid()
        marker = f"/dev/shm/fake-mps-control.{pid}"
        with open(marker, "w", encoding="ascii") as fh:
            fh.write(f"{pid}\n")
        with open(os.path.join(pipe_dir, PID_FILE), "w", encoding="ascii") as fh:
            fh.write(f"{pid}\n")
        record = {
            "pid": pid,
            "uid": os.getuid(),
            "argv": sys.argv,
            "env": dict(os.environ),
            "shm_marker": marker,
            "time": time.time(),
        }
        _log(log_dir, "start " + json.dumps(record, sort_keys=True))
    except Exception as err:  # noqa: BLE001 - reported to the waiting parent
        os.write(ready_w, f"fake mps daemon: {err}".encode())
        os._exit(1)
    os.write(ready_w, b"ok")
    os.close(ready_w)
    daemon = Daemon(pipe_dir, log_dir)
    try:
        daemon.serve(listener)
    finally:
        _log(log_dir, "quit")
        for path in (os.path.join(pipe_dir, PID_FILE), _socket_path(dir_fd), marker):
            try:
                os.unlink(path)
            except OSError:
                pass
    os._exit(0)


def client():
    pipe_dir, _ = _dirs()
    if not _live_pid(pipe_dir):
        print("Cannot find MPS control daemon process", file=sys.stderr)
        return 1
    dir_fd = os.open(pipe_dir, os.O_PATH | os.O_DIRECTORY)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(_socket_path(dir_fd))
        except OSError as err:
            print(f"Cannot connect to MPS control daemon: {err.strerror}", file=sys.stderr)
            return 1
        with sock.makefile("rwb") as stream:
            for line in sys.stdin:
                if not line.strip():
                    continue
                stream.write(line.strip().encode() + b"\n")
                stream.flush()
                answer = stream.readline().decode("utf-8", "replace").rstrip("\n")
                if answer:
                    print(answer)
    return 0


def main(argv):
    if argv == ["-d"]:
        return start_daemon()
    if not argv:
        return client()
    print("usage: nvidia-cuda-mps-control [-d]", file=sys.stderr)
    return 1


def extra_files():
    """``build_host`` extra_files installing this script as the driver's control binary."""
    with open(os.path.abspath(__file__), encoding="utf-8") as fh:
        return {"usr/bin/nvidia-cuda-mps-control": fh.read()}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
