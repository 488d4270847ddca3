"""``nvshim-runtime`` entry point. Everything but ``create``/``run`` is exec'd into the
low-level runtime unchanged; those two first edit the bundle's ``config.json``.

Imports stay minimal on the pass-through path (it runs for every runc call an engine
makes): built-in modules only (``posix``, ``sys``) and the runtime from a cache
(``nvshim.runtime.passthrough``) until a create is seen.
"""

from __future__ import annotations

import posix
import sys

TOOL = "nvshim-runtime"


def _report(args, message: str) -> None:
    """An error the engine will show: stderr, and runc's JSON log when one is configured."""
    print(f"{TOOL}: error: {message}", file=sys.stderr)
    if args is not None and args.log:
        import json
        import time

        record = {
            "level": "error",
            "msg": f"{TOOL}: {message}",
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        line = json.dumps(record) if args.log_format == "json" else record["msg"]
        try:
            with open(args.log, "a", encoding="utf-8") as fh:
                fh.write(line + "\n")
        except OSError:
            pass


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = None
    try:
        from nvshim.runtime.args import parse_runc_args

        args = parse_runc_args(argv)
        if args.command in ("create", "run"):
            from nvshim.runtime.create import prepare_bundle
            from nvshim.runtime.lowlevel import resolve

            config = prepare_bundle(args.bundle or posix.getcwd(), args.container_id or "")
            runtime = resolve(config)
        else:
            runtime = _passthrough_runtime()
    except Exception as err:  # noqa: BLE001 - every failure must be one line, never a traceback
        from nvshim.errors import NvshimError

        message = str(err) if isinstance(err, NvshimError) else f"{type(err).__name__}: {err}"
        _report(args, message)
        return 1
    posix.execv(runtime, [runtime, *argv])
    return 127  # not reached


def _passthrough_runtime() -> str:
    """The low-level runtime for a call nvshim does not edit: cached, else resolved from
    the configuration and remembered (when the file did not change meanwhile)."""
    from nvshim.runtime.passthrough import cached_runtime, config_file, entry_key, remember

    path = config_file()
    runtime, key = cached_runtime(path)
    if runtime is None:
        from nvshim.runtime.lowlevel import resolve

        runtime = resolve(None)
        if entry_key(path) == key:
            remember(key, runtime)
    return runtime
