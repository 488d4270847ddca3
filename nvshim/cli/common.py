"""Options and helpers shared by CLI commands (``option``: nvshim.options)."""

from __future__ import annotations

import functools

import click

from nvshim.console import discover, load_config_warn, roots
from nvshim.engines import ENGINES
from nvshim.options import Option, option

__all__ = [
    "Option",
    "discover",
    "engine_options",
    "load_config_warn",
    "option",
    "root_options",
]


def engine_options(
    help: str,
    env: tuple[str, ...] = ("NVSHIM_ENGINE",),
    config_dest: str = "config",
    where: str = "",
    **defaults: str,
) -> list:
    """``--engine``, ``--engine-config``, ``--socket`` and ``--runtime-name``: the same
    names, metavars and variables in every command that finds an engine (nvidia-ctk's
    ``--runtime`` and ``--config`` work, unshown). ``help``: what ``--engine`` is for;
    ``where``: appended to the file options' help (", a host path"); ``defaults``: each
    option's shown default by its parameter name."""
    return [
        option(
            "--engine",
            "--runtime",  # nvidia-ctk's name
            "engine",
            type=click.Choice(ENGINES),
            hidden_opts=("--runtime",),
            env=env,
            shown_default=defaults.get("engine"),
            help=help,
        ),
        option(
            "--engine-config",
            "--config",  # nvidia-ctk's name
            config_dest,
            metavar="FILE",
            hidden_opts=("--config",),
            env=("NVSHIM_<ENGINE>_CONFIG", "RUNTIME_CONFIG", "<ENGINE>_CONFIG"),
            shown_default=defaults.get("config", "as nvshim configure"),
            help=f"The engine's config file{where}.",
        ),
        option(
            "--socket",
            metavar="PATH",
            env=("NVSHIM_<ENGINE>_SOCKET", "RUNTIME_SOCKET", "<ENGINE>_SOCKET"),
            shown_default=defaults.get("socket", "as nvshim configure"),
            help=f"The engine's socket{where}.",
        ),
        option(
            "--runtime-name",
            metavar="NAME",
            env=("NVSHIM_RUNTIME_NAME", "NVIDIA_RUNTIME_NAME"),
            shown_default="nvshim",
            help="Runtime (handler) name.",
        ),
    ]


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
        kwargs["driver_root"], kwargs["dev_root"] = roots(config, driver_root, dev_root)
        return func(*args, **kwargs)

    return wrapper
