"""The GPU-NIC topology of a host: where each GPU and RDMA device sits on the PCIe tree,
NVLinks between GPUs (when NVML reports them), and the ``nvidia-smi topo -m`` matrix.

sysfs only (no NVML) unless NVLink counts are asked for, so the runtime can pair GPUs with
NICs per container without initialising NVML.
"""

from __future__ import annotations

from nvshim.host.model import Host, NodeInfo
from nvshim.host.pcie import LEGEND, PciLocation, affinity, bdf_from_bus_id, pci_location
from nvshim.host.rdma import RdmaDevice, discover_rdma, rdma_cm_node
from nvshim.record import asdict, field, record

NvLinks = tuple  # (links to NVSwitches, ((peer GPU bdf, links), ...))


@record(frozen=True)
class GpuPlace:
    """A GPU's place in the topology."""

    index: int
    uuid: str
    location: PciLocation
    nvlinks: int = 0  # active NVLinks to NVSwitches (0: none or unknown)
    nvlink_peers: tuple[tuple[str, int], ...] = ()  # (GPU bdf, links) of direct NVLinks


@record
class Topology:
    gpus: list[GpuPlace] = field(default_factory=list)
    nics: list[RdmaDevice] = field(default_factory=list)
    rdma_cm: NodeInfo | None = None
    warnings: list[str] = field(default_factory=list)

    def gpu(self, index: int) -> GpuPlace:
        for g in self.gpus:
            if g.index == index:
                return g
        raise KeyError(index)

    def nic(self, name: str) -> RdmaDevice | None:
        return next((n for n in self.nics if n.name == name), None)


def discover_topology(
    host: Host, nvlinks: dict[int, NvLinks] | None = None, gpus: list[int] | None = None
) -> Topology:
    """The topology of ``host``'s GPUs (only indexes ``gpus`` when given) and the RDMA
    devices under its dev root.

    Raises TopologyError (one line naming the device and the sysfs path) when a GPU's or
    NIC's sysfs entry is missing, dangling or loops.
    """
    warnings: list[str] = []
    gpus = [
        GpuPlace(
            g.index,
            g.uuid,
            pci_location(host.dev_root, bdf_from_bus_id(g.pci_bus_id), f"GPU {g.index}"),
            *(nvlinks or {}).get(g.index, (0, ())),
        )
        for g in host.gpus
        if gpus is None or g.index in gpus
    ]
    nics = discover_rdma(host.dev_root, warnings)
    return Topology(gpus, nics, rdma_cm_node(host.dev_root), warnings)


def gpu_gpu(a: GpuPlace, b: GpuPlace) -> str:
    """GPU to GPU: ``X``, ``NV#`` when both reach the NVSwitch fabric, else PCIe."""
    if a.index == b.index:
        return "X"
    if a.nvlinks and b.nvlinks:
        return f"NV{min(a.nvlinks, b.nvlinks)}"
    direct = dict(a.nvlink_peers).get(b.location.bdf)
    return f"NV{direct}" if direct else affinity(a.location, b.location)


def matrix(topo: Topology) -> tuple[list[str], list[list[str]]]:
    """``nvidia-smi topo -m``: labels (``GPU0``..., ``NIC0``...) and the square matrix."""
    labels = [f"GPU{g.index}" for g in topo.gpus] + [f"NIC{i}" for i in range(len(topo.nics))]
    places = [("gpu", g) for g in topo.gpus] + [("nic", n) for n in topo.nics]
    rows = []
    for kind_a, a in places:
        row = []
        for kind_b, b in places:
            if kind_a == kind_b == "gpu":
                row.append(gpu_gpu(a, b))
            else:
                row.append(affinity(a.location, b.location))
        rows.append(row)
    return labels, rows


def nic_matrix(topo: Topology) -> dict[int, dict[str, str]]:
    """GPU index -> NIC name -> affinity."""
    return {
        g.index: {n.name: affinity(g.location, n.location) for n in topo.nics} for g in topo.gpus
    }


