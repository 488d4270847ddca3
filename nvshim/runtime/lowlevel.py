"""The low-level runtime: which one (the first of the configured ``runtimes`` found,
absolute or on ``PATH``) and how this process runs it (``LowLevel``: exec'd, or started
and waited for). Pass-through calls reach the look-up only when the sh front's cache
(``nvshim.runtime.passthrough``) misses; every call that does refreshes that cache.
"""

from __future__ import annotations

import os
import sys

_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def find_runtime(candidates, path: str | None = None) -> str | None:
    """First configured runtime found (absolute paths or names on PATH), never ourselves."""
    dirs = (path or os.environ.get("PATH") or _DEFAULT_PATH).split(":")
    me = os.path.realpath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    for name in candidates:
        options = [name] if "/" in name else [os.path.join(d, name) for d in dirs if d]
        for option in options:
            if os.path.isfile(option) and os.access(option, os.X_OK):
                if os.path.realpath(option) != me:
                    return option
    return None


def runtime_for(config) -> str:
    """The first configured runtime found. Raises NvshimError when none is."""
    runtimes = config.runtime.runtimes
    runtime = find_runtime(runtimes)
    if runtime is None:
        from nvshim.errors import NvshimError

        raise NvshimError(f"no low-level runtime found (tried {', '.join(runtimes)})")
    return runtime


def start(
    runtime: str, argv: list[str], stdout: int | None = None, stderr: int | None = None
) -> int:
    """Start the low-level runtime with ``argv`` (this process's stdio and environment,
    as the exec it replaces would have; ``stdout``/``stderr``: other fds); its pid."""
    actions = [
        (os.POSIX_SPAWN_DUP2, fd, n) for n, fd in ((1, stdout), (2, stderr)) if fd is not None
    ]
    return os.posix_spawn(runtime, [runtime, *argv], os.environ, file_actions=actions)


def wait(pid: int) -> int:
    """The exit status of child ``pid`` (128+N: killed by signal N)."""
    from nvshim.runtime import exit_status

    return exit_status(os.waitpid(pid, 0)[1])


def spawn(
    runtime: str, argv: list[str], stdout: int | None = None, stderr: int | None = None
) -> int:
    """Run the low-level runtime with ``argv`` and return its exit status."""
    return wait(start(runtime, argv, stdout, stderr))


def spawn_quiet(runtime: str, argv: list[str]) -> int:
    """Run the low-level runtime with ``argv``, its output thrown away; its exit status."""
    null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    try:
        return spawn(runtime, argv, stdout=null, stderr=null)
    finally:
        os.close(null)


class LowLevel:
    """The low-level runtime, run by this process: exec'd for a call nvshim is done
    with, or started and waited for when a create has finishing steps. The daemon's
    stand-ins (``nvshim.runtimed.worker``, ``nvshim.runtime.slots``) have their caller do
    both."""

    def exec(self, runtime: str, argv: list[str], keep: list[int] = ()) -> int | None:
        """Exec ``runtime argv``; ``keep``: inheritable fds argv names (here already)."""
        os.execv(runtime, [runtime, *argv])
        return 127  # not reached

    def start(self, runtime: str, argv: list[str], cleanup: list[str]) -> None:
        """Start ``runtime argv``; ``cleanup``: its argv that undoes a successful create."""
        self.pid = start(runtime, argv)

    def wait(self) -> int:
        return wait(self.pid)
