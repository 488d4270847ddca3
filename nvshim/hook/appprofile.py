"""``update-application-profile``: limit EGL and Vulkan to the container's GPUs.

The driver reads application profiles from ``/etc/nvidia/nvidia-application-profiles-rc.d``;
NVIDIA's hook writes one whose ``EGLVisibleDGPUDevices`` mask has a bit per GPU device
node (``/dev/nvidiaN``, a character device, minor N below 64) in the container's
``/dev``. This writes the same file, byte for byte, fd-based inside the root.
"""

from __future__ import annotations

import os
import stat

from nvshim.errors import NvshimError
from nvshim.rootfs.fsroot import RootFS, RootPathError

PROFILE_DIR = "/etc/nvidia/nvidia-application-profiles-rc.d"
PROFILE_FILE = PROFILE_DIR + "/10-container.conf"
MAX_MINOR = 64


def _gpu_minor(name: str) -> bool:
    return name.startswith("nvidia") and name[6:].isascii() and name[6:].isdigit()


def gpu_minors(root: RootFS) -> list[int]:
    """Minors of the ``/dev/nvidiaN`` character devices in the container."""
    try:
        dfd = root.open("/dev", os.O_RDONLY | os.O_DIRECTORY)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as err:
        raise NvshimError(f"/dev in the container root: {err.strerror}") from None
    try:
        minors = []
        for name in sorted(os.listdir(dfd)):
            if not _gpu_minor(name):
                continue
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISCHR(st.st_mode):
                minors.append(os.minor(st.st_rdev))
        return minors
    finally:
        os.close(dfd)


def profile(mask: int) -> bytes:
    """The application profile NVIDIA's hook writes for the GPU bit ``mask``."""
    return (
        '{"profiles":[{"name":"_container_","settings":["EGLVisibleDGPUDevices",'
        f'0x{mask:x}]}}],"rules":[{{"pattern":[],"profile":"_container_"}}]}}'
    ).encode()


def update_application_profile(root: RootFS) -> dict[str, object]:
    """Write the profile when the container has GPU device nodes. Returns log fields."""
    minors = gpu_minors(root)
    mask = 0
    for minor in minors:
        if 0 <= minor < MAX_MINOR:
            mask |= 1 << minor
    if not mask:
        return {"application_profile": "no-gpu-nodes"}
    try:
        os.close(root.open_dir(PROFILE_DIR, create=True, mode=0o555))
        root.write_file(PROFILE_FILE, profile(mask), mode=0o444)
    except (OSError, RootPathError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise NvshimError(f"{PROFILE_FILE} in the container root: {reason}") from None
    return {"application_profile": f"0x{mask:x}"}
