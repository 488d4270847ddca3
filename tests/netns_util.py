"""Private network namespaces for tests: real links (veth pairs made with pyroute2) stand
for a simulated host's NIC netdevs, and nothing touches the machine's own links."""

from __future__ import annotations

CLONE_NEWNET = 0x40000000


def in_private_net_ns(fn) -> object:
    """``fn()`` in a forked child inside a new network namespace; its JSON result, or an
    AssertionError carrying the child's failure."""
    from nvshim.rootfs import kernel
    from tests.runc_util import in_forked_child

    reply = in_forked_child(fn, lambda: kernel.unshare(CLONE_NEWNET))
    if "error" in reply:
        raise AssertionError(reply["error"])
    return reply["ok"]


def add_veths(names: list[str]) -> None:
    """A veth pair per name (the peer ``<name>p`` stays here too: ``p`` is never moved)."""
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        for name in names:
            ipr.link("add", ifname=name, kind="veth", peer=f"{name[:13]}p")


def links(ns_path: str | None = None) -> list[str]:
    """Link names of this namespace, or of the one at ``ns_path``."""
    from pyroute2 import IPRoute

    kwargs = {"netns": ns_path} if ns_path else {}
    with IPRoute(**kwargs) as ipr:
        return sorted(link.get_attr("IFLA_IFNAME") for link in ipr.get_links())
