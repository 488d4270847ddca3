"""GPU-NIC pairing for GPUDirect RDMA: which RDMA devices a container's GPUs get.

A container asks with the ``nvshim.io/rdma`` annotation or ``NVSHIM_RDMA`` (a source the
``[pairing] request-sources`` key accepts): ``paired`` (or true/1/yes) pairs each of its
GPUs with the nearest allowed NIC; a comma list of HCA names or PCI addresses names the
NICs instead. It gets each NIC's ``/dev/infiniband/uverbsN``, ``/dev/infiniband/rdma_cm``,
``NCCL_IB_HCA`` and ``NVSHIM_RDMA_HCAS``; with ``exclusive`` a ``createRuntime`` hook that
claims the NICs, with ``netdev-handover`` one that moves their netdevs into its network
namespace (``nvshim-hook rdma-pair``). The same edits feed the runtime, the prestart hook
and CDI specs.
"""

from __future__ import annotations

from nvshim.edits import ContainerEdits
from nvshim.errors import NvshimError

TYPE_CHECKING = False  # typing costs ~5 ms at import, per container
if TYPE_CHECKING:
    from nvshim.config import PairingConfig
    from nvshim.host.rdma import RdmaDevice
    from nvshim.host.topology import GpuPlace, Topology

AUTO_WORDS = ("paired", "true", "1", "yes", "auto")
OFF_WORDS = ("", "false", "0", "no", "none")
STEP = "rdma-pair"
HCA_ENV = "NVSHIM_RDMA_HCAS"
NCCL_ENV = "NCCL_IB_HCA"
MAX_ASK = 4096


class PairingError(NvshimError):
    """A pairing request the policy refuses."""


def matches(nic: RdmaDevice, patterns: list[str]) -> bool:
    """True when a pattern is the NIC's PCI address, or matches its HCA name or one of its
    netdevs (shell wildcards)."""
    from fnmatch import fnmatchcase

    names = (nic.name, *nic.netdevs)
    return any(p.lower() == nic.bdf or any(fnmatchcase(n, p) for n in names) for p in patterns)


def parse_ask(value: str, what: str) -> list[str] | None:
    """``[]`` for automatic pairing, a list of NIC names, or None for no pairing."""
    if len(value) > MAX_ASK:
        raise PairingError(f"{what}: value longer than {MAX_ASK} bytes")
    word = value.strip().lower()
    if word in OFF_WORDS:
        return None
    if word in AUTO_WORDS:
        return []
    names = [n.strip() for n in value.split(",") if n.strip()]
    for name in names:
        if len(name) > 64 or not all(c.isalnum() or c in "_-:." for c in name):
            raise PairingError(f"{what}: {name[:64]!r} is not an HCA name or PCI address")
    return names


def _describe(gpu: GpuPlace) -> str:
    return f"GPU {gpu.index} ({gpu.location.bdf})"


def _candidates(gpu: GpuPlace, nics: list[RdmaDevice]) -> list[tuple[int, str, RdmaDevice]]:
    from nvshim.host.pcie import affinity, rank

    return sorted((rank(affinity(gpu.location, n.location)), n.bdf, n) for n in nics)


def pair(
    topo: Topology,
    gpus: list[GpuPlace],
    cfg: PairingConfig,
    named: list[str],
    busy: dict[str, str] | None = None,
) -> tuple[list[RdmaDevice], list[str]]:
    """The NICs for ``gpus`` (in GPU order, without repeats) and warnings.

    Automatic (``named`` empty): per GPU the allowed NIC with the best affinity no worse
    than ``worst-affinity``, ties to the lowest PCI address, skipping NICs in ``busy``
    (name -> owner: claimed by another container). Named: each must exist, be allowed and
    reach one of the GPUs within ``worst-affinity``. Raises PairingError, or warns under
    ``on-no-nic = "warn"``.
    """
    from nvshim.host.pcie import LEVELS, affinity, rank

    busy = busy or {}
    worst = rank(cfg.worst_affinity)
    allowed = [n for n in topo.nics if not cfg.nics or matches(n, cfg.nics)]
    usable = [n for n in allowed if n.uverbs is not None]
    chosen: list[RdmaDevice] = []
    warnings: list[str] = []
    if named:
        for name in named:
            nic = next((n for n in topo.nics if name in (n.name, n.bdf)), None)
            if nic is None:
                known = ", ".join(n.name for n in topo.nics) or "none"
                raise PairingError(f"RDMA device {name!r} not found (host has: {known})")
            if nic not in allowed:
                raise PairingError(
                    f"RDMA device {nic.name} ({nic.bdf}) is not in the pairing.nics allow-list"
                )
            if nic not in usable:
                raise PairingError(f"RDMA device {nic.name} ({nic.bdf}) has no uverbs device")
            if nic.name in busy:
                raise PairingError(
                    f"RDMA device {nic.name} is claimed by container {busy[nic.name]} "
                    "(pairing.exclusive)"
                )
            best = min(rank(affinity(g.location, nic.location)) for g in gpus)
            if best > worst:
                raise PairingError(
                    f"RDMA device {nic.name} ({nic.bdf}) is {LEVELS[best]} from the "
                    f"container's GPUs, worse than pairing.worst-affinity {cfg.worst_affinity}"
                )
            if nic not in chosen:
                chosen.append(nic)
        return chosen, warnings
    for gpu in gpus:
        ranked = _candidates(gpu, usable)
        pick = next((n for r, _, n in ranked if r <= worst and n.name not in busy), None)
        if pick is None:
            message = _nothing_qualifies(gpu, ranked, busy, cfg)
            if cfg.on_no_nic == "fail":
                raise PairingError(message)
            warnings.append(message)
            continue
        if pick not in chosen:
            chosen.append(pick)
    return chosen, warnings


