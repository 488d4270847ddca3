"""The kubelet plugin's two gRPC servers and their sockets.

- ``<kubelet>/plugins_registry/gpu.nvshim.io-reg.sock``: pluginregistration v1
  ``Registration`` (``GetInfo`` answers type ``DRAPlugin``, the driver name, the DRA
  endpoint and the services ``v1.DRAPlugin``, ``v1beta1.DRAPlugin``). The kubelet's plugin
  watcher registers every socket it finds there at start and on creation: a restarted
  kubelet registers the plugin again from the same socket, and a socket removed by someone
  is made again within a second (the watcher thread), which registers it anew.
- ``<kubelet>/plugins/gpu.nvshim.io/dra.sock``: the ``DRAPlugin`` service, v1 and v1beta1
  (same messages), ``NodePrepareResources`` / ``NodeUnprepareResources``.

Both sockets are removed on ``stop`` (SIGTERM).
"""

from __future__ import annotations

import os
import stat
import sys
import threading
import time
from collections.abc import Callable
from concurrent import futures

from nvshim.dra import DRIVER_NAME, wire

# MPS daemons are started by fork+exec from a handler thread: gRPC's fork handlers are
# for children that keep using gRPC, which these never do (and they log a line each time).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

REGISTRATION_SERVICE = "pluginregistration.Registration"
DRA_SERVICES = {
    "v1.DRAPlugin": "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin",
    "v1beta1.DRAPlugin": "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin",
}
PLUGIN_TYPE = "DRAPlugin"
WATCH_INTERVAL = 1.0
MAX_SOCKET_PATH = 107  # sun_path less its NUL


def log(line: str) -> None:
    """One line on stderr (the DaemonSet's log)."""
    print(f"nvshim dra: {line}", file=sys.stderr, flush=True)


def socket_paths(kubelet_dir: str) -> tuple[str, str]:
    """The registration socket and the DRA service socket under ``kubelet_dir``."""
    return (
        os.path.join(kubelet_dir, "plugins_registry", f"{DRIVER_NAME}-reg.sock"),
        os.path.join(kubelet_dir, "plugins", DRIVER_NAME, "dra.sock"),
    )


def _unary(fn: Callable, request: wire.Schema, response: wire.Schema):
    import grpc

    return grpc.unary_unary_rpc_method_handler(
        fn,
        request_deserializer=lambda data: wire.decode(data, request),
        response_serializer=lambda msg: wire.encode(msg, response),
    )


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISSOCK(st.st_mode) else None


class _Socket:
    """One gRPC server on one Unix socket, restartable when its socket file goes."""

    def __init__(self, path: str, handlers: list):
        self.path = path
        self.handlers = handlers
        self.server = None
        self.identity: tuple[int, int] | None = None

    def start(self) -> None:
        import grpc

        os.makedirs(os.path.dirname(self.path), mode=0o750, exist_ok=True)
        _unlink(self.path)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        server.add_generic_rpc_handlers(self.handlers)
        if len(self.path.encode()) > MAX_SOCKET_PATH:
            raise OSError(f"{self.path}: longer than {MAX_SOCKET_PATH} bytes (a socket's limit)")
        try:
            server.add_insecure_port(f"unix://{self.path}")
        except RuntimeError:
            raise OSError(f"{self.path}: cannot listen on this socket") from None
        server.start()
        self.server = server
        self.identity = _identity(self.path)

    def lost(self) -> bool:
        """True when the socket file is gone or replaced."""
        return _identity(self.path) != self.identity

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(grace=1).wait(2)
            self.server = None
        if _identity(self.path) == self.identity:
            _unlink(self.path)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class Plugin:
    """Both servers of the plugin around a ``Driver`` (``prepare``/``unprepare``)."""

    def __init__(self, driver, kubelet_dir: str):
        import grpc

        self.driver = driver
        self.registered = threading.Event()
        self.registrations = 0
        reg_path, dra_path = socket_paths(kubelet_dir)
        self.reg_path, self.dra_path = reg_path, dra_path
        registration = grpc.method_handlers_generic_handler(
            REGISTRATION_SERVICE,
            {
                "GetInfo": _unary(self._get_info, wire.EMPTY, wire.PLUGIN_INFO),
                "NotifyRegistrationStatus": _unary(
                    self._notify, wire.REGISTRATION_STATUS, wire.EMPTY
                ),
            },
        )
        dra = [
            grpc.method_handlers_generic_handler(
                service,
                {
                    "NodePrepareResources": _unary(
                        self._prepare, wire.CLAIMS_REQUEST, wire.PREPARE_RESPONSE
                    ),
                    "NodeUnprepareResources": _unary(
                        self._unprepare, wire.CLAIMS_REQUEST, wire.UNPREPARE_RESPONSE
                    ),
                },
            )
            for service in DRA_SERVICES.values()
        ]
        self.dra = _Socket(dra_path, dra)
        self.reg = _Socket(reg_path, [registration])
        self.stopping = threading.Event()
        self.watcher: threading.Thread | None = None

    # -- RPCs -----------------------------------------------------------------------------
    def _get_info(self, _request, _context) -> dict:
        return {
            "type": PLUGIN_TYPE,
            "name": DRIVER_NAME,
            "endpoint": self.dra_path,
            "supported_versions": list(DRA_SERVICES),
        }

    def _notify(self, status, _context) -> dict:
        if status["plugin_registered"]:
            self.registrations += 1
            self.registered.set()
            log("registered with the kubelet")
        else:
            log(f"the kubelet refused the registration: {status['error']}")
        return {}

    def _prepare(self, request, _context) -> dict:
        out = {}
        for claim in request["claims"]:
            started = time.monotonic()
            out[claim["uid"]] = answer = self.driver.prepare(claim)
            what = answer["error"] or ", ".join(d["device_name"] for d in answer["devices"])
            took = (time.monotonic() - started) * 1000
            log(
                f"prepare {claim['namespace']}/{claim['name']} ({claim['uid']}): {what} "
                f"[{took:.1f} ms]"
            )
        return {"claims": out}

    def _unprepare(self, request, _context) -> dict:
        out = {}
        for claim in request["claims"]:
            out[claim["uid"]] = answer = self.driver.unprepare(claim)
            log(
                f"unprepare {claim['namespace']}/{claim['name']} ({claim['uid']}): "
                f"{answer['error'] or 'done'}"
            )
        return {"claims": out}

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        """Serve the DRA socket first, then the registration socket (the kubelet dials the
        endpoint as soon as it sees the registration), then watch both."""
        self.dra.start()
        self.reg.start()
        log(f"serving {self.dra_path}, registration {self.reg_path}")
        self.watcher = threading.Thread(target=self._watch, name="socket-watch", daemon=True)
        self.watcher.start()

    def _watch(self) -> None:
        while not self.stopping.wait(WATCH_INTERVAL):
            for sock in (self.dra, self.reg):
                if sock.lost() and not self.stopping.is_set():
                    log(f"socket {sock.path} gone: serving it again")
                    try:
                        sock.stop()
                        sock.start()
                    except OSError as err:
                        log(f"cannot serve {sock.path} again: {err}")

    def stop(self) -> None:
        """Stop serving and remove both sockets (registration first: the kubelet then
        deregisters the plugin)."""
        self.stopping.set()
        if self.watcher is not None:
            self.watcher.join(timeout=3)
        self.reg.stop()
        self.dra.stop()
