"""``nvshim-runtimed``: the command (its options, in the ``nvshim`` command's notation and
error style), then ``nvshim.runtimed.server.serve``."""

from __future__ import annotations

import os
import sys

from nvshim import __version__
from nvshim.errors import NvshimError, error_line, usage_line
from nvshim.runtime import DAEMON_SOCKET
from nvshim.runtimed import TOOL
from nvshim.runtimed.pool import Limits
from nvshim.runtimed.server import serve
from nvshim.trusted import CACHE_DIR


def _command():
    import click

    from nvshim.options import above_zero, option

    default = Limits()

    def seconds(name: str, value: float, text: str):
        return option(name, type=float, default=value, show_default=True, metavar="SECONDS",
                      callback=above_zero, help=text)  # fmt: skip

    @click.command(
        context_settings={"help_option_names": ["-h", "--help"]},
        help=f"nvshim-runtime's resident half: listens on {CACHE_DIR}/{DAEMON_SOCKET}"
        " ($NVSHIM_CACHE_DIR/... when set), where nvshim-runtime looks.",
    )
    @click.version_option(__version__, prog_name=TOOL, message="%(prog)s version %(version)s")
    @option("--verbose", is_flag=True, help="One line per call on stderr.")
    @option("--workers", type=int, default=default.workers, show_default=True, metavar="N",
            help="Workers kept ready.")  # fmt: skip
    @option("--max-workers", type=int, default=default.max_workers, show_default=True,
            metavar="N", help="At most, added while all are busy.")  # fmt: skip
    @seconds("--idle-timeout", default.idle_timeout, "How long an extra worker may idle.")
    @seconds("--call-timeout", default.call_timeout, "How long a call may run.")
    @seconds("--marker-sweep", default.marker_sweep,
             "Time between sweeps of the exec markers of containers that are gone.")  # fmt: skip
    def command(verbose, workers, max_workers, idle_timeout, call_timeout, marker_sweep):
        if not 1 <= workers <= max_workers:
            raise click.BadParameter(
                f"{workers}: must be 1 to --max-workers ({max_workers})", param_hint="'--workers'"
            )
        limits = Limits(workers, max_workers, idle_timeout, call_timeout, marker_sweep)
        serve(os.path.join(CACHE_DIR, DAEMON_SOCKET), verbose, limits)

    return command


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and serve until stopped; returns the exit status (2: usage
    error, 1: a failure, each one line on stderr)."""
    import click

    try:
        _command().main(
            args=sys.argv[1:] if argv is None else argv, prog_name=TOOL, standalone_mode=False
        )
    except click.UsageError as err:
        print(usage_line(TOOL, err.format_message(), TOOL), file=sys.stderr)
        return err.exit_code
    except click.exceptions.Exit as err:
        return err.exit_code
    except NvshimError as err:
        print(error_line(TOOL, err), file=sys.stderr)
        return err.exit_code
    return 0
