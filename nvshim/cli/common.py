"""Options and helpers shared by CLI commands."""

from __future__ import annotations

import functools

import click

from nvshim.config import Config, load_config


def root_options(func):
    """Add ``--driver-root``/``--dev-root`` (defaults from the [host] config table)."""

    @click.option("--driver-root", metavar="DIR", help="Driver root (default: config, then /).")
    @click.option("--dev-root", metavar="DIR", help="Root of /dev, /proc and /sys (default: /).")
    @functools.wraps(func)
    def wrapper(*args, driver_root=None, dev_root=None, **kwargs):
        config = load_config_warn()
        kwargs["config"] = config
        kwargs["driver_root"] = driver_root or config.driver_root
        kwargs["dev_root"] = dev_root or config.dev_root
        return func(*args, **kwargs)

    return wrapper


def load_config_warn() -> Config:
    """Load nvshim's config, printing its warnings to stderr."""
    config = load_config()
    for warning in config.warnings:
        click.echo(f"nvshim: warning: {warning}", err=True)
    return config


def discover(driver_root: str, dev_root: str, quiet: bool = False):
    """Discover the host (always fresh, no cache) and print its warnings unless quiet."""
    from nvshim.host.discover import discover_host

    host = discover_host(driver_root, dev_root)
    if not quiet:
        for warning in host.warnings:
            click.echo(f"nvshim: warning: {warning}", err=True)
    return host
