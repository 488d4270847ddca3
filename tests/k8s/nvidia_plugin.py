"""NVIDIA's real device plugin (``../shared/nvidia``: nvidia-device-plugin v0.20.0) as the
kubelet's device plugin of a test cluster (tests/k8s/cluster.py), and what tests check
against it:

- ``plugin_bin()``: the binary, unpacked once from the shared archive into the test cache;
- ``NvidiaPlugin(k8s)``: runs it as a node process in the cluster's namespaces, the way
  the GPU Operator's pod runs it on a node whose driver lives under ``/run/nvidia/driver``
  (driver root, container driver root and NVML from there; the simulated host's
  ``/proc/driver`` bound over the node's in a mount namespace of its own). ``start()``
  takes the plugin's own flags or environment (``DEVICE_LIST_STRATEGY`` ...) and a config
  file's text; a restart between matrix cells costs about a second, not a cluster;
- ``checkpoint(k8s)``: what the kubelet's ``kubelet_internal_checkpoint`` says the plugin
  allocated, per pod UID and container;
- ``layout(name)`` and ``change_host(k8s, topology)``: the simulated host's MIG layouts the
  plugin accepts, and a host change under the running cluster (mig-manager's re-layout,
  a driver container's upgrade).
"""

from __future__ import annotations

import copy
import glob
import json
import os
import signal
import subprocess
import time

import yaml

from tests.debroot import REPO, cached
from tests.k8s.cluster import DRIVER_ROOT, NODE_NAME, ClusterError

CHECKPOINT = "device-plugins/kubelet_internal_checkpoint"  # under the kubelet's root dir
LIB_DIR = "usr/lib/x86_64-linux-gnu"
CONFIG_PATH = "/etc/nvidia-device-plugin.yaml"  # inside the cluster (its /etc overlay)
SPEC = "/run/cdi/k8s.device-plugin.nvidia.com-gpu.json"  # the plugin's own CDI spec
BASE_TOPOLOGY = os.path.join(REPO, "tests", "sim", "hosts", "h100x8-mig.yaml")

# In a mount namespace of its own: the simulated host's /proc/driver (MIG capabilities,
# mig-minors) over the node's, then the plugin (as the driver container's /proc would be).
_WRAP = 'mount --bind "$PROC_DRIVER" /proc/driver && exec "$@"'


def plugin_archive() -> str:
    """The shared archive of NVIDIA's device plugin."""
    for shared in (os.path.join(os.path.dirname(REPO), "shared"), "/work/shared"):
        found = sorted(glob.glob(os.path.join(shared, "nvidia", "nvidia-device-plugin-*.tar.xz")))
        if found:
            return found[-1]
    raise FileNotFoundError("no nvidia-device-plugin archive in ../shared/nvidia")


def plugin_bin() -> str:
    """Path of ``nvidia-device-plugin``, unpacked once per archive."""
    archive = plugin_archive()
    stat = os.stat(archive)

    def build(path: str) -> None:
        os.makedirs(path)
        subprocess.run(["tar", "-C", path, "-xJf", archive], check=True, capture_output=True)

    key = {"archive": os.path.basename(archive), "size": stat.st_size}
    return os.path.join(cached("nvidia-device-plugin", key, build), "nvidia-device-plugin")


# -- the simulated host's layouts -----------------------------------------------------------


def _mig_uuid(*seed: object) -> str:
    import hashlib

    h = hashlib.sha256(repr(seed).encode()).hexdigest()
    return f"MIG-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _migs(gpu: int, profile: str, count: int, slices: int) -> list[dict]:
    """``count`` GPU instances of ``profile`` (``slices`` each), one compute instance each."""
    gis = {1: [9, 10, 11, 12, 13, 14, 7], 2: [3, 4, 5], 3: [1, 2], 4: [0], 7: [0]}[slices]
    return [
        {"gi": gis[i], "ci": 0, "profile": profile, "uuid": _mig_uuid(gpu, profile, i)}
        for i in range(count)
    ]


