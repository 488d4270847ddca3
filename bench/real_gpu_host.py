"""What the real-GPU kit knows about the host: nvidia-smi's view, nvshim's host model as
CUDA-visible units, and snapshots of what must not change (MIG layout, compute and
persistence modes, nvshim's host paths)."""

from __future__ import annotations

import csv
import io
import os
import re
import subprocess
from dataclasses import dataclass, field
from typing import Any

SMI_FIELDS = (
    "index", "uuid", "name", "memory.total", "pci.bus_id", "mig.mode.current", "driver_version",
)  # fmt: skip
SMI_MODES = ("uuid", "compute_mode", "persistence_mode", "mig.mode.current")
# Host paths for nvshim's config and CDI specs: the kit uses its own config and spec dir.
# (nvshim-runtime's own caches in /run/nvshim are written by design, and the machine's
# other nvshim users may write them and /var/log/nvshim.log meanwhile: not compared.)
HOST_PATHS = ("/etc/cdi", "/var/run/cdi", "/etc/nvshim")
_MIG_LINE = re.compile(r"^\s+MIG\s+(\S+)\s+Device\s+(\d+):\s+\(UUID:\s+(\S+)\)")
_GPU_LINE = re.compile(r"^GPU\s+(\d+):\s+(.*?)\s+\(UUID:\s+(\S+)\)")


def uuid_hex(uuid: str) -> str:
    """The 32 hex digits of a ``GPU-``/``MIG-`` UUID (the CUDA probe prints ``GPU-`` for all)."""
    body = uuid.split("-", 1)[1] if uuid[:4] in ("GPU-", "MIG-") else uuid
    return body.replace("-", "").lower()


def smi(binary: str, *args: str) -> str:
    """stdout of ``nvidia-smi ARGS``; RuntimeError with its message on failure."""
    proc = subprocess.run([binary, *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        text = " ".join((proc.stdout + proc.stderr).split())[:300]
        raise RuntimeError(f"{binary} {' '.join(args)}: exit {proc.returncode}: {text}")
    return proc.stdout


def smi_query(binary: str, fields: tuple[str, ...]) -> list[dict[str, str]]:
    """``nvidia-smi --query-gpu=FIELDS --format=csv,noheader,nounits`` as dicts."""
    out = smi(binary, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits")
    rows = [[c.strip() for c in row] for row in csv.reader(io.StringIO(out)) if row]
    if any(len(row) != len(fields) for row in rows):
        raise RuntimeError(f"{binary} --query-gpu: unexpected output {out[:200]!r}")
    return [dict(zip(fields, row, strict=True)) for row in rows]


def smi_list(binary: str) -> dict[str, list[tuple[str, str]]]:
    """``nvidia-smi -L``: GPU UUID -> [(MIG profile, MIG UUID), ...]."""
    out: dict[str, list[tuple[str, str]]] = {}
    current = None
    for line in smi(binary, "-L").splitlines():
        if m := _GPU_LINE.match(line):
            current = m.group(3)
            out[current] = []
        elif (m := _MIG_LINE.match(line)) and current:
            out[current].append((m.group(1), m.group(3)))
    return out


@dataclass
class Unit:
    """One device CUDA enumerates: a GPU without MIG, or a MIG device."""

    name: str  # the index form: "3" or "6:0"
    uuid: str
    nodes: set[str] = field(default_factory=set)  # nvidiaN and nvidia-caps/nvidia-capN


def units(info: dict[str, Any]) -> list[Unit]:
    """The CUDA-visible units of ``nvshim info --json``, GPUs by index, MIG devices by slot."""
    out = []
    for gpu in info["gpus"]:
        parent = {os.path.basename(gpu["node"]["path"])} if gpu.get("node") else set()
        if not gpu["mig_enabled"]:
            out.append(Unit(str(gpu["index"]), gpu["uuid"], parent))
        for mig in gpu["mig_devices"]:
            caps = {
                "nvidia-caps/" + os.path.basename(mig[k]["path"])
                for k in ("gi_cap", "ci_cap")
                if mig.get(k)
            }
            out.append(Unit(f"{gpu['index']}:{mig['index']}", mig["uuid"], parent | caps))
    return out


def nvml_state(driver_root: str, dev_root: str) -> dict[str, Any]:
    """Per GPU, freshly discovered: MIG mode and devices, compute and persistence mode."""
    from nvshim.host.discover import discover_host
    from nvshim.mps.compute import get_compute_mode, nvml_session

    out: dict[str, Any] = {}
    host = discover_host(driver_root, dev_root)
    with nvml_session(host) as pynvml:
        for gpu in host.gpus:
            handle = pynvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
            try:
                persistence: object = int(pynvml.nvmlDeviceGetPersistenceMode(handle))
            except pynvml.NVMLError as err:
                persistence = f"n/a ({err})"
            out[gpu.uuid] = {
                "mig_enabled": gpu.mig_enabled,
                "mig_devices": sorted(m.uuid for m in gpu.mig_devices),
                "compute_mode": get_compute_mode(pynvml, gpu.uuid),
                "persistence_mode": persistence,
            }
    return out


def _path_state(path: str) -> object:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if os.path.isdir(path) and not os.path.islink(path):
        return {name: _path_state(os.path.join(path, name)) for name in sorted(os.listdir(path))}
    return (st.st_mode, st.st_size, st.st_mtime_ns)


def snapshot(driver_root: str, dev_root: str, nvidia_smi: str | None) -> dict[str, Any]:
    """What the kit must leave as it found it: each GPU's MIG mode and devices, compute
    and persistence mode (NVML), nvidia-smi's modes and ``-L`` when there is one, and
    nvshim's config and CDI paths on the host."""
    state: dict[str, Any] = {"host_paths": {p: _path_state(p) for p in HOST_PATHS}}
    try:
        state["gpus"] = nvml_state(driver_root, dev_root)
    except Exception as err:  # noqa: BLE001 - recorded, compared like any value
        state["gpus"] = f"unreadable: {err}"
    if nvidia_smi:
        try:
            state["smi_modes"] = smi_query(nvidia_smi, SMI_MODES)
            state["smi_list"] = smi_list(nvidia_smi)
        except (OSError, RuntimeError) as err:
            state["smi_modes"] = f"unreadable: {err}"
    return state


def differences(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """Readable differences between two snapshots (empty: nothing changed)."""
    out = []
    for key in sorted(set(before) | set(after)):
        if before.get(key) != after.get(key):
            out.append(f"{key}: before {before.get(key)!r}, after {after.get(key)!r}")
    return out
