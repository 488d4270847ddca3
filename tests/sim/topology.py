"""Simulated-host topologies: load and check the YAML format, derive the rest, render for C.

A topology names the driver and its GPUs; see ``hosts/*.yaml`` for examples. Keys:

- ``driver_version`` (str), ``cuda_driver_version`` (int, 12040), optional ``nvml_version``,
  ``init_error`` (NVML error code every ``nvmlInit*`` returns), ``majors``
  (``{uvm: 508, caps: 509}``), ``frontend_name`` (the 195 name in /proc/devices),
  ``defaults`` (keys merged into every GPU).
- ``gpus``: list in NVML index order, each with ``uuid`` (``GPU-...``), ``name``,
  ``pci_bus_id`` (``00000000:18:00.0``), ``memory_mib``, ``compute_capability`` ("9.0"),
  ``architecture`` and ``brand`` (NVML enum name or number), and optionally ``index`` (must
  equal the position), ``minor`` (default: index), ``pci_device_id``, ``pci_subsystem_id``,
  ``memory_used_mib``, ``memory_reserved_mib``, ``sm_count``, ``mig_mode``
  (unsupported/disabled/enabled), ``mig_pending``, ``max_mig_devices`` (default 7),
  ``numa_node`` (int, -1 allowed, absent: no sysfs file), ``persistence_mode``
  (enabled/disabled, default enabled), ``compute_mode``, ``fail``
  (``{code: 15, on_handle: false, only: [nvmlDeviceGetUUID]}``) and ``mig_devices``.
- ``mig_devices``: each ``gi``, ``ci``, ``profile`` (``1g.5gb``, ``1c.2g.20gb``), ``uuid``
  (``MIG-...``), optionally ``memory_mib`` (default from the profile), ``slot`` (position in
  NVML's MIG index, default: list position), ``gi_slices``, ``ci_slices``, ``sm_count``.
- GPUs may also give ``pci_path`` (the PCIe bridges from the root port down to the GPU's
  parent, ``["0000:10:01.0", "0000:11:00.0"]``: sysfs then holds the tree, see ``pcifs``)
  and ``nvlinks`` (active NVLinks: to NVSwitches, or with ``nvlink_peer``, the index of
  another GPU, all to that GPU, as an NVLink bridge does).
- ``nics``: RDMA devices, each ``name`` (``mlx5_0``), ``pci_bus_id`` (``0000:15:00.0``),
  ``pci_path``, ``numa_node``, ``link_layer`` (InfiniBand/Ethernet), ``netdevs``, ``uverbs``
  (N of ``/dev/infiniband/uverbsN``), optionally ``ports`` (default 1) and ``physfn`` (the
  PF's address: an SR-IOV virtual function).

``load_topology`` returns the normalized form (every derived field filled in) that the
builder, the fake NVML and tests all read.
"""

from __future__ import annotations

import copy
import hashlib
import os
import re
from typing import Any

import yaml

from nvshim.errors import NvshimError

HOSTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hosts")

ARCHITECTURES = {
    "kepler": 2,
    "maxwell": 3,
    "pascal": 4,
    "volta": 5,
    "turing": 6,
    "ampere": 7,
    "ada": 8,
    "hopper": 9,
    "blackwell": 10,
}
BRANDS = {
    "unknown": 0,
    "quadro": 1,
    "tesla": 2,
    "nvs": 3,
    "grid": 4,
    "geforce": 5,
    "titan": 6,
    "nvidia_vapps": 7,
    "nvidia_vpc": 8,
    "nvidia_vcs": 9,
    "nvidia_vws": 10,
    "nvidia_cloud_gaming": 11,
    "quadro_rtx": 12,
    "nvidia_rtx": 13,
    "nvidia": 14,
    "geforce_rtx": 15,
    "titan_rtx": 16,
}
COMPUTE_MODES = {"default": 0, "exclusive_thread": 1, "prohibited": 2, "exclusive_process": 3}
MIG_MODES = {"unsupported": -1, "disabled": 0, "enabled": 1}
PERSISTENCE_MODES = {"disabled": 0, "enabled": 1}

