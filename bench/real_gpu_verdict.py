"""The kit's verdicts on what a container or the host saw: the probe's JSON line, the
device nodes it saw, the devices CUDA enumerated; ``Failed`` carries a difference."""

from __future__ import annotations

import json
from typing import Any

from bench.real_gpu_host import Unit, uuid_hex


class Failed(Exception):
    """A check that ran and found a difference (the message is the detail)."""


def none_of(problems: list[str]) -> None:
    """Fail the check with every problem found, if any."""
    if problems:
        raise Failed("; ".join(problems))


def probe_line(stdout: str) -> dict[str, Any] | None:
    """The probe's JSON line in a container's output (None if there is none)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith('{"probe":"nvshim-cuda-probe"'):
            return json.loads(line)
    return None


def probe_error(probe: dict[str, Any]) -> str:
    extra = probe.get("detail") or probe.get("init_name") or probe.get("stage")
    return f"{probe['error']} ({extra})" if extra else probe["error"]


def gpu_nodes(probe: dict[str, Any]) -> set[str]:
    return {
        d
        for d in probe["dev"]
        if d.startswith("nvidia-caps/") or (d.startswith("nvidia") and d[6:].isdigit())
    }


def nodes_match(probe: dict[str, Any], expected: list[Unit]) -> str:
    want = set().union(*(u.nodes for u in expected)) if expected else set()
    got = gpu_nodes(probe)
    if got != want:
        raise Failed(f"saw {sorted(got)}, expected {sorted(want)}")
    if expected and "nvidiactl" not in probe["dev"]:
        raise Failed("no /dev/nvidiactl")
    gpus = sorted(n for n in got if "/" not in n)
    caps = len(got) - len(gpus)
    seen = ", ".join(gpus) + (f" and {caps} MIG cap node(s)" if caps else "") or "no GPU node"
    return f"{seen}; CUDA_VISIBLE_DEVICES={probe.get('cuda_visible_devices')}"


def cuda_match(probe: dict[str, Any], expected: list[Unit]) -> str:
    devices = probe.get("devices", [])
    if not expected:
        if devices:
            raise Failed(f"CUDA sees {[d['uuid'] for d in devices]}, expected none")
        return f"no device ({probe_error(probe)})"
    if not probe["ok"] and not devices:
        raise Failed(f"CUDA sees nothing: {probe_error(probe)}")
    bad = [
        f"{d['uuid']} ctx {d['ctx_name']} alloc {d['alloc_name']}" for d in devices if not d["ok"]
    ]
    got = {uuid_hex(d["uuid"]) for d in devices}
    want = {uuid_hex(u.uuid): u.uuid for u in expected}
    # CUDA may enumerate only one MIG device per process: every granted whole GPU and at
    # least one granted MIG device is right (the detail shows how many it saw)
    whole = {uuid_hex(u.uuid) for u in expected if not u.uuid.startswith("MIG-")}
    mig = set(want) - whole
    right = got == set(want) or (bool(mig) and whole <= got <= set(want) and bool(got & mig))
    if bad or not right:
        names = sorted(want.get(h, f"GPU/MIG {h}") for h in got)
        raise Failed(f"CUDA sees {names}, expected {sorted(want.values())}; failing: {bad}")
    summary = ", ".join(f"{d['name']} {d['uuid']}" for d in devices)
    return f"{len(devices)} device(s), context + 1 MiB each: {summary}"
