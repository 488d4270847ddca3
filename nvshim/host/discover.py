"""Build the ``Host`` model from NVML, the driver root and the dev root."""

from __future__ import annotations

import os

from nvshim.errors import NvshimError
from nvshim.host import devices, files, nvml
from nvshim.host.model import Gpu, Host, MigDevice


def discover_host(driver_root: str = "/", dev_root: str = "/") -> Host:
    """Discover the host. Raises NvshimError (one line) on missing roots or NVML failure."""
    driver_root = os.path.abspath(driver_root)
    dev_root = os.path.abspath(dev_root)
    if not os.path.isdir(driver_root):
        raise NvshimError(f"driver root {driver_root}: not a directory")
    devices.check_dev_root(dev_root)
    warnings: list[str] = []
    entries = files.read_ld_cache(driver_root, warnings)
    library = nvml.find_library(driver_root, entries)
    if library is None and driver_root != "/":
        raise NvshimError(f"driver root {driver_root}: no NVML library (libnvidia-ml.so.1) found")
    snap = nvml.query(library)
    warnings += snap.warnings

    majors = devices.read_char_majors(dev_root, warnings)
    caps_major = majors.get("nvidia-caps")
    mig_minors = devices.read_mig_minors(dev_root, warnings) if _any_mig(snap) else None
    gpus = []
    for g in snap.gpus:
        node = devices.stat_node(dev_root, f"/dev/nvidia{g.minor}")
        if node is None:
            warnings.append(f"GPU {g.index}: device node /dev/nvidia{g.minor} missing; GPU skipped")
            continue
        migs = []
        for m in g.migs:
            gi_cap = ci_cap = None
            if mig_minors is not None:
                gi_cap = devices.cap_node(dev_root, caps_major, mig_minors.gi.get((g.minor, m.gi)))
                ci_cap = devices.cap_node(
                    dev_root, caps_major, mig_minors.ci.get((g.minor, m.gi, m.ci))
                )
            if gi_cap is None or ci_cap is None:
                warnings.append(
                    f"MIG {g.index}:{m.index}: capability nodes for gi{m.gi}/ci{m.ci} "
                    "missing; MIG device skipped"
                )
                continue
            migs.append(
                MigDevice(
                    g.index,
                    m.index,
                    m.gi,
                    m.ci,
                    m.uuid,
                    m.profile,
                    m.memory_total,
                    gi_cap,
                    ci_cap,
                    m.multiprocessors,
                    tuple(sorted((m.engines or {}).items())),
                    m.memory_slices,
                )
            )
        numa = devices.numa_node(dev_root, g.pci_bus_id)
        if numa is None or numa < 0:
            warnings.append(
                f"GPU {g.index}: NUMA node unknown (sysfs numa_node "
                f"{'missing' if numa is None else numa}); CUDA frameworks will warn"
            )
        gpus.append(
            Gpu(
                index=g.index,
                minor=g.minor,
                uuid=g.uuid,
                name=g.name,
                pci_bus_id=g.pci_bus_id,
                memory_total=g.memory_total,
                compute_capability=g.compute_capability,
                architecture=g.architecture,
                brand=g.brand,
                mig_enabled=g.mig_enabled,
                numa_node=numa,
                node=node,
                mig_devices=tuple(migs),
            )
        )
    driver_files = (
        files.find_libraries(driver_root, snap.driver_version, entries, warnings)
        + files.find_binaries(driver_root)
        + files.find_firmware(driver_root, snap.driver_version)
        + files.find_configs(driver_root)
        + files.find_sockets(driver_root)
    )
    if not any(f.soname and f.soname.startswith("libcuda.so") for f in driver_files):
        warnings.append(f"driver root {driver_root}: libcuda not found")
    return Host(
        driver_version=snap.driver_version,
        cuda_version=snap.cuda_version,
        driver_root=driver_root,
        dev_root=dev_root,
        gpus=gpus,
        control_nodes=devices.control_nodes(dev_root),
        files=driver_files,
        warnings=warnings,
    )


def _any_mig(snap: nvml.NvmlSnapshot) -> bool:
    return any(g.migs for g in snap.gpus)
