"""The dev root of a simulated host: char device nodes, ``/proc`` and ``/sys`` files.

Device numbers follow the real driver: ``/dev/nvidia<minor>`` is 195:minor, nvidiactl
195:255, nvidia-modeset 195:254, nvidia-uvm and -uvm-tools a dynamic major (minors 0 and 1),
``/dev/nvidia-caps/nvidia-cap<N>`` the dynamic nvidia-caps major. MIG capability minors
follow the driver's fixed table (``mig_minor``): config 1, monitor 2, then per GPU minor
15 GPU instances x (1 access + 8 compute-instance access) minors.
"""

from __future__ import annotations

import os
import stat
from typing import Any

from nvshim.errors import NvshimError
from nvshim.host.model import NodeInfo

FRONTEND_MAJOR = 195
CTL_MINOR = 255
MODESET_MINOR = 254
GIS_PER_GPU = 15
CIS_PER_GI = 8
MIN_MINORS_TABLE_GPUS = 32  # the driver always lists gpu0..gpu31


def mig_minor(gpu_minor: int, gi: int, ci: int | None = None) -> int:
    """The nvidia-caps minor of ``gpu<gpu_minor>/gi<gi>/access`` (or ``.../ci<ci>/access``)."""
    base = 3 + gpu_minor * GIS_PER_GPU * (1 + CIS_PER_GI) + gi * (1 + CIS_PER_GI)
    return base if ci is None else base + 1 + ci


def expected_nodes(topo: dict[str, Any], dev_root: str) -> list[NodeInfo]:
    """Every device node a host with this topology has, in creation order."""
    root = dev_root.rstrip("/")
    uvm, caps = topo["majors"]["uvm"], topo["majors"]["caps"]

    def node(path: str, major: int, minor: int, mode: int = 0o666) -> NodeInfo:
        return NodeInfo(path=path, host_path=root + path, major=major, minor=minor, mode=mode)

    nodes = [node(f"/dev/nvidia{g['minor']}", FRONTEND_MAJOR, g["minor"]) for g in topo["gpus"]]
    nodes += [
        node("/dev/nvidiactl", FRONTEND_MAJOR, CTL_MINOR),
        node("/dev/nvidia-modeset", FRONTEND_MAJOR, MODESET_MINOR),
        node("/dev/nvidia-uvm", uvm, 0),
        node("/dev/nvidia-uvm-tools", uvm, 1),
        node("/dev/nvidia-caps/nvidia-cap1", caps, 1, 0o400),
        node("/dev/nvidia-caps/nvidia-cap2", caps, 2, 0o444),
    ]
    seen: set[int] = set()
    for g in topo["gpus"]:
        for m in g["mig_devices"]:
            for minor in (mig_minor(g["minor"], m["gi"]), mig_minor(g["minor"], m["gi"], m["ci"])):
                if minor not in seen:
                    seen.add(minor)
                    nodes.append(node(f"/dev/nvidia-caps/nvidia-cap{minor}", caps, minor, 0o444))
    return nodes


def make_nodes(topo: dict[str, Any], dev_root: str) -> list[NodeInfo]:
    """Create the char devices with ``mknod`` (needs root); return them."""
    nodes = expected_nodes(topo, dev_root)
    os.makedirs(os.path.join(dev_root, "dev", "nvidia-caps"), mode=0o755, exist_ok=True)
    for n in nodes:
        if os.path.lexists(n.host_path):
            os.unlink(n.host_path)
        try:
            os.mknod(n.host_path, stat.S_IFCHR | n.mode, os.makedev(n.major, n.minor))
        except PermissionError:
            raise NvshimError(f"{n.host_path}: mknod needs root (CAP_MKNOD)") from None
        os.chmod(n.host_path, n.mode)
    return nodes


def _write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="ascii") as fh:
        fh.write(text)


def proc_devices(topo: dict[str, Any]) -> str:
    """``/proc/devices`` of a host with the NVIDIA driver loaded."""
    chars = [
        (1, "mem"),
        (4, "/dev/vc/0"),
        (4, "tty"),
        (4, "ttyS"),
        (5, "/dev/tty"),
        (5, "/dev/console"),
        (5, "/dev/ptmx"),
        (7, "vcs"),
        (10, "misc"),
        (13, "input"),
        (29, "fb"),
        (128, "ptm"),
        (136, "pts"),
        (180, "usb"),
        (189, "usb_device"),
        (FRONTEND_MAJOR, topo["frontend_name"]),
        (202, "cpu/msr"),
        (203, "cpu/cpuid"),
        (226, "drm"),
        (243, "hidraw"),
        (244, "ttyDBC"),
        (245, "aux"),
        (246, "bsg"),
        (247, "watchdog"),
        (248, "ptp"),
        (249, "pps"),
        (250, "rtc"),
        (251, "dma_heap"),
        (252, "dax"),
        (253, "tpm"),
        (254, "gpiochip"),
        (topo["majors"]["uvm"], "nvidia-uvm"),
        (topo["majors"]["caps"], "nvidia-caps"),
        (topo["majors"].get("nvswitch", 509), "nvidia-nvswitch"),  # listed with no switch
    ]
    blocks = [(7, "loop"), (8, "sd"), (9, "md"), (253, "device-mapper"), (259, "blkext")]
    lines = ["Character devices:"]
    lines += [f"{major:3d} {name}" for major, name in sorted(chars, key=lambda c: c[0])]
    lines += ["", "Block devices:"]
    lines += [f"{major:3d} {name}" for major, name in blocks]
    return "\n".join(lines) + "\n"