# GPU-instance profile -> memory in MiB as the driver reports it.
PROFILE_MEMORY_MIB = {
    "1g.5gb": 4864,
    "2g.10gb": 9984,
    "3g.20gb": 19968,
    "4g.20gb": 19968,
    "7g.40gb": 40192,
    "1g.10gb": 9856,
    "1g.20gb": 19968,
    "2g.20gb": 19968,
    "3g.40gb": 40192,
    "4g.40gb": 40192,
    "7g.80gb": 80768,
}
# SMs per compute-instance slice count, by architecture (A100 / H100 SXM).
SM_PER_SLICES = {
    7: {1: 14, 2: 28, 3: 42, 4: 56, 7: 98},
    9: {1: 16, 2: 32, 3: 60, 4: 64, 7: 132},
}
_PROFILE_RE = re.compile(r"^(?:(\d)c\.)?(\d)g\.(\d+)gb(?:\+me)?$")
_UUID_BODY = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_GPU_UUID_RE = re.compile(rf"^GPU-{_UUID_BODY}$")
_MIG_UUID_RE = re.compile(rf"^MIG-{_UUID_BODY}$")
_BUS_ID_RE = re.compile(r"^([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")
_NAME_RE = re.compile(r"^[\x20-\x7e]{1,63}$")


def shipped_hosts() -> list[str]:
    """Names of the topologies shipped in ``tests/sim/hosts``."""
    return sorted(f[:-5] for f in os.listdir(HOSTS_DIR) if f.endswith(".yaml"))


def load_topology(topology: str | dict) -> dict[str, Any]:
    """Load a shipped name, a YAML path or a dict, check it and return the normalized form."""
    if isinstance(topology, dict):
        return normalize(copy.deepcopy(topology), "<dict>")
    path = topology
    if os.sep not in topology and not topology.endswith((".yaml", ".yml")):
        path = os.path.join(HOSTS_DIR, topology + ".yaml")
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except FileNotFoundError:
        known = ", ".join(shipped_hosts())
        raise NvshimError(f"{path}: no such topology (shipped: {known})") from None
    except (OSError, yaml.YAMLError) as err:
        raise NvshimError(f"{path}: cannot load topology: {_one_line(err)}") from None
    if not isinstance(data, dict):
        raise NvshimError(f"{path}: a topology must be a mapping")
    data.setdefault("name", os.path.basename(path).rsplit(".", 1)[0])
    return normalize(data, path)


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split())


class _Checker:
    """Typed access to a mapping that raises NvshimError naming source and key."""

    def __init__(self, source: str, where: str, data: Any) -> None:
        self.source, self.where = source, where
        if not isinstance(data, dict):
            self.fail("", "must be a mapping")
        self.data = data

    def fail(self, key: str, why: str):
        name = f"{self.where}.{key}" if self.where and key else self.where or key
        raise NvshimError(f"{self.source}: {name}: {why}")

    def get(self, key: str, kind: type | tuple, default: Any = ..., enum: dict | None = None):
        if key not in self.data:
            if default is ...:
                self.fail(key, "is required")
            return default
        value = self.data[key]
        if enum is not None and isinstance(value, str):
            if value.lower() not in enum:
                self.fail(key, f"unknown value {value!r} (known: {', '.join(enum)})")
            return enum[value.lower()]
        if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
            self.fail(key, f"has the wrong type: {value!r}")
        return value

    def string(self, key: str, pattern: re.Pattern, default: Any = ...) -> str:
        value = self.get(key, str, default)
        if value is not None and not pattern.match(value):
            self.fail(key, f"malformed value {value!r}")
        return value


