"""``nvshim config show``."""

from __future__ import annotations

import click


@click.group()
def config() -> None:
    """Inspect nvshim's configuration (/etc/nvshim/config.toml, or $NVSHIM_CONFIG)."""


@config.command()
def show() -> None:
    """Print the effective configuration (defaults overlaid with the file), then check the
    sharing file it names (exit 1 naming the file and key when it is bad)."""
    from nvshim.cli.common import load_config_warn
    from nvshim.config import render_config
    from nvshim.mps.sharing import check_sharing

    config = load_config_warn()
    click.echo(render_config(config), nl=False)
    warnings = check_sharing(config)  # its errors name the file
    for warning in warnings:
        click.echo(f"nvshim: warning: sharing config: {warning}", err=True)
