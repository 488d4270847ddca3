"""Per-container sharing enforcement, called by ``nvshim.policy.select`` for the runtime and
the hook alike.

A container given an MPS-shared device gets exactly that device's pipe directory at
``/run/nvidia-mps``, its shm tmpfs at ``/dev/shm``, ``CUDA_MPS_PIPE_DIRECTORY`` and its share
in ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` / ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` (a user value
survives only when stricter). Every other GPU container loses every ``CUDA_MPS_*`` variable
it set (set to the empty string: edits cannot delete variables) and any MPS mount.
"""

from __future__ import annotations

import os

from nvshim.edits import ContainerEdits, Mount
from nvshim.errors import NvshimError
from nvshim.mps import CONTAINER_PIPE_DIR, CONTAINER_SHM_DIR, MPS_ENV_PREFIX
from nvshim.mps.sharing import MIB, SharedDevice, sharing_for
from nvshim.record import replace

DEFAULT_PIPE_DIR = "/tmp/nvidia-mps"  # where CUDA looks without CUDA_MPS_PIPE_DIRECTORY
PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
THREADS_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
MEMORY_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
MOUNT_OPTIONS = ("nosuid", "nodev", "noexec", "bind")

_SIZE_UNITS = {"K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


class SharingError(NvshimError):
    """A container request that breaks the sharing rules."""


def requested_replicas(request, devices, host) -> dict[str, int]:
    """How many distinct replicas of each device the request names.

    Replica ids (``GPU-x::0,GPU-x::1``) are stripped by the request parser, so this reads the
    raw ids: ``request.raw_ids`` when the request carries them, else the raw
    ``NVIDIA_VISIBLE_DEVICES`` of an env request. Other requests count 1 per device.
    """
    counts = {d.uuid: 1 for d in devices}
    raw = getattr(request, "raw_ids", None)
    if raw is None and request.source == "env":
        raw = (request.env.get("NVIDIA_VISIBLE_DEVICES") or "").split(",")
    if raw is None or request.devices.kind != "list":
        return counts
    from nvshim.policy.request import DeviceList, parse_device_id
    from nvshim.policy.resolve import resolve_devices

    replicas: dict[str, set[str]] = {}
    for entry in raw:
        entry = entry.strip()
        if not entry or entry in ("all", "none", "void"):
            continue
        _base, sep, replica = entry.partition("::")
        device = resolve_devices(host, DeviceList("list", (parse_device_id(entry),)))[0]
        replicas.setdefault(device.uuid, set()).add(replica if sep else "")
    for uuid, seen in replicas.items():
        counts[uuid] = len(seen)
    return counts


def _stricter_percentage(user: str | None, share: int) -> str | None:
    """The user's thread percentage when it is valid and below ``share``."""
    whole, dot, fraction = (user or "").strip().partition(".")
    if not _digits(whole, 3) or (dot and not _digits(fraction, 6)):
        return None
    value = float(user)
    return user.strip() if 0 < value < share else None


def _size_bytes(text: str) -> int | None:
    """``<digits><K|M|G|T>[B]`` (any case) in bytes; None when it is not that."""
    text = text.strip().upper()
    if text[-2:-1] in _SIZE_UNITS and text.endswith("B"):
        text = text[:-1]
    digits, unit = text[:-1], text[-1:]
    if unit not in _SIZE_UNITS or not _digits(digits, 15):
        return None
    return int(digits) * _SIZE_UNITS[unit]


def _digits(text: str, most: int) -> bool:
    """1 to ``most`` ASCII digits."""
    return 0 < len(text) <= most and all("0" <= c <= "9" for c in text)


def _stricter_memory(user: str | None, uuid: str, share_mib: int) -> str | None:
    """The user's pinned-memory limit for this device (keyed by its UUID or by ordinal 0,
    the only device the container sees) when every such entry parses with a unit and the
    loosest is below the share; returned as ``<uuid>=<value>``."""
    if not user or len(user) > 4096:
        return None
    values = []
    for item in user.split(","):
        key, eq, value = item.strip().partition("=")
        if not eq:
            return None
        if key.strip() in ("0", uuid) or key.strip().lower() == uuid.lower():
            size = _size_bytes(value)
            if size is None or size <= 0:
                return None
            values.append((size, value.strip()))
    if not values:
        return None
    size, text = max(values)
    return f"{uuid}={text}" if size < share_mib * MIB else None


def _without_mps_mounts(edits: ContainerEdits, mps_root: str) -> ContainerEdits:
    root = mps_root.rstrip("/") + "/"
    keep = [
        m
        for m in edits.mounts
        if m.container_path not in (CONTAINER_PIPE_DIR, DEFAULT_PIPE_DIR)
        and not (m.host_path + "/").startswith(root)
    ]
    return edits if len(keep) == len(edits.mounts) else replace(edits, mounts=keep)


def _describe(device) -> str:
    name = getattr(device, "name_index", None) or str(getattr(device, "index", "?"))
    return f"{name} ({device.uuid})"


def _check_replicas(devices, shared: dict[str, SharedDevice], counts: dict[str, int]) -> None:
    mine = [d for d in devices if d.uuid in shared]
    for d in mine:
        s = shared[d.uuid]
        if s.fail_requests_greater_than_one and counts.get(d.uuid, 1) > 1:
            raise SharingError(
                f"device {_describe(d)} is shared ({s.label}) with failRequestsGreaterThanOne: "
                f"{counts[d.uuid]} replicas requested, at most 1 allowed"
            )
    if len(mine) > 1 and any(shared[d.uuid].fail_requests_greater_than_one for d in mine):
        raise SharingError(
            f"{len(mine)} shared devices requested ({', '.join(_describe(d) for d in mine)}) "
            "with failRequestsGreaterThanOne: at most 1 allowed"
        )


def _clear_mps_env(edits: ContainerEdits, request, log: dict) -> ContainerEdits:
    names = sorted(k for k in request.env if k.startswith(MPS_ENV_PREFIX))
    if not names:
        return edits
    log["mps_env_cleared"] = ",".join(names)
    return edits.with_env(**{k: "" for k in names})


def sharing_edits(edits: ContainerEdits, devices, request, host, config, log: dict):
    """``edits`` amended for the sharing config: MPS edits for an MPS-shared device, every
    ``CUDA_MPS_*`` cleared otherwise. Raises SharingError (one line) for a request the
    sharing rules refuse, including an MPS device whose daemon is down unless
    ``[sharing] on-daemon-down = "warn"``."""
    mps_root = config.sharing.mps_root
    on_down = config.sharing.on_daemon_down  # one of fail, warn (nvshim.config)
    edits = _without_mps_mounts(edits, mps_root)
    shared = sharing_for(config, host)
    if not shared:
        return _clear_mps_env(edits, request, log)
    counts = requested_replicas(request, devices, host)
    _check_replicas(devices, shared, counts)
    mps = [d for d in devices if d.uuid in shared and shared[d.uuid].mode == "mps"]
    if any(d.uuid in shared for d in devices):
        log["sharing"] = ",".join(
            f"{_describe(d)}:{shared[d.uuid].label}" for d in devices if d.uuid in shared
        )
    if not mps or "compute" not in request.capabilities:
        return _clear_mps_env(edits, request, log)
    if len(devices) > 1:
        others = ", ".join(_describe(d) for d in devices if d is not mps[0])
        raise SharingError(
            f"device {_describe(mps[0])} is MPS-shared and cannot be combined with other "
            f"devices ({others}): an MPS client reaches only its own daemon's device"
        )
    return _mps_edits(edits, mps[0], shared[mps[0].uuid], counts, request, mps_root, on_down, log)


def check_daemon(mps_root: str, uuid: str, on_down: str, label: str = "") -> str | None:
    """Refuse (SharingError) when the daemon of MPS-shared ``uuid`` is not running; with
    ``on_down == "warn"`` return the warning instead. None when it runs. For the runtime,
    the hook, and a CDI ``mps-check`` hook."""
    from nvshim.mps.daemon import daemon_dirs, daemon_pid

    dirs = daemon_dirs(mps_root, uuid)
    if daemon_pid(dirs.pipe) is not None:
        return None
    message = (
        f"device {label or uuid} is MPS-shared but its MPS control daemon is not running "
        f"(no live daemon in {dirs.pipe}); start it with `nvshim mps start`"
    )
    if on_down != "warn":
        raise SharingError(message)
    return message


def _mps_edits(edits, device, share: SharedDevice, counts, request, mps_root, on_down, log):
    from nvshim.mps.daemon import daemon_dirs

    dirs = daemon_dirs(mps_root, share.uuid)
    warning = check_daemon(mps_root, share.uuid, on_down, _describe(device))
    if warning:
        log["mps_warning"] = warning
    n = counts.get(share.uuid, 1)
    threads = min(100, share.thread_percentage * n)
    memory = min(share.memory_total // MIB, share.memory_limit_mib * n)
    env = request.env
    thread_value = _stricter_percentage(env.get(THREADS_ENV), threads) or str(threads)
    memory_value = _stricter_memory(env.get(MEMORY_ENV), share.uuid, memory) or (
        f"{share.uuid}={memory}M"
    )
    log.update(mps=share.uuid, mps_threads=thread_value, mps_memory=memory_value)
    if n > 1:
        log["mps_replicas"] = n
    client = _client_edits(dirs, thread_value, memory_value)
    if not os.path.isdir(dirs.pipe):  # warn mode, daemon never started: nothing to mount
        client = replace(client, mounts=[])
    return edits.merge(client)


def _client_edits(dirs, threads: str, memory: str) -> ContainerEdits:
    return ContainerEdits(
        env=[
            f"{PIPE_ENV}={CONTAINER_PIPE_DIR}",
            f"{THREADS_ENV}={threads}",
            f"{MEMORY_ENV}={memory}",
        ],
        mounts=[
            Mount(dirs.pipe, CONTAINER_PIPE_DIR, MOUNT_OPTIONS),
            Mount(dirs.shm, CONTAINER_SHM_DIR, MOUNT_OPTIONS),
        ],
    )


def mps_device_edits(share: SharedDevice, mps_root: str) -> ContainerEdits:
    """The static MPS edits of one device (for CDI specs: no user values to compare)."""
    from nvshim.mps.daemon import daemon_dirs

    dirs = daemon_dirs(mps_root, share.uuid)
    return _client_edits(
        dirs, str(share.thread_percentage), f"{share.uuid}={share.memory_limit_mib}M"
    )
