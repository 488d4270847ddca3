"""The plugin's checkpoint (``<plugin-dir>/checkpoint.json``): every prepared claim, each
entry checked where it enters.

Format (version 1)::

    {"version": 1, "claims": {"<uid>": {"uid": ..., "namespace": ..., "name": ...,
      "devices": [{"request", "pool", "device", "uuid", "admin"}],
      "mps": [{"uuid", "threads", "memory_mib", "pid", "start_time"}]}}}

Reading never fails the plugin: an entry that does not check out is dropped with one line
saying why, and a file that is not JSON at all (truncated, overwritten) gives up only the
claims it no longer holds whole: each complete ``"<uid>": {...}`` in it is recovered. The
unreadable original is kept beside it as ``checkpoint.json.bad``. Writes are atomic (temp,
fsync, rename): a full disk leaves the previous checkpoint as it was.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from nvshim.errors import NvshimError

VERSION = 1
NAME = "checkpoint.json"
BAD_SUFFIX = ".bad"
MAX_BYTES = 16 * 1024 * 1024
MAX_PID = 1 << 22  # the kernel's PID_MAX_LIMIT
MAX_START_TIME = 10**19  # clock ticks since boot: 20 digits at most
_UID = re.compile(r"[0-9A-Za-z][0-9A-Za-z-]{0,63}")
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_DEVICE_UUID = re.compile(r"(GPU|MIG)-[0-9A-Za-z-]{1,80}")
_ENTRY_START = re.compile(r'"([0-9A-Za-z-]{1,64})"\s*:\s*\{')


class CheckpointError(NvshimError):
    """A checkpoint entry or a claim value that does not check out (one line)."""


def _text(value: Any, what: str, pattern: re.Pattern[str], form: str) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
        raise CheckpointError(f"{what} {shown} is not {form}")
    return value


def check_uid(value: Any) -> str:
    """A Kubernetes UID: ASCII letters, digits and ``-``, 1-64 characters (it names files:
    never ``/`` or ``..``)."""
    return _text(value, "claim UID", _UID, "a Kubernetes UID")


def check_namespace(value: Any) -> str:
    return _text(value, "namespace", _LABEL, "a DNS label")


def check_name(value: Any) -> str:
    return _text(value, "claim name", _SUBDOMAIN, "a DNS subdomain")


def check_request(value: Any) -> str:
    """A request name, or ``request/subrequest`` (``firstAvailable``)."""
    if isinstance(value, str) and value.count("/") <= 1:
        for part in value.split("/"):
            _text(part, "request name", _LABEL, "a DNS label")
        return value
    return _text(value, "request name", _LABEL, "a DNS label")


def check_device_uuid(value: Any) -> str:
    return _text(value, "device UUID", _DEVICE_UUID, "a GPU or MIG UUID")


def _int(value: Any, what: str, low: int, high: int, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise CheckpointError(f"{what} {str(value)[:40]!r} is not an integer {low}..{high}")
    return value


def _mapping(value: Any, what: str, keys: tuple[str, ...], optional=()) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise CheckpointError(f"{what}: a {type(value).__name__} where a mapping belongs")
    missing = [k for k in keys if k not in value]
    if missing:
        raise CheckpointError(f"{what}: missing {', '.join(missing)}")
    extra = sorted(set(value) - set(keys) - set(optional))
    if extra:
        raise CheckpointError(f"{what}: unknown key {extra[0]!r}")
    return value


def _list(value: Any, what: str) -> list:
    if not isinstance(value, list):
        raise CheckpointError(f"{what}: a {type(value).__name__} where a list belongs")
    return value


def check_entry(uid: str, entry: Any) -> dict[str, Any]:
    """One claim's entry, checked; CheckpointError names the first bad value."""
    check_uid(uid)
    entry = _mapping(entry, "entry", ("uid", "namespace", "name", "devices", "mps"))
    if entry["uid"] != uid:
        raise CheckpointError(f"entry names UID {str(entry['uid'])[:64]!r}")
    check_namespace(entry["namespace"])
    check_name(entry["name"])
    devices = []
    for i, d in enumerate(_list(entry["devices"], "devices")):
        d = _mapping(d, f"devices[{i}]", ("request", "pool", "device", "uuid", "admin"))
        check_request(d["request"])
        _text(d["pool"], "pool", _SUBDOMAIN, "a node name")
        _text(d["device"], "device", _LABEL, "a device name")
        check_device_uuid(d["uuid"])
        if not isinstance(d["admin"], bool):
            raise CheckpointError(f"devices[{i}].admin {d['admin']!r} is not a boolean")
        devices.append(dict(d))
    mps = []
    for i, m in enumerate(_list(entry["mps"], "mps")):
        m = _mapping(m, f"mps[{i}]", ("uuid", "threads", "memory_mib"), ("pid", "start_time"))
        check_device_uuid(m["uuid"])
        _int(m["threads"], f"mps[{i}].threads", 1, 100, optional=True)
        _int(m["memory_mib"], f"mps[{i}].memory_mib", 1, 1 << 40, optional=True)
        _int(m.get("pid"), f"mps[{i}].pid", 1, MAX_PID, optional=True)
        _int(m.get("start_time"), f"mps[{i}].start_time", 0, MAX_START_TIME, optional=True)
        mps.append(dict(m))
    return {**entry, "devices": devices, "mps": mps}