def mig_minors_table(topo: dict[str, Any]) -> str:
    """``/proc/driver/nvidia-caps/mig-minors``: every capability minor of every GPU slot."""
    slots = max([MIN_MINORS_TABLE_GPUS] + [g["minor"] + 1 for g in topo["gpus"]])
    lines = ["config 1", "monitor 2"]
    for gpu in range(slots):
        for gi in range(GIS_PER_GPU):
            lines.append(f"gpu{gpu}/gi{gi}/access {mig_minor(gpu, gi)}")
            lines += [
                f"gpu{gpu}/gi{gi}/ci{ci}/access {mig_minor(gpu, gi, ci)}"
                for ci in range(CIS_PER_GI)
            ]
    return "\n".join(lines) + "\n"


PARAMS = """ResmanDebugLevel: 4294967295
RmLogonRC: 1
ModifyDeviceFiles: 1
DeviceFileUID: 0
DeviceFileGID: 0
DeviceFileMode: 438
InitializeSystemMemoryAllocations: 1
UsePageAttributeTable: 4294967295
EnableMSI: 1
EnablePCIeGen3: 0
MemoryPoolSize: 0
KMallocHeapMaxSize: 0
VMallocHeapMaxSize: 0
IgnoreMMIOCheck: 0
TCEBypassMode: 0
EnableStreamMemOPs: 0
EnableUserNUMAManagement: 1
NvLinkDisable: 0
RmProfilingAdminOnly: 1
PreserveVideoMemoryAllocations: 0
EnableS0ixPowerManagement: 0
S0ixPowerManagementVideoMemoryThreshold: 256
DynamicPowerManagement: 3
DynamicPowerManagementVideoMemoryThreshold: 200
RegisterPCIDriver: 1
EnablePCIERelaxedOrderingMode: 0
EnableResizableBar: 0
EnableGpuFirmware: 18
EnableGpuFirmwareLogs: 2
RmNvlinkBandwidthLinkCount: 0
EnableDbgBreakpoint: 0
OpenRmEnableUnsupportedGpus: 1
DmaRemapPeerMmio: 1
ImexChannelCount: 2048
CreateImexChannel0: 0
GrdmaPciTopoCheckOverride: 0
RegistryDwords: ""
RegistryDwordsPerDevice: ""
RmMsg: ""
GpuBlacklist: ""
TemporaryFilePath: ""
ExcludedGpus: ""
"""


def _capability(minor: int, mode: int) -> str:
    return f"DeviceFileMinor: {minor}\nDeviceFileMode: {mode}\nDeviceFileModify: 1\n"


def write_proc_sys(topo: dict[str, Any], dev_root: str) -> None:
    """Write the ``proc`` and ``sys`` files discovery reads (relative to the dev root)."""
    proc = os.path.join(dev_root, "proc")
    version = topo["driver_version"]
    _write(f"{proc}/devices", proc_devices(topo))
    _write(f"{proc}/driver/nvidia/params", PARAMS)
    _write(
        f"{proc}/driver/nvidia/version",
        f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {version}  "
        "Fri May 31 09:35:42 UTC 2024\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n",
    )
    _write(f"{proc}/driver/nvidia-caps/mig-minors", mig_minors_table(topo))
    caps = f"{proc}/driver/nvidia/capabilities"
    _write(f"{caps}/mig/config", _capability(1, 0o400))
    _write(f"{caps}/mig/monitor", _capability(2, 0o444))
    for g in topo["gpus"]:
        _write(
            f"{proc}/driver/nvidia/gpus/{g['pci_bdf']}/information",
            f"Model: \t\t {g['name']}\n"
            f"IRQ:   \t\t {120 + g['index']}\n"
            f"GPU UUID: \t {g['uuid']}\n"
            "Video BIOS: \t 96.00.99.00.01\n"
            "Bus Type: \t PCIe\n"
            "DMA Size: \t 52 bits\n"
            "DMA Mask: \t 0xfffffffffffff\n"
            f"Bus Location: \t {g['pci_bdf']}\n"
            f"Device Minor: \t {g['minor']}\n"
            "GPU Excluded:\t No\n",
        )
        for m in g["mig_devices"]:
            gi_dir = f"{caps}/gpu{g['minor']}/mig/gi{m['gi']}"
            _write(f"{gi_dir}/access", _capability(mig_minor(g["minor"], m["gi"]), 0o444))
            ci_minor = mig_minor(g["minor"], m["gi"], m["ci"])
            _write(f"{gi_dir}/ci{m['ci']}/access", _capability(ci_minor, 0o444))
        if g["numa_node"] is not None:
            _write(
                os.path.join(dev_root, "sys/bus/pci/devices", g["pci_bdf"], "numa_node"),
                f"{g['numa_node']}\n",
            )
