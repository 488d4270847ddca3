"""``nvshim cdi refresh``: rewrite a generated CDI spec only when the host changed.

The host's key is the runtime inventory cache's (``nvshim.host.inventory.cache_key``: boot,
driver libraries and module, device and MIG capability nodes), extended with what else the
spec is made from (nvshim's version, the generate options, the sharing config). It is kept
beside the spec in ``<spec>.nvshim-key``, a name CDI runtimes never load (they read only
``.json`` and ``.yaml``). The spec is written first, the key after, both atomically: a crash
in between only costs one more regeneration. When discovery fails the previous spec stays.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import stat
from collections.abc import Callable
from typing import Any

from nvshim import __version__
from nvshim.errors import NvshimError
from nvshim.host.inventory import cache_key
from nvshim.host.model import Host

KEY_SUFFIX = ".nvshim-key"
KEY_FORMAT = 1
MAX_SHOWN = 4

# key field -> how the log line names its change
FIELD_NAMES = {
    "format": "key format",
    "driver_root": "driver root",
    "dev_root": "dev root",
    "boot_id": "boot",
    "ld_cache": "driver libraries",
    "module": "driver module",
    "dev": "device nodes",
    "caps": "MIG capability nodes",
    "mig_minors": "MIG minors",
    "nvshim": "nvshim version",
    "options": "options",
    "inputs": "input files",
}

# What a render callback returns: the spec's text and its device names.
Render = Callable[[Host], tuple[str, list[str]]]


def key_path(output: str) -> str:
    """Where the key of ``output`` is kept."""
    return output + KEY_SUFFIX


def file_digest(path: str) -> str | None:
    """SHA-256 of a file's bytes, None when it cannot be read."""
    try:
        with open(path, "rb") as fh:
            return hashlib.sha256(fh.read()).hexdigest()
    except OSError:
        return None


def host_key(
    driver_root: str, dev_root: str, options: dict[str, Any], inputs: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The inventory cache key plus nvshim's version, the options and input file digests."""
    return {
        **cache_key(driver_root, dev_root),
        "nvshim": __version__,
        "options": options,
        "inputs": {path: file_digest(path) for path in inputs},
    }


def _check_key_file(path: str) -> None:
    """Refuse a key path that is there but no regular file (a directory, a socket ...):
    the key could not be written over it, and the spec must not be written first."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode) and not stat.S_ISLNK(st.st_mode):
        raise NvshimError(f"{path}: the refresh's key file is not a regular file")


def _load_record(output: str) -> dict[str, Any] | None:
    try:
        with open(key_path(output), encoding="utf-8") as fh:
            record = json.load(fh)
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("format") != KEY_FORMAT:
        return None
    return record


def _stale_reasons(record: dict[str, Any] | None, key: dict[str, Any], output: str) -> list[str]:
    """Why the spec at ``output`` must be rewritten; empty when it is current."""
    if record is None or not isinstance(record.get("key"), dict):
        return ["no previous key"]
    old = record["key"]
    reasons = [FIELD_NAMES.get(name, name) for name in key if old.get(name) != key[name]]
    digest = file_digest(output)
    if digest is None:
        reasons.append("spec missing")
    elif digest != record.get("spec_sha256"):
        reasons.append("spec edited")
    return reasons


def _shown(names: list[str]) -> str:
    more = len(names) - MAX_SHOWN
    return ",".join(names[:MAX_SHOWN]) + (f",+{more} more" if more > 0 else "")


def _differences(record: dict[str, Any] | None, driver: str, devices: list[str]) -> list[str]:
    """Driver version and device name changes against the previous run, for the log."""
    if record is None:
        return []
    out = []
    old_driver = record.get("driver")
    if old_driver and old_driver != driver:
        out.append(f"driver {old_driver} -> {driver}")
    old_devices = record.get("devices") or []
    added = [name for name in devices if name not in old_devices]
    removed = [name for name in old_devices if name not in devices]
    if added:
        out.append(f"devices added {_shown(added)}")
    if removed:
        out.append(f"devices removed {_shown(removed)}")
    return out


def refresh_spec(
    output: str,
    driver_root: str,
    dev_root: str,
    options: dict[str, Any],
    render: Render,
    discover: Callable[[str, str], Host],
    inputs: tuple[str, ...] = (),
    force: bool = False,
) -> tuple[bool, str]:
    """Rewrite ``output`` when the host's key changed (or ``force``); return whether it was
    written and the one line to log. Raises NvshimError, leaving the old spec, when
    discovery or rendering fails."""
    from nvshim.fsutil import atomic_write

    output = os.path.abspath(output)
    directory = os.path.dirname(output)
    if not os.path.isdir(directory):
        raise NvshimError(f"{output}: directory {directory} does not exist")
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(dir_fd, fcntl.LOCK_EX)  # one refresh of a directory at a time
        _check_key_file(key_path(output))  # before the spec is written, not after
        # the key is taken before discovery: a change during discovery shows next time
        key = host_key(driver_root, dev_root, options, inputs)
        record = _load_record(output)
        reasons = ["forced"] if force else _stale_reasons(record, key, output)
        if not reasons:
            return False, (
                f"{output} is current (driver {record.get('driver')}, "
                f"{len(record.get('devices') or [])} devices)"
            )
        kept = "kept the previous spec" if os.path.exists(output) else "nothing written"
        try:
            host = discover(driver_root, dev_root)
            text, devices = render(host)
        except (NvshimError, OSError) as err:
            raise NvshimError(f"{output}: {kept}: {err}") from None
        data = text.encode()
        atomic_write(output, data, mode=0o644)
        new_record = {
            "format": KEY_FORMAT,
            "key": key,
            "spec_sha256": hashlib.sha256(data).hexdigest(),
            "driver": host.driver_version,
            "devices": devices,
        }
        record_text = json.dumps(new_record, indent=1, sort_keys=True) + "\n"
        atomic_write(key_path(output), record_text.encode(), mode=0o644)
    finally:
        os.close(dir_fd)
    changes = "; ".join([", ".join(reasons)] + _differences(record, host.driver_version, devices))
    return True, (
        f"refreshed {output} ({changes}): driver {host.driver_version}, {len(devices)} devices"
    )
