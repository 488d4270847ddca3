"""Options and helpers shared by CLI commands."""

from __future__ import annotations

import functools

import click

from nvshim.console import discover, load_config_warn

__all__ = ["discover", "load_config_warn", "root_options"]


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
