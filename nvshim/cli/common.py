"""Options and helpers shared by CLI commands (``option``: nvshim.options)."""

from __future__ import annotations

import functools

from nvshim.console import discover, load_config_warn
from nvshim.options import Option, option

__all__ = ["Option", "discover", "load_config_warn", "option", "root_options"]


def root_options(func):
    """Add ``--driver-root``/``--dev-root`` (defaults from the [host] config table)."""

    @option(
        "--driver-root",
        metavar="DIR",
        help="Where the driver's files are.",
        shown_default="the config's host.driver-root, else /",
    )
    @option(
        "--dev-root",
        metavar="DIR",
        help="Root of /dev, /proc and /sys.",
        shown_default="the config's host.dev-root, else /",
    )
    @functools.wraps(func)
    def wrapper(*args, driver_root=None, dev_root=None, **kwargs):
        config = load_config_warn()
        kwargs["config"] = config
        kwargs["driver_root"] = driver_root or config.driver_root
        kwargs["dev_root"] = dev_root or config.dev_root
        return func(*args, **kwargs)

    return wrapper
