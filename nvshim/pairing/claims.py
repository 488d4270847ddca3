"""Exclusive NIC claims: ``rdma-claims/<hca>`` in the inventory directory (``[runtime]
inventory-dir``) names the container holding the NIC, with its init's pid and start
time. A claim is live while that process runs (same pid, same start time), so a
container that is gone releases its NICs without a cleanup step. Claims are taken under
a lock on the directory, all or none."""

from __future__ import annotations

import fcntl
import os

from nvshim import fastjson
from nvshim.errors import NvshimError

DIR = "rdma-claims"


def claims_dir(inventory_dir: str) -> str:
    return os.path.join(inventory_dir, DIR)


def start_time(pid: int) -> str | None:
    """Field 22 of ``/proc/<pid>/stat`` (clock ticks after boot); None when gone (a zombie
    is gone: it only waits to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2 :].split()
    if len(fields) <= 19 or fields[0] in (b"Z", b"X"):
        return None
    return fields[19].decode()


def _read(path: str) -> dict | None:
    try:
        with open(path, "rb") as fh:
            data = fastjson.loads(fh.read(4096))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _live(claim: dict | None) -> bool:
    if not claim or not isinstance(claim.get("pid"), int):
        return False
    return start_time(claim["pid"]) == claim.get("start")


def live_claims(inventory_dir: str) -> dict[str, str]:
    """HCA name -> container id, for every live claim."""
    base = claims_dir(inventory_dir)
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return {}
    out = {}
    for name in names:
        claim = _read(os.path.join(base, name))
        if _live(claim):
            out[name] = str(claim.get("id"))
    return out


def claim(inventory_dir: str, nics: list[str], container_id: str, pid: int) -> list[str]:
    """Claim ``nics`` for the container (idempotent for its own claims); NvshimError naming
    the holder, with nothing claimed, when another live container holds one."""
    base = claims_dir(inventory_dir)
    os.makedirs(base, mode=0o700, exist_ok=True)
    start = start_time(pid)
    if start is None:
        raise NvshimError(f"container {container_id}: process {pid} is gone; nothing claimed")
    lock = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for nic in nics:
            held = _read(os.path.join(base, nic))
            if _live(held) and held.get("id") != container_id:
                raise NvshimError(
                    f"RDMA device {nic} is claimed by container {held.get('id')} "
                    "(pairing.exclusive); nothing claimed"
                )
        record = fastjson.dumps({"id": container_id, "pid": pid, "start": start}).encode()
        for nic in nics:
            tmp = os.path.join(base, f".{nic}.{os.getpid()}")
            with open(tmp, "wb") as fh:
                fh.write(record)
            os.replace(tmp, os.path.join(base, nic))
    finally:
        os.close(lock)
    return list(nics)


def release(inventory_dir: str, nics: list[str], container_id: str) -> None:
    """Drop the container's own claims on ``nics`` (after a failed start)."""
    base = claims_dir(inventory_dir)
    for nic in nics:
        path = os.path.join(base, nic)
        held = _read(path)
        if held and held.get("id") == container_id:
            try:
                os.unlink(path)
            except OSError:
                pass
