"""The sharing config (``[sharing] config``, default ``/etc/nvshim/sharing.yaml``).

Same format as the NVIDIA device plugin's ``sharing`` section, so operators can reuse it::

    version: v1
    sharing:
      mps:                       # or timeSlicing (not both)
        failRequestsGreaterThanOne: true
        resources:
        - name: nvidia.com/gpu   # or nvidia.com/mig-<profile>
          replicas: 4
          devices: all           # or a count, or a list of indexes/UUIDs/<gpu>:<mig>

``load_sharing_config`` checks the file's shape; ``resolve_sharing`` checks it against a host
(devices exist, replica limits, MPS on MIG only per MIG device). Every problem is one
NvshimError line naming the file and the key.
"""

from __future__ import annotations

import os

from nvshim.errors import NvshimError
from nvshim.host.model import Gpu, Host, MigDevice
from nvshim.record import record

TYPE_CHECKING = False  # typing costs ~5 ms at import, per container
if TYPE_CHECKING:
    from typing import Any

MODES = ("mps", "timeSlicing")
MODE_LABELS = {"mps": "mps", "timeSlicing": "time-slicing"}
MIB = 1024 * 1024
MAX_FILE_BYTES = 1024 * 1024
MPS_CLIENTS_PRE_VOLTA = 16
MPS_CLIENTS_VOLTA = 48
MAX_TIME_SLICING_REPLICAS = 1024
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"

_TOP_KEYS = ("version", "sharing", "flags")  # "flags" is the device plugin's; ignored here
_MODE_KEYS = ("renameByDefault", "failRequestsGreaterThanOne", "resources")
_RESOURCE_KEYS = ("name", "rename", "replicas", "devices")

Device = Gpu | MigDevice


@record(frozen=True)
class Resource:
    """One ``resources`` entry; ``devices`` is ``"all"``, a count, or a tuple of ids."""

    name: str
    replicas: int
    devices: str | int | tuple[str, ...]
    where: str  # the key path, for messages: "sharing.mps.resources[0]"


@record(frozen=True)
class SharingConfig:
    """A checked sharing config; ``mode`` is None when it shares nothing."""

    path: str
    mode: str | None
    fail_requests_greater_than_one: bool = False
    resources: tuple[Resource, ...] = ()


