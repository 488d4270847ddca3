"""Device access for the standalone prestart hook: cgroup v1 ``devices.allow``.

On cgroup v2 device access is an eBPF program the runtime attaches from
``linux.resources.devices``; a prestart hook cannot change it, so it fails with a
pointer to the two ways that can (``nvshim-runtime`` or CDI).
"""

from __future__ import annotations

import os

from nvshim.errors import NvshimError

V2_MESSAGE = (
    "cgroup v2: a prestart hook cannot grant device access; run the container through "
    "nvshim-runtime or request the GPUs with CDI"
)


def devices_cgroup(pid: int, proc: str = "/proc") -> str | None:
    """The cgroup v1 ``devices`` path of ``pid`` (None on a pure cgroup v2 system)."""
    try:
        with open(f"{proc}/{pid}/cgroup", encoding="utf-8") as fh:
            lines = fh.read(1 << 16).splitlines()
    except OSError as err:
        raise NvshimError(f"{proc}/{pid}/cgroup: cannot read: {err.strerror}") from None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3 and "devices" in parts[1].split(","):
            path = parts[2]
            if not path.startswith("/") or "/../" in path + "/" or "\0" in path:
                raise NvshimError(f"{proc}/{pid}/cgroup: unexpected devices path {path!r}")
            return path
    return None


def devices_mount(proc: str = "/proc") -> str:
    """Where the cgroup v1 ``devices`` hierarchy is mounted (from mountinfo)."""
    from nvshim.rootfs.mountinfo import mounts

    for point, fstype, options in mounts(f"{proc}/self/mountinfo"):
        if fstype == "cgroup" and "devices" in options:
            return point
    raise NvshimError(f"{proc}/self/mountinfo: no cgroup v1 devices hierarchy is mounted")


def allow_rule(kind: str, major: int, minor: int, access: str = "rwm") -> str:
    """A ``devices.allow`` line, e.g. ``c 195:0 rwm``."""
    if kind not in ("c", "b", "u"):
        raise NvshimError(f"device type {kind!r}: only c and b devices can be allowed")
    if not access or set(access) - set("rwm"):
        raise NvshimError(f"device permissions {access!r}: must be a subset of rwm")
    return f"{'c' if kind == 'u' else kind} {int(major)}:{int(minor)} {access}"


def allow_devices(pid: int, rules: list[str], proc: str = "/proc") -> str:
    """Write each rule to the container's ``devices.allow``; returns the cgroup file."""
    path = devices_cgroup(pid, proc)
    if path is None:
        raise NvshimError(V2_MESSAGE)
    target = os.path.join(devices_mount(proc), path.lstrip("/"), "devices.allow")
    try:
        fd = os.open(target, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        raise NvshimError(f"{target}: cannot open: {err.strerror}") from None
    try:
        for rule in rules:
            try:
                os.write(fd, rule.encode())
            except OSError as err:
                raise NvshimError(f"{target}: cannot write {rule!r}: {err.strerror}") from None
    finally:
        os.close(fd)
    return target
