"""``nvshim dra``: the Kubernetes DRA driver (kubelet plugin ``gpu.nvshim.io``)."""

from __future__ import annotations

import json
import os

import click

from nvshim.cli.common import discover, root_options
from nvshim.console import warn
from nvshim.dra import DEFAULT_CDI_DIR, DEFAULT_KUBELET_DIR, DEFAULT_MPS_ROOT
from nvshim.errors import UsageError


def _node(node_name: str | None) -> str:
    node = node_name or os.environ.get("NODE_NAME")
    if not node:
        raise UsageError("--node-name (or NODE_NAME) is required")
    return node


_node_option = click.option(
    "--node-name", metavar="NAME", help="This node's name (default: $NODE_NAME)."
)
_kubeconfig_option = click.option(
    "--kubeconfig",
    metavar="FILE",
    help="Kubeconfig (default: $KUBECONFIG, else the pod's service account).",
)


@click.group()
def dra() -> None:
    """The DRA driver gpu.nvshim.io: ResourceSlices and claim preparation."""


@dra.command()
@_node_option
@_kubeconfig_option
@click.option("--kubelet-dir", default=DEFAULT_KUBELET_DIR, show_default=True, metavar="DIR")
@click.option("--cdi-dir", default=DEFAULT_CDI_DIR, show_default=True, metavar="DIR")
@click.option(
    "--mps-root",
    default=DEFAULT_MPS_ROOT,
    show_default=True,
    metavar="DIR",
    help="Where the claims' MPS daemons keep their pipe, log and shm directories.",
)
@click.option(
    "--host-root",
    default="/",
    show_default=True,
    metavar="DIR",
    help="Where the node's / is mounted (in a pod: /host); CDI specs name the node's paths.",
)
@click.option("--interval", default=5.0, show_default=True, help="Host check period (s).")
@click.option("--resync", default=60.0, show_default=True, help="Slice resync period (s).")
@root_options
def run(
    node_name, kubeconfig, kubelet_dir, cdi_dir, mps_root, host_root, interval, resync, **roots
) -> None:
    """Serve the kubelet plugin and keep this node's ResourceSlices current."""
    from nvshim.dra.kube import connect
    from nvshim.dra.run import run as run_plugin

    run_plugin(
        connect(kubeconfig),
        _node(node_name),
        roots["config"],
        roots["driver_root"],
        roots["dev_root"],
        os.path.abspath(kubelet_dir),
        os.path.abspath(cdi_dir),
        os.path.abspath(mps_root),
        interval,
        resync,
        os.path.abspath(host_root),
    )


@dra.command()
@_node_option
@root_options
def slices(node_name, driver_root, dev_root, config) -> None:
    """Print the ResourceSlices this node would publish (JSON; nothing is sent)."""
    from nvshim.dra.slices import desired_slices, slice_devices

    host = discover(driver_root, dev_root)
    warnings: list[str] = []
    devices = slice_devices(host, config, warnings)
    for warning in warnings:
        warn(warning)
    click.echo(json.dumps(desired_slices(_node(node_name), devices, 1), indent=2))


@dra.command()
@_node_option
@_kubeconfig_option
def withdraw(node_name, kubeconfig) -> None:
    """Delete this node's ResourceSlices of gpu.nvshim.io (uninstall)."""
    from nvshim.dra.kube import connect
    from nvshim.dra.slices import withdraw as withdraw_slices

    node = _node(node_name)
    count = withdraw_slices(connect(kubeconfig), node)
    click.echo(f"nvshim: withdrew {count} ResourceSlice(s) of node {node}", err=True)
