"""Build a simulated GPU host: a driver root and a dev root that discovery reads as real.

``build_host("h100x8-mig", dest)`` lays out, under ``dest``: driver libraries (real ELF
stubs with SONAMEs, and the compiled fake NVML as ``libnvidia-ml.so.<version>`` with its
``fake-nvml.topology``), ``etc/ld.so.cache`` made by the real ``ldconfig -r``, driver
binaries, GSP firmware, graphics configs, IPC sockets, and under the dev root (``dest``
unless given) char device nodes, ``proc`` and ``sys`` files. Needs root (mknod, ldconfig -r).

CLI: ``python3 -m tests.sim.simhost build NAME DEST [--dev-root DIR]`` prints the driver root.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

from nvshim.errors import NvshimError
from nvshim.host.model import NodeInfo

from . import compile as simcompile
from . import devfs, driverfiles, pcifs
from .driverfiles import LIB_DIR, SimLibrary
from .topology import generate_topology, load_topology, render_fake_nvml, shipped_hosts

__all__ = [
    "SimHost",
    "build_host",
    "generate_topology",
    "load_topology",
    "prebuild",
    "shipped_hosts",
]


@dataclass
class SimHost:
    """A built simulated host. Paths without a root prefix are container paths."""

    root: str
    driver_root: str
    dev_root: str
    topology: dict[str, Any]
    driver_version: str
    nvml_path: str  # host path of the fake libnvidia-ml.so.<version>
    lib_dir: str = LIB_DIR
    libraries: list[SimLibrary] = field(default_factory=list)

    @property
    def topology_path(self) -> str:
        """Host path of the fake NVML's topology file."""
        return os.path.join(os.path.dirname(self.nvml_path), "fake-nvml.topology")

    @property
    def state_path(self) -> str:
        """Host path of the file where the fake NVML persists compute modes."""
        return self.topology_path + ".state"

    def gpu_uuids(self) -> list[str]:
        """GPU UUIDs in NVML index order."""
        return [g["uuid"] for g in self.topology["gpus"]]

    def mig_uuids(self) -> list[str]:
        """MIG device UUIDs, by parent index then slot."""
        return [
            m["uuid"]
            for g in self.topology["gpus"]
            for m in sorted(g["mig_devices"], key=lambda m: m["slot"])
        ]

    def gpu(self, index: int) -> dict[str, Any]:
        """The normalized topology entry of GPU ``index``."""
        return self.topology["gpus"][index]

    def expected_nodes(self) -> list[NodeInfo]:
        """Every device node of the host (container path, host path, numbers, mode)."""
        return devfs.expected_nodes(self.topology, self.dev_root)

    def mig_minor(self, gpu_minor: int, gi: int, ci: int | None = None) -> int:
        """The nvidia-caps minor of a GI access (or CI access) capability."""
        return devfs.mig_minor(gpu_minor, gi, ci)

    def mig_cap_names(self, uuid: str) -> list[str]:
        """The /dev/nvidia-caps node names of MIG device ``uuid``: GI access, CI access."""
        for g in self.topology["gpus"]:
            for m in g["mig_devices"]:
                if m["uuid"] == uuid:
                    return [
                        f"nvidia-cap{self.mig_minor(g['minor'], m['gi'])}",
                        f"nvidia-cap{self.mig_minor(g['minor'], m['gi'], m['ci'])}",
                    ]
        raise KeyError(f"no MIG device {uuid} on this simulated host")

    def nvml_env(self) -> dict[str, str]:
        """Environment additions that make ``CDLL("libnvidia-ml.so.1")`` load the fake."""
        return {"LD_LIBRARY_PATH": self.driver_root.rstrip("/") + self.lib_dir}

    def host_path(self, path: str) -> str:
        """Host path of a driver-root container path such as ``/usr/bin/nvidia-smi``."""
        return self.driver_root.rstrip("/") + path


def _ldconfig() -> str:
    for candidate in (shutil.which("ldconfig"), "/usr/sbin/ldconfig", "/sbin/ldconfig"):
        if candidate and os.path.exists(candidate):
            return candidate
    raise NvshimError("simulated host: ldconfig not found")