def normalize(data: dict[str, Any], source: str) -> dict[str, Any]:
    """Check a raw topology and fill in every derived field."""
    top = _Checker(source, "", data)
    known = {
        "name",
        "driver_version",
        "cuda_driver_version",
        "nvml_version",
        "init_error",
        "majors",
        "frontend_name",
        "defaults",
        "gpus",
        "nics",
    }
    for key in data:
        if key not in known:
            top.fail(key, "unknown key")
    driver = top.string("driver_version", re.compile(r"^\d+\.\d+(\.\d+)?$"))
    cuda = top.get("cuda_driver_version", int)
    majors = _Checker(source, "majors", data.get("majors") or {})
    out: dict[str, Any] = {
        "name": str(data.get("name") or "custom"),
        "driver_version": driver,
        "cuda_driver_version": cuda,
        "cuda_version": f"{cuda // 1000}.{cuda % 1000 // 10}",
        "nvml_version": top.get("nvml_version", str, f"{cuda // 1000}.{driver}"),
        "init_error": top.get("init_error", int, 0),
        "majors": {"uvm": majors.get("uvm", int, 508), "caps": majors.get("caps", int, 509)},
        "frontend_name": top.get("frontend_name", str, "nvidia-frontend"),
    }
    defaults = top.get("defaults", dict, {})
    gpus_raw = top.get("gpus", list)
    gpus = [
        _gpu(source, f"gpus[{i}]", {**defaults, **(g if isinstance(g, dict) else {"?": g})}, i)
        for i, g in enumerate(gpus_raw)
    ]
    for key, what in (("uuid", "uuid"), ("minor", "minor"), ("pci_bus_id", "PCI bus id")):
        seen: dict[Any, int] = {}
        for gpu in gpus:
            if gpu[key] in seen:
                raise NvshimError(
                    f"{source}: gpus[{gpu['index']}].{key}: {what} {gpu[key]!r} "
                    f"already used by gpus[{seen[gpu[key]]}]"
                )
            seen[gpu[key]] = gpu["index"]
    mig_uuids = [m["uuid"] for g in gpus for m in g["mig_devices"]]
    if len(set(mig_uuids)) != len(mig_uuids):
        raise NvshimError(f"{source}: gpus: a MIG uuid is used twice")
    for gpu in gpus:
        peer = gpu["nvlink_peer"]
        if peer is not None and not (0 <= peer < len(gpus) and peer != gpu["index"]):
            raise NvshimError(f"{source}: gpus[{gpu['index']}].nvlink_peer: no GPU {peer}")
    out["gpus"] = gpus
    out["nics"] = [_nic(source, f"nics[{i}]", n) for i, n in enumerate(top.get("nics", list, []))]
    _check_pci_tree(source, gpus, out["nics"])
    return out


_BDF_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def _pci_path(c: _Checker) -> list[str] | None:
    path = c.get("pci_path", list, None)
    if path is not None and not all(isinstance(b, str) and _BDF_RE.match(b) for b in path):
        c.fail("pci_path", "must be a list of lower-case PCI addresses (0000:10:01.0)")
    return path


def _nic(source: str, where: str, raw: Any) -> dict[str, Any]:
    c = _Checker(source, where, raw)
    known = {"name", "pci_bus_id", "pci_path", "numa_node", "link_layer", "netdevs", "uverbs"}
    for key in raw:
        if key not in known | {"ports", "physfn"}:
            c.fail(key, "unknown key")
    netdevs = c.get("netdevs", list, [])
    if not all(isinstance(n, str) and re.match(r"^[a-z][a-z0-9_]{0,14}$", n) for n in netdevs):
        c.fail("netdevs", "must be a list of interface names")
    return {
        "name": c.string("name", re.compile(r"^[a-z][a-z0-9_]{0,30}$")),
        "pci_bdf": c.string("pci_bus_id", _BDF_RE),
        "pci_path": _pci_path(c) or [],
        "numa_node": c.get("numa_node", int, -1),
        "link_layer": c.get("link_layer", str, "InfiniBand"),
        "netdevs": netdevs,
        "uverbs": c.get("uverbs", int),
        "ports": c.get("ports", int, 1),
        "physfn": c.string("physfn", _BDF_RE, None),
    }


def _check_pci_tree(source: str, gpus: list[dict], nics: list[dict]) -> None:
    """Every bridge has one parent, whichever device's path names it."""
    parent: dict[str, str | None] = {}
    for dev in [*gpus, *nics]:
        path = dev.get("pci_path") or []
        for i, bridge in enumerate(path):
            up = path[i - 1] if i else None
            if parent.setdefault(bridge, up) != up:
                raise NvshimError(
                    f"{source}: PCI bridge {bridge} has two parents ({parent[bridge]}, {up})"
                )


