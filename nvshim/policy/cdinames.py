"""CDI names of any vendor, and GPU nodes an engine injected, as the host's devices.

Where the engine applied no CDI (containerd 1.6, CRI-O without CDI, a CDI annotation the
engine did not act on), nvshim-runtime is the only one that can: every name is looked up
in the spec directories as CDI runtimes do (``nvshim.cdi.registry``). A device whose
device nodes are a GPU's (``/dev/nvidia<N>``) or a MIG device's capability nodes is an
NVIDIA device: it becomes the host's GPU or MIG device and gets nvshim's own edits and
enforcement (UUID ``CUDA_VISIBLE_DEVICES``, MPS, requirements) instead of its spec's. Any
other device gets its spec's edits (device and spec level) as a CDI runtime applies them.
A name no spec defines fails the request. The spec directories are host files written by
root (trusted); the names come from hostile annotations and were checked as CDI names
(``nvshim.policy.request.cdi_annotation_names``).
"""

from __future__ import annotations

from nvshim.policy.request import RequestError, is_gpu_node_path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from nvshim.edits import ContainerEdits
    from nvshim.host.model import Gpu, Host, MigDevice


def devices_for_nodes(host: Host, paths: Sequence[str], strict: bool, what: str) -> list:
    """The host devices whose nodes ``paths`` are: a MIG device when its capability nodes
    are among them, else the GPU of each ``/dev/nvidia<N>``. ``strict``: a GPU node the
    host lacks raises RequestError naming ``what`` (else it is skipped)."""
    wanted = set(paths)
    found: list[Gpu | MigDevice] = []
    covered: set[str] = set()
    for gpu in host.gpus:
        for mig in gpu.mig_devices:
            caps = [c.path for c in (mig.gi_cap, mig.ci_cap) if c is not None]
            if caps and all(c in wanted for c in caps):
                found.append(mig)
                covered.update(caps)
                covered.add(gpu.node.path if gpu.node else f"/dev/nvidia{gpu.minor}")
    for path in paths:
        if path in covered or path.startswith("/dev/nvidia-caps/"):
            continue
        gpu = next((g for g in host.gpus if f"/dev/nvidia{g.minor}" == path), None)
        if gpu is not None:
            found.append(gpu)
        elif strict:
            raise RequestError(f"{what}: device node {path} is not one of this host's GPUs")
    return found


def resolve_cdi_names(
    host: Host, names: Sequence[str], dirs: Sequence[str]
) -> tuple[list, ContainerEdits]:
    """``(host devices, edits of the other devices)`` for the CDI ``names``; a name no
    spec in ``dirs`` defines raises RequestError with the reason."""
    from nvshim.cdi.registry import scan_spec_dirs
    from nvshim.edits import ContainerEdits

    scan = scan_spec_dirs(dirs)
    devices: list[Gpu | MigDevice] = []
    edits = ContainerEdits()
    specs_applied: set[str] = set()
    for name in names:
        found = scan.devices.get(name)
        if found is None:
            problems = f" ({'; '.join(scan.warnings[:3])})" if scan.warnings else ""
            raise RequestError(
                f"CDI device {name}: no spec in {', '.join(dirs)} defines it{problems}"
            )
        path, device, spec = found
        device_edits = ContainerEdits.from_cdi(device.get("containerEdits"))
        nodes = [n.path for n in device_edits.device_nodes if is_gpu_node_path(n.path)]
        if nodes:
            devices += devices_for_nodes(host, nodes, True, f"CDI device {name} ({path})")
            continue
        edits = edits.merge(device_edits)
        if path not in specs_applied:
            specs_applied.add(path)
            edits = edits.merge(ContainerEdits.from_cdi(spec.get("containerEdits")))
    return devices, edits
