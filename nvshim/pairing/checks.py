"""Readiness checks for GPUDirect RDMA, for ``nvshim doctor`` to register: is
``nvidia_peermem`` loaded, and does every GPU have a NIC at the accepted affinity.

Each returns ``(status, reason, fix)``: status ``ok``, ``warn`` or ``skip`` (nothing to
check: no RDMA device), reason one line, fix None when ok. ``nvshim.doctor.pairing_checks``
registers them as ``gpudirect-rdma`` and ``gpu-nic-affinity``.
"""

from __future__ import annotations

import os

from nvshim.host.rootpath import host_path

PEERMEM_MODULES = ("nvidia_peermem", "nv_peer_mem")  # the driver's, and MOFED's older one
Outcome = tuple[str, str, str | None]


def _loaded_modules(dev_root: str) -> set[str]:
    found = {m for m in PEERMEM_MODULES if os.path.isdir(host_path(dev_root, f"/sys/module/{m}"))}
    try:
        with open(host_path(dev_root, "/proc/modules"), encoding="utf-8") as fh:
            found |= {line.split(" ", 1)[0] for line in fh} & set(PEERMEM_MODULES)
    except OSError:
        pass
    return found


def _has_rdma(dev_root: str) -> bool:
    try:
        return bool(os.listdir(host_path(dev_root, "/sys/class/infiniband")))
    except OSError:
        return False


def check_peermem(dev_root: str) -> Outcome:
    """GPUDirect RDMA needs ``nvidia_peermem`` once the host has RDMA devices."""
    if not _has_rdma(dev_root):
        return "skip", "no RDMA devices (/sys/class/infiniband empty or absent)", None
    loaded = _loaded_modules(dev_root)
    if loaded:
        return "ok", f"{', '.join(sorted(loaded))} loaded: GPUDirect RDMA available", None
    return (
        "warn",
        "nvidia_peermem is not loaded: NCCL falls back to staging RDMA through host memory",
        "modprobe nvidia_peermem (and add it to /etc/modules-load.d)",
    )


def check_gpu_nics(host, config) -> Outcome:
    """Every GPU has an allowed NIC (with a uverbs device) at ``pairing.worst-affinity``
    or better."""
    from nvshim.host.pcie import LEVELS, affinity, rank
    from nvshim.host.topology import discover_topology
    from nvshim.policy.pairing import matches

    if not _has_rdma(host.dev_root):
        return "skip", "no RDMA devices", None
    cfg = config.pairing
    topo = discover_topology(host)
    allowed = [n for n in topo.nics if n.uverbs and (not cfg.nics or matches(n, cfg.nics))]
    worst = rank(cfg.worst_affinity)
    lonely = []
    for gpu in topo.gpus:
        best = min((rank(affinity(gpu.location, n.location)) for n in allowed), default=None)
        if best is None or best > worst:
            lonely.append(f"GPU {gpu.index} (best {LEVELS[best] if best is not None else 'none'})")
    if lonely:
        return (
            "warn",
            f"no NIC at {cfg.worst_affinity} or better for {', '.join(lonely)}",
            "pairing refuses these GPUs: move NICs or GPUs, widen pairing.nics, or set "
            'pairing.worst-affinity / pairing.on-no-nic = "warn"',
        )
    return (
        "ok",
        f"each of {len(topo.gpus)} GPU(s) has a NIC at {cfg.worst_affinity} or better",
        None,
    )
