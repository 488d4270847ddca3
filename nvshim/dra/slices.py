"""The node's ResourceSlices (``resource.k8s.io/v1``): every GPU not in MIG mode and every
MIG device as a device with the attributes an operator selects on and its capacities.

A GPU in MIG mode is offered only through its MIG devices (as nvshim's CDI specs do), so
the scheduler can never hand out a GPU and one of its MIG devices at once. Attribute names
without a domain belong to the driver (``device.attributes["gpu.nvshim.io"].productName``
in CEL); the PCI address, PCIe root and NUMA node use the standard
``resource.kubernetes.io/`` names, so NIC and CPU drivers can align with them.
"""

from __future__ import annotations

from typing import Any

from nvshim.dra import DRIVER_NAME, device_name
from nvshim.dra.kube import RESOURCE_API, Kube, KubeError
from nvshim.host.model import Gpu, Host, MigDevice
from nvshim.host.pcie import bdf_from_bus_id

MAX_DEVICES_PER_SLICE = 128  # resource.k8s.io/v1 ResourceSliceMaxDevices
# the standard attributes other drivers align on (matchAttribute constraints)
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
NUMA_NODE = "resource.kubernetes.io/numaNode"
SLICES = f"{RESOURCE_API}/resourceslices"
MEMORY_SLICES = 8  # a MIG-capable GPU's memory, in eighths


def semver(text: str) -> str | None:
    """``550.54`` / ``550.54.15`` / ``9.0`` as a semantic version (``major.minor.patch``),
    None when it is not numeric."""
    parts = text.strip().split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        return None
    parts = [str(int(p)) for p in parts] + ["0"] * (3 - len(parts))
    return ".".join(parts)


def _attrs(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Typed attribute values; None values left out; ``("version", v)`` for versions."""
    out: dict[str, dict[str, Any]] = {}
    for name, value in values.items():
        if value is None:
            continue
        if isinstance(value, tuple):
            version = semver(value[1])
            if version is not None:
                out[name] = {"version": version}
        elif isinstance(value, bool):
            out[name] = {"bool": value}
        elif isinstance(value, int):
            out[name] = {"int": value}
        else:
            out[name] = {"string": str(value)}
    return out


def _mebibytes(size: int) -> str:
    return f"{size // (1024 * 1024)}Mi"


def _common(gpu: Gpu, host: Host, places: dict[str, dict[str, Any]]) -> dict[str, Any]:
    place = places.get(gpu.uuid, {})
    return {
        "productName": gpu.name,
        "brand": gpu.brand,
        "architecture": gpu.architecture,
        "cudaComputeCapability": ("version", gpu.compute_capability),
        "driverVersion": ("version", host.driver_version),
        "cudaDriverVersion": ("version", host.cuda_version),
        PCI_BUS_ID: bdf_from_bus_id(gpu.pci_bus_id),
        NUMA_NODE: gpu.numa_node if gpu.numa_node is not None and gpu.numa_node >= 0 else None,
        PCIE_ROOT: place.get("pcie_root"),
        "rdmaNic": place.get("nic"),
    }


def gpu_device(gpu: Gpu, host: Host, places: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The ResourceSlice device of a whole GPU."""
    attrs = {"type": "gpu", "uuid": gpu.uuid, "index": gpu.index, "minor": gpu.minor}
    return {
        "name": device_name(gpu),
        "attributes": _attrs({**attrs, **_common(gpu, host, places)}),
        "capacity": {"memory": {"value": _mebibytes(gpu.memory_total)}},
    }


def mig_device(mig: MigDevice, host: Host, places: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The ResourceSlice device of a MIG device."""
    parent = host.gpu(mig.parent_index)
    attrs = {
        "type": "mig",
        "uuid": mig.uuid,
        "index": mig.index,
        "parentIndex": parent.index,
        "parentUUID": parent.uuid,
        "profile": mig.profile,
        "gpuInstance": mig.gi,
        "computeInstance": mig.ci,
    }
    capacity = {"memory": {"value": _mebibytes(mig.memory_total)}}
    if mig.multiprocessors:
        capacity["multiprocessors"] = {"value": str(mig.multiprocessors)}
    for name, count in mig.engines:
        capacity[name] = {"value": str(count)}
    if mig.memory_slices:  # the reference driver's memorySliceN: 1 for each one it holds
        start, size = mig.memory_slices
        for n in range(start, min(start + size, MEMORY_SLICES)):
            capacity[f"memorySlice{n}"] = {"value": "1"}
    return {
        "name": device_name(mig),
        "attributes": _attrs({**attrs, **_common(parent, host, places)}),
        "capacity": capacity,
    }


def topology_places(host: Host, config, warnings: list[str]) -> dict[str, dict[str, Any]]:
    """Per GPU UUID its PCIe root (host bridge) and paired RDMA NIC, from nvshim's topology
    and pairing policy; empty (with a warning) when the topology cannot be read."""
    from nvshim.errors import NvshimError
    from nvshim.host.topology import discover_topology
    from nvshim.policy.pairing import pair
    from nvshim.record import replace

    cfg = replace(config.pairing, on_no_nic="warn")
    try:
        topo = discover_topology(host)
    except NvshimError as err:
        warnings.append(f"topology: {err}")
        return {}
    out: dict[str, dict[str, Any]] = {}
    for place in topo.gpus:
        nics, _ = pair(topo, [place], cfg, [])
        out[place.uuid] = {
            "pcie_root": place.location.host_bridge,
            "nic": nics[0].name if nics else None,
        }
    return out


def slice_devices(host: Host, config, warnings: list[str]) -> list[dict[str, Any]]:
    """Every device of the node, GPUs (not in MIG mode) first, then MIG devices."""
    places = topology_places(host, config, warnings)
    devices = [gpu_device(g, host, places) for g in host.gpus if not g.mig_enabled]
    return devices + [mig_device(m, host, places) for m in host.mig_devices()]


def desired_slices(node: str, devices: list[dict[str, Any]], generation: int) -> list[dict]:
    """The slices of the node's pool (one per 128 devices; at least one, maybe empty)."""
    chunks = [
        devices[i : i + MAX_DEVICES_PER_SLICE]
        for i in range(0, len(devices), MAX_DEVICES_PER_SLICE)
    ] or [[]]
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": slice_name(node, i)},
            "spec": {
                "driver": DRIVER_NAME,
                "nodeName": node,
                "pool": {
                    "name": node,
                    "generation": generation,
                    "resourceSliceCount": len(chunks),
                },
                "devices": chunk,
            },
        }
        for i, chunk in enumerate(chunks)
    ]


