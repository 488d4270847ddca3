"""What a GPU container needs from the driver, per driver capability (FACTS §2).

Names only: ``nvshim.host.files`` finds them under a driver root.
"""

from __future__ import annotations

# capability -> library name stems (the part before ".so"); found by SONAME prefix in ld.so.cache
LIBRARIES: dict[str, tuple[str, ...]] = {
    "utility": ("libnvidia-ml", "libnvidia-cfg", "libnvidia-nscq"),
    "compute": (
        "libcuda",
        "libcudadebugger",
        "libnvidia-opencl",
        "libnvidia-gpucomp",
        "libnvidia-ptxjitcompiler",
        "libnvidia-fatbinaryloader",
        "libnvidia-allocator",
        "libnvidia-compiler",
        "libnvidia-pkcs11",
        "libnvidia-pkcs11-openssl3",
        "libnvidia-nvvm",
        "libnvidia-tileiras",
    ),
    "video": ("libvdpau_nvidia", "libnvidia-encode", "libnvidia-opticalflow", "libnvcuvid"),
    "graphics": (
        "libnvidia-eglcore",
        "libnvidia-glcore",
        "libnvidia-tls",
        "libnvidia-glsi",
        "libnvidia-fbc",
        "libnvidia-ifr",
        "libnvidia-rtcore",
        "libnvoptix",
        "libGLX_nvidia",
        "libEGL_nvidia",
        "libGLESv2_nvidia",
        "libGLESv1_CM_nvidia",
        "libnvidia-glvkspirv",
        "libnvidia-cbl",
    ),
    "ngx": ("libnvidia-ngx",),
}

# Libraries that get a plain "<stem>.so" development link besides their SONAME link.
DEV_LINKS = ("libcuda", "libnvidia-ml")

BINARIES: dict[str, tuple[str, ...]] = {
    "utility": ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced"),
    "compute": ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server"),
}

# Config files (driver-root relative), per capability.
CONFIG_FILES: dict[str, tuple[str, ...]] = {
    "graphics": (
        "usr/share/vulkan/icd.d/nvidia_icd.json",
        "etc/vulkan/icd.d/nvidia_icd.json",
        "usr/share/vulkan/implicit_layer.d/nvidia_layers.json",
        "etc/vulkan/implicit_layer.d/nvidia_layers.json",
        "usr/share/glvnd/egl_vendor.d/10_nvidia.json",
        "etc/glvnd/egl_vendor.d/10_nvidia.json",
        "usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json",
        "usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json",
    ),
}

# IPC sockets (driver-root relative), per capability.
IPC_SOCKETS: dict[str, tuple[str, ...]] = {
    "utility": (
        "run/nvidia-persistenced/socket",
        "run/nvidia-fabricmanager/socket",
    ),
}

# Directories searched for libraries when the ld.so.cache is unusable (driver-root relative).
LIB_DIRS = (
    "usr/lib/x86_64-linux-gnu",
    "usr/lib64",
    "lib/x86_64-linux-gnu",
    "lib64",
    "usr/lib",
    "lib",
)
LIB32_DIRS = ("usr/lib/i386-linux-gnu", "usr/lib32", "lib/i386-linux-gnu", "lib32")
BIN_DIRS = ("usr/bin", "usr/sbin", "bin", "sbin", "usr/local/bin")
FIRMWARE_DIR = "lib/firmware/nvidia"

# Device nodes (dev-root relative) and the capability that needs each (None: always).
CONTROL_NODES: dict[str, str | None] = {
    "dev/nvidiactl": None,
    "dev/nvidia-uvm": "compute",
    "dev/nvidia-uvm-tools": "compute",
    "dev/nvidia-modeset": "display",
}