def _gpu(source: str, where: str, raw: dict[str, Any], position: int) -> dict[str, Any]:
    c = _Checker(source, where, raw)
    known = {
        "index",
        "minor",
        "uuid",
        "name",
        "pci_bus_id",
        "pci_device_id",
        "pci_subsystem_id",
        "memory_mib",
        "memory_used_mib",
        "memory_reserved_mib",
        "compute_capability",
        "architecture",
        "brand",
        "sm_count",
        "mig_mode",
        "mig_pending",
        "max_mig_devices",
        "numa_node",
        "persistence_mode",
        "compute_mode",
        "fail",
        "mig_devices",
        "pci_path",
        "nvlinks",
        "nvlink_peer",
    }
    for key in raw:
        if key not in known:
            c.fail(key, "unknown key")
    index = c.get("index", int, position)
    if index != position:
        c.fail("index", f"is {index} but the GPU is at position {position} (NVML index order)")
    minor = c.get("minor", int, index)
    if not 0 <= minor <= 253:
        c.fail("minor", f"{minor} out of range 0..253 (254 and 255 belong to modeset and ctl)")
    bus_id = c.string("pci_bus_id", _BUS_ID_RE)
    m = _BUS_ID_RE.match(bus_id)
    domain, bus, dev, fn = (int(x, 16) for x in m.groups())
    cc = c.string("compute_capability", re.compile(r"^\d+\.\d+$"))
    arch = c.get("architecture", int, enum=ARCHITECTURES)
    memory_mib = c.get("memory_mib", int)
    mig_mode = c.get("mig_mode", (int, str), "unsupported", enum=MIG_MODES)
    if mig_mode not in (-1, 0, 1):
        c.fail("mig_mode", f"unknown value {mig_mode!r}")
    numa = c.get("numa_node", int, None)
    if numa is not None and numa < -1:
        c.fail("numa_node", f"{numa} is below -1")
    gpu: dict[str, Any] = {
        "index": index,
        "minor": minor,
        "uuid": c.string("uuid", _GPU_UUID_RE),
        "name": c.string("name", _NAME_RE),
        "pci_bus_id": f"{domain:08X}:{bus:02X}:{dev:02X}.{fn}",
        "pci_bdf": f"{domain:04x}:{bus:02x}:{dev:02x}.{fn}",
        "pci_domain": domain,
        "pci_bus": bus,
        "pci_device": dev,
        "pci_device_id": c.get("pci_device_id", int, 0x000010DE),
        "pci_subsystem_id": c.get("pci_subsystem_id", int, 0),
        "memory_mib": memory_mib,
        "memory_used_mib": c.get("memory_used_mib", int, 0),
        "memory_reserved_mib": c.get("memory_reserved_mib", int, 0),
        "compute_capability": cc,
        "architecture": arch,
        "brand": c.get("brand", int, enum=BRANDS),
        "sm_count": c.get("sm_count", int, 0),
        "mig_mode": {-1: "unsupported", 0: "disabled", 1: "enabled"}[mig_mode],
        "mig_pending": c.get("mig_pending", (int, str), mig_mode, enum=MIG_MODES),
        "max_mig_devices": c.get("max_mig_devices", int, 7 if mig_mode == 1 else 0),
        "numa_node": numa,
        "persistence_mode": c.get("persistence_mode", (int, str), 1, enum=PERSISTENCE_MODES),
        "compute_mode": c.get("compute_mode", int, 0, enum=COMPUTE_MODES),
        "fail": _fail(source, where, raw.get("fail")),
        "pci_path": _pci_path(c),
        "nvlinks": c.get("nvlinks", int, 0),
        "nvlink_peer": c.get("nvlink_peer", int, None),
    }
    migs_raw = c.get("mig_devices", list, [])
    if migs_raw and mig_mode != 1:
        c.fail("mig_devices", "given but mig_mode is not enabled")
    gpu["mig_devices"] = [
        _mig(source, f"{where}.mig_devices[{j}]", m, j, gpu) for j, m in enumerate(migs_raw)
    ]
    _check_migs(c, gpu)
    return gpu


def _fail(source: str, where: str, raw: Any) -> dict[str, Any] | None:
    if raw is None:
        return None
    c = _Checker(source, f"{where}.fail", raw)
    only = c.get("only", list, [])
    if not all(isinstance(x, str) and re.match(r"^nvml\w+$", x) for x in only):
        c.fail("only", "must be a list of NVML function names")
    code = c.get("code", int)
    if code <= 0:
        c.fail("code", f"{code} is not an NVML error code")
    return {"code": code, "on_handle": c.get("on_handle", bool, False), "only": only}


