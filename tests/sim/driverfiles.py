"""The driver root of a simulated host: libraries, binaries, firmware, configs, IPC sockets.

Library names and SONAMEs are those of a 550-series Linux driver: most SONAMEs are
``lib<name>.so.1``, but the GLVND vendor libraries end in ``.so.0``/``.so.2``, libnvidia-nvvm
in ``.so.4``, libnvidia-nscq in ``.so.2``, and the internal graphics/compiler libraries
(libnvidia-glcore, -eglcore, -tls, -glsi, -rtcore, -cbl, -glvkspirv, -gpucomp, -pkcs11*)
carry the full driver version as their SONAME, so ldconfig makes no extra link for them.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass

from nvshim.errors import NvshimError

from . import compile as simcompile

LIB_DIR = "/usr/lib/x86_64-linux-gnu"
LIB32_DIR = "/usr/lib/i386-linux-gnu"
VERSIONED = "ver"  # SONAME suffix meaning "the driver version"

# (library base name, capability, SONAME suffix)
LIBRARIES: tuple[tuple[str, str, str], ...] = (
    ("libnvidia-ml", "utility", "1"),
    ("libnvidia-cfg", "utility", "1"),
    ("libnvidia-nscq", "utility", "2"),
    ("libcuda", "compute", "1"),
    ("libcudadebugger", "compute", "1"),
    ("libnvidia-opencl", "compute", "1"),
    ("libnvidia-gpucomp", "compute", VERSIONED),
    ("libnvidia-ptxjitcompiler", "compute", "1"),
    ("libnvidia-allocator", "compute", "1"),
    ("libnvidia-pkcs11", "compute", VERSIONED),
    ("libnvidia-pkcs11-openssl3", "compute", VERSIONED),
    ("libnvidia-nvvm", "compute", "4"),
    ("libvdpau_nvidia", "video", "1"),
    ("libnvidia-encode", "video", "1"),
    ("libnvidia-opticalflow", "video", "1"),
    ("libnvcuvid", "video", "1"),
    ("libnvidia-eglcore", "graphics", VERSIONED),
    ("libnvidia-glcore", "graphics", VERSIONED),
    ("libnvidia-tls", "graphics", VERSIONED),
    ("libnvidia-glsi", "graphics", VERSIONED),
    ("libnvidia-fbc", "graphics", "1"),
    ("libnvidia-rtcore", "graphics", VERSIONED),
    ("libnvoptix", "graphics", "1"),
    ("libGLX_nvidia", "graphics", "0"),
    ("libEGL_nvidia", "graphics", "0"),
    ("libGLESv2_nvidia", "graphics", "2"),
    ("libGLESv1_CM_nvidia", "graphics", "1"),
    ("libnvidia-glvkspirv", "graphics", VERSIONED),
    ("libnvidia-cbl", "graphics", VERSIONED),
    ("libnvidia-ngx", "ngx", "1"),
)
# 32-bit copies shipped for compat32 (names as in LIBRARIES).
COMPAT32 = (
    "libnvidia-ml",
    "libcuda",
    "libnvidia-ptxjitcompiler",
    "libnvidia-opencl",
    "libnvidia-gpucomp",
    "libnvidia-encode",
    "libnvcuvid",
    "libvdpau_nvidia",
    "libnvidia-eglcore",
    "libnvidia-glcore",
    "libnvidia-tls",
    "libnvidia-glsi",
    "libnvidia-fbc",
    "libGLX_nvidia",
    "libEGL_nvidia",
    "libGLESv2_nvidia",
    "libGLESv1_CM_nvidia",
    "libnvidia-glvkspirv",
)
BINARIES = (
    ("nvidia-smi", "utility"),
    ("nvidia-debugdump", "utility"),
    ("nvidia-persistenced", "utility"),
    ("nvidia-cuda-mps-control", "compute"),
    ("nvidia-cuda-mps-server", "compute"),
)
FIRMWARE = ("gsp_ga10x.bin", "gsp_tu10x.bin")
SOCKETS = ("run/nvidia-persistenced/socket", "run/nvidia-fabricmanager/socket")


@dataclass(frozen=True)
class SimLibrary:
    """One driver library laid out in the simulated root (paths are container paths)."""

    name: str  # e.g. libcuda
    capability: str
    path: str  # /usr/lib/x86_64-linux-gnu/libcuda.so.550.90.12
    soname: str  # libcuda.so.1
    bits: int = 64

    @property
    def links(self) -> tuple[tuple[str, str], ...]:
        """Symlinks ldconfig (and the dev link rule) make beside it: ``(link path, target)``."""
        directory, filename = os.path.split(self.path)
        out = []
        if self.soname != filename:
            out.append((os.path.join(directory, self.soname), filename))
        if self.name == "libcuda":
            out.append((os.path.join(directory, "libcuda.so"), self.soname))
        return tuple(out)


def libraries(version: str) -> list[SimLibrary]:
    """Every library of a simulated driver ``version``, 64-bit then compat32."""
    out = []
    for bits, directory, names in ((64, LIB_DIR, None), (32, LIB32_DIR, COMPAT32)):
        for name, capability, suffix in LIBRARIES:
            if names is not None and name not in names:
                continue
            soname = f"{name}.so.{version if suffix == VERSIONED else suffix}"
            out.append(
                SimLibrary(
                    name=name,
                    capability="compat32" if bits == 32 else capability,
                    path=f"{directory}/{name}.so.{version}",
                    soname=soname,
                    bits=bits,
                )
            )
    return out


def stub_requests(version: str) -> list[tuple[str, int]]:
    """The ``(SONAME, bits)`` stubs of driver ``version``'s libraries (all but the 64-bit
    NVML, which is the fake)."""
    return [
        (lib.soname, lib.bits)
        for lib in libraries(version)
        if lib.bits == 32 or lib.name != "libnvidia-ml"
    ]


def install_libraries(driver_root: str, version: str, topology_text: str) -> list[SimLibrary]:
    """Copy compiled stubs and the fake NVML into the root; return what was installed."""
    wanted = libraries(version)
    built = simcompile.stubs(stub_requests(version))
    nvml = simcompile.fake_nvml()
    installed = []
    for lib in wanted:
        source = (
            nvml
            if (lib.name, lib.bits) == ("libnvidia-ml", 64)
            else built.get((lib.soname, lib.bits))
        )
        if source is None:  # no 32-bit toolchain: no compat32 libraries
            continue
        dest = driver_root + lib.path
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        _copy(source, dest, 0o755)
        installed.append(lib)
        for link, target in lib.links:
            if link.endswith("/libcuda.so"):
                _symlink(target, driver_root + link)
    lib_dir = driver_root + LIB_DIR
    _write(os.path.join(lib_dir, "fake-nvml.topology"), topology_text.encode(), 0o644)
    return installed


def _copy(source: str, dest: str, mode: int) -> None:
    with open(source, "rb") as fh:
        _write(dest, fh.read(), mode)


def _write(path: str, data: bytes, mode: int) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _symlink(target: str, path: str) -> None:
    if os.path.lexists(path):
        os.unlink(path)
    os.symlink(target, path)


def install_binaries(driver_root: str, version: str) -> None:
    """Small ``#!/bin/sh`` stand-ins for the driver's binaries in ``usr/bin``."""
    for name, _ in BINARIES:
        body = f'#!/bin/sh\n# simulated {name} {version}\necho "{name} {version} (simulated)"\n'
        if name == "nvidia-smi":
            body = (
                "#!/bin/sh\n# simulated nvidia-smi\n"
                f'echo "NVIDIA-SMI {version}    Driver Version: {version} (simulated host)"\n'
            )
        _write(f"{driver_root}/usr/bin/{name}", body.encode(), 0o755)