def slice_name(node: str, i: int) -> str:
    """``<node>-gpu.nvshim.io-<i>`` (a DNS subdomain, at most 253 characters)."""
    return f"{node[:230]}-{DRIVER_NAME}-{i}"


def node_slices(kube: Kube, node: str) -> list[dict[str, Any]]:
    """This driver's ResourceSlices of ``node`` now in the API server."""
    answer = kube.get(SLICES, fieldSelector=f"spec.nodeName={node},spec.driver={DRIVER_NAME}")
    return answer.get("items") or []


def publish(kube: Kube, node: str, devices: list[dict[str, Any]], node_uid: str | None) -> str:
    """Make the node's slices hold ``devices``: unchanged slices are left alone, changed
    ones replaced under a new pool generation, extra ones deleted. Returns what was done."""
    current = {s["metadata"]["name"]: s for s in node_slices(kube, node)}
    generation = max((s["spec"]["pool"].get("generation", 0) for s in current.values()), default=0)
    wanted = desired_slices(node, devices, generation)
    same = len(wanted) == len(current) and all(
        w["metadata"]["name"] in current
        and current[w["metadata"]["name"]]["spec"].get("devices", []) == w["spec"]["devices"]
        and current[w["metadata"]["name"]]["spec"]["pool"] == w["spec"]["pool"]
        for w in wanted
    )
    if same:
        return f"{len(devices)} devices current"
    wanted = desired_slices(node, devices, generation + 1)
    for body in wanted:
        name = body["metadata"]["name"]
        if node_uid:
            body["metadata"]["ownerReferences"] = [
                {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}
            ]
        if name in current:
            body["metadata"]["resourceVersion"] = current[name]["metadata"]["resourceVersion"]
            kube.replace(f"{SLICES}/{name}", body)
        else:
            kube.create(SLICES, body)
    for name in set(current) - {w["metadata"]["name"] for w in wanted}:
        _delete(kube, name)
    return f"published {len(devices)} devices (generation {generation + 1})"


def withdraw(kube: Kube, node: str) -> int:
    """Delete the node's slices of this driver; how many were deleted."""
    names = [s["metadata"]["name"] for s in node_slices(kube, node)]
    for name in names:
        _delete(kube, name)
    return len(names)


def _delete(kube: Kube, name: str) -> None:
    try:
        kube.delete(f"{SLICES}/{name}")
    except KubeError as err:
        if err.status != 404:
            raise
