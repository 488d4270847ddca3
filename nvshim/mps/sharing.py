"""The sharing config (``[sharing] config``, default ``/etc/nvshim/sharing.yaml``).

The NVIDIA device plugin's config file, read as the device plugin reads it, so nvshim and the
scheduler always agree on which devices are shared and how::

    version: v1                  # default v1
    flags:
      migStrategy: mixed         # none (default) | single | mixed
    sharing:
      mps:                       # or timeSlicing (not both)
        renameByDefault: false
        failRequestsGreaterThanOne: true   # default: true for mps, false for timeSlicing
        resources:
        - name: nvidia.com/gpu   # or nvidia.com/mig-<profile> (migStrategy mixed)
          rename: nvidia.com/gpu.shared
          replicas: 4            # at least 2

``flags.migStrategy`` decides which devices a resource name covers: ``none`` every GPU as a
whole ``nvidia.com/gpu`` (MIG devices not exposed); ``single`` every MIG device as
``nvidia.com/gpu`` (all GPUs MIG-enabled with one profile, else as ``none``); ``mixed`` GPUs
not in MIG mode as ``nvidia.com/gpu`` and MIG devices as ``nvidia.com/mig-<profile>``. Every
device of a shared resource is shared: ``devices`` lists are ignored with a warning, as the
device plugin does. MPS on MIG devices is refused. Unknown keys are warned about.

Per-node selection: the file may hold several named configs (the device plugin ConfigMap's
``data``, or the whole ConfigMap manifest); ``[sharing] config-name`` (or the env
``NVSHIM_SHARING_CONFIG_NAME``) picks one, else ``[sharing] config-default``, else the only
one. ``[sharing] mig-strategy`` stands for the device plugin's ``--mig-strategy`` (it wins
over the file's). ``check_sharing`` validates everything (for ``nvshim info``, ``config
show`` and the node installer); every problem is one NvshimError line naming the file and
the key.
"""

from __future__ import annotations

import os

from nvshim.errors import NvshimError, did_you_mean
from nvshim.host.model import Gpu, Host, MigDevice
from nvshim.record import record

TYPE_CHECKING = False  # typing costs ~5 ms at import, per container
if TYPE_CHECKING:
    from typing import Any

MODES = ("mps", "timeSlicing")
MODE_LABELS = {"mps": "mps", "timeSlicing": "time-slicing"}
MIG_STRATEGIES = ("none", "single", "mixed")
MIB = 1024 * 1024
MAX_FILE_BYTES = 1024 * 1024
MPS_CLIENTS_PRE_VOLTA = 16
MPS_CLIENTS_VOLTA = 48
MIN_REPLICAS = 2
MAX_TIME_SLICING_REPLICAS = 1024
RESOURCE_PREFIX = "nvidia.com/"
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
NAME_ENV = "NVSHIM_SHARING_CONFIG_NAME"
STRATEGY_ENV = "NVSHIM_MIG_STRATEGY"

# the device plugin's top-level keys; only version, flags and sharing matter here
_TOP_KEYS = ("version", "flags", "resources", "sharing", "imex")
_MODE_KEYS = ("renameByDefault", "failRequestsGreaterThanOne", "resources")
_RESOURCE_KEYS = ("name", "rename", "replicas", "devices")
_CONFIG_KEYS = ("version", "flags", "sharing")  # any of these: a single config, not named ones

Device = Gpu | MigDevice


@record(frozen=True)
class Resource:
    """One ``resources`` entry: every device of ``name`` shared ``replicas`` ways and
    advertised as ``advertised`` (``rename``, or ``<name>.shared`` with renameByDefault)."""

    name: str
    replicas: int
    advertised: str
    where: str  # the key path, for messages: "sharing.mps.resources[0]"