def layout(name: str, driver_version: str | None = None) -> dict:
    """A topology the real plugin accepts, from the cluster's 8 x H100 host:

    - ``mixed``: GPUs 0-5 whole; GPU 6 3g.40gb + 2g.20gb + 1g.10gb; GPU 7 2g.20gb + five
      1g.10gb (the shipped host's two ``1c.2g.20gb`` compute instances, which the plugin
      refuses to start with, made one 2g.20gb);
    - ``whole``: no GPU in MIG mode (what ``migStrategy: none`` is for);
    - ``single``: every GPU in MIG mode with two 3g.40gb;
    - ``mixed-7g``: ``mixed`` with GPU 0 in MIG mode as one 7g.80gb (a new MIG device).
    ``driver_version``: another driver (an upgrade)."""
    with open(BASE_TOPOLOGY, encoding="utf-8") as fh:
        topo = yaml.safe_load(fh)
    gpus = topo["gpus"]
    first = gpus[7]["mig_devices"][0]
    gpus[7]["mig_devices"] = [{**first, "profile": "2g.20gb"}] + gpus[7]["mig_devices"][2:]
    if name == "whole":
        for gpu in gpus:
            gpu.pop("mig_mode", None)
            gpu.pop("mig_devices", None)
    elif name == "single":
        for gpu in gpus:
            gpu["mig_mode"] = "enabled"
            gpu["mig_devices"] = _migs(gpu["index"], "3g.40gb", 2, 3)
    elif name == "mixed-7g":
        gpus[0]["mig_mode"] = "enabled"
        gpus[0]["mig_devices"] = _migs(0, "7g.80gb", 1, 7)
    elif name != "mixed":
        raise ValueError(f"layout {name!r}: whole, mixed, single or mixed-7g")
    if driver_version:
        topo["driver_version"] = driver_version
    topo["name"] = f"h100x8-{name}"
    return copy.deepcopy(topo)


def change_host(k8s, topology: str | dict, extra_files: dict | None = None) -> None:
    """Change the cluster's simulated host under the running cluster (its driver root
    ``/run/nvidia/driver`` is a bind mount of the built host: rebuilt in place, with
    ``extra_files`` as ``build_host`` takes them)."""
    from tests.sim.simhost import rebuild_host

    k8s.sim = rebuild_host(k8s.sim, topology, extra_files)


# -- the kubelet's record ------------------------------------------------------------------


def checkpoint(k8s) -> dict[tuple[str, str], dict[str, list[str]]]:
    """``{(pod UID, container): {resource: [device ids]}}`` from the kubelet's checkpoint."""
    with open(os.path.join(str(k8s.workdir), "kubelet", CHECKPOINT), encoding="utf-8") as fh:
        data = json.load(fh)["Data"]
    out: dict[tuple[str, str], dict[str, list[str]]] = {}
    for entry in data.get("PodDeviceEntries") or []:
        ids = [i for per_numa in (entry.get("DeviceIDs") or {}).values() for i in per_numa]
        key = (entry["PodUID"], entry["ContainerName"])
        out.setdefault(key, {}).setdefault(entry["ResourceName"], []).extend(ids)
    return out


def allocated(k8s, namespace: str, pod: str, container: str) -> dict[str, list[str]]:
    """What the checkpoint says the plugin gave ``container`` of ``pod``."""
    uid = k8s.get("pod", "-n", namespace, pod)["metadata"]["uid"]
    return checkpoint(k8s).get((uid, container), {})


def allocate_response(k8s, namespace: str, pod: str, container: str) -> bytes:
    """The plugin's ``ContainerAllocateResponse`` for ``container`` of ``pod`` as the
    kubelet keeps it (serialized protobuf)."""
    import base64

    uid = k8s.get("pod", "-n", namespace, pod)["metadata"]["uid"]
    with open(os.path.join(str(k8s.workdir), "kubelet", CHECKPOINT), encoding="utf-8") as fh:
        entries = json.load(fh)["Data"].get("PodDeviceEntries") or []
    (entry,) = [e for e in entries if (e["PodUID"], e["ContainerName"]) == (uid, container)]
    return base64.b64decode(entry["AllocResp"])


