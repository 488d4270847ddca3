"""Prepare and unprepare ResourceClaims: one transient CDI spec per claim, a checkpoint.

Prepare reads the allocated claim from the API server, picks the results of this driver
and node's pool, and writes ``<cdi-dir>/k8s.gpu.nvshim.io-claim_<uid>.json`` (kind
``k8s.gpu.nvshim.io/claim``, one CDI device ``<uid>-<device>`` per allocated device). The
edits are nvshim's: the driver files, control nodes and hooks every GPU container needs
(spec level), each device's nodes, and per request ``CUDA_VISIBLE_DEVICES`` by UUID plus,
under an MPS ``GpuConfig``, the claim's own MPS daemon with its pipe directory, shm and
limits. A device prepared for another claim is refused. The checkpoint
(``<plugin-dir>/checkpoint.json``) holds every prepared claim: prepare is idempotent, and a
restarted plugin unprepares the claims the API server no longer has for this node.

Order: daemon, then spec, then checkpoint; unprepare in reverse. A crash between leaves a
spec without a checkpoint entry, which ``reconcile`` removes.
"""

from __future__ import annotations

import json
import os
import threading
from typing import TYPE_CHECKING, Any

from nvshim.dra import CDI_CLASS, CDI_VENDOR, DRIVER_NAME, checkpoint, device_name
from nvshim.dra.checkpoint import CheckpointError, check_name, check_namespace, check_request
from nvshim.dra.kube import RESOURCE_API, Kube, KubeError
from nvshim.dra.params import GpuConfig, ParamsError, configs_for_requests
from nvshim.edits import ContainerEdits
from nvshim.errors import NvshimError
from nvshim.host.model import Host

if TYPE_CHECKING:
    from nvshim.node.hostview import RootPairs

SPEC_PREFIX = f"{CDI_VENDOR}-{CDI_CLASS}_"


class PrepareError(NvshimError):
    """A claim this node cannot prepare (returned to the kubelet as the claim's error)."""


class ClaimGone(PrepareError):
    """The claim the kubelet (or the checkpoint) names no longer exists under that UID."""


def spec_path(cdi_dir: str, uid: str) -> str:
    """Where the claim's CDI spec lives."""
    return os.path.join(cdi_dir, f"{SPEC_PREFIX}{uid}.json")


def cdi_id(uid: str, device: str) -> str:
    """The fully qualified CDI name of one prepared device."""
    return f"{CDI_VENDOR}/{CDI_CLASS}={uid}-{device}"


def parent_request(name: str) -> str:
    """The request a result answers to the kubelet: ``gpu`` for a ``firstAvailable``
    subrequest ``gpu/whole`` (a container names the request, never the subrequest; k8s'
    kubeletplugin helper strips it the same way)."""
    return name.split("/", 1)[0]


def _check_claim(claim: dict[str, str]) -> str:
    """The kubelet's claim reference, checked where it enters; its UID."""
    try:
        check_namespace(claim.get("namespace"))
        check_name(claim.get("name"))
        return checkpoint.check_uid(claim.get("uid"))
    except CheckpointError as err:
        raise PrepareError(str(err)) from None


def _check_uid(uid: str) -> str:
    try:
        return checkpoint.check_uid(uid)
    except CheckpointError as err:
        raise PrepareError(str(err)) from None


