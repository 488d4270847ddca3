"""``nvshim-runtime``: an OCI runtime that wraps runc and injects GPUs at create.

Keep this module free of imports: the pass-through path loads it for every runc call.
"""

DEFAULT_RUNTIMES = ("runc", "crun")
DEFAULT_CONFIG = "/etc/nvshim/config.toml"  # $NVSHIM_CONFIG names another
FRONT_CACHE = "runtime-front"  # the low-level runtime, for the sh front (passthrough.py)
DAEMON_SOCKET = "runtime.sock"  # nvshim-runtimed listens here, in the cache dir (daemon.py)
MARKER_DIR = "exec"  # one empty file per container id nvshim prepared (create.py)


def exit_status(status: int) -> int:
    """A ``waitpid`` status as a shell reports it: the exit code, 128+N if killed by N."""
    import posix  # built in, loaded at start-up

    code = posix.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


# Tests' fault injection (tests/test_runtime_faults.py): read once, from the environment
# nvshim-runtime or nvshim-runtimed started with (an engine's, the unit's), never from a
# call's (a worker takes a call's environment on later) nor from a container's.
_PAUSE = __import__("posix").environ.get(b"NVSHIM_TEST_PAUSE", b"").decode(errors="replace")


def fault_point(step: str) -> None:
    """Stop this process (SIGSTOP) at ``step`` when ``NVSHIM_TEST_PAUSE`` is
    ``DIR:STEP[,STEP...]`` and ``DIR/STEP`` does not exist yet: it then holds this pid
    (the test kills a process or sends SIGCONT). Does nothing otherwise."""
    if not _PAUSE:
        return
    import posix

    directory, _, steps = _PAUSE.rpartition(":")
    if step not in steps.split(","):
        return
    try:  # once: the test removes the file to stop here again
        fd = posix.open(f"{directory}/{step}", posix.O_WRONLY | posix.O_CREAT | posix.O_EXCL, 0o600)
    except FileExistsError:
        return
    posix.write(fd, f"{posix.getpid()}\n".encode())
    posix.close(fd)
    posix.kill(posix.getpid(), 19)  # SIGSTOP (the signal module costs an import)