@record(frozen=True)
class SharingConfig:
    """A checked sharing config; ``mode`` is None when it shares nothing."""

    path: str  # the file, and the selected named config: "/etc/nvshim/sharing.yaml [a100]"
    mode: str | None
    fail_requests_greater_than_one: bool = False
    resources: tuple[Resource, ...] = ()
    mig_strategy: str = "none"
    warnings: tuple[str, ...] = ()


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
    resource: str = GPU_RESOURCE  # the resource name the device plugin advertises it as
    threads: int | None = None  # explicit limits (a DRA claim's), instead of 1/replicas
    memory_mib: int | None = None

    @property
    def thread_percentage(self) -> int:
        """Each client's share of the SMs, in percent (at least 1)."""
        return self.threads or max(1, 100 // self.replicas)

    @property
    def memory_limit_mib(self) -> int:
        """Each client's share of device memory, in MiB (at least 1)."""
        return self.memory_mib or max(1, self.memory_total // MIB // self.replicas)

    @property
    def label(self) -> str:
        """``mps x4`` / ``time-slicing x4``, as ``nvshim info`` shows it."""
        return f"{MODE_LABELS[self.mode]} x{self.replicas}"


def _fail(path: str, where: str, message: str) -> NvshimError:
    return NvshimError(f"{path}: {where}: {message}" if where else f"{path}: {message}")


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 64 else text[:61] + "..."


def _mapping(path: str, where: str, table: Any) -> dict:
    if not isinstance(table, dict):
        raise _fail(path, where, f"must be a mapping, got {_show(table)}")
    return table


def _warn_unknown(path, where, table: dict, allowed, warnings: list[str]) -> None:
    """The device plugin ignores keys it does not know: a warning each, never a refusal."""
    for key in table:
        if key not in allowed:
            at = f"{where}.{key}" if where else str(key)
            hint = did_you_mean(key, allowed).replace(" (", "; ").rstrip(")")
            known = ", ".join(allowed)
            warnings.append(f"{path}: {at}: unknown key ignored (known: {known}{hint})")


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
    return _parse_yaml(raw, path)


def _parse_yaml(raw: bytes | str, path: str) -> Any:
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


def _named_configs(data: Any) -> dict | None:
    """The named configs of a file holding several (a ConfigMap manifest, or its ``data``
    mapping of name to YAML text or mapping); None for a single config."""
    if not isinstance(data, dict):
        return None
    if data.get("kind") == "ConfigMap":
        return data.get("data") or {}
    if any(key in data for key in _CONFIG_KEYS) or not data:
        return None
    values = data.values()
    if all(_is_config(v) for v in values):
        return data
    return None


def _is_config(value: Any) -> bool:
    """A named config's value: a mapping, or YAML text, naming one of the config keys."""
    if not isinstance(value, (str, dict)):
        return False
    return any(key in value for key in _CONFIG_KEYS)


def select_config(data: Any, path: str, name: str = "", default: str = "") -> tuple[Any, str]:
    """The config of ``data`` to use and the path label naming it in messages: a single
    config as is; of several named ones, ``name``, else ``default``, else the only one (the
    device plugin: node label ``nvidia.com/device-plugin.config``, else ``config.default``)."""
    named = _named_configs(data)
    if named is None:
        return data, path
    names = sorted(str(n) for n in named)
    chosen = name or default
    if not chosen:
        if len(names) != 1:
            raise NvshimError(
                f"{path}: holds {len(names)} named configs ({', '.join(names) or 'none'}): "
                "set [sharing] config-name or config-default to pick one"
            )
        chosen = names[0]
    if chosen not in named:
        how = "config-name" if name else "config-default"
        raise NvshimError(
            f"{path}: no config named {_show(chosen)} (sharing.{how}; "
            f"the file has: {', '.join(names) or 'none'})"
        )
    label = f"{path} [{chosen}]"
    value = named[chosen]
    return (_parse_yaml(value, label) if isinstance(value, str) else value), label


def parse_sharing_config(data: Any, path: str) -> SharingConfig:
    """Check the shape of one parsed device-plugin config (no host needed)."""
    warnings: list[str] = []
    if data is None:
        return SharingConfig(path, None, warnings=(f"{path}: empty config: nothing shared",))
    top = _mapping(path, "", data)
    _warn_unknown(path, "", top, _TOP_KEYS, warnings)
    version = top.get("version", "v1")
    if version != "v1":
        raise _fail(path, "version", f"must be 'v1', got {_show(version)}")
    strategy = _mig_strategy(path, top.get("flags"))
    sharing = top.get("sharing")
    if sharing is None:
        return SharingConfig(path, None, mig_strategy=strategy, warnings=tuple(warnings))
    sharing = _mapping(path, "sharing", sharing)
    _warn_unknown(path, "sharing", sharing, MODES, warnings)
    present = [m for m in MODES if sharing.get(m) is not None]
    if len(present) > 1:
        raise _fail(path, "sharing", "set only one of mps and timeSlicing")
    if not present:
        return SharingConfig(path, None, mig_strategy=strategy, warnings=tuple(warnings))
    mode = present[0]
    where = f"sharing.{mode}"
    table = _mapping(path, where, sharing[mode])
    _warn_unknown(path, where, table, _MODE_KEYS, warnings)
    for flag in ("renameByDefault", "failRequestsGreaterThanOne"):
        if flag in table and not isinstance(table[flag], bool):
            raise _fail(path, f"{where}.{flag}", f"must be true or false, got {_show(table[flag])}")
    entries = table.get("resources")
    if not isinstance(entries, list) or not entries:
        raise _fail(path, f"{where}.resources", "must be a non-empty list")
    by_default = bool(table.get("renameByDefault"))
    resources = tuple(
        _parse_resource(path, f"{where}.resources[{i}]", entry, mode, by_default, warnings)
        for i, entry in enumerate(entries)
    )
    seen: dict[str, str] = {}
    for res in resources:
        if res.name in seen:
            raise _fail(path, f"{res.where}.name", f"{res.name} already listed in {seen[res.name]}")
        seen[res.name] = res.where
    fail_more = table.get("failRequestsGreaterThanOne", mode == "mps")
    return SharingConfig(path, mode, fail_more, resources, strategy, tuple(warnings))


def _mig_strategy(path: str, flags: Any) -> str:
    if flags is None:
        return "none"
    flags = _mapping(path, "flags", flags)
    strategy = flags.get("migStrategy")
    if strategy is None:
        return "none"
    if strategy not in MIG_STRATEGIES:
        raise _fail(
            path, "flags.migStrategy", f"must be none, single or mixed, got {_show(strategy)}"
        )
    return strategy


def _resource_name(path: str, where: str, value: Any) -> str:
    """A resource name as the device plugin reads it: ``nvidia.com/`` added when absent."""
    if not isinstance(value, str) or not value:
        raise _fail(path, where, f"must be a resource name, got {_show(value)}")
    name = value if "/" in value else RESOURCE_PREFIX + value
    if not name.startswith(RESOURCE_PREFIX) or len(name) == len(RESOURCE_PREFIX):
        raise _fail(path, where, f"must be a {RESOURCE_PREFIX}<name> resource, got {_show(value)}")
    return name


def _parse_resource(path, where, entry: Any, mode: str, by_default: bool, warnings) -> Resource:
    entry = _mapping(path, where, entry)
    _warn_unknown(path, where, entry, _RESOURCE_KEYS, warnings)
    name = _resource_name(path, f"{where}.name", entry.get("name"))
    if name != GPU_RESOURCE and not (
        name.startswith(MIG_RESOURCE_PREFIX) and len(name) > len(MIG_RESOURCE_PREFIX)
    ):
        raise _fail(
            path,
            f"{where}.name",
            f"must be {GPU_RESOURCE} or {MIG_RESOURCE_PREFIX}<profile>, got {_show(name)}",
        )
    if entry.get("rename") is not None:
        advertised = _resource_name(path, f"{where}.rename", entry["rename"])
    else:
        advertised = f"{name}.shared" if by_default else name
    replicas = entry.get("replicas")
    if replicas is None:
        misspelt = [k for k in entry if did_you_mean(k, ("replicas",))]
        hint = f" ({misspelt[0]!r} is not a key: did you mean 'replicas'?)" if misspelt else ""
        raise _fail(path, f"{where}.replicas", f"missing: the number of replicas{hint}")
    if isinstance(replicas, bool) or not isinstance(replicas, int):
        raise _fail(path, f"{where}.replicas", f"must be an integer, got {_show(replicas)}")
    top = MPS_CLIENTS_VOLTA if mode == "mps" else MAX_TIME_SLICING_REPLICAS
    if not MIN_REPLICAS <= replicas <= top:
        raise _fail(
            path, f"{where}.replicas", f"must be between {MIN_REPLICAS} and {top}, got {replicas}"
        )
    if "devices" in entry:
        warnings.append(
            f"{path}: {where}.devices: ignored, as the device plugin does: every {name} "
            "device is shared"
        )
    return Resource(name, replicas, advertised, where)


def selected_name(config) -> tuple[str, str]:
    """The named config to use and the default: ``NVSHIM_SHARING_CONFIG_NAME`` (when set)
    or ``[sharing] config-name``, and ``[sharing] config-default``."""
    return os.environ.get(NAME_ENV) or config.sharing.config_name, config.sharing.config_default


def load_sharing_config(path: str, name: str = "", default: str = "") -> SharingConfig | None:
    """Read, select (``name``/``default``) and check ``path``; None when it does not exist
    (nothing is shared)."""
    if not path:
        return None
    data = read_sharing_file(path)
    if data is MISSING:
        return None
    data, label = select_config(data, path, name, default)
    return parse_sharing_config(data, label)


def covered_devices(host: Host, config: SharingConfig, name: str) -> list[Device]:
    """The devices the device plugin advertises as resource ``name`` under the config's
    ``migStrategy``."""
    strategy = config.mig_strategy
    if strategy == "single":
        strategy = _single_strategy(host, config)
    if name == GPU_RESOURCE:
        if strategy == "none":
            return list(host.gpus)
        if strategy == "single":
            return host.mig_devices()
        return [g for g in host.gpus if not g.mig_enabled]
    if strategy != "mixed":
        return []
    profile = name[len(MIG_RESOURCE_PREFIX) :]
    return [m for m in host.mig_devices() if m.profile == profile]


def _single_strategy(host: Host, config: SharingConfig) -> str:
    """``single`` on this host: ``none`` when no GPU is in MIG mode; refused unless every
    GPU is in MIG mode with MIG devices of one profile (the device plugin's rule)."""
    enabled = [g for g in host.gpus if g.mig_enabled]
    if not enabled:
        return "none"
    where = "flags.migStrategy"
    if len(enabled) != len(host.gpus):
        off = ", ".join(str(g.index) for g in host.gpus if not g.mig_enabled)
        raise _fail(config.path, where, f"single needs every GPU in MIG mode; GPU {off} is not")
    empty = [str(g.index) for g in enabled if not g.mig_devices]
    if empty:
        raise _fail(config.path, where, f"single: GPU {', '.join(empty)} has no MIG devices")
    profiles = sorted({m.profile for m in host.mig_devices()})
    if len(profiles) > 1:
        raise _fail(
            config.path, where, f"single needs one MIG profile, the host has {', '.join(profiles)}"
        )
    return "single"


def _device_name(device: Device) -> str:
    return device.name_index if isinstance(device, MigDevice) else str(device.index)


MPS_ON_MIG = "sharing with MPS is not supported for MIG devices"


def mps_unsupported(device: Device) -> str | None:
    """``MIG device 6:1 (<uuid>)`` / ``GPU in MIG mode 6 (<uuid>)`` when MPS cannot share
    ``device`` (the device plugin's rule, ``MPS_ON_MIG``), else None."""
    if not (isinstance(device, MigDevice) or device.mig_enabled):
        return None
    what = "MIG device" if isinstance(device, MigDevice) else "GPU in MIG mode"
    return f"{what} {_device_name(device)} ({device.uuid})"


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
        if config.mig_strategy == "single":
            _single_strategy(host, config)
        return out
    path = config.path
    for res in config.resources:
        for device in covered_devices(host, config, res.name):
            what = mps_unsupported(device) if config.mode == "mps" else None
            if what:
                raise _fail(
                    path,
                    f"{res.where}.name",
                    f"{res.name} covers {what} under migStrategy {config.mig_strategy}: "
                    f"{MPS_ON_MIG}",
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
                resource=res.advertised,
            )
    return out


def config_for(config) -> SharingConfig | None:
    """The sharing config nvshim's ``config`` names (``[sharing] config``, selected by
    ``config-name``/``config-default``); None when the file does not exist. ``[sharing]
    mig-strategy`` (or ``NVSHIM_MIG_STRATEGY``), when set, wins over the file's
    ``flags.migStrategy``, as the device plugin's ``--mig-strategy``/``MIG_STRATEGY`` do
    (the GPU Operator sets those, not the file)."""
    name, default = selected_name(config)
    sharing = load_sharing_config(config.sharing.config, name, default)
    strategy = os.environ.get(STRATEGY_ENV) or config.sharing.mig_strategy
    if sharing is None or not strategy:
        return sharing
    if strategy not in MIG_STRATEGIES:  # the variable's: the file's is checked at load
        raise NvshimError(f"{STRATEGY_ENV}: must be none, single or mixed, got {_show(strategy)}")
    from nvshim.record import replace

    return replace(sharing, mig_strategy=strategy)


def check_sharing(config, host: Host | None = None) -> list[str]:
    """Validate the sharing file of nvshim's ``config`` (against ``host`` when given): its
    warnings, or NvshimError naming the file and key. For ``nvshim info``, ``nvshim config
    show`` and the node installer, which refuse to start on a bad file."""
    sharing = config_for(config)
    if sharing is None:
        return []
    if host is not None:
        resolve_sharing(sharing, host)
    return list(sharing.warnings)


def sharing_for(config, host: Host) -> dict[str, SharedDevice]:
    """Shared devices per UUID from nvshim's ``config`` (``[sharing] config``)."""
    sharing = config_for(config)
    return resolve_sharing(sharing, host) if sharing is not None else {}