class Driver:
    """The node side of the driver: prepared claims, their specs and MPS daemons.

    ``host`` is the current discovery (replaced by the slice publisher when the host
    changes); ``config`` nvshim's config (capabilities, hook path, pairing).
    """

    def __init__(
        self,
        kube: Kube,
        node: str,
        host: Host,
        config,
        cdi_dir: str,
        plugin_dir: str,
        mps_root: str,
        host_root: str = "/",
        view: RootPairs | None = None,
    ):
        self.kube = kube
        self.node = node
        self.host = host
        self.config = config
        self.cdi_dir = cdi_dir
        self.plugin_dir = plugin_dir
        self.mps_root = mps_root
        self.host_root = host_root
        if view is None and host_root not in ("", "/"):
            view = ((host_root, "/"), (host_root, "/"))
        self.view = view
        self.lock = threading.Lock()
        self.claims, self.load_lines = checkpoint.load(self.checkpoint_path)
        self.dirty = bool(self.load_lines)  # the file differs from what was kept

    # -- checkpoint ---------------------------------------------------------------------
    @property
    def checkpoint_path(self) -> str:
        return os.path.join(self.plugin_dir, checkpoint.NAME)

    def _save(self) -> None:
        """Write the checkpoint; a failed write (a full disk) leaves the old file and is
        one PrepareError line."""
        try:
            checkpoint.save(self.checkpoint_path, self.claims)
        except OSError as err:
            self.dirty = True
            raise PrepareError(
                f"checkpoint {self.checkpoint_path}: cannot write: {err.strerror or err}"
            ) from None
        self.dirty = False

    # -- prepare ------------------------------------------------------------------------
    def prepare(self, claim: dict[str, str]) -> dict[str, Any]:
        """The kubelet's ``NodePrepareResourceResponse`` for one claim (errors inside)."""
        try:
            with self.lock:
                entry = self._prepare(claim)
        except NvshimError as err:
            return {"devices": [], "error": str(err)}
        except Exception as err:  # noqa: BLE001 - the kubelet gets a line and retries
            return {"devices": [], "error": f"internal error: {type(err).__name__}: {err}"}
        devices = [
            {
                "request_names": [parent_request(d["request"])],
                "pool_name": d["pool"],
                "device_name": d["device"],
                "cdi_device_ids": [cdi_id(entry["uid"], d["device"])],
            }
            for d in entry["devices"]
        ]
        return {"devices": devices, "error": ""}

    def _prepare(self, claim: dict[str, str]) -> dict[str, Any]:
        uid = _check_claim(claim)
        known = self.claims.get(uid)
        if known is not None and os.path.exists(spec_path(self.cdi_dir, uid)):
            return known
        obj = self._read_claim(claim)
        allocation = (obj.get("status") or {}).get("allocation")
        if not allocation:
            raise PrepareError(f"claim {claim['namespace']}/{claim['name']} is not allocated")
        results = [
            r
            for r in (allocation.get("devices") or {}).get("results") or []
            if r.get("driver") == DRIVER_NAME and r.get("pool") == self.node
        ]
        entry = {
            "uid": uid,
            "namespace": claim.get("namespace", ""),
            "name": claim.get("name", ""),
            "devices": [],
            "mps": [],
        }
        if not results:  # nothing of ours in this claim
            return entry
        by_name = self._devices_by_name()
        for r in results:
            if r.get("device") not in by_name:
                raise PrepareError(
                    f"claim {entry['namespace']}/{entry['name']}: device {r.get('device')!r} "
                    f"is not on node {self.node} (known: {', '.join(by_name) or 'none'})"
                )
            self._refuse_taken(uid, by_name[r["device"]].uuid, r)
        try:
            requests = sorted({check_request(r.get("request")) for r in results})
        except CheckpointError as err:
            raise PrepareError(f"claim {entry['namespace']}/{entry['name']}: {err}") from None
        try:
            configs = configs_for_requests(allocation, requests)
        except ParamsError as err:
            raise PrepareError(f"claim {entry['namespace']}/{entry['name']}: {err}") from None
        per_request = {}
        try:
            for request in requests:
                devices = [by_name[r["device"]] for r in results if r["request"] == request]
                per_request[request] = self._request_edits(
                    request, devices, configs[request], entry
                )
            spec = self._spec(uid, results, by_name, per_request)
            self._write_spec(uid, spec)
            entry["devices"] = [
                {
                    "request": r["request"],
                    "pool": r["pool"],
                    "device": r["device"],
                    "uuid": by_name[r["device"]].uuid,
                    "admin": bool(r.get("adminAccess")),
                }
                for r in results
            ]
            self.claims[uid] = entry
            self._save()
        except BaseException:
            self.claims.pop(uid, None)  # nothing of this attempt is left behind
            _unlink(spec_path(self.cdi_dir, uid))
            for limits in entry["mps"]:
                try:
                    self._stop_mps(limits)
                except (NvshimError, OSError):
                    pass  # the first error is the one to report
            raise
        return entry

    def _read_claim(self, claim: dict[str, str]) -> dict[str, Any]:
        ns, name = claim.get("namespace", ""), claim.get("name", "")
        try:
            obj = self.kube.get(f"{RESOURCE_API}/namespaces/{ns}/resourceclaims/{name}")
        except KubeError as err:
            kind = ClaimGone if err.status == 404 else PrepareError
            raise kind(f"claim {ns}/{name}: {err}") from None
        if obj.get("metadata", {}).get("uid") != claim.get("uid"):
            raise ClaimGone(
                f"claim {ns}/{name} has UID {obj.get('metadata', {}).get('uid')}, "
                f"the kubelet asked for {claim.get('uid')}"
            )
        return obj

    def _devices_by_name(self) -> dict[str, Any]:
        from nvshim.host.edits import all_devices

        return {device_name(d): d for d in all_devices(self.host)}

    def _refuse_taken(self, uid: str, uuid: str, result: dict[str, Any]) -> None:
        if result.get("adminAccess"):
            return  # admin access (monitoring) may share a device with its owner
        for other, entry in self.claims.items():
            if other == uid:
                continue
            for d in entry["devices"]:
                if d["uuid"] == uuid and not d.get("admin"):
                    raise PrepareError(
                        f"device {result['device']} ({uuid}) is already prepared for claim "
                        f"{entry['namespace']}/{entry['name']} ({other})"
                    )

    def _request_edits(self, request, devices, config: GpuConfig, entry) -> ContainerEdits:
        """The edits every device of one request carries: its GPUs by UUID, and MPS."""
        edits = ContainerEdits(
            env=[f"CUDA_VISIBLE_DEVICES={','.join(d.uuid for d in devices)}"],
            hooks=[self._require_hook(devices)],
        )
        if config.strategy != "MPS":
            return edits
        from nvshim.mps.enforce import mps_device_edits
        from nvshim.mps.sharing import MPS_ON_MIG, mps_unsupported

        where = f"claim {entry['namespace']}/{entry['name']}: request {request}"
        if len(devices) != 1:
            raise PrepareError(
                f"{where}: MPS sharing needs exactly one device per request, got "
                f"{len(devices)} (an MPS client reaches only its own daemon's device)"
            )
        refused = mps_unsupported(devices[0])
        if refused:
            raise PrepareError(f"{where}: {refused}: {MPS_ON_MIG}")
        limits = {
            "uuid": devices[0].uuid,
            "threads": config.threads,
            "memory_mib": config.memory_mib,
        }
        share = self._start_mps(limits)
        entry["mps"].append(limits)
        return edits.merge(mps_device_edits(share, self.mps_root))

    def _require_hook(self, devices):
        """The createRuntime hook refusing a container whose ``NVIDIA_REQUIRE_*`` this
        request's devices and the host's driver do not meet (the image's env is known only
        when the container is created)."""
        from nvshim.hookentries import hook_entry
        from nvshim.policy.resolve import requirement_facts

        args = ["--cuda", self.host.cuda_version, "--driver", self.host.driver_version]
        for cc, brand in requirement_facts(self.host, devices):
            args += ["--device", f"{cc}:{brand}"]
        hook_path = self.config.runtime.hook_path
        return hook_entry(hook_path, "createRuntime", "require-check", *args)

    def _start_mps(self, limits: dict[str, Any]):
        """Start (or find running) the MPS daemon of one claim device with its limits."""
        from nvshim.mps.daemon import start_daemon
        from nvshim.mps.sharing import MIB, SharedDevice

        device = next(g for g in self.host.gpus if g.uuid == limits["uuid"])
        whole = device.memory_total // MIB
        share = SharedDevice(
            uuid=device.uuid,
            name=str(device.index),
            mode="mps",
            replicas=1,
            fail_requests_greater_than_one=False,
            memory_total=device.memory_total,
            threads=limits["threads"],
            memory_mib=min(limits["memory_mib"] or whole, whole),
        )
        status = start_daemon(self.host, share, self.mps_root)
        if not status.running:
            raise PrepareError(f"MPS daemon for {device.uuid} did not start: {status.problem}")
        self._record_daemon(limits, detach=status.action == "started")
        return share

    def _record_daemon(self, limits: dict[str, Any], detach: bool = False) -> bool:
        """Record the running daemon's identity (pid, start time) in ``limits``; False when
        none runs. ``detach``: in a pod, move a daemon just started out of the pod's
        cgroups (nvshim.dra.detach), so it outlives the pod."""
        from nvshim.mps.daemon import daemon_dirs, pin_daemon

        pinned = pin_daemon(daemon_dirs(self.mps_root, limits["uuid"]).pipe)
        if pinned is None:
            return False
        fd, limits["pid"], limits["start_time"] = pinned
        try:
            if detach and self.host_root not in ("", "/"):
                from nvshim.dra.detach import leave_pod
                from nvshim.dra.server import log

                why = leave_pod(fd, limits["pid"])
                if why:
                    log(f"MPS daemon {limits['pid']} of {limits['uuid']} stays in this pod: {why}")
        finally:
            os.close(fd)
        return True

    def _adopt_mps(self, limits: dict[str, Any]) -> str:
        """After a restart: the claim's daemon still running (the very process recorded,
        checked through a pidfd) is adopted; otherwise one is started. What was done."""
        from nvshim.mps.daemon import daemon_dirs, pin_daemon

        recorded = (limits.get("pid"), limits.get("start_time"))
        if None not in recorded:
            pinned = pin_daemon(daemon_dirs(self.mps_root, limits["uuid"]).pipe, recorded)
            if pinned is not None:
                os.close(pinned[0])
                return f"adopted its MPS daemon (pid {recorded[0]})"
        was = f"pid {recorded[0]} recorded" if recorded[0] else "none recorded"
        if self._record_daemon(limits):  # another process serves the claim's pipe directory
            return f"adopted the MPS daemon serving its pipe directory (pid {limits['pid']}; {was})"
        self._start_mps(limits)
        return f"started its MPS daemon again (pid {limits.get('pid')}; {was}, gone)"

    def _spec(self, uid, results, by_name, per_request) -> dict[str, Any]:
        from nvshim.cdi.writer import assemble_spec
        from nvshim.host.edits import all_devices, common_edits, device_edits
        from nvshim.policy.capabilities import parse_capabilities

        caps = parse_capabilities(None, self.config.policy.default_capabilities, [])
        hook_path = self.config.runtime.hook_path
        view = self.host_view()
        in_view = {d.uuid: d for d in all_devices(view)}  # the same devices, the node's paths
        devices = []
        for r in results:
            device = in_view[by_name[r["device"]].uuid]
            edits = device_edits(device, view).merge(per_request[r["request"]])
            edits = self._node_hooks(edits)
            devices.append({"name": f"{uid}-{r['device']}", "containerEdits": edits.to_cdi()})
        common = self._node_hooks(common_edits(view, caps, hook_path))
        return assemble_spec(CDI_VENDOR, CDI_CLASS, devices, common)

    def _node_hooks(self, edits: ContainerEdits) -> ContainerEdits:
        """In a pod (``host_root`` set) the hooks run on the node, where the pod's
        ``NVSHIM_CONFIG``/``NVSHIM_CACHE_DIR`` paths mean nothing: they get the bare hook env
        and so the node's own nvshim config."""
        if self.host_root in ("", "/"):
            return edits
        from nvshim.hookentries import HOOK_ENV
        from nvshim.record import replace

        return replace(edits, hooks=[replace(h, env=HOOK_ENV) for h in edits.hooks])

    def host_view(self) -> Host:
        """The host with the paths the node's runtime sees: discovery's driver root and dev
        root (``view``: (here, on the node); by default under ``host_root``, the node's /
        mounted in the plugin's pod) moved back to the node's own."""
        if self.view is None:
            return self.host
        from nvshim.node.hostview import rebase_host

        return rebase_host(self.host, *self.view)

    def _write_spec(self, uid: str, spec: dict[str, Any]) -> None:
        from nvshim.fsutil import atomic_write

        os.makedirs(self.cdi_dir, mode=0o755, exist_ok=True)
        data = (json.dumps(spec, indent=1) + "\n").encode()
        # transient (a tmpfs in /var/run): no fsync; the checkpoint written after is durable
        atomic_write(spec_path(self.cdi_dir, uid), data, mode=0o644, durable=False)

    # -- unprepare ----------------------------------------------------------------------
    def unprepare(self, claim: dict[str, str]) -> dict[str, str]:
        """The kubelet's ``NodeUnprepareResourceResponse`` for one claim."""
        try:
            with self.lock:
                self._unprepare(_check_uid(claim.get("uid", "")))
        except (NvshimError, OSError) as err:
            return {"error": str(err)}
        return {"error": ""}

    def _unprepare(self, uid: str) -> None:
        entry = self.claims.get(uid)
        _unlink(spec_path(self.cdi_dir, uid))
        if entry is None:
            if self.dirty:  # an earlier write failed: the file still names gone claims
                self._save()
            return
        for limits in entry.get("mps") or ():
            self._stop_mps(limits)
        del self.claims[uid]
        self._save()

    def _stop_mps(self, limits: dict[str, Any]) -> None:
        """Stop one claim daemon and remove its directories (after a reboot they may be
        gone already: nothing to stop), never crossing a mount point below them (a
        daemon's shm tmpfs still mounted stays, with the directories above it)."""
        from nvshim.fsutil import remove_tree
        from nvshim.mps.daemon import daemon_dirs, stop_daemon

        result = stop_daemon(self.host, limits["uuid"], self.mps_root, None)
        if result.problem:
            raise PrepareError(f"MPS daemon of {limits['uuid']}: {result.problem}")
        try:
            remove_tree(daemon_dirs(self.mps_root, limits["uuid"]).base)
        except FileNotFoundError:
            pass

    # -- restart ------------------------------------------------------------------------
    def reconcile(self) -> list[str]:
        """After a restart: unprepare checkpointed claims the API server no longer holds
        allocated here (gone, another UID, no allocation), remove claim specs without a
        checkpoint entry. One line per action."""
        lines = list(self.load_lines)
        with self.lock:
            for uid, entry in list(self.claims.items()):
                claim = {"namespace": entry["namespace"], "name": entry["name"], "uid": uid}
                try:
                    obj = self._read_claim(claim)
                    live = bool((obj.get("status") or {}).get("allocation"))
                except ClaimGone:
                    live = False
                except PrepareError as err:  # the API unreachable: decide next restart
                    lines.append(f"kept claim {entry['namespace']}/{entry['name']}: {err}")
                    continue
                what = f"claim {entry['namespace']}/{entry['name']} ({uid})"
                if not live:
                    try:
                        self._unprepare(uid)
                    except (NvshimError, OSError) as err:
                        lines.append(f"{what}: cannot unprepare yet: {err}")
                        continue
                    lines.append(f"unprepared {what}: no longer allocated")
                    continue
                for limits in entry.get("mps") or ():
                    try:
                        lines.append(f"{what}: {self._adopt_mps(limits)}")
                    except (NvshimError, OSError, StopIteration) as err:
                        lines.append(f"{what}: MPS daemon: {err}")
            lines += self._remove_orphans()
            if self.dirty or any(e["mps"] for e in self.claims.values()):
                try:
                    self._save()  # what was dropped, and the daemons' identities, on disk
                except PrepareError as err:
                    lines.append(str(err))
        return lines

    def _remove_orphans(self) -> list[str]:
        """Claim specs and claim MPS daemons no checkpointed claim owns (a crash between
        steps, entries dropped from a damaged checkpoint)."""
        lines = []
        for name in _listdir(self.cdi_dir):
            if name.startswith(SPEC_PREFIX) and name.endswith(".json"):
                uid = name[len(SPEC_PREFIX) : -len(".json")]
                if uid not in self.claims:
                    _unlink(os.path.join(self.cdi_dir, name))
                    lines.append(f"removed orphan CDI spec {name}")
        from nvshim.mps.daemon import daemon_uuids

        owned = {m["uuid"] for e in self.claims.values() for m in e["mps"]}
        for uuid in daemon_uuids(self.mps_root):
            if uuid not in owned:
                try:
                    self._stop_mps({"uuid": uuid})
                    lines.append(f"stopped orphan MPS daemon of {uuid}")
                except (NvshimError, OSError) as err:
                    lines.append(f"orphan MPS daemon of {uuid}: {err}")
        return lines

    def forget_all_if_idle(self) -> bool:
        """On exit with nothing prepared: remove the checkpoint (nothing left behind)."""
        with self.lock:
            if self.claims:
                return False
            try:
                os.unlink(self.checkpoint_path)
            except FileNotFoundError:
                pass
            return True


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except FileNotFoundError:
        return []