def _salvage(text: str) -> dict[str, Any]:
    """Every complete ``"<uid>": {...}`` object in a damaged checkpoint's text."""
    decoder = json.JSONDecoder()
    found: dict[str, Any] = {}
    for match in _ENTRY_START.finditer(text):
        try:
            value, _ = decoder.raw_decode(text, match.end() - 1)
        except ValueError:
            continue
        if isinstance(value, dict) and value.get("uid") == match.group(1):
            found.setdefault(match.group(1), value)
    return found


def load(path: str) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """The checked claims of the checkpoint at ``path`` and one line per thing dropped (or
    recovered). A missing file holds nothing."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return {}, []
    except OSError as err:
        return {}, [f"checkpoint {path}: unreadable ({err.strerror}): starting with no claims"]
    lines: list[str] = []
    text = raw[:MAX_BYTES].decode("utf-8", "replace")
    try:
        data = json.loads(text) if len(raw) <= MAX_BYTES else None
    except ValueError as err:
        data = None
        lines.append(f"checkpoint {path}: not JSON ({err}): recovering the claims it holds whole")
    if data is None:
        claims = _salvage(text)
        _keep_bad(path, raw, lines)
    elif not isinstance(data, dict) or data.get("version") != VERSION:
        lines.append(f"checkpoint {path}: unknown format: starting with no claims")
        _keep_bad(path, raw, lines)
        return {}, lines
    else:
        claims = data.get("claims")
        if not isinstance(claims, dict):
            lines.append(f"checkpoint {path}: claims: not a mapping: starting with no claims")
            _keep_bad(path, raw, lines)
            return {}, lines
    out = {}
    for uid, entry in claims.items():
        try:
            out[uid] = check_entry(uid, entry)
        except CheckpointError as err:
            lines.append(f"checkpoint {path}: dropped claim {str(uid)[:64]!r}: {err}")
    if data is None:
        lines.append(f"checkpoint {path}: recovered {len(out)} claim(s)")
    return out, lines


def _keep_bad(path: str, raw: bytes, lines: list[str]) -> None:
    from nvshim.fsutil import atomic_write

    try:
        atomic_write(path + BAD_SUFFIX, raw, mode=0o600)
        lines.append(f"checkpoint {path}: the unreadable original is kept as {path}{BAD_SUFFIX}")
    except OSError as err:
        lines.append(f"checkpoint {path}: cannot keep the original: {err.strerror}")


def save(path: str, claims: dict[str, dict[str, Any]]) -> None:
    """Write the checkpoint atomically; OSError (a full disk) leaves the old one."""
    from nvshim.fsutil import atomic_write

    os.makedirs(os.path.dirname(path), mode=0o750, exist_ok=True)
    text = json.dumps({"version": VERSION, "claims": claims}, indent=1)
    atomic_write(path, text.encode() + b"\n", mode=0o600)