def _nothing_qualifies(gpu, ranked, busy: dict[str, str], cfg: PairingConfig) -> str:
    from nvshim.host.pcie import LEVELS

    head = f"{_describe(gpu)}: no RDMA NIC at {cfg.worst_affinity} or better"
    if not ranked:
        return head + " (no allowed NIC with a uverbs device)"
    rank, _, nic = ranked[0]
    best = f"best: {nic.name} at {LEVELS[rank]}"
    if nic.name in busy:
        best += f", claimed by container {busy[nic.name]}"
    return f"{head} ({best}; pairing.worst-affinity, pairing.on-no-nic)"


def nic_edits(
    nics: list[RdmaDevice], topo: Topology, cfg: PairingConfig, hook_path: str | None
) -> tuple[ContainerEdits, list[str]]:
    """Edits for a set of paired NICs, and the netdevs kept on the host (PFs not named in
    ``move-physical``). ``hook_path`` None: no hook entries (a caller that runs the step
    itself)."""
    from nvshim.host.edits import node_edit

    if not nics:
        return ContainerEdits(), []
    nodes = [node_edit(n.uverbs) for n in nics if n.uverbs is not None]
    if topo.rdma_cm is not None:
        nodes.append(node_edit(topo.rdma_cm))
    names = ",".join(n.name for n in nics)
    edits = ContainerEdits(env=[f"{NCCL_ENV}=={names}", f"{HCA_ENV}={names}"], device_nodes=nodes)
    args: list[str] = []
    if cfg.exclusive:
        args += [a for n in nics for a in ("--claim", n.name)]
    kept: list[str] = []
    if cfg.netdev_handover:
        count = 0
        for nic in nics:
            for netdev in nic.netdevs:
                if not nic.is_vf and not matches(nic, cfg.move_physical):
                    kept.append(netdev)
                    continue
                args += ["--netdev", _rename(netdev, cfg.netdev_name, count)]
                count += 1
    if args and hook_path:
        from nvshim.hookentries import hook_entry

        edits.hooks.append(hook_entry(hook_path, "createRuntime", STEP, *args))
    return edits, kept


def _rename(netdev: str, pattern: str, count: int) -> str:
    if not pattern:
        return netdev
    new = pattern.replace("%d", str(count)) if "%d" in pattern else f"{pattern}{count}"
    return f"{netdev}={new}"


def gpu_places(topo: Topology, devices, host) -> list[GpuPlace]:
    """The GPUs (a MIG device: its parent) behind ``devices``, in order, without repeats."""
    out: list[GpuPlace] = []
    for device in devices:
        index = getattr(device, "parent_index", None)
        place = topo.gpu(device.index if index is None else index)
        if place not in out:
            out.append(place)
    return out


def pairing_edits(edits: ContainerEdits, devices, request, host, config, log: dict):
    """``edits`` amended with the RDMA devices the request's pairing ask gets (unchanged
    when it asks for none, or the policy is off: then the log says why)."""
    ask = getattr(request, "rdma", None)
    if ask is None or not devices:
        return edits
    source, value = ask
    what = "annotation nvshim.io/rdma" if source == "annotation" else "NVSHIM_RDMA"
    cfg = config.pairing
    if not cfg.enabled:
        log["rdma"] = "ignored: pairing.enabled is false"
        return edits
    if source not in cfg.request_sources:
        log["rdma"] = f"ignored: {source} is not in pairing.request-sources"
        return edits
    named = parse_ask(value, what)
    if named is None:
        return edits
    from nvshim.host.topology import discover_topology

    wanted = [getattr(d, "parent_index", None) for d in devices]
    wanted = [d.index if i is None else i for d, i in zip(devices, wanted, strict=True)]
    topo = discover_topology(host, gpus=wanted)
    busy: dict[str, str] = {}
    if cfg.exclusive:
        from nvshim.pairing.claims import live_claims

        busy = live_claims(config.runtime.inventory_dir)
    nics, warnings = pair(topo, gpu_places(topo, devices, host), cfg, named, busy)
    if warnings:
        log["rdma_warning"] = "; ".join(warnings)
    added, kept = nic_edits(nics, topo, cfg, config.runtime.hook_path)
    log["rdma"] = ",".join(n.name for n in nics) or "none"
    if kept:
        log["netdev_kept"] = ",".join(kept) + " (physical function, not in pairing.move-physical)"
    return edits.merge(added)


def cdi_pairing_edits(host, config, hook_path: str):
    """For ``nvshim cdi generate --pairing``: edits per device UUID (each GPU or MIG device
    with its paired NIC), the edits of the ``all`` device, and warnings. Static: no claims
    are consulted (the spec's ``rdma-pair`` hook enforces ``exclusive`` at start)."""
    from nvshim.host.edits import all_devices
    from nvshim.host.topology import discover_topology
    from nvshim.record import replace

    cfg = config.pairing
    topo = discover_topology(host)
    devices = all_devices(host)
    per_device: dict[str, ContainerEdits] = {}
    warnings: list[str] = []
    for device in devices:
        nics, notes = pair(topo, gpu_places(topo, [device], host), cfg, [])
        warnings += [n for n in notes if n not in warnings]
        if nics:
            per_device[device.uuid] = nic_edits(nics, topo, cfg, hook_path)[0]
    every, _ = pair(topo, gpu_places(topo, devices, host), replace(cfg, on_no_nic="warn"), [])
    return per_device, nic_edits(every, topo, cfg, hook_path)[0], warnings
