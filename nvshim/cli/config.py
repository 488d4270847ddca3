"""``nvshim config show``."""

from __future__ import annotations

import click


@click.group()
def config() -> None:
    """Inspect nvshim's configuration (/etc/nvshim/config.toml, or $NVSHIM_CONFIG)."""


@config.command()
def show() -> None:
    """Print the effective configuration (defaults overlaid with the file)."""
    from nvshim.cli.common import load_config_warn
    from nvshim.config import render_config

    click.echo(render_config(load_config_warn()), nl=False)