# -- the plugin ----------------------------------------------------------------------------


class NvidiaPlugin:
    """NVIDIA's device plugin as the node's one device plugin; restartable with other
    settings (``start`` stops a running one first)."""

    def __init__(self, k8s) -> None:
        self.k8s = k8s
        self.binary = plugin_bin()
        self.proc: subprocess.Popen | None = None
        self.log_path = os.path.join(str(k8s.workdir), "logs", "nvidia-device-plugin.log")
        self.starts = 0
        self._log_from = 0

    def start(
        self,
        flags: dict[str, str] | None = None,
        env: dict[str, str] | None = None,
        config: str | None = None,
        resources: tuple[str, ...] = ("nvidia.com/gpu",),
        timeout: float = 60.0,
    ) -> NvidiaPlugin:
        """Run the plugin with ``flags`` (``--name=value``), ``env`` (its variables) and
        ``config`` (the text of ``--config-file``, as the GPU Operator mounts its
        ConfigMap); wait until the node offers every one of ``resources``."""
        self.stop()
        argv = [
            self.binary,
            f"--driver-root={DRIVER_ROOT}",
            f"--dev-root={DRIVER_ROOT}",
            f"--container-driver-root={DRIVER_ROOT}",
            "--fail-on-init-error=true",
        ]
        argv += [f"--{k}={v}" for k, v in (flags or {}).items()]
        if config is not None:
            with open(self.k8s.path(CONFIG_PATH), "w") as fh:
                fh.write(config)
            argv.append(f"--config-file={CONFIG_PATH}")
        wrapped = ["unshare", "--mount", "--propagation", "private", "sh", "-c", _WRAP, "sh"]
        run_env = {
            "PROC_DRIVER": f"{DRIVER_ROOT}/proc/driver",
            "LD_LIBRARY_PATH": f"{DRIVER_ROOT}/{LIB_DIR}",
            "DP_DISABLE_HEALTHCHECKS": "all",
            **(env or {}),
        }
        self.starts += 1
        with open(self.log_path, "ab") as log:
            self._log_from = log.tell()
            log.write(f"\n==== start {self.starts}: {argv[5:]} {env or {}}\n".encode())
            log.flush()
            self.proc = self.k8s.popen(
                wrapped + argv, env=run_env, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self.wait_resources(resources, timeout)
        return self

    def wait_resources(self, resources: tuple[str, ...], timeout: float = 60.0) -> dict:
        """Wait until this start registered every one of ``resources`` with the kubelet
        and the node offers a non-zero count of each."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise ClusterError(f"nvidia-device-plugin exited:\n{self.log()}")
            with open(self.log_path, errors="replace") as fh:
                fh.seek(self._log_from)
                text = fh.read()
            if all(f"Registered device plugin for '{r}' with Kubelet" in text for r in resources):
                node = self.k8s.get("node", NODE_NAME)
                allocatable = node["status"].get("allocatable", {})
                if all(allocatable.get(r, "0") != "0" for r in resources):
                    return allocatable
            if time.monotonic() > deadline:
                raise ClusterError(f"resources {resources} never offered ({allocatable}):\n"
                                   f"{self.log()}")  # fmt: skip
            time.sleep(0.3)

    def stop(self) -> None:
        """SIGTERM (the plugin removes its sockets; the kubelet marks its devices
        unhealthy), then wait for it."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None

    def clean(self) -> None:
        """Stop it and remove what it left on the node: its CDI spec and config file."""
        self.stop()
        for inside in (SPEC, CONFIG_PATH):
            try:
                os.unlink(self.k8s.path(inside))
            except FileNotFoundError:
                pass

    def log(self, tail: int = 6000) -> str:
        try:
            with open(self.log_path, errors="replace") as fh:
                return fh.read()[-tail:]
        except OSError:
            return ""
