"""``nvshim configure`` / ``nvshim unconfigure``: option parsing and printing only."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from nvshim.engines import ENGINES
from nvshim.engines.settings import RESTART_MODES


def _engine_options(func: Callable) -> Callable:
    options = [
        click.option(
            "--runtime",
            "engine",
            type=click.Choice(ENGINES),
            help="Container engine to configure [env NVSHIM_ENGINE].",
        ),
        click.option(
            "--config",
            help="Engine config file [containerd /etc/containerd/config.toml, docker"
            " /etc/docker/daemon.json, crio /etc/crio/crio.conf.d/99-nvshim.toml].",
        ),
        click.option(
            "--drop-in",
            help="containerd 2.1+: put the settings in this file and import it.",
        ),
        click.option("--runtime-name", help="Runtime (handler) name [nvshim]."),
        click.option("--runtime-path", help="nvshim-runtime binary [/usr/bin/nvshim-runtime]."),
        click.option(
            "--set-as-default/--no-set-as-default",
            default=None,
            help="Make it the engine's default runtime.",
        ),
        click.option(
            "--enable-cdi/--no-enable-cdi", default=None, help="Turn on CDI in the engine."
        ),
        click.option("--dry-run", is_flag=True, help="Print a unified diff; write nothing."),
        click.option(
            "--restart",
            type=click.Choice(RESTART_MODES),
            help="How to make the engine reload: none, signal (SIGHUP the socket's owner)"
            " or systemd [none].",
        ),
        click.option("--socket", help="Engine socket for --restart signal."),
        click.option("--containerd-version", hidden=True),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _run(action: Callable, engine: str | None, options: dict[str, Any]) -> None:
    from nvshim.engines.settings import resolve_settings

    settings = resolve_settings(engine, options)
    report = action(settings)
    for line in report.lines:
        click.echo(line)


@click.command()
@_engine_options
def configure(engine: str | None, **options: Any) -> None:
    """Register the nvshim runtime with containerd, Docker or CRI-O."""
    from nvshim.engines.apply import configure as do_configure

    _run(do_configure, engine, options)


@click.command()
@_engine_options
def unconfigure(engine: str | None, **options: Any) -> None:
    """Remove what `nvshim configure` added (the original file when nothing else changed)."""
    from nvshim.engines.apply import unconfigure as do_unconfigure

    _run(do_unconfigure, engine, options)