def install_firmware(driver_root: str, version: str) -> None:
    """GSP firmware blobs under ``lib/firmware/nvidia/<version>``."""
    for name in FIRMWARE:
        blob = b"\x7fGSP-simulated " + name.encode() + b" " + version.encode() + b"\0" * 48
        _write(f"{driver_root}/lib/firmware/nvidia/{version}/{name}", blob, 0o644)


def install_configs(driver_root: str) -> None:
    """Vulkan ICD, EGL vendor and Vulkan implicit-layer JSON files."""
    files = {
        "usr/share/vulkan/icd.d/nvidia_icd.json": {
            "file_format_version": "1.0.0",
            "ICD": {"library_path": "libGLX_nvidia.so.0", "api_version": "1.3.277"},
        },
        "usr/share/glvnd/egl_vendor.d/10_nvidia.json": {
            "file_format_version": "1.0.0",
            "ICD": {"library_path": "libEGL_nvidia.so.0"},
        },
        "etc/vulkan/implicit_layer.d/nvidia_layers.json": {
            "file_format_version": "1.0.0",
            "layer": {
                "name": "VK_LAYER_NV_optimus",
                "type": "INSTANCE",
                "library_path": "libGLX_nvidia.so.0",
                "api_version": "1.3.277",
                "implementation_version": "1",
                "description": "NVIDIA Optimus layer",
                "functions": {
                    "vkGetInstanceProcAddr": "vk_optimusGetInstanceProcAddr",
                    "vkGetDeviceProcAddr": "vk_optimusGetDeviceProcAddr",
                },
                "enable_environment": {"__NV_PRIME_RENDER_OFFLOAD": "1"},
                "disable_environment": {"DISABLE_LAYER_NV_OPTIMUS_1": ""},
            },
        },
    }
    for rel, content in files.items():
        _write(f"{driver_root}/{rel}", (json.dumps(content, indent=4) + "\n").encode(), 0o644)