def _mig(source: str, where: str, raw: Any, position: int, gpu: dict) -> dict[str, Any]:
    c = _Checker(source, where, raw)
    known = {"gi", "ci", "profile", "uuid", "memory_mib", "slot", "gi_slices", "ci_slices"}
    known |= {"sm_count"}
    for key in raw:
        if key not in known:
            c.fail(key, "unknown key")
    profile = c.string("profile", _PROFILE_RE)
    ci_part, gi_part, gb = _PROFILE_RE.match(profile).groups()
    gi_slices = c.get("gi_slices", int, int(gi_part))
    ci_slices = c.get("ci_slices", int, int(ci_part or gi_part))
    gi_profile = f"{gi_part}g.{gb}gb"
    memory = c.get("memory_mib", int, PROFILE_MEMORY_MIB.get(gi_profile))
    if memory is None:
        c.fail("memory_mib", f"is required for profile {profile!r} (no default known)")
    gi, ci = c.get("gi", int), c.get("ci", int)
    if not 0 <= gi <= 14:
        c.fail("gi", f"{gi} out of range 0..14")
    if not 0 <= ci <= 7:
        c.fail("ci", f"{ci} out of range 0..7")
    sm_table = SM_PER_SLICES.get(gpu["architecture"], SM_PER_SLICES[9])
    return {
        "parent_index": gpu["index"],
        "slot": c.get("slot", int, position),
        "gi": gi,
        "ci": ci,
        "profile": profile,
        "gi_slices": gi_slices,
        "ci_slices": ci_slices,
        "memory_mib": memory,
        "uuid": c.string("uuid", _MIG_UUID_RE),
        "name": f"{gpu['name']} MIG {profile}",
        "sm_count": c.get("sm_count", int, sm_table.get(ci_slices, 16 * ci_slices)),
        "copy_engines": gi_slices,
        "decoders": 0 if gpu["architecture"] == 7 and gi_slices == 1 else max(1, gi_slices // 2),
        "encoders": 0,
        "jpegs": 0 if gpu["architecture"] == 7 and gi_slices == 1 else 1,
        "ofas": 1 if gi_slices == 7 else 0,
    }


def _check_migs(c: _Checker, gpu: dict[str, Any]) -> None:
    slots: set[int] = set()
    pairs: set[tuple[int, int]] = set()
    gi_slices: dict[int, int] = {}
    for j, mig in enumerate(gpu["mig_devices"]):
        where = f"mig_devices[{j}]"
        if not 0 <= mig["slot"] < gpu["max_mig_devices"]:
            c.fail(where, f"slot {mig['slot']} outside 0..{gpu['max_mig_devices'] - 1}")
        if mig["slot"] in slots:
            c.fail(where, f"slot {mig['slot']} used twice")
        if (mig["gi"], mig["ci"]) in pairs:
            c.fail(where, f"gi {mig['gi']} ci {mig['ci']} used twice")
        if gi_slices.setdefault(mig["gi"], mig["gi_slices"]) != mig["gi_slices"]:
            c.fail(where, f"gi {mig['gi']} has two different slice counts")
        slots.add(mig["slot"])
        pairs.add((mig["gi"], mig["ci"]))
    if sum(gi_slices.values()) > 7:
        c.fail("mig_devices", f"GPU instances use {sum(gi_slices.values())} slices (max 7)")


def render_fake_nvml(topo: dict[str, Any]) -> str:
    """The fake NVML's line format (see fakenvml.c) for a normalized topology."""
    mib = 1 << 20
    lines = [
        f"# fake-nvml topology, generated from {topo['name']}",
        f"driver {topo['driver_version']}",
        f"nvml {topo['nvml_version']}",
        f"cuda {topo['cuda_driver_version']}",
        f"init_error {topo['init_error']}",
    ]
    for g in topo["gpus"]:
        major, minor = g["compute_capability"].split(".")
        fail = g["fail"] or {"code": 0, "on_handle": False, "only": []}
        fields = {
            "minor": g["minor"],
            "uuid": g["uuid"],
            "bus_id": g["pci_bus_id"],
            "domain": g["pci_domain"],
            "bus": g["pci_bus"],
            "device": g["pci_device"],
            "pci_id": g["pci_device_id"],
            "pci_subsys": g["pci_subsystem_id"],
            "mem_total": g["memory_mib"] * mib,
            "mem_used": g["memory_used_mib"] * mib,
            "mem_reserved": g["memory_reserved_mib"] * mib,
            "cc_major": major,
            "cc_minor": minor,
            "arch": g["architecture"],
            "brand": g["brand"],
            "mig_mode": MIG_MODES[g["mig_mode"]],
            "mig_pending": g["mig_pending"],
            "mig_max": g["max_mig_devices"],
            "numa": -1 if g["numa_node"] is None else g["numa_node"],
            "persistence": g["persistence_mode"],
            "sm": g["sm_count"],
            "compute_mode": g["compute_mode"],
            "fail": fail["code"],
            "fail_on_handle": int(fail["on_handle"]),
            "nvlinks": g["nvlinks"],
        }
        if g["nvlink_peer"] is not None:
            fields["nvlink_peer"] = topo["gpus"][g["nvlink_peer"]]["pci_bus_id"]
        if fail["only"]:
            fields["fail_only"] = ",".join(fail["only"])
        lines.append(_record("gpu", fields, g["name"]))
    for g in topo["gpus"]:
        for m in g["mig_devices"]:
            fields = {
                "parent": g["index"],
                "slot": m["slot"],
                "uuid": m["uuid"],
                "gi": m["gi"],
                "ci": m["ci"],
                "gi_slices": m["gi_slices"],
                "ci_slices": m["ci_slices"],
                "mem_total": m["memory_mib"] * mib,
                "sm": m["sm_count"],
                "ce": m["copy_engines"],
                "dec": m["decoders"],
                "enc": m["encoders"],
                "jpg": m["jpegs"],
                "ofa": m["ofas"],
            }
            lines.append(_record("mig", fields, m["name"]))
    return "\n".join(lines) + "\n"


def _record(kind: str, fields: dict[str, Any], name: str) -> str:
    body = " ".join(f"{k}={v}" for k, v in fields.items())
    return f"{kind} {body} name={name}"


def _fake_uuid(prefix: str, *seed: object) -> str:
    h = hashlib.sha256(repr(seed).encode()).hexdigest()
    return f"{prefix}-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def generate_topology(gpus: int, mig: bool, driver_version: str = "550.90.12") -> dict[str, Any]:
    """A raw topology of ``gpus`` H100s for benchmarks; with ``mig`` each has 4 MIG devices.

    UUIDs and PCI addresses are deterministic, half the GPUs sit on each NUMA node.
    """
    if not 1 <= gpus <= 254:
        raise NvshimError(f"generate_topology: gpus={gpus} outside 1..254")
    layout = [("3g.40gb", 2), ("2g.20gb", 3), ("1g.10gb", 9), ("1g.10gb", 10)]
    out_gpus = []
    for i in range(gpus):
        gpu: dict[str, Any] = {
            "index": i,
            "minor": i,
            "uuid": _fake_uuid("GPU", driver_version, i),
            "name": "NVIDIA H100 80GB HBM3",
            "pci_bus_id": f"{i // 32:08X}:{0x18 + (i % 32) * 7:02X}:00.0",
            "pci_device_id": 0x233010DE,
            "pci_subsystem_id": 0x16C110DE,
            "memory_mib": 81559,
            "compute_capability": "9.0",
            "architecture": "hopper",
            "brand": "nvidia",
            "sm_count": 132,
            "mig_mode": "enabled" if mig else "disabled",
            "numa_node": 0 if i < (gpus + 1) // 2 else 1,
        }
        if mig:
            gpu["mig_devices"] = [
                {"gi": gi, "ci": 0, "profile": p, "uuid": _fake_uuid("MIG", driver_version, i, gi)}
                for p, gi in layout
            ]
        out_gpus.append(gpu)
    return {
        "name": f"generated-{gpus}{'-mig' if mig else ''}",
        "driver_version": driver_version,
        "cuda_driver_version": 12040,
        "gpus": out_gpus,
    }
