"""``nvshim-runtime``'s Python half. The sh front (``nvshim.launch``) sends here only
``create``, ``run``, ``exec`` of containers nvshim prepared, and whatever it cannot
classify; everything else it execs into the low-level runtime itself. Those calls reach
``run`` here through ``nvshim.runtime.client``: in that process, or in
``nvshim-runtimed`` when it runs.

Here the command line is parsed exactly as runc parses it (``nvshim.runtime.args``):
a well-formed create/run gets its bundle edited, an exec of a prepared container gets
the enforced variables, and every call then execs the low-level runtime (a delete of a
prepared container runs it as a child, then drops its exec marker).
"""

from __future__ import annotations

import os
import sys

from nvshim import __version__

TOOL = "nvshim-runtime"

TYPE_CHECKING = False  # typing costs ~5 ms at import, per container
if TYPE_CHECKING:
    from nvshim.runtime.lowlevel import LowLevel


def _report(args, message: str) -> None:
    """An error the engine will show: stderr, and runc's JSON log when one is configured."""
    print(f"{TOOL}: error: {message}", file=sys.stderr)
    if args is not None and args.log:
        import time

        from nvshim import fastjson

        record = {
            "level": "error",
            "msg": f"{TOOL}: {message}",
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        line = fastjson.dumps(record) if args.log_format == "json" else record["msg"]
        from nvshim.log import open_log

        try:
            fd = open_log(args.log)  # no symlink followed, no FIFO waited on
            try:
                os.write(fd, (line + "\n").encode("utf-8", "replace"))
            finally:
                os.close(fd)
        except OSError:
            pass


def run(argv: list[str], lowlevel: LowLevel) -> int | None:
    """Do the call ``argv`` (runc's command line), starting the low-level runtime through
    ``lowlevel``; the exit status, or what ``lowlevel.exec`` returns."""
    args, keep = None, []
    try:
        from nvshim.runtime.args import parse_runc_args

        args = parse_runc_args(argv)
        if args.action in ("create", "run"):
            from nvshim.runtime.create import prepare_bundle
            from nvshim.runtime.passthrough import resolve

            bundle = args.bundle or os.getcwd()
            prepared = prepare_bundle(
                bundle, args.container_id, args.action == "create", args.globals.get("root")
            )
            runtime = resolve(prepared.config, prepared.runtime)
            if prepared.steps or prepared.mounts:
                from nvshim.runtime.finish import create_and_finish

                return create_and_finish(runtime, argv, args, prepared, lowlevel)
        else:
            from nvshim.runtime.passthrough import resolve_and_remember

            runtime = resolve_and_remember()
            if args.action == "exec":
                from nvshim.runtime.execenv import rewrite_exec

                argv, keep = rewrite_exec(args, argv, runtime)
            elif args.action == "delete":
                # as the sh front does: the exec marker goes once runc deleted the container
                from nvshim.runtime.markers import delete_unmarking
                from nvshim.trusted import CACHE_DIR

                status = delete_unmarking(CACHE_DIR, runtime, argv, args.container_id, lowlevel)
                if status is not None:
                    return status
            elif args.action == "version":
                sys.stdout.write(f"{TOOL} version {__version__}\n")
                sys.stdout.flush()
    except Exception as err:  # noqa: BLE001 - every failure must be one line, never a traceback
        from nvshim.errors import one_line

        message = one_line(err)
        _report(args, message)
        return 1
    return lowlevel.exec(runtime, argv, keep)


def main(argv: list[str] | None = None) -> int | None:
    """The call in this process (no daemon, or ``nvshim-runtimed`` declined it)."""
    from nvshim.runtime.lowlevel import LowLevel

    return run(list(sys.argv[1:] if argv is None else argv), LowLevel())