@record(frozen=True)
class SharedDevice:
    """A GPU or MIG device shared ``replicas`` ways under ``mode`` ("mps"/"timeSlicing")."""

    uuid: str
    name: str  # "0" or "6:1"
    mode: str
    replicas: int
    fail_requests_greater_than_one: bool
    memory_total: int  # bytes
    is_mig: bool = False

    @property
    def thread_percentage(self) -> int:
        """Each replica's share of the SMs, in percent (at least 1)."""
        return max(1, 100 // self.replicas)

    @property
    def memory_limit_mib(self) -> int:
        """Each replica's share of device memory, in MiB (at least 1)."""
        return max(1, self.memory_total // MIB // self.replicas)

    @property
    def label(self) -> str:
        """``mps x4`` / ``time-slicing x4``, as ``nvshim info`` shows it."""
        return f"{MODE_LABELS[self.mode]} x{self.replicas}"


def _fail(path: str, where: str, message: str) -> NvshimError:
    return NvshimError(f"{path}: {where}: {message}" if where else f"{path}: {message}")


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 64 else text[:61] + "..."


def _check_keys(path: str, where: str, table: Any, allowed: tuple[str, ...]) -> dict:
    if not isinstance(table, dict):
        raise _fail(path, where, f"must be a mapping, got {_show(table)}")
    for key in table:
        if key not in allowed:
            raise _fail(path, where, f"unknown key {_show(key)} (known: {', '.join(allowed)})")
    return table


MISSING = object()


def read_sharing_file(path: str) -> Any:
    """The parsed YAML of ``path``; ``MISSING`` when the file does not exist."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY)
    except FileNotFoundError:
        return MISSING
    except OSError as err:
        raise NvshimError(f"{path}: cannot read: {err.strerror}") from None
    try:
        with os.fdopen(fd, "rb") as fh:
            raw = fh.read(MAX_FILE_BYTES + 1)
    except OSError as err:
        raise NvshimError(f"{path}: cannot read: {err.strerror}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise NvshimError(f"{path}: larger than {MAX_FILE_BYTES} bytes")
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        return yaml.load(raw, Loader=loader)  # noqa: S506 - a safe loader
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err)
        raise NvshimError(
            f"{path}: invalid YAML: {where}{' '.join(str(problem).split())}"
        ) from None


def parse_sharing_config(data: Any, path: str) -> SharingConfig:
    """Check the shape of a parsed sharing config (no host needed)."""
    if data is None:
        raise _fail(path, "", "empty file (need at least 'version: v1')")
    top = _check_keys(path, "", data, _TOP_KEYS)
    version = top.get("version")
    if version != "v1":
        raise _fail(path, "version", f"must be 'v1', got {_show(version)}")
    sharing = top.get("sharing")
    if sharing is None:
        return SharingConfig(path, None)
    sharing = _check_keys(path, "sharing", sharing, MODES)
    present = [m for m in MODES if sharing.get(m) is not None]
    if not present:
        return SharingConfig(path, None)
    if len(present) > 1:
        raise _fail(path, "sharing", "set only one of mps and timeSlicing")
    mode = present[0]
    where = f"sharing.{mode}"
    table = _check_keys(path, where, sharing[mode], _MODE_KEYS)
    for flag in ("renameByDefault", "failRequestsGreaterThanOne"):
        if flag in table and not isinstance(table[flag], bool):
            raise _fail(path, f"{where}.{flag}", f"must be true or false, got {_show(table[flag])}")
    entries = table.get("resources")
    if not isinstance(entries, list) or not entries:
        raise _fail(path, f"{where}.resources", "must be a non-empty list")
    resources = tuple(
        _parse_resource(path, f"{where}.resources[{i}]", entry, mode)
        for i, entry in enumerate(entries)
    )
    return SharingConfig(path, mode, bool(table.get("failRequestsGreaterThanOne")), resources)


def _parse_resource(path: str, where: str, entry: Any, mode: str) -> Resource:
    entry = _check_keys(path, where, entry, _RESOURCE_KEYS)
    name = entry.get("name")
    if not isinstance(name, str) or not (
        name == GPU_RESOURCE or (name.startswith(MIG_RESOURCE_PREFIX) and len(name) > 15)
    ):
        raise _fail(
            path,
            f"{where}.name",
            f"must be {GPU_RESOURCE} or nvidia.com/mig-<profile>, got {_show(name)}",
        )
    if "rename" in entry and not isinstance(entry["rename"], str):
        raise _fail(path, f"{where}.rename", f"must be a string, got {_show(entry['rename'])}")
    replicas = entry.get("replicas")
    if isinstance(replicas, bool) or not isinstance(replicas, int):
        raise _fail(path, f"{where}.replicas", f"must be an integer, got {_show(replicas)}")
    top = MPS_CLIENTS_VOLTA if mode == "mps" else MAX_TIME_SLICING_REPLICAS
    if not 1 <= replicas <= top:
        raise _fail(path, f"{where}.replicas", f"must be between 1 and {top}, got {replicas}")
    devices = entry.get("devices", "all")
    if isinstance(devices, bool):
        raise _fail(path, f"{where}.devices", f"must be 'all', a count or a list, got {devices}")
    if isinstance(devices, str):
        if devices != "all":
            raise _fail(
                path, f"{where}.devices", f"the only string allowed is 'all', got {_show(devices)}"
            )
        return Resource(name, replicas, "all", where)
    if isinstance(devices, int):
        if devices < 1:
            raise _fail(path, f"{where}.devices", f"a count must be at least 1, got {devices}")
        return Resource(name, replicas, devices, where)
    if not isinstance(devices, list) or not devices:
        raise _fail(
            path,
            f"{where}.devices",
            f"must be 'all', a count or a non-empty list, got {_show(devices)}",
        )
    ids = []
    for i, item in enumerate(devices):
        if isinstance(item, bool) or not isinstance(item, (str, int)) or item == "":
            raise _fail(
                path, f"{where}.devices[{i}]", f"must be an index or a UUID, got {_show(item)}"
            )
        ids.append(str(item))
    return Resource(name, replicas, tuple(ids), where)


def load_sharing_config(path: str) -> SharingConfig | None:
    """Read and check ``path``; None when it does not exist (nothing is shared)."""
    if not path:
        return None
    data = read_sharing_file(path)
    return None if data is MISSING else parse_sharing_config(data, path)


def _candidates(host: Host, name: str) -> list[Device]:
    from nvshim.host.edits import all_devices

    if name == GPU_RESOURCE:
        return all_devices(host)
    profile = name[len(MIG_RESOURCE_PREFIX) :]
    return [m for m in host.mig_devices() if m.profile == profile]


def _device_name(device: Device) -> str:
    return device.name_index if isinstance(device, MigDevice) else str(device.index)


def _resolve_ref(host: Host, ref: str, where: str, path: str) -> Device:
    from nvshim.policy.request import RequestError, parse_device_id
    from nvshim.policy.resolve import resolve_devices

    try:
        canonical = parse_device_id(ref, where)
    except RequestError as err:
        raise NvshimError(f"{path}: {err}") from None
    whole = None
    if canonical.isdigit():
        whole = next((g for g in host.gpus if g.index == int(canonical)), None)
    elif canonical.lower().startswith("gpu-"):
        whole = next((g for g in host.gpus if g.uuid.lower() == canonical.lower()), None)
    if whole is not None and whole.mig_enabled:
        names = ", ".join(m.name_index for m in whole.mig_devices) or "none configured"
        raise _fail(
            path,
            where,
            f"GPU {ref} is in MIG mode: it is shared per MIG device, list those instead ({names})",
        )
    from nvshim.policy.request import DeviceList

    try:
        return resolve_devices(host, DeviceList("list", (canonical,)))[0]
    except RequestError as err:
        raise _fail(path, where, str(err)) from None


def _max_replicas(device: Device, host: Host, mode: str) -> int:
    if mode != "mps":
        return MAX_TIME_SLICING_REPLICAS
    gpu = host.gpu(device.parent_index) if isinstance(device, MigDevice) else device
    try:
        major = int(gpu.compute_capability.split(".")[0])
    except ValueError:
        major = 0
    return MPS_CLIENTS_VOLTA if major >= 7 else MPS_CLIENTS_PRE_VOLTA


def resolve_sharing(config: SharingConfig, host: Host) -> dict[str, SharedDevice]:
    """The shared devices of ``host`` by UUID, checked against the host."""
    out: dict[str, SharedDevice] = {}
    if config.mode is None:
        return out
    path = config.path
    for res in config.resources:
        candidates = _candidates(host, res.name)
        if res.devices == "all":
            chosen = [(d, f"{res.where}.devices") for d in candidates]
        elif isinstance(res.devices, int):
            if res.devices > len(candidates):
                raise _fail(
                    path,
                    f"{res.where}.devices",
                    f"count {res.devices} but the host has {len(candidates)} {res.name} device(s)",
                )
            chosen = [(d, f"{res.where}.devices") for d in candidates[: res.devices]]
        else:
            chosen = []
            for i, ref in enumerate(res.devices):
                where = f"{res.where}.devices[{i}]"
                device = _resolve_ref(host, ref, where, path)
                if device.uuid not in {c.uuid for c in candidates}:
                    raise _fail(path, where, f"device {ref} is not a {res.name} device")
                chosen.append((device, where))
        for device, where in chosen:
            if device.uuid in out:
                raise _fail(
                    path,
                    where,
                    f"device {_device_name(device)} ({device.uuid}) is listed more than once",
                )
            limit = _max_replicas(device, host, config.mode)
            if res.replicas > limit:
                gpu = host.gpu(device.parent_index) if isinstance(device, MigDevice) else device
                raise _fail(
                    path,
                    f"{res.where}.replicas",
                    f"{res.replicas} exceeds the {limit} MPS "
                    f"clients device {_device_name(device)} supports (compute capability "
                    f"{gpu.compute_capability})",
                )
            out[device.uuid] = SharedDevice(
                uuid=device.uuid,
                name=_device_name(device),
                mode=config.mode,
                replicas=res.replicas,
                fail_requests_greater_than_one=config.fail_requests_greater_than_one,
                memory_total=device.memory_total,
                is_mig=isinstance(device, MigDevice),
            )
    return out


def sharing_for(config, host: Host) -> dict[str, SharedDevice]:
    """Shared devices per UUID from nvshim's ``config`` (``[sharing] config``)."""
    sharing = load_sharing_config(config.get("sharing", "config"))
    return resolve_sharing(sharing, host) if sharing is not None else {}


def sharing_modes(config, host: Host) -> dict[str, str]:
    """The sharing mode label of each shared device by UUID (``nvshim info``)."""
    return {uuid: shared.label for uuid, shared in sharing_for(config, host).items()}
