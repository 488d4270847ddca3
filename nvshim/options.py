"""The one help notation of every option of nvshim's click commands (``nvshim``,
``nvshim-runtimed``): the description, then one bracket ``[env var: NAME, ...; default:
VALUE]`` (click's own layout; docs/commands.md "Conventions")."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import click
from click.core import ParameterSource

__all__ = ["Option", "above_zero", "option", "zero_or_more"]

PATH_METAVARS = ("DIR", "FILE", "PATH")
EMPTY_PATH = "empty path"  # what nvshim.errors.empty_path says, click's way


class Option(click.Option):
    """A click option whose help ends in ``[env var: ...; default: ...]``.

    ``env``: the variables the setting is read from when the option is not given (shown
    only; the command's resolver reads them). ``default``: a real default, shown when
    ``show_default``; ``shown_default``: the words for a default resolved later (from the
    config, per engine). ``hidden_opts``: spellings that work but are not shown (another
    tool's name for the option). ``empty_ok``: an empty path given means something (its
    help says what); else it is refused."""

    def __init__(
        self,
        *args,
        env: str | Sequence[str] = (),
        shown_default: str | None = None,
        hidden_opts: Sequence[str] = (),
        empty_ok: bool = False,
        **kwargs,
    ) -> None:
        self.show_default_value = bool(kwargs.pop("show_default", False))
        super().__init__(*args, **kwargs)
        self.env_names = (env,) if isinstance(env, str) else tuple(env)
        self.shown_default = shown_default
        self.hidden_opts = tuple(hidden_opts)
        self.empty_ok = empty_ok

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

    def process_value(self, ctx: click.Context, value):
        """The value, refused when it is an empty path given on the command line (an
        option whose metavar names a path: ``--cdi-dir ""`` is a mistake, not a default)."""
        value = super().process_value(ctx, value)
        given = ctx.get_parameter_source(self.name) == ParameterSource.COMMANDLINE
        if given and self.metavar in PATH_METAVARS and not self.empty_ok:
            if any(v == "" for v in (value if self.multiple else (value,))):
                raise click.BadParameter(EMPTY_PATH, ctx=ctx, param=self)
        return value

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


def above_zero(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """A click callback: a number of seconds above 0 (nan, which no wait honours, too)."""
    return _seconds(ctx, param, value, "above 0", value is None or value > 0)


def zero_or_more(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """A click callback: a number of seconds, 0 or more (nan refused too)."""
    return _seconds(ctx, param, value, "0 or more", value is None or value >= 0)


def _seconds(ctx, param, value: float | None, bound: str, within: bool) -> float | None:
    """``value`` unless it is out of ``bound`` or infinite (inf is "never", not a wait)."""
    if not within:
        raise click.BadParameter(f"{value:g}: must be {bound}", ctx=ctx, param=param)
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"{value:g}: must be finite", ctx=ctx, param=param)
    return value
