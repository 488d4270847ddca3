"""The typed picture of a GPU host that discovery builds and everything else reads.

Paths: ``host_path`` is where a file is on this machine (it keeps the driver or dev
root prefix); ``path`` is where it belongs inside a container (the prefix dropped).
The model round-trips through JSON (``to_dict``/``from_dict``) for the inventory cache.
"""

from __future__ import annotations

from nvshim.record import asdict, field, fields, record

TYPE_CHECKING = False  # typing costs ~5 ms at import, per container
if TYPE_CHECKING:
    from typing import Any


@record(frozen=True)
class NodeInfo:
    """A device node found on the host."""

    path: str  # container path, e.g. /dev/nvidia0
    host_path: str  # path on this machine, dev root prefix kept
    major: int
    minor: int
    type: str = "c"
    mode: int = 0o666
    uid: int = 0
    gid: int = 0


@record(frozen=True)
class DriverFile:
    """A driver file to expose: a library, binary, firmware blob, config file or IPC socket.

    ``kind`` is one of ``lib``, ``bin``, ``firmware``, ``config``, ``ipc``.
    ``capability`` is the driver capability that needs it (``None``: always needed).
    ``soname`` and ``links`` are for libraries: the SONAME and the symlinks
    (``name -> target``, container paths) to create beside it.
    """

    kind: str
    path: str
    host_path: str
    capability: str | None = None
    soname: str | None = None
    links: tuple[tuple[str, str], ...] = ()


@record(frozen=True)
class MigDevice:
    """A MIG device: a compute instance inside a GPU instance of a parent GPU."""

    parent_index: int
    index: int  # position among the parent's MIG devices (the N of "<gpu>:<N>")
    gi: int
    ci: int
    uuid: str
    profile: str  # e.g. "1g.5gb" or "1c.2g.20gb"
    memory_total: int  # bytes
    gi_cap: NodeInfo | None = None
    ci_cap: NodeInfo | None = None
    multiprocessors: int | None = None  # streaming multiprocessors (NVML MIG attributes)
    # its GPU instance profile's engine counts (copyEngines, decoders, encoders,
    # jpegEngines, ofaEngines) and its placement among the 8 memory slices (start, size)
    engines: tuple[tuple[str, int], ...] = ()
    memory_slices: tuple[int, int] | None = None

    @property
    def name_index(self) -> str:
        return f"{self.parent_index}:{self.index}"


@record(frozen=True)
class Gpu:
    """A physical GPU."""

    index: int
    minor: int
    uuid: str
    name: str
    pci_bus_id: str
    memory_total: int  # bytes
    compute_capability: str  # "9.0"
    architecture: str  # "hopper", "ampere", ...
    brand: str  # "nvidia", "tesla", ...
    mig_enabled: bool = False
    numa_node: int | None = None
    node: NodeInfo | None = None
    mig_devices: tuple[MigDevice, ...] = ()


@record
class Host:
    """Everything discovery found on one host."""

    driver_version: str
    cuda_version: str  # newest CUDA the driver supports, "12.4"
    driver_root: str = "/"
    dev_root: str = "/"
    gpus: list[Gpu] = field(default_factory=list)
    control_nodes: list[NodeInfo] = field(default_factory=list)  # nvidiactl, uvm, modeset...
    files: list[DriverFile] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def gpu(self, index: int) -> Gpu:
        for gpu in self.gpus:
            if gpu.index == index:
                return gpu
        raise KeyError(index)

    def mig_devices(self) -> list[MigDevice]:
        return [m for g in self.gpus for m in g.mig_devices]

    def control_node(self, path: str) -> NodeInfo | None:
        return next((n for n in self.control_nodes if n.path == path), None)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Host:
        """Rebuild a host from ``to_dict`` output (the inventory cache)."""

        def node(d: dict | None) -> NodeInfo | None:
            return NodeInfo(**d) if d else None

        def mig(d: dict) -> MigDevice:
            slices = d.get("memory_slices")
            return MigDevice(
                **{
                    **d,
                    "gi_cap": node(d.get("gi_cap")),
                    "ci_cap": node(d.get("ci_cap")),
                    "engines": tuple(tuple(e) for e in d.get("engines") or ()),
                    "memory_slices": tuple(slices) if slices else None,
                }
            )

        def gpu(d: dict) -> Gpu:
            return Gpu(
                **{
                    **d,
                    "node": node(d.get("node")),
                    "mig_devices": tuple(mig(m) for m in d.get("mig_devices") or ()),
                }
            )

        def dfile(d: dict) -> DriverFile:
            return DriverFile(**{**d, "links": tuple(tuple(x) for x in d.get("links") or ())})

        known = {f.name for f in fields(cls)}
        data = {k: v for k, v in data.items() if k in known}
        return cls(
            **{
                **data,
                "gpus": [gpu(g) for g in data.get("gpus") or ()],
                "control_nodes": [NodeInfo(**n) for n in data.get("control_nodes") or ()],
                "files": [dfile(f) for f in data.get("files") or ()],
                "warnings": list(data.get("warnings") or ()),
            }
        )