def run_ldconfig(driver_root: str) -> None:
    """Make ``etc/ld.so.cache`` and the SONAME links with the real ``ldconfig -r``."""
    os.makedirs(os.path.join(driver_root, "var/cache/ldconfig"), exist_ok=True)
    # -i: ldconfig's aux cache (keyed by inode, size and ctime seconds) would hand a new
    # same-sized stub that reuses a just-freed inode the old file's SONAME
    proc = subprocess.run(
        [_ldconfig(), "-i", "-r", driver_root], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        msg = " ".join(proc.stderr.split())
        raise NvshimError(f"ldconfig -r {driver_root} failed: {msg}")


def build_host(
    topology: str | dict,
    dest: str,
    dev_root: str | None = None,
    extra_files: dict[str, bytes | str] | None = None,
) -> SimHost:
    """Build a simulated host from ``topology`` (shipped name, YAML path or dict) in ``dest``.

    The driver root is ``dest``; the dev root is ``dev_root`` or ``dest``. ``extra_files``
    maps driver-root-relative paths to contents (``usr/bin/*`` get mode 0755) and is
    written last, so it can replace a default file such as ``usr/bin/nvidia-cuda-mps-control``.
    """
    if os.geteuid() != 0:
        raise NvshimError("build_host: needs root (mknod, ldconfig -r)")
    topo = load_topology(topology)
    driver_root = os.path.abspath(dest)
    dev_root = os.path.abspath(dev_root or dest)
    os.makedirs(driver_root, exist_ok=True)
    os.makedirs(dev_root, exist_ok=True)
    version = topo["driver_version"]

    libs = driverfiles.install_libraries(driver_root, version, render_fake_nvml(topo))
    driverfiles.install_binaries(driver_root, version)
    driverfiles.install_firmware(driver_root, version)
    driverfiles.install_configs(driver_root)
    driverfiles.install_sockets(driver_root)
    driverfiles.install_extra_files(driver_root, extra_files or {})
    driverfiles.write_ld_so_conf(driver_root)
    run_ldconfig(driver_root)
    devfs.make_nodes(topo, dev_root)
    pcifs.write_pci_tree(topo, dev_root)
    devfs.write_proc_sys(topo, dev_root)
    return SimHost(
        root=driver_root,
        driver_root=driver_root,
        dev_root=dev_root,
        topology=topo,
        driver_version=version,
        nvml_path=f"{driver_root}{LIB_DIR}/libnvidia-ml.so.{version}",
        libraries=libs,
    )


def prebuild(topology: str | dict) -> str:
    """Compile what ``build_host(topology)`` needs into the compile cache and record the
    compiler, so that a machine without gcc builds the host from a copy of the cache
    (``$NVSHIM_SIM_CACHE``); returns the cache's path. Needs no root."""
    version = load_topology(topology)["driver_version"]
    return simcompile.prebuild(driverfiles.stub_requests(version))


def rebuild_host(
    sim: SimHost, topology: str | dict, extra_files: dict[str, bytes | str] | None = None
) -> SimHost:
    """Change a built host in place, as a MIG re-layout (mig-manager) or a driver upgrade
    (the driver container) changes a live node: everything under its roots is replaced by
    ``topology``'s host (and ``extra_files``, as ``build_host``) while the roots themselves
    stay (so bind mounts of them, such as a test cluster's driver root, see the change)."""
    for root in dict.fromkeys((sim.driver_root, sim.dev_root)):
        for entry in os.scandir(root):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
    dev_root = None if sim.dev_root == sim.driver_root else sim.dev_root
    return build_host(topology, sim.driver_root, dev_root, extra_files)


def main(argv: list[str] | None = None) -> int:
    """``build NAME DEST [--dev-root DIR]``: build a host, print its driver root."""
    parser = argparse.ArgumentParser(prog="python3 -m tests.sim.simhost")
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build a simulated host")
    build.add_argument("name", help=f"shipped topology ({', '.join(shipped_hosts())}) or YAML")
    build.add_argument("dest")
    build.add_argument("--dev-root")
    sub.add_parser("list", help="list the shipped topologies")
    args = parser.parse_args(argv)
    try:
        if args.command == "list":
            print("\n".join(shipped_hosts()))
            return 0
        host = build_host(args.name, args.dest, args.dev_root)
    except NvshimError as err:
        print(f"simhost: {err}", file=sys.stderr)
        return err.exit_code
    print(host.driver_root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
