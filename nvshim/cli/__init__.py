"""The ``nvshim`` command line: a thin, lazily loaded front over the library modules."""

from __future__ import annotations

import importlib
import os
import sys

import click

from nvshim import __version__
from nvshim.console import guarded
from nvshim.errors import UsageError
from nvshim.options import option

# name -> "module:attribute"; each module is imported only when its command runs.
COMMANDS = {
    "info": ("nvshim.cli.info:info", "Show the discovered GPU host."),
    "cdi": ("nvshim.cli.cdi:cdi", "Generate, list and validate CDI specs."),
    "config": ("nvshim.cli.config:config", "Show the effective nvshim configuration."),
    "configure": ("nvshim.cli.configure:configure", "Register nvshim with a container engine."),
    "unconfigure": ("nvshim.cli.configure:unconfigure", "Remove nvshim from a container engine."),
    "install": ("nvshim.cli.install:install", "Install the runtime and hook launchers."),
    "mps": ("nvshim.cli.mps:mps", "Run and inspect the per-GPU MPS control daemons."),
    "node": ("nvshim.cli.node:node", "Install nvshim on a Kubernetes node (DaemonSet entrypoint)."),
    "dra": ("nvshim.cli.dra:dra", "Kubernetes DRA driver gpu.nvshim.io (kubelet plugin)."),
    "doctor": ("nvshim.cli.doctor:doctor", "Check whether GPU pods can run on this node."),
    "exporter": ("nvshim.cli.exporter:exporter", "Serve the node's Prometheus metrics."),
    "system": ("nvshim.cli.system:system", "Host setup: create missing /dev/nvidia* nodes."),
    # nvidia-ctk's spelling: `nvshim runtime configure` (not listed in --help)
    "runtime": ("nvshim.cli.configure:runtime", "Same as configure / unconfigure."),
}
HIDDEN = ("runtime",)


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use (keeps --help fast)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for name in COMMANDS if name not in HIDDEN)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        target = COMMANDS[name][0]
        module_name, attr = target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                return None
            raise
        return getattr(module, attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][1]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="nvshim", message="%(prog)s version %(version)s")
@option("-d", "--debug", is_flag=True, env="NVSHIM_DEBUG", help="Tracebacks on internal errors.")
@option("--quiet", is_flag=True, help="Print warnings and errors only.")
@click.pass_context
def cli(ctx: click.Context, debug: bool, quiet: bool) -> None:
    """nvshim: give containers exactly the GPUs they were given, and nothing more."""
    if debug:
        os.environ["NVSHIM_DEBUG"] = "1"
    ctx.meta["nvshim.quiet"] = quiet


def main(argv: list[str] | None = None) -> None:
    """Run the CLI, turning NvshimError into one line and an exit code (``nvshim.entry``
    is the console entry point: it runs ``cdi generate`` itself, the rest here)."""
    guarded(_click_main, argv)


def _click_main(argv: list[str] | None) -> None:
    try:
        cli.main(args=argv, prog_name="nvshim", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("nvshim: aborted", err=True)
        sys.exit(1)
    except getattr(click.exceptions, "NoArgsIsHelpError", ()) as err:  # a group alone: its help
        err.show()
        sys.exit(err.exit_code)
    except click.UsageError as err:
        from nvshim.errors import usage_line

        command = err.ctx.command_path if err.ctx is not None else _command_path(argv)
        click.echo(usage_line("nvshim", err.format_message(), command), err=True)
        sys.exit(err.exit_code)
    except click.ClickException as err:
        err.show()
        sys.exit(err.exit_code)
    except click.exceptions.Exit as err:
        sys.exit(err.exit_code)
    except UsageError as err:  # one a command raised: its help, as the parser's errors
        err.help_command = err.help_command or _command_path(argv)
        raise


def _command_path(argv: list[str] | None) -> str:
    """``nvshim cdi generate`` for a command line (click leaves some errors without it)."""
    cmd: click.Command = cli
    path = ["nvshim"]
    for word in sys.argv[1:] if argv is None else argv:
        if not isinstance(cmd, click.Group) or word.startswith("-"):
            continue
        sub = cmd.get_command(click.Context(cmd), word)
        if sub is None:
            break
        path.append(word)
        cmd = sub
    return " ".join(path)