def install_sockets(driver_root: str) -> None:
    """Real AF_UNIX socket inodes (bound, then closed) for persistenced and fabricmanager."""
    for rel in SOCKETS:
        path = f"{driver_root}/{rel}"
        directory, name = os.path.split(path)
        os.makedirs(directory, exist_ok=True)
        if os.path.lexists(path):
            os.unlink(path)
        # Bind through the directory's fd: a deep test path may exceed sun_path's 108 bytes.
        dir_fd = os.open(directory, os.O_PATH | os.O_DIRECTORY)
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.bind(f"/proc/self/fd/{dir_fd}/{name}")
        finally:
            os.close(dir_fd)
        os.chmod(path, 0o777 if "persistenced" in rel else 0o660)


def install_extra_files(driver_root: str, extra: dict[str, bytes | str]) -> None:
    """Write caller-supplied files (driver-root-relative); ``usr/bin/*`` gets mode 0755."""
    for rel, content in extra.items():
        parts = rel.split("/")
        if rel.startswith("/") or ".." in parts or not rel:
            raise NvshimError(f"extra_files: {rel!r} must be a relative path inside the root")
        data = content.encode() if isinstance(content, str) else content
        mode = 0o755 if rel.startswith("usr/bin/") else 0o644
        path = f"{driver_root}/{rel}"
        if os.path.lexists(path) and not os.path.isfile(path):
            os.unlink(path)
        _write(path, data, mode)


def write_ld_so_conf(driver_root: str) -> None:
    """``etc/ld.so.conf`` with its Debian multiarch drop-ins."""
    _write(f"{driver_root}/etc/ld.so.conf", b"include /etc/ld.so.conf.d/*.conf\n", 0o644)
    drop_ins = {
        "x86_64-linux-gnu.conf": "# Multiarch support\n/usr/local/lib/x86_64-linux-gnu\n"
        "/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu\n",
        "i386-linux-gnu.conf": "# Multiarch support\n/usr/local/lib/i386-linux-gnu\n"
        "/lib/i386-linux-gnu\n/usr/lib/i386-linux-gnu\n",
    }
    for name, text in drop_ins.items():
        _write(f"{driver_root}/etc/ld.so.conf.d/{name}", text.encode(), 0o644)
