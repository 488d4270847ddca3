"""Take a claim's MPS daemon out of the plugin's pod, so that deleting the pod (a rolling
update) does not end it.

In its pod the plugin shares the node's PID namespace (``hostPID: true``), so the daemon's
pid is a node pid and no pod PID namespace dies under it; what remains is the container's
cgroup, whose processes the runtime kills when the container stops. The daemon is moved into
the cgroups of the node's init (PID 1), through the node's own cgroup mounts
(``/proc/1/root/sys/fs/cgroup``) from a short-lived child that first enters PID 1's cgroup
namespace (on cgroup v2 the pod has its own). The pid is used only while the caller holds a
pidfd on it, and the move is checked by reading the daemon's cgroups back.
"""

from __future__ import annotations

import os

CGROUP_MOUNTS = "/proc/1/root/sys/fs/cgroup"
_CLONE_NEWCGROUP = 0x02000000


def shares_node_pids() -> bool:
    """True when PID 1 here is not this container's own init (``hostPID: true``)."""
    try:
        return os.readlink("/proc/1/ns/pid") == os.readlink("/proc/self/ns/pid") and (
            os.readlink("/proc/1/ns/mnt") != os.readlink("/proc/self/ns/mnt")
        )
    except OSError:
        return False


def _targets(init_cgroups: str, mounts: str) -> list[tuple[str, str]]:
    """``(cgroup.procs path, hierarchy)`` for each line of PID 1's ``/proc/1/cgroup``."""
    out = []
    for line in init_cgroups.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[2].startswith("/") or "/.." in parts[2]:
            continue
        _, controllers, path = parts
        if not controllers:  # cgroup v2 (the whole tree, or "unified" beside v1)
            unified = os.path.join(mounts, "unified")
            base = unified if os.path.isdir(unified) else mounts
        else:
            base = os.path.join(mounts, controllers.removeprefix("name="))
        out.append((os.path.join(base + path.rstrip("/"), "cgroup.procs"), controllers or "v2"))
    return out


def _in_child(pid: int, libc, get_errno) -> str:
    """In a forked child (``libc`` loaded before the fork: nothing here imports): enter
    PID 1's cgroup namespace, write ``pid`` into every hierarchy's cgroup of PID 1.
    Returns what failed ('' when nothing)."""
    fd = os.open("/proc/1/ns/cgroup", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, _CLONE_NEWCGROUP) != 0:
            return f"setns(cgroup of PID 1): {os.strerror(get_errno())}"
    finally:
        os.close(fd)
    with open("/proc/1/cgroup", encoding="utf-8") as fh:
        targets = _targets(fh.read(), CGROUP_MOUNTS)
    failed = []
    for procs, hierarchy in targets:
        try:
            with open(procs, "w", encoding="ascii") as fh:
                fh.write(str(pid))
        except OSError as err:
            failed.append(f"{hierarchy}: {err.strerror}")
    return "; ".join(failed)


def leave_pod(pidfd: int, pid: int) -> str | None:
    """Move the daemon ``pid`` (held by ``pidfd``) into the node init's cgroups. None when
    done, else why not (one line)."""
    if not shares_node_pids():
        return "the plugin's pod does not share the node's PID namespace (hostPID)"
    import ctypes

    from nvshim.mps.daemon import wait_pidfd

    libc = ctypes.CDLL(None, use_errno=True)  # before the fork: the child only calls it
    r, w = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - in the child
        try:
            os.close(r)
            os.write(w, _in_child(pid, libc, ctypes.get_errno).encode()[:500])
        except BaseException as err:  # noqa: BLE001 - reported through the pipe
            os.write(w, str(err).encode()[:500])
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        failed = fh.read().decode("utf-8", "replace")
    os.waitpid(child, 0)
    if failed:
        return f"cannot move it out of the pod's cgroups: {failed}"
    still = _shared_cgroups(pid)
    if wait_pidfd(pidfd, 0):
        return "the daemon exited"
    return f"still in the pod's cgroups: {', '.join(still)}" if still else None


def _shared_cgroups(pid: int) -> list[str]:
    """The hierarchies in which ``pid`` is still in this process's own cgroup."""

    def cgroups(who: str) -> dict[str, str]:
        try:
            with open(f"/proc/{who}/cgroup", encoding="utf-8") as fh:
                lines = fh.read().splitlines()
        except OSError:
            return {}
        return {p[1] or "v2": p[2] for p in (line.split(":", 2) for line in lines) if len(p) == 3}

    mine, its = cgroups("self"), cgroups(str(pid))
    return sorted(h for h, path in its.items() if mine.get(h) == path and path != "/")
