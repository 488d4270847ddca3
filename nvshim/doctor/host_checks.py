"""Checks of the driver and the node: NVML, CUDA level, device nodes, persistence mode,
NUMA affinity, pending MIG changes, the fabric manager, and the cgroup version."""

from __future__ import annotations

import glob
import os
import stat

from nvshim.doctor import Skip, check, fail, ok, warn
from nvshim.doctor.context import NEEDS_DRIVER, Context
from nvshim.errors import NvshimError

FRONTEND_MAJOR = 195
CTL_MINOR = 255
FABRIC_MANAGER = "nv-fabricmanager"


def _snapshot(ctx: Context):
    try:
        return ctx.snapshot()
    except NvshimError:
        raise Skip(NEEDS_DRIVER) from None


def _listing(items: list[str], most: int = 3) -> str:
    more = f" (+{len(items) - most} more)" if len(items) > most else ""
    return "; ".join(items[:most]) + more


@check("driver", "the driver is loaded and NVML answers")
def driver(ctx: Context):
    try:
        snap = ctx.snapshot()
    except NvshimError as err:
        return fail(
            "driver",
            str(err),
            "load the NVIDIA kernel module (modprobe nvidia) or set [host] driver-root"
            " to the driver's tree (/run/nvidia/driver under the GPU Operator)",
        )
    gpus = len(snap.gpus)
    if snap.warnings:
        return warn("driver", _listing(snap.warnings), "check the GPUs NVML reports errors for")
    if ctx.ld_warnings:
        return warn(
            "driver",
            _listing(ctx.ld_warnings),
            f"run ldconfig -r {ctx.driver_root} so libraries are found as the loader finds them",
        )
    if not gpus:
        return fail("driver", f"driver {snap.driver_version}: NVML sees no GPU", "check dmesg")
    return ok("driver", f"driver {snap.driver_version}, {gpus} GPU(s) through NVML")


@check("cuda-version", "the driver against the CUDA toolkit table")
def cuda_version(ctx: Context):
    from nvshim.policy.cuda_table import MINOR_COMPAT, compare_versions, newest_cuda_for_driver

    snap = _snapshot(ctx)
    try:
        newest = newest_cuda_for_driver(snap.driver_version)
    except ValueError:
        return warn(
            "cuda-version",
            f"driver version {snap.driver_version!r} is not dotted numeric",
            "check the driver installation",
        )
    oldest_floor = min(MINOR_COMPAT.values(), key=int)
    if not newest or compare_versions(snap.driver_version, oldest_floor) < 0:
        return fail(
            "cuda-version",
            f"driver {snap.driver_version} predates CUDA 11 (needs >= {oldest_floor})",
            "upgrade the driver",
        )
    reported = snap.cuda_version
    if compare_versions(reported, newest) > 0:
        return warn(
            "cuda-version",
            f"NVML reports CUDA {reported} but driver {snap.driver_version} is only known to"
            f" support {newest}",
            "check that the user-space libraries match the kernel module",
        )
    return ok("cuda-version", f"driver {snap.driver_version} runs CUDA up to {newest}")


def _node_problem(ctx: Context, path: str, major: int | None, minor: int) -> str | None:
    """Why the char device ``path`` is not ``major:minor`` (None: it is)."""
    try:
        st = os.stat(ctx.path(path))
    except FileNotFoundError:
        return f"{path} missing"
    except OSError as err:
        return f"{path}: {err.strerror}"
    if not stat.S_ISCHR(st.st_mode):
        return f"{path} is not a char device"
    found = (os.major(st.st_rdev), os.minor(st.st_rdev))
    if major is not None and found != (major, minor):
        return f"{path} is {found[0]}:{found[1]}, expected {major}:{minor}"
    return None


def _proc_majors(ctx: Context) -> dict[str, int]:
    from nvshim.host.devices import read_char_majors

    problems: list[str] = []
    majors = read_char_majors(ctx.dev_root, problems)
    if problems:
        raise NvshimError(problems[0])
    return majors


