"""The nvshim runtime entry of an engine: in its config file, and as the running engine
loaded it (containerd: CRI ``Status``; Docker: ``GET /info``; CRI-O: ``GET /config``)."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import tomllib

from nvshim.engines.settings import Settings
from nvshim.errors import NvshimError

TIMEOUT = 10.0


def _toml(text: str, where: str) -> dict:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise NvshimError(f"{where}: invalid TOML: {err}") from None


def _dig(data: object, *keys: str) -> object:
    for key in keys:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def entry_from_config(engine: str, data: dict, name: str) -> str | None:
    """The runtime binary ``name`` names in an engine config (parsed), None if absent."""
    if engine == "containerd":
        from nvshim.engines.containerd import CRI_PLUGIN

        version = data.get("version", 1)
        cri = CRI_PLUGIN.get(version) if isinstance(version, int) else None
        if cri is None:
            raise NvshimError(f"containerd config version {version!r} is not supported")
        found = _dig(data, *cri, "containerd", "runtimes", name, "options", "BinaryName")
    elif engine == "docker":
        found = _dig(data, "runtimes", name, "path")
    else:
        found = _dig(data, "crio", "runtime", "runtimes", name, "runtime_path")
    return found if isinstance(found, str) else None


def configured_entry(s: Settings) -> str | None:
    """The runtime binary of ``s.runtime_name`` in the engine's config file (and the
    containerd drop-in when given); NvshimError for an unreadable or broken file."""
    from nvshim.engines.common import decode, read_bytes

    found = None
    for path in [s.config] + ([s.drop_in] if s.drop_in else []):
        raw = read_bytes(path)  # configure's reader: its one-line errors
        if raw is None:
            continue
        text = decode(path, raw)
        if s.engine == "docker":
            try:
                data = json.loads(text or "{}")
            except json.JSONDecodeError as err:
                raise NvshimError(f"{path}: invalid JSON: {err}") from None
        else:
            data = _toml(text, path)
        found = entry_from_config(s.engine, data, s.runtime_name) or found
    return found


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=TIMEOUT)
        self.unix_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(TIMEOUT)
        self.sock.connect(self.unix_path)


def _http_get(sock_path: str, url: str) -> str:
    conn = _UnixConnection(sock_path)
    try:
        conn.request("GET", url)
        reply = conn.getresponse()
        body = reply.read().decode("utf-8", "replace")
    except OSError as err:
        raise NvshimError(f"{sock_path}: GET {url}: {err}") from None
    finally:
        conn.close()
    if reply.status != 200:
        raise NvshimError(f"{sock_path}: GET {url}: HTTP {reply.status}")
    return body


def _cri_config(sock_path: str) -> dict:
    """The CRI plugin's loaded config: the grpc stubs when installed, else ``crictl``."""
    try:
        import grpc
        from cri_api.v1 import api_pb2, api_pb2_grpc
    except ImportError:
        grpc = None
    if grpc is not None:
        try:
            with grpc.insecure_channel(f"unix://{sock_path}") as channel:
                stub = api_pb2_grpc.RuntimeServiceStub(channel)
                reply = stub.Status(api_pb2.StatusRequest(verbose=True), timeout=TIMEOUT)
        except grpc.RpcError as err:
            raise NvshimError(f"{sock_path}: CRI Status: {err.code().name}") from None
        return json.loads(reply.info["config"])
    try:
        out = subprocess.run(
            ["crictl", "--runtime-endpoint", f"unix://{sock_path}", "info", "-o", "json"],
            capture_output=True,
            text=True,
            timeout=TIMEOUT * 3,
            check=False,
        )
    except FileNotFoundError:
        raise LookupError("neither the CRI python stubs nor crictl are installed") from None
    except subprocess.TimeoutExpired:
        raise NvshimError(f"{sock_path}: crictl info timed out") from None
    if out.returncode != 0:
        raise NvshimError(f"{sock_path}: crictl info: {' '.join(out.stderr.split())[:200]}")
    return json.loads(out.stdout)["config"]


def loaded_entry(s: Settings) -> str | None:
    """The runtime binary the running engine has for ``s.runtime_name`` (None: not
    loaded). NvshimError when the engine does not answer; LookupError when this host
    has no way to ask (containerd without CRI stubs or crictl)."""
    if not os.path.exists(s.socket):
        raise NvshimError(f"{s.engine} is not running (no socket {s.socket})")
    if s.engine == "containerd":
        found = _dig(_cri_config(s.socket), "containerd", "runtimes", s.runtime_name)
        found = _dig(found, "options", "BinaryName")
    elif s.engine == "docker":
        found = _dig(json.loads(_http_get(s.socket, "/info")), "Runtimes", s.runtime_name, "path")
    else:
        data = _toml(_http_get(s.socket, "/config"), f"{s.socket} /config")
        found = entry_from_config("crio", data, s.runtime_name)
    return found if isinstance(found, str) else None


def started_after(pid: int, path: str) -> bool | None:
    """Whether process ``pid`` started after ``path`` was last written (None: unknown)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            ticks = int(fh.read().rpartition(")")[2].split()[19])
        with open("/proc/stat") as fh:
            btime = next(int(line.split()[1]) for line in fh if line.startswith("btime"))
        started = btime + ticks / os.sysconf("SC_CLK_TCK")
        return started >= os.stat(path).st_mtime
    except (OSError, ValueError, StopIteration, IndexError):
        return None
