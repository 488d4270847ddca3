"""``nvshim configure`` / ``nvshim unconfigure``: option parsing and printing only."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from nvshim.cli.common import engine_options, option
from nvshim.engines.settings import CGROUP_DRIVERS, RESTART_MODES

ALIASES = {  # nvidia-ctk option -> nvshim option
    "alias_runtime_name": "runtime_name",
    "alias_set_as_default": "set_as_default",
    "alias_enable_cdi": "enable_cdi",
    "alias_drop_in": "drop_in",
}


# options unconfigure has too: those that find nvshim's entry and make the engine reload
_BOTH = True


def _engine_options(configure: bool) -> Callable[[Callable], Callable]:
    """The options of ``configure`` (all) or ``unconfigure`` (those marked ``_BOTH``)."""
    engine, config, socket, runtime_name = engine_options(
        "Container engine to configure.",
        config="containerd /etc/containerd/config.toml, docker /etc/docker/daemon.json,"
        " crio /etc/crio/crio.conf.d/99-nvshim.toml",
        socket="the engine's usual socket; only --restart signal uses it",
    )
    options = [
        (_BOTH, engine),
        (_BOTH, config),
        (_BOTH, option(
            "--drop-in",
            metavar="FILE",
            env="NVSHIM_CONTAINERD_DROP_IN",
            help="containerd 2.1+: put the settings in this file and import it.",
        )),
        (_BOTH, runtime_name),
        (_BOTH, option(
            "--runtime-path",
            metavar="FILE",
            env="NVSHIM_RUNTIME_PATH",
            shown_default="/usr/bin/nvshim-runtime",
            help="The nvshim-runtime binary.",
        )),
        (False, option(
            "--set-as-default/--no-set-as-default",
            default=None,
            env=("NVSHIM_SET_AS_DEFAULT", "NVIDIA_RUNTIME_SET_AS_DEFAULT"),
            shown_default="no",
            help="Make it the engine's default runtime.",
        )),
        (False, option(
            "--enable-cdi/--no-enable-cdi",
            default=None,
            env=("NVSHIM_ENABLE_CDI", "RUNTIME_ENABLE_CDI"),
            shown_default="no",
            help="Turn on CDI in the engine.",
        )),
        (_BOTH, option(
            "--dry-run", is_flag=True, help="Print a unified diff; write nothing."
        )),
        (_BOTH, option(
            "--restart",
            type=click.Choice(RESTART_MODES),
            env=("NVSHIM_RESTART", "RUNTIME_RESTART_MODE"),
            shown_default="none",
            help="How to make the engine reload: none, signal (SIGHUP the socket's owner)"
            " or systemd.",
        )),
        (_BOTH, socket),
        (False, option(
            "--config-source",
            env=("NVSHIM_CONFIG_SOURCE", "RUNTIME_CONFIG_SOURCES"),
            shown_default="file",
            help="Where to read the default runtime's settings from: command (containerd"
            " config dump), file, or both in order.",
        )),
        (False, option(
            "--runtime-config-override",
            metavar="JSON",
            env=("NVSHIM_RUNTIME_CONFIG_OVERRIDE", "RUNTIME_CONFIG_OVERRIDE"),
            help="JSON object merged into the runtime's options, e.g."
            " '{\"SystemdCgroup\": true}'.",
        )),
        (False, option(
            "--take-over/--no-take-over",
            default=None,
            env="NVSHIM_TAKE_OVER",
            shown_default="no",
            help="Re-point an existing entry of --runtime-name that runs"
            " nvidia-container-runtime at nvshim (unconfigure gives it back).",
        )),
        (_BOTH, option(
            "--check",
            is_flag=True,
            help="Write nothing; exit 1 when a change is pending (drift), 0 when not.",
        )),
        (_BOTH, click.option("--containerd-version", hidden=True)),
        (_BOTH, click.option("--cgroup-driver", type=click.Choice(CGROUP_DRIVERS), hidden=True)),
        # nvidia-ctk's spellings of the same options
        (_BOTH, click.option("--nvidia-runtime-name", "alias_runtime_name", hidden=True)),
        (False, click.option(
            "--nvidia-set-as-default/--no-nvidia-set-as-default",
            "alias_set_as_default",
            default=None,
            hidden=True,
        )),
        (False, click.option(
            "--cdi.enabled", "alias_enable_cdi", is_flag=True, default=None, hidden=True
        )),
        (_BOTH, click.option("--drop-in-config", "alias_drop_in", hidden=True)),
    ]  # fmt: skip

    def decorate(func: Callable) -> Callable:
        for both, one in reversed(options):
            if configure or both:
                func = one(func)
        return func

    return decorate


def _run(action: Callable, engine: str | None, options: dict[str, Any]) -> None:
    from nvshim.engines.settings import resolve_settings

    for alias, name in ALIASES.items():
        value = options.pop(alias, None)
        if value is not None and options.get(name) is None:
            options[name] = value
    check = options.pop("check", False)
    if check:
        options["dry_run"] = True
    settings = resolve_settings(engine, options)
    report = action(settings)
    quiet = click.get_current_context().find_root().meta.get("nvshim.quiet", False)
    for line in report.lines:
        if line.startswith("warning: "):  # stderr: never inside a diff on stdout
            click.echo(f"nvshim: {line}", err=True)
        elif not quiet or (check and report.pending):
            click.echo(line)
    if check and report.pending:
        raise SystemExit(1)


@click.command()
@_engine_options(configure=True)
def configure(engine: str | None, **options: Any) -> None:
    """Register the nvshim runtime with containerd, Docker or CRI-O."""
    from nvshim.engines.apply import configure as do_configure

    _run(do_configure, engine, options)


@click.command()
@_engine_options(configure=False)
def unconfigure(engine: str | None, **options: Any) -> None:
    """Remove what `nvshim configure` added (the original file when nothing else changed)."""
    from nvshim.engines.apply import unconfigure as do_unconfigure

    _run(do_unconfigure, engine, options)


@click.group(hidden=True)
def runtime() -> None:
    """nvidia-ctk's `runtime configure`: the same as `nvshim configure`."""


runtime.add_command(configure, "configure")
runtime.add_command(unconfigure, "unconfigure")
