"""``nvshim-runtime``: an OCI runtime that wraps runc and injects GPUs at create.

Keep this module free of imports: the pass-through path loads it for every runc call.
The defaults it shares with the config, and its tests' fault points, are in
``nvshim.defaults``.
"""

FRONT_CACHE = "runtime-front"  # the low-level runtime, for the sh front (passthrough.py)
DAEMON_SOCKET = "runtime.sock"  # nvshim-runtimed listens here, in the cache directory
MARKER_DIR = "exec"  # one file per container id nvshim prepared (markers.py)


def exit_status(status: int) -> int:
    """A ``waitpid`` status as a shell reports it: the exit code, 128+N if killed by N."""
    import posix  # built in, loaded at start-up

    code = posix.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code