def render(topo: Topology, links: dict[str, dict[str, object]] | None = None) -> str:
    """The matrix, the NIC legend (HCA, PCI, link layer, netdevs, uverbs) and the legend.
    ``links`` (netlink, by name) adds each netdev's state in this network namespace."""
    labels, rows = matrix(topo)
    width = max([len(x) for x in labels] + [4]) + 1
    numa = [g.location.numa_node for g in topo.gpus] + [n.location.numa_node for n in topo.nics]
    lines = [" " * width + "".join(x.ljust(width) for x in labels) + "NUMA"]
    for label, row, node in zip(labels, rows, numa, strict=True):
        cells = "".join(c.ljust(width) for c in row)
        lines.append(label.ljust(width) + cells + ("-" if node is None else str(node)))
    if topo.nics:
        lines += ["", "NIC legend:"]
        for i, n in enumerate(topo.nics):
            lines.append(f"  NIC{i}: {n.name}  {_nic_facts(n, links)}")
    lines += ["", "Legend:"]
    lines += [f"  {k:<4} = {v}" for k, v in LEGEND.items()]
    lines += [f"Warning: {w}" for w in topo.warnings]
    return "\n".join(lines)


def _nic_facts(nic: RdmaDevice, links: dict[str, dict[str, object]] | None) -> str:
    numa = "-" if nic.location.numa_node is None else nic.location.numa_node
    netdevs = []
    for name in nic.netdevs:
        if links is None:
            netdevs.append(name)
        elif name in links:
            netdevs.append(f"{name} ({links[name]['state']})")
        else:
            netdevs.append(f"{name} (not in this netns)")
    parts = [
        nic.bdf,
        f"NUMA {numa}",
        nic.link_layers(),
        "VF of " + nic.physfn if nic.physfn else "PF",
        "netdevs " + (",".join(netdevs) or "-"),
        nic.uverbs.path if nic.uverbs else "no uverbs",
    ]
    return "  ".join(str(p) for p in parts)


def to_dict(topo: Topology, links: dict[str, dict[str, object]] | None = None) -> dict:
    """JSON form: the model, the matrix, and each NIC's netdev states when given."""
    labels, rows = matrix(topo)
    data = asdict(topo)
    data["matrix"] = {"labels": labels, "rows": rows}
    if links is not None:
        data["netdev_state"] = {name: links.get(name) for n in topo.nics for name in n.netdevs}
    return data


def nvlink_counts(driver_root: str) -> tuple[dict[int, NvLinks], list[str]]:
    """Per GPU index, from NVML: active NVLinks to NVSwitches, and direct links per peer
    GPU (sysfs address); a warning instead when NVML cannot say."""
    from nvshim.errors import NvshimError
    from nvshim.host import files, nvml

    warnings: list[str] = []
    try:
        library = nvml.find_library(driver_root, files.read_ld_cache(driver_root, warnings))
        pynvml = nvml.load_library(library)
        pynvml.nvmlInit()
    except (NvshimError, Exception) as err:  # noqa: BLE001 - NVLink is optional here
        return {}, [f"NVLink state unknown: {err}"]
    counts: dict[int, NvLinks] = {}
    try:
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            counts[index] = _links(pynvml, handle)
    except pynvml.NVMLError as err:
        warnings.append(f"NVLink state unknown: {err}")
    finally:
        pynvml.nvmlShutdown()
    return counts, warnings


def _links(pynvml, handle) -> NvLinks:
    switch = 0
    peers: dict[str, int] = {}
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            if not pynvml.nvmlDeviceGetNvLinkState(handle, link):
                continue
            kind = pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)
            if kind == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
                switch += 1
            elif kind == pynvml.NVML_NVLINK_DEVICE_TYPE_GPU:
                remote = pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId
                bdf = bdf_from_bus_id(remote.decode() if isinstance(remote, bytes) else remote)
                peers[bdf] = peers.get(bdf, 0) + 1
        except pynvml.NVMLError:
            continue
    return switch, tuple(sorted(peers.items()))