@check("device-nodes", "device nodes match /proc/devices and NVML (uvm and MIG caps too)")
def device_nodes(ctx: Context):
    from nvshim.host.devices import read_mig_minors

    snap = _snapshot(ctx)
    majors = _proc_majors(ctx)
    uvm, caps = majors.get("nvidia-uvm"), majors.get("nvidia-caps")
    problems: list[str] = []
    expected: list[tuple[str, int | None, int]] = [
        (f"/dev/nvidia{g.minor}", FRONTEND_MAJOR, g.minor) for g in snap.gpus
    ]
    expected.append(("/dev/nvidiactl", FRONTEND_MAJOR, CTL_MINOR))
    if uvm is None:
        problems.append("nvidia-uvm is not in /proc/devices (module not loaded)")
    else:
        expected.append(("/dev/nvidia-uvm", uvm, 0))
    if any(g.migs for g in snap.gpus):
        if caps is None:
            problems.append("nvidia-caps is not in /proc/devices")
        minors_problems: list[str] = []
        minors = read_mig_minors(ctx.dev_root, minors_problems)
        problems += minors_problems
        for g in snap.gpus:
            for m in g.migs:
                for key, table in (
                    ((g.minor, m.gi), minors.gi),
                    ((g.minor, m.gi, m.ci), minors.ci),
                ):
                    minor = table.get(key)
                    if minor is None:
                        problems.append(f"MIG {g.index}:{m.index}: no mig-minors entry for {key}")
                    else:
                        expected.append((f"/dev/nvidia-caps/nvidia-cap{minor}", caps, minor))
    problems += [p for p in (_node_problem(ctx, *e) for e in dict.fromkeys(expected)) if p]
    fix = (
        "run `nvshim system create-device-nodes` (or nvidia-modprobe -u -c N), or"
        " `nvidia-smi` once as root; then `nvshim cdi generate` again"
    )
    if problems:
        return fail("device-nodes", _listing(problems), fix)
    tools = _node_problem(ctx, "/dev/nvidia-uvm-tools", uvm, 1)
    if tools:
        return warn("device-nodes", tools + " (profilers need it)", fix)
    return ok("device-nodes", f"{len(set(expected))} nodes match NVML and /proc/devices")


def _per_gpu(ctx: Context, query) -> list[tuple[object, object]]:
    """``(gpu, query(pynvml, handle))`` for every NVML GPU; NotSupported gives None;
    a missing NVML function raises Skip."""
    snap = _snapshot(ctx)
    out = []
    with ctx.nvml_session() as nvml:
        for g in snap.gpus:
            try:
                out.append((g, query(nvml, nvml.nvmlDeviceGetHandleByUUID(g.uuid))))
            except nvml.NVMLError_FunctionNotFound:
                raise Skip("this driver's NVML cannot tell") from None
            except nvml.NVMLError_NotSupported:
                out.append((g, None))
    return out


@check("persistence-mode", "persistence mode is on (no driver reload per container start)")
def persistence_mode(ctx: Context):
    values = _per_gpu(ctx, lambda nvml, h: nvml.nvmlDeviceGetPersistenceMode(h))
    off = [str(g.index) for g, mode in values if mode == 0]
    if off:
        return warn(
            "persistence-mode",
            f"off on GPU {', '.join(off)}: each first client pays the driver's start-up",
            "enable nvidia-persistenced (systemctl enable --now nvidia-persistenced)",
        )
    return ok("persistence-mode", f"on for {len(values)} GPU(s)")


@check("numa-node", "each GPU's NUMA node is known (sysfs numa_node)")
def numa_node(ctx: Context):
    from nvshim.host.devices import numa_node as read_numa

    snap = _snapshot(ctx)
    bad = []
    for g in snap.gpus:
        node = read_numa(ctx.dev_root, g.pci_bus_id)
        if node is None or node < 0:
            bad.append(
                f"GPU {g.index} ({g.pci_bus_id}) numa_node {'missing' if node is None else node}"
            )
    if bad:
        return warn(
            "numa-node",
            _listing(bad),
            "the firmware gives no NUMA affinity (no ACPI _PXM; common on VMs): on VMware set"
            ' chipset.motherboardLayout = "acpi"; CUDA frameworks warn until then',
        )
    return ok("numa-node", f"known for {len(snap.gpus)} GPU(s)")


