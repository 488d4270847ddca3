"""``nvshim info --topology``: the GPU-NIC matrix, or its JSON form."""

from __future__ import annotations

import json

import click

from nvshim.host.model import Host


def show_topology(host: Host, as_json: bool) -> None:
    """Print the topology of ``host`` (sysfs, NVML for NVLink, netlink for netdev state)."""
    from nvshim.host import topology as tp
    from nvshim.host.rdma import netlink_links

    counts, warnings = tp.nvlink_counts(host.driver_root)
    topo = tp.discover_topology(host, counts)
    topo.warnings[:0] = warnings
    links = netlink_links()
    if as_json:
        click.echo(json.dumps(tp.to_dict(topo, links), indent=2))
    else:
        click.echo(tp.render(topo, links))
