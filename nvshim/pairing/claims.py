"""Exclusive NIC claims: ``rdma-claims/<hca>`` in the inventory directory (``[runtime]
inventory-dir``) names the container holding the NIC, with its init's pid and start
time. A claim is live while that process runs (same pid, same start time), so a
container that is gone releases its NICs without a cleanup step. Claims are taken under
a lock on the directory, all or none, and kept (and read) only in a directory no other
user can change (``nvshim.trusted.trusted_dir_fd``), through its fd."""

from __future__ import annotations

import fcntl
import os

from nvshim import fastjson
from nvshim.errors import NvshimError
from nvshim.fsutil import write_new_at
from nvshim.trusted import trusted_dir_fd

DIR = "rdma-claims"


def claims_dir(inventory_dir: str) -> str:
    return os.path.join(inventory_dir, DIR)


def open_claims(inventory_dir: str) -> int:
    """A read fd of the claims directory (made when missing); NvshimError, one line
    naming the directory, where another user could change it."""
    return trusted_dir_fd(claims_dir(inventory_dir), "NIC claims")


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


def _read(dir_fd: int, name: str) -> dict | None:
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        data = fastjson.loads(os.read(fd, 4096))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    return data if isinstance(data, dict) else None


def _live(claim: dict | None) -> bool:
    if not claim or not isinstance(claim.get("pid"), int):
        return False
    return start_time(claim["pid"]) == claim.get("start")


def live_claims(inventory_dir: str) -> dict[str, str]:
    """HCA name -> container id, for every live claim (none where the directory is not
    trusted: ``claim`` refuses to keep any there)."""
    try:
        base = open_claims(inventory_dir)
    except NvshimError:
        return {}
    out = {}
    try:
        for name in sorted(os.listdir(base)):
            claim = _read(base, name)
            if _live(claim):
                out[name] = str(claim.get("id"))
    finally:
        os.close(base)
    return out


def claim(inventory_dir: str, nics: list[str], container_id: str, pid: int) -> list[str]:
    """Claim ``nics`` for the container (idempotent for its own claims); NvshimError naming
    the holder, with nothing claimed, when another live container holds one."""
    start = start_time(pid)
    if start is None:
        raise NvshimError(f"container {container_id}: process {pid} is gone; nothing claimed")
    base = open_claims(inventory_dir)
    try:
        fcntl.flock(base, fcntl.LOCK_EX)
        for nic in nics:
            held = _read(base, nic)
            if _live(held) and held.get("id") != container_id:
                raise NvshimError(
                    f"RDMA device {nic} is claimed by container {held.get('id')} "
                    "(pairing.exclusive); nothing claimed"
                )
        record = fastjson.dumps({"id": container_id, "pid": pid, "start": start}).encode()
        for nic in nics:
            tmp = f".{nic}.{os.getpid()}"
            write_new_at(base, tmp, record, 0o644)
            os.replace(tmp, nic, src_dir_fd=base, dst_dir_fd=base)
    finally:
        os.close(base)
    return list(nics)


def release(inventory_dir: str, nics: list[str], container_id: str) -> None:
    """Drop the container's own claims on ``nics`` (after a failed start)."""
    try:
        base = open_claims(inventory_dir)
    except NvshimError:
        return  # claim kept none there
    try:
        for nic in nics:
            held = _read(base, nic)
            if held and held.get("id") == container_id:
                try:
                    os.unlink(nic, dir_fd=base)
                except OSError:
                    pass
    finally:
        os.close(base)