@check("mig-pending", "no MIG mode change waits for a GPU reset")
def mig_pending(ctx: Context):
    values = _per_gpu(ctx, lambda nvml, h: tuple(nvml.nvmlDeviceGetMigMode(h)))
    pending = [
        f"GPU {g.index}: MIG {'on' if cur else 'off'} now, {'on' if new else 'off'} after reset"
        for g, modes in values
        if modes is not None
        for cur, new in [modes]
        if cur != new
    ]
    if pending:
        return warn(
            "mig-pending",
            _listing(pending),
            "drain the node, then reset the GPU (nvidia-smi -r -i N) or reboot;"
            " then `nvshim cdi generate` again",
        )
    capable = sum(1 for _g, m in values if m is not None)
    return ok("mig-pending", f"no change pending ({capable} MIG-capable GPU(s))")


def _has_nvswitch(ctx: Context) -> bool:
    """An NVSwitch is attached: the nvswitch driver lists one under /proc/driver, or its
    node exists. The driver's ``nvidia-nvswitch`` major in /proc/devices and the
    ``nvidia-nvswitchctl`` node are there without any switch (a one-GPU H100 VM has them)."""
    listed = ctx.path("/proc/driver/nvidia-nvswitch/devices")
    try:
        if os.listdir(listed):
            return True
    except OSError:
        pass
    return bool(glob.glob(ctx.path("/dev/nvidia-nvswitch[0-9]*")))


def _running(ctx: Context, comm: str) -> list[int]:
    """PIDs under the dev root's /proc whose command name is ``comm``."""
    pids = []
    for entry in glob.glob(ctx.path("/proc/[0-9]*/comm")):
        try:
            with open(entry, encoding="utf-8", errors="replace") as fh:
                if fh.read().strip() == comm:
                    pids.append(int(entry.split("/")[-2]))
        except (OSError, ValueError):
            continue
    return pids


@check("fabric-manager", "NVSwitch systems run the fabric manager")
def fabric_manager(ctx: Context):
    if not _has_nvswitch(ctx):
        raise Skip("no NVSwitch on this node")
    pids = _running(ctx, FABRIC_MANAGER)
    if not pids:
        return fail(
            "fabric-manager",
            "NVSwitch present but nv-fabricmanager is not running: CUDA fails to initialise",
            "systemctl enable --now nvidia-fabricmanager (the same version as the driver)",
        )
    return ok("fabric-manager", f"nv-fabricmanager running (pid {pids[0]})")


def cgroup_version(ctx: Context) -> str:
    """``v2`` (unified, devices by eBPF) or ``v1`` (a v1 devices controller: legacy or
    hybrid), from the dev root's /sys/fs/cgroup (the real one when the dev root has none)."""
    base = ctx.path("/sys/fs/cgroup")
    if not os.path.isdir(base):
        base = "/sys/fs/cgroup"
    if os.path.isdir(os.path.join(base, "devices")):
        return "v1"
    if os.path.exists(os.path.join(base, "cgroup.controllers")):
        return "v2"
    raise Skip(f"{base}: cgroup layout not recognised")


@check("cgroup", "the cgroup version suits the configured mode")
def cgroup(ctx: Context):
    from nvshim.doctor.engine_checks import hook_files

    version = cgroup_version(ctx)
    if hook_files(ctx) and version == "v2":
        return fail(
            "cgroup",
            "prestart mode on cgroup v2: the hook cannot add device rules",
            "use nvshim-runtime (nvshim configure) or CDI instead of the prestart hook",
        )
    mode = "prestart hook" if hook_files(ctx) else "runtime/CDI"
    return ok("cgroup", f"cgroup {version} with {mode} mode")
