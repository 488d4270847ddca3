"""``nvshim node``: the Kubernetes node installer (option parsing only; see nvshim.node)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click

from nvshim.cli.common import engine_options, option
from nvshim.engines.settings import RESTART_MODES


def _node_options(keep: bool = True) -> Callable[[Callable], Callable]:
    """The installer's options; ``keep``: with ``--keep`` (the commands that uninstall)."""
    engine, config, socket, runtime_name = engine_options(
        "Engine to register with.",
        env=("NVSHIM_ENGINE", "RUNTIME"),
        where=", a host path",
        engine="docker",
    )
    options = [
        engine,
        option(
            "--host-root",
            metavar="DIR",
            env=("NVSHIM_HOST_ROOT", "HOST_ROOT_MOUNT"),
            shown_default="/host",
            help="Where the host's / is mounted.",
        ),
        option(
            "--prefix",
            metavar="DIR",
            env=("NVSHIM_PREFIX", "TOOLKIT_INSTALL_DIR"),
            shown_default="/usr/local/nvshim",
            help="Host directory nvshim is installed in.",
        ),
        config,
        socket,
        runtime_name,
        option(
            "--restart",
            type=click.Choice(RESTART_MODES),
            env=("NVSHIM_RESTART", "RUNTIME_RESTART_MODE"),
            shown_default="containerd signal, docker signal, crio systemd",
            help="How the engine reloads.",
        ),
        option(
            "--ready-file",
            metavar="FILE",
            env="NVSHIM_READY_FILE",
            shown_default="/run/nvshim/node-ready",
            help="Readiness file (written once installed, removed on uninstall).",
        ),
    ]
    if keep:
        options.append(
            option(
                "--keep/--no-keep",
                default=None,
                env="NVSHIM_KEEP_INSTALLED",
                shown_default="no",
                help="On uninstall keep the installed files and CDI spec.",
            )
        )

    def decorate(func: Callable) -> Callable:
        for one in reversed(options):
            func = one(func)
        return func

    return decorate


def _settings(options: dict[str, Any], acting: bool = True):
    """The run's settings; ``acting``: a command that changes the host (not ``show``)."""
    from nvshim.node.env import resolve_node

    return resolve_node(options, acting=acting)


@click.group()
def node() -> None:
    """Install nvshim on a Kubernetes node from a privileged DaemonSet pod.

    Reads the GPU Operator's toolkit variables (RUNTIME, RUNTIME_CONFIG, CONTAINERD_CONFIG,
    HOST_ROOT_MOUNT, TOOLKIT_INSTALL_DIR, CDI_ENABLED, ...) and their NVSHIM_* forms; paths
    are host paths, reached under the host root mount."""


@node.command()
@_node_options()
def run(**options: Any) -> None:
    """Install, report ready, supervise MPS; on SIGTERM/SIGINT uninstall and exit 0
    (NO_DAEMON=true: install and exit)."""
    from nvshim.node.main import run as do_run

    s = _settings(options)
    sys.exit(do_run(s, daemon=not s.no_daemon))


@node.command()
@_node_options(keep=False)
def install(**options: Any) -> None:
    """Install and exit (the host keeps nvshim until `nvshim node uninstall`)."""
    from nvshim.node.main import run as do_run

    sys.exit(do_run(_settings(options), daemon=False))


@node.command()
@_node_options()
def uninstall(**options: Any) -> None:
    """Take back what `install` or `run` did."""
    from nvshim.node.main import uninstall as do_uninstall

    sys.exit(do_uninstall(_settings(options)))


@node.command()
@_node_options()
def show(**options: Any) -> None:
    """Print the resolved settings (JSON) and warnings; change nothing."""
    from nvshim.node.env import describe

    s = _settings(options, acting=False)
    for warning in s.warnings:
        click.echo(f"nvshim: warning: {warning}", err=True)
    click.echo(describe(s))
