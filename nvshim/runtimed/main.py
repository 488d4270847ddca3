"""``nvshim-runtimed``: the command (its options), then ``nvshim.runtimed.server.serve``."""

from __future__ import annotations

import os
import sys

from nvshim import __version__
from nvshim.errors import NvshimError
from nvshim.runtime import DAEMON_SOCKET
from nvshim.runtimed import TOOL
from nvshim.runtimed.pool import Limits
from nvshim.runtimed.server import serve
from nvshim.trusted import CACHE_DIR


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog=TOOL,
        description=f"nvshim-runtime's resident half: listens on {CACHE_DIR}/{DAEMON_SOCKET} "
        "($NVSHIM_CACHE_DIR/... when set), where nvshim-runtime looks",
    )
    default = Limits()
    parser.add_argument("--version", action="version", version=f"{TOOL} version {__version__}")
    parser.add_argument("--verbose", action="store_true", help="one line per call on stderr")
    parser.add_argument("--workers", type=int, default=default.workers,
                        help="workers kept ready (default %(default)s)")  # fmt: skip
    parser.add_argument("--max-workers", type=int, default=default.max_workers,
                        help="at most, added while all are busy (default %(default)s)")  # fmt: skip
    parser.add_argument("--idle-timeout", type=float, default=default.idle_timeout,
                        help="seconds an extra worker may idle (default %(default)g)")  # fmt: skip
    parser.add_argument("--call-timeout", type=float, default=default.call_timeout,
                        help="seconds a call may run (default %(default)g)")  # fmt: skip
    parser.add_argument("--marker-sweep", type=float, default=default.marker_sweep,
                        help="seconds between sweeps of the exec markers of containers "
                        "that are gone (default %(default)g)")  # fmt: skip
    opts = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if not 1 <= opts.workers <= opts.max_workers:
        parser.error(f"--workers {opts.workers}: must be 1 to --max-workers ({opts.max_workers})")
    for name in ("idle_timeout", "call_timeout", "marker_sweep"):
        if not getattr(opts, name) > 0:
            parser.error(f"--{name.replace('_', '-')} {getattr(opts, name)}: must be above 0")
    limits = Limits(
        opts.workers, opts.max_workers, opts.idle_timeout, opts.call_timeout, opts.marker_sweep
    )
    try:
        serve(os.path.join(CACHE_DIR, DAEMON_SOCKET), opts.verbose, limits)
    except NvshimError as err:
        print(f"{TOOL}: error: {err}", file=sys.stderr)
        return err.exit_code
    return 0
