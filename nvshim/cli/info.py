"""``nvshim info``: the discovered host as a table, or JSON."""

from __future__ import annotations

import json

import click

from nvshim.cli.common import discover, option, root_options
from nvshim.host.model import Host


@click.command()
@option("--json", "as_json", is_flag=True, help="Print the host model as JSON.")
@option(
    "--topology", is_flag=True, help="Print the GPU-NIC matrix (nvidia-smi topo -m vocabulary)."
)
@root_options
def info(as_json: bool, topology: bool, driver_root: str, dev_root: str, config) -> None:
    """Show the driver, GPUs, MIG devices, device nodes and driver files found."""
    host = discover(driver_root, dev_root, quiet=as_json)
    if topology:
        from nvshim.cli.topology import show_topology

        show_topology(host, as_json)
        return
    shared, error = _shared_devices(config, host)
    if as_json:
        click.echo(json.dumps(host_json(host, shared), indent=2))
    else:
        click.echo(render_host(host, sharing={u: s.label for u, s in shared.items()}))
    if error is not None:  # the host is still shown; the broken file fails the command
        raise error


def host_json(host: Host, shared: dict) -> dict:
    """The host model as JSON, each GPU and MIG device with its ``sharing``: ``mode``
    (``none``, ``mps`` or ``timeSlicing``) and ``replicas``."""

    def sharing(uuid: str) -> dict:
        share = shared.get(uuid)
        return {"mode": share.mode, "replicas": share.replicas} if share else {"mode": "none"}

    data = host.to_dict()
    for gpu in data["gpus"]:
        gpu["sharing"] = sharing(gpu["uuid"])
        for mig in gpu["mig_devices"]:
            mig["sharing"] = sharing(mig["uuid"])
    return data


def _shared_devices(config, host: Host):
    """Shared devices by UUID from the sharing config, and its error (or None)."""
    from nvshim.errors import NvshimError
    from nvshim.mps.sharing import check_sharing, sharing_for

    try:
        for warning in check_sharing(config):
            click.echo(f"nvshim: warning: sharing config: {warning}", err=True)
        return sharing_for(config, host), None
    except NvshimError as err:
        return {}, err  # it names the file


def _gib(nbytes: int) -> str:
    return f"{nbytes / 1024**3:.1f} GiB"


def render_host(host: Host, sharing: dict[str, str] | None = None) -> str:
    """A readable multi-line summary of the host."""
    sharing = sharing or {}
    lines = [
        f"Driver {host.driver_version}  CUDA {host.cuda_version}  "
        f"driver root {host.driver_root}  dev root {host.dev_root}",
        "",
    ]
    rows = [("IDX", "NAME", "UUID", "PCI", "MEM", "CC", "ARCH", "NUMA", "MIG", "NODE", "SHARING")]
    for g in host.gpus:
        rows.append(
            (
                str(g.index),
                g.name,
                g.uuid,
                g.pci_bus_id,
                _gib(g.memory_total),
                g.compute_capability,
                g.architecture,
                "-" if g.numa_node is None else str(g.numa_node),
                "on" if g.mig_enabled else "off",
                g.node.path if g.node else "-",
                sharing.get(g.uuid, "none"),
            )
        )
        for m in g.mig_devices:
            rows.append(
                (
                    f"  {m.name_index}",
                    f"MIG {m.profile} (gi {m.gi}, ci {m.ci})",
                    m.uuid,
                    "",
                    _gib(m.memory_total),
                    "",
                    "",
                    "",
                    "",
                    ",".join(n.path.rsplit("/", 1)[1] for n in (m.gi_cap, m.ci_cap) if n),
                    sharing.get(m.uuid, "none"),
                )
            )
    lines += _table(rows)
    lines.append("")
    lines.append(
        "Control nodes: " + ", ".join(f"{n.path} ({n.major}:{n.minor})" for n in host.control_nodes)
    )
    by_kind: dict[str, int] = {}
    for f in host.files:
        by_kind[f.kind] = by_kind.get(f.kind, 0) + 1
    lines.append("Driver files: " + ", ".join(f"{n} {k}" for k, n in sorted(by_kind.items())))
    for w in host.warnings:
        lines.append(f"Warning: {w}")
    return "\n".join(lines)


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
