"""``nvshim dra``: the Kubernetes DRA driver (kubelet plugin ``gpu.nvshim.io``)."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

import click

from nvshim.cli.common import discover, option, root_options
from nvshim.console import warn
from nvshim.dra import DEFAULT_CDI_DIR, DEFAULT_KUBELET_DIR, DEFAULT_MPS_ROOT
from nvshim.errors import UsageError
from nvshim.options import above_zero

if TYPE_CHECKING:
    from nvshim.node.hostview import RootPairs


def _node(node_name: str | None) -> str:
    node = node_name or os.environ.get("NODE_NAME")
    if not node:
        raise UsageError("--node-name (or NODE_NAME) is required")
    return node


_node_option = option("--node-name", metavar="NAME", env="NODE_NAME", help="This node's name.")
_kubeconfig_option = option(
    "--kubeconfig",
    metavar="FILE",
    env="KUBECONFIG",
    shown_default="the pod's service account",
    help="Kubeconfig.",
)


@click.group()
def dra() -> None:
    """The DRA driver gpu.nvshim.io: ResourceSlices and claim preparation."""


@dra.command()
@_node_option
@_kubeconfig_option
@option(
    "--kubelet-dir",
    default=DEFAULT_KUBELET_DIR,
    show_default=True,
    metavar="DIR",
    help="The kubelet's root: its plugins_registry and plugins directories are under it.",
)
@option(
    "--cdi-dir",
    default=DEFAULT_CDI_DIR,
    show_default=True,
    metavar="DIR",
    help="Where each prepared claim's transient CDI spec is written.",
)
@option(
    "--mps-root",
    default=DEFAULT_MPS_ROOT,
    show_default=True,
    metavar="DIR",
    help="Where the claims' MPS daemons keep their pipe, log and shm directories.",
)
@option(
    "--host-root",
    default="/",
    show_default=True,
    metavar="DIR",
    help="Where the node's / is mounted (in a pod: /host); CDI specs name the node's paths.",
)
@option(
    "--interval",
    default=5.0,
    show_default=True,
    metavar="SECONDS",
    callback=above_zero,
    help="How often the host is checked.",
)
@option(
    "--resync",
    default=60.0,
    show_default=True,
    metavar="SECONDS",
    callback=above_zero,
    help="How often the slices are resent.",
)
@root_options
def run(
    node_name, kubeconfig, kubelet_dir, cdi_dir, mps_root, host_root, interval, resync, **roots
) -> None:
    """Serve the kubelet plugin and keep this node's ResourceSlices current."""
    from nvshim.dra.kube import connect
    from nvshim.dra.run import run as run_plugin

    node = _node(node_name)  # the command line's mistakes before the kubeconfig's
    driver_root, dev_root, view = _roots(os.path.abspath(host_root), roots)
    run_plugin(
        connect(kubeconfig),
        node,
        roots["config"],
        driver_root,
        dev_root,
        os.path.abspath(kubelet_dir),
        os.path.abspath(cdi_dir),
        os.path.abspath(mps_root),
        interval,
        resync,
        os.path.abspath(host_root),
        view,
    )


def _roots(host_root: str, roots: dict) -> tuple[str, str, RootPairs | None]:
    """Where discovery runs, and (here, on the node) of the driver root and dev root for
    the claims' CDI specs (None: under ``--host-root``, moved to /).

    ``--driver-root``/``--dev-root`` as given (paths here); else, in a pod (``--host-root``)
    or with the node installer's variables set (:func:`nvshim.node.env.driver_roots`: node
    paths under the host root, or where ``DRIVER_ROOT_CTR_PATH``/``DEV_ROOT_CTR_PATH`` say
    they are seen here); else the config's ``[host]`` roots."""
    from nvshim.node.env import ROOT_SETTINGS, VARS, driver_roots

    ctx = click.get_current_context()
    given = {
        name: ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE
        for name in ("driver_root", "dev_root")
    }
    if all(given.values()):
        return roots["driver_root"], roots["dev_root"], None
    names = [name for setting in ROOT_SETTINGS for name in VARS[setting]]
    if host_root == "/" and not any(os.environ.get(n) for n in names):
        return roots["driver_root"], roots["dev_root"], None
    found = driver_roots(host_root, need=True)
    moved = (host_root, "/")  # a root given on the command line: under --host-root
    (driver_pair, dev_pair) = found.pairs
    return (
        roots["driver_root"] if given["driver_root"] else found.driver_root_ctr,
        roots["dev_root"] if given["dev_root"] else found.dev_root_ctr,
        (moved if given["driver_root"] else driver_pair, moved if given["dev_root"] else dev_pair),
    )


@dra.command()
@_node_option
@root_options
def slices(node_name, driver_root, dev_root, config) -> None:
    """Print the ResourceSlices this node would publish (JSON; nothing is sent)."""
    from nvshim.dra.slices import desired_slices, slice_devices

    node = _node(node_name)
    host = discover(driver_root, dev_root)
    warnings: list[str] = []
    devices = slice_devices(host, config, warnings)
    for warning in warnings:
        warn(warning)
    click.echo(json.dumps(desired_slices(node, devices, 1), indent=2))


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
