"""``disable-device-node-modification``: hide the driver's permission to create device
nodes from the container.

When the host's ``/proc/driver/nvidia/params`` says ``ModifyDeviceFiles: 1``, a copy
saying ``0`` is bind-mounted (read-only) over the container's own
``/proc/driver/nvidia/params``, so NVML inside cannot mknod nodes of GPUs the
container was not given.
"""

from __future__ import annotations

import os
import stat

from nvshim.errors import NvshimError
from nvshim.host.rootpath import host_path
from nvshim.rootfs import bind
from nvshim.rootfs.fsroot import RootFS

PARAMS = "/proc/driver/nvidia/params"
KEY = "ModifyDeviceFiles"
MAX_PARAMS_BYTES = 1 << 16


def without_modification(text: str) -> str | None:
    """``text`` with ``ModifyDeviceFiles: 0`` (None when it already says so)."""
    lines = text.splitlines()
    found = False
    for i, line in enumerate(lines):
        key, sep, value = line.partition(":")
        if sep and key.strip() == KEY:
            found = True
            if value.strip() == "0":
                return None
            lines[i] = f"{KEY}: 0"
    if not found:
        lines.append(f"{KEY}: 0")
    return "\n".join(lines) + "\n"


def host_params(dev_root: str) -> tuple[str | None, bytes | None]:
    """The host half, run before entering the container: ``(log value, None)`` when
    nothing is to be done (no params file on the host, or it already says 0), else
    ``(None, the rewritten file)``."""
    source = host_path(dev_root, PARAMS)
    try:
        with open(source, "rb") as fh:
            text = fh.read(MAX_PARAMS_BYTES).decode("utf-8", "replace")
    except FileNotFoundError:
        return "absent-on-host", None
    except OSError as err:
        raise NvshimError(f"{source}: cannot read: {err.strerror}") from None
    new = without_modification(text)
    return ("already-0", None) if new is None else (None, new.encode())


def mount_params(root: RootFS, tree: int) -> dict:
    """The container half: mount the detached copy ``tree`` (a ``private_file_tree``
    made on the host) over the container's params file. Returns log fields."""
    try:
        target = root.open(PARAMS, os.O_PATH)
    except (FileNotFoundError, NotADirectoryError):
        return {"params": "absent-in-container"}
    except OSError as err:
        raise NvshimError(f"{PARAMS} in the container root: {err.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(target).st_mode):
            raise NvshimError(f"{PARAMS} in the container root: not a regular file")
        attrs = bind.BASE_ATTRS | bind.kernel.MOUNT_ATTR_RDONLY | bind.kernel.MOUNT_ATTR_NOEXEC
        bind.attach(tree, target, attrs, PARAMS)
    finally:
        os.close(target)
    return {"params": "ModifyDeviceFiles=0"}
