"""``nvshim dra run``: the plugin's main loop.

Discover the host, unprepare what the checkpoint holds but the cluster no longer does,
serve the kubelet's sockets, and keep the node's ResourceSlices current: every ``interval``
seconds the host key (the CDI refresh key, ``nvshim.cdi.refresh.host_key``) and NVML's
device layout (GPUs, MIG mode, MIG devices and profiles: a MIG reconfiguration need not
touch any file the key reads) are checked, and a change rediscovers and republishes; every
``resync`` seconds the slices are compared with the API server's anyway (a deleted slice
comes back), and on every tick for ``REGISTERED_RECHECK`` seconds after the kubelet
registers the plugin: a kubelet that starts deletes the node's slices (it cannot know which
drivers come back), so a kubelet restart would otherwise leave the node's GPUs unadvertised
until the next resync. SIGTERM/SIGINT stop it, removing its sockets (and its checkpoint
when no claim is prepared).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import TYPE_CHECKING

from nvshim.dra import slices
from nvshim.dra.kube import Kube, KubeError
from nvshim.dra.prepare import Driver
from nvshim.dra.server import Plugin, log, socket_paths
from nvshim.errors import NvshimError

if TYPE_CHECKING:
    from nvshim.node.hostview import RootPairs

KEY_OPTIONS = {"sink": "dra-resourceslices"}
REGISTERED_RECHECK = 10.0  # seconds of per-tick slice checks after a registration


class Publisher:
    """Keeps the node's slices in step with the host."""

    def __init__(self, kube: Kube, node: str, driver: Driver, driver_root: str, dev_root: str):
        self.kube, self.node, self.driver = kube, node, driver
        self.driver_root, self.dev_root = driver_root, dev_root
        self.key: dict | None = None
        self.layout: tuple | None = None
        self.library: str | None = None  # the NVML library of the last discovery
        self.node_uid: str | None = None
        self.last_sync = 0.0

    def _layout(self) -> tuple | None:
        """NVML's device layout now (a few calls, no file scan); None when NVML fails."""
        from nvshim.host import nvml

        try:
            snap = nvml.query(self.library)
        except NvshimError:
            return None
        return tuple(
            (g.uuid, g.mig_enabled, tuple((m.uuid, m.profile) for m in g.migs)) for g in snap.gpus
        )

    def _find_library(self) -> None:
        from nvshim.host import files, nvml

        entries = files.read_ld_cache(self.driver_root, [])
        self.library = nvml.find_library(self.driver_root, entries)

    def tick(self, resync: float) -> None:
        """Republish when the host changed or ``resync`` seconds passed; errors are logged
        and retried on the next tick."""
        from nvshim.cdi.refresh import host_key
        from nvshim.host.discover import discover_host

        key = host_key(self.driver_root, self.dev_root, KEY_OPTIONS)
        if key != self.key:
            self._find_library()
        layout = self._layout()
        changed = key != self.key or (layout is not None and layout != self.layout)
        if not changed and time.monotonic() - self.last_sync < resync:
            return
        try:
            if changed and self.key is not None:
                host = discover_host(self.driver_root, self.dev_root)
                with self.driver.lock:
                    self.driver.host = host
                log("host changed: rediscovered")
            warnings: list[str] = []
            devices = slices.slice_devices(self.driver.host, self.driver.config, warnings)
            for warning in warnings if changed else ():  # once per host state
                log(f"warning: {warning}")
            if self.node_uid is None:
                self.node_uid = _node_uid(self.kube, self.node)
            line = slices.publish(self.kube, self.node, devices, self.node_uid)
        except (NvshimError, OSError) as err:
            log(f"ResourceSlices of {self.node}: {err} (retrying)")
            return
        if changed or not line.endswith("current"):
            log(f"ResourceSlices of {self.node}: {line}")
        self.key, self.layout, self.last_sync = key, layout, time.monotonic()


def _node_uid(kube: Kube, node: str) -> str | None:
    try:
        return kube.get(f"/api/v1/nodes/{node}")["metadata"]["uid"]
    except (KubeError, KeyError):
        return None


def run(
    kube: Kube,
    node: str,
    config,
    driver_root: str,
    dev_root: str,
    kubelet_dir: str,
    cdi_dir: str,
    mps_root: str,
    interval: float = 5.0,
    resync: float = 60.0,
    host_root: str = "/",
    view: RootPairs | None = None,
) -> None:
    """Run until SIGTERM or SIGINT. ``view``: (here, on the node) of the driver root and
    dev root (:meth:`nvshim.dra.prepare.Driver.host_view`)."""
    from nvshim.host.discover import discover_host

    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    host = discover_host(driver_root, dev_root)
    plugin_dir = os.path.dirname(socket_paths(kubelet_dir)[1])  # its DRA socket's
    driver = Driver(kube, node, host, config, cdi_dir, plugin_dir, mps_root, host_root, view)
    for line in driver.reconcile():
        log(line)
    plugin = Plugin(driver, kubelet_dir)
    plugin.start()
    publisher = Publisher(kube, node, driver, driver_root, dev_root)
    registrations, recheck_until = 0, 0.0
    try:
        while not stop.is_set():
            if plugin.registrations != registrations:  # a kubelet (re)started
                registrations = plugin.registrations
                recheck_until = time.monotonic() + REGISTERED_RECHECK
            publisher.tick(0.0 if time.monotonic() < recheck_until else resync)
            stop.wait(interval)
    finally:
        plugin.stop()
        if driver.forget_all_if_idle():
            try:
                os.rmdir(plugin_dir)
            except OSError:
                pass
        log("stopped: sockets removed")
