"""Options and helpers shared by CLI commands, and the one help notation of every option:
the description, then one bracket ``[env var: NAME, ...; default: VALUE]`` (click's own
layout, docs/commands.md "Conventions")."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import click

from nvshim.console import discover, load_config_warn

__all__ = ["Option", "discover", "load_config_warn", "option", "root_options"]


class Option(click.Option):
    """A click option whose help ends in ``[env var: ...; default: ...]``.

    ``env``: the variables the setting is read from when the option is not given (shown
    only; the command's resolver reads them). ``default``: a real default, shown when
    ``show_default``; ``shown_default``: the words for a default resolved later (from the
    config, per engine). ``hidden_opts``: spellings that work but are not shown (another
    tool's name for the option)."""

    def __init__(
        self,
        *args,
        env: str | Sequence[str] = (),
        shown_default: str | None = None,
        hidden_opts: Sequence[str] = (),
        **kwargs,
    ) -> None:
        self.show_default_value = bool(kwargs.pop("show_default", False))
        super().__init__(*args, **kwargs)
        self.env_names = (env,) if isinstance(env, str) else tuple(env)
        self.shown_default = shown_default
        self.hidden_opts = tuple(hidden_opts)

    def help_extra(self) -> str:
        """The bracket after the description (empty when there is nothing to say)."""
        items = []
        if self.env_names:
            items.append("env var: " + ", ".join(self.env_names))
        default = self.shown_default
        if default is None and self.show_default_value and self.default is not None:
            default = str(self.default)
        if default is not None:
            items.append(f"default: {default}")
        return f"[{'; '.join(items)}]" if items else ""

    def get_error_hint(self, ctx: click.Context) -> str:
        return " / ".join(f"'{o}'" for o in self.opts if o not in self.hidden_opts)

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        saved = self.opts, self.help
        extra = self.help_extra()
        self.opts = [o for o in self.opts if o not in self.hidden_opts]
        self.help = f"{self.help}  {extra}" if extra and self.help else (self.help or extra)
        try:
            return super().get_help_record(ctx)
        finally:
            self.opts, self.help = saved


def option(*decls: str, **kwargs) -> Callable[[Callable], Callable]:
    """``click.option`` with the help notation of :class:`Option`."""
    return click.option(*decls, cls=Option, **kwargs)


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
