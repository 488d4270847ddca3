"""Moving netdevs into a container's network namespace with pyroute2 (netlink).

All or nothing: every netdev is looked up first; a netdev that is neither here nor already
in the container (it vanished or was renamed since discovery) is an error before anything
moves, and a move that fails puts back the ones already moved. Running again after a
success changes nothing; a namespace that is gone (the container exited) moves nothing.
"""

from __future__ import annotations

import os

from nvshim.errors import NvshimError

MAX_NAME = 15  # IFNAMSIZ - 1


def parse_move(spec: str) -> tuple[str, str]:
    """``OLD`` or ``OLD=NEW`` -> (old, new); NvshimError on a name the kernel refuses."""
    old, _, new = spec.partition("=")
    new = new or old
    for name in (old, new):
        if (
            not name
            or len(name) > MAX_NAME
            or any(c in name for c in "/: \t\n")
            or name
            in (
                ".",
                "..",
            )
        ):
            raise NvshimError(f"netdev {spec!r}: not a valid interface name")
    return old, new


def _names(ipr) -> dict[str, int]:
    return {link.get_attr("IFLA_IFNAME"): link["index"] for link in ipr.get_links()}


def move_netdevs(pid: int, specs: list[str]) -> dict[str, str]:
    """Move each ``OLD[=NEW]`` netdev of this namespace into ``pid``'s; log fields."""
    moves = [parse_move(s) for s in specs]
    ns_path = f"/proc/{pid}/ns/net"
    try:
        ns_fd = os.open(ns_path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return {"netdevs": "none moved: the container's network namespace is gone"}
    try:
        mine, theirs = os.stat("/proc/self/ns/net"), os.fstat(ns_fd)
        if (mine.st_dev, mine.st_ino) == (theirs.st_dev, theirs.st_ino):
            raise NvshimError(
                "netdev hand-over: the container shares this network namespace "
                "(it needs its own); nothing moved"
            )
        return _move(ns_fd, ns_path, moves)
    finally:
        os.close(ns_fd)


def _move(ns_fd: int, ns_path: str, moves: list[tuple[str, str]]) -> dict[str, str]:
    from pyroute2 import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError

    with IPRoute() as here, IPRoute(netns=ns_path) as there:
        local, remote = _names(here), _names(there)
        plan = []
        for old, new in moves:
            if old in local:
                if new in remote:
                    raise NvshimError(f"netdev {old}: the container already has a {new}")
                plan.append((old, new, local[old]))
            elif new not in remote:
                raise NvshimError(
                    f"netdev {old}: vanished since discovery (not in this network namespace "
                    "nor the container's); nothing moved"
                )
        done: list[tuple[str, str]] = []
        try:
            for old, new, index in plan:
                here.link("set", index=index, net_ns_fd=ns_fd, ifname=new)
                done.append((old, new))
        except NetlinkError as err:
            _put_back(there, done)
            raise NvshimError(
                f"netdev {old}: cannot move it: {err.args[-1]}; nothing moved"
            ) from None
    moved = ",".join(f"{o}->{n}" if o != n else o for o, n in done)
    return {"netdevs": moved or "already in place"}


def _put_back(there, done: list[tuple[str, str]]) -> None:
    home = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        for old, new in reversed(done):
            index = _names(there).get(new)
            if index is not None:
                there.link("set", index=index, net_ns_fd=home, ifname=old)
    finally:
        os.close(home)
