"""``nvshim node``: the Kubernetes node installer (option parsing only; see nvshim.node)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click


def _node_options(func: Callable) -> Callable:
    options = [
        click.option(
            "--runtime",
            "engine",
            type=click.Choice(["containerd", "docker", "crio"]),
            help="Engine to register with [env RUNTIME; docker].",
        ),
        click.option(
            "--host-root",
            metavar="DIR",
            help="Where the host's / is mounted [HOST_ROOT_MOUNT; /host].",
        ),
        click.option(
            "--prefix",
            metavar="DIR",
            help="Host directory nvshim is installed in [TOOLKIT_INSTALL_DIR; /usr/local/nvshim].",
        ),
        click.option("--config", help="Engine config, a host path [RUNTIME_CONFIG]."),
        click.option("--socket", help="Engine socket, a host path [RUNTIME_SOCKET]."),
        click.option(
            "--runtime-name", help="Runtime (handler) name [NVIDIA_RUNTIME_NAME; nvshim]."
        ),
        click.option(
            "--restart",
            type=click.Choice(["none", "signal", "systemd"]),
            help="How the engine reloads [RUNTIME_RESTART_MODE].",
        ),
        click.option("--ready-file", metavar="FILE", help="Readiness file [NVSHIM_READY_FILE]."),
        click.option(
            "--keep/--no-keep",
            default=None,
            help="On uninstall keep the installed files and CDI spec [NVSHIM_KEEP_INSTALLED].",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _settings(options: dict[str, Any]):
    from nvshim.node.env import resolve_node

    return resolve_node(options)


@click.group()
def node() -> None:
    """Install nvshim on a Kubernetes node from a privileged DaemonSet pod.

    Reads the GPU Operator's toolkit variables (RUNTIME, RUNTIME_CONFIG, CONTAINERD_CONFIG,
    HOST_ROOT_MOUNT, TOOLKIT_INSTALL_DIR, CDI_ENABLED, ...) and their NVSHIM_* forms; paths
    are host paths, reached under the host root mount."""


@node.command()
@_node_options
def run(**options: Any) -> None:
    """Install, report ready, supervise MPS; on SIGTERM/SIGINT uninstall and exit 0
    (NO_DAEMON=true: install and exit)."""
    from nvshim.node.main import run as do_run

    s = _settings(options)
    sys.exit(do_run(s, daemon=not s.no_daemon))


@node.command()
@_node_options
def install(**options: Any) -> None:
    """Install and exit (the host keeps nvshim until `nvshim node uninstall`)."""
    from nvshim.node.main import run as do_run

    sys.exit(do_run(_settings(options), daemon=False))


@node.command()
@_node_options
def uninstall(**options: Any) -> None:
    """Take back what `install` or `run` did."""
    from nvshim.node.main import uninstall as do_uninstall

    sys.exit(do_uninstall(_settings(options)))


@node.command()
@_node_options
def show(**options: Any) -> None:
    """Print the resolved settings (JSON) and warnings; change nothing."""
    from nvshim.node.env import describe

    s = _settings(options)
    for warning in s.warnings:
        click.echo(f"nvshim: warning: {warning}", err=True)
    click.echo(describe(s))
