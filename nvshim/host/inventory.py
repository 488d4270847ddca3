"""The host inventory cache: discovery (NVML) runs once per driver, boot and device layout,
not once per container. Standard library only on the cache-hit path."""

from __future__ import annotations

import os

from nvshim import filecache
from nvshim.host.model import Host
from nvshim.host.rootpath import host_path
from nvshim.memo import Last

CACHE_NAME = "inventory.json"
FORMAT = 2


def _stamp(path: str) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_ino, st.st_size, st.st_mtime_ns]


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read(4096).strip()
    except OSError:
        return None


def cache_key(driver_root: str, dev_root: str) -> dict:
    """What invalidates the cache: the boot, the driver (its ld cache and kernel module),
    and the device layout (GPU and MIG capability nodes appear or go)."""
    driver_root = os.path.abspath(driver_root)
    dev_root = os.path.abspath(dev_root)
    return {
        "format": FORMAT,
        "driver_root": driver_root,
        "dev_root": dev_root,
        "boot_id": _read("/proc/sys/kernel/random/boot_id"),
        "ld_cache": _stamp(host_path(driver_root, "/etc/ld.so.cache")),
        "module": _read(host_path(dev_root, "/proc/driver/nvidia/version")),
        "dev": _stamp(host_path(dev_root, "/dev")),
        "caps": _stamp(host_path(dev_root, "/dev/nvidia-caps")),
        "mig_minors": _stamp(host_path(dev_root, "/proc/driver/nvidia-caps/mig-minors")),
    }


def cache_path(inventory_dir: str) -> str:
    return os.path.join(inventory_dir, CACHE_NAME)


# the host last parsed in this process, kept while its entry's path, bytes and key are
# the same: parsing is most of a load (a Host is never modified)
_last = Last()


def load_cached(inventory_dir: str, driver_root: str, dev_root: str) -> Host | None:
    """The cached host if its key still matches, else None. The file is read and the key
    worked out on every call; the host is parsed again only when the file changed."""
    path, key = cache_path(inventory_dir), cache_key(driver_root, dev_root)
    raw = filecache.read(path)
    if raw is None:
        return None
    kept = _last.get((path, raw, key))
    if kept is not None:
        return kept
    data = filecache.load(path, key, raw)
    if not isinstance(data, dict):
        return None
    try:
        host = Host.from_dict(data)
    except (ValueError, KeyError, TypeError):
        return None
    return _last.keep((path, raw, key), host)


def store(inventory_dir: str, host: Host) -> None:
    """Write the cache atomically; failure to write is not fatal (next call rediscovers)."""
    key = cache_key(host.driver_root, host.dev_root)
    filecache.store(cache_path(inventory_dir), key, host.to_dict())


def load_host(driver_root: str, dev_root: str, inventory_dir: str, refresh: bool = False) -> Host:
    """The host, from the cache when valid, else discovered (NVML) and cached."""
    if not refresh:
        cached = load_cached(inventory_dir, driver_root, dev_root)
        if cached is not None:
            return cached
    from nvshim.host.discover import discover_host

    host = discover_host(driver_root, dev_root)
    store(inventory_dir, host)
    return host
