"""Just enough of runc's command line to find the command, bundle, id and log file."""

from __future__ import annotations

# runc global flags that take a value
_GLOBAL_VALUE_FLAGS = {"--root", "--log", "--log-format", "--criu", "--rootless"}
# create/run flags that take a value
_CREATE_VALUE_FLAGS = {"--bundle", "-b", "--console-socket", "--pid-file", "--preserve-fds"}


class RuncArgs:
    """The parts of a runc command line nvshim-runtime needs (no dataclass: import cost)."""

    __slots__ = ("command", "bundle", "container_id", "log", "log_format")

    def __init__(self, command: str | None = None) -> None:
        self.command = command
        self.bundle: str | None = None
        self.container_id: str | None = None
        self.log: str | None = None
        self.log_format: str | None = None


def _flag(arg: str) -> tuple[str, str | None]:
    if arg.startswith("--") and "=" in arg:
        name, value = arg.split("=", 1)
        return name, value
    return arg, None


def parse_runc_args(argv: list[str]) -> RuncArgs:
    """Find the subcommand; for create/run also the bundle and container id."""
    out = RuncArgs(command=None)
    i = 0
    while i < len(argv):
        name, value = _flag(argv[i])
        if name in _GLOBAL_VALUE_FLAGS and value is None:
            value = argv[i + 1] if i + 1 < len(argv) else None
            i += 1
        if name == "--log":
            out.log = value
        elif name == "--log-format":
            out.log_format = value
        if not argv[i].startswith("-") and name not in _GLOBAL_VALUE_FLAGS:
            out.command = argv[i]
            break
        i += 1
    if out.command not in ("create", "run"):
        return out
    rest = argv[i + 1 :]
    positional = []
    j = 0
    while j < len(rest):
        name, value = _flag(rest[j])
        if name in _CREATE_VALUE_FLAGS:
            if value is None:
                value = rest[j + 1] if j + 1 < len(rest) else None
                j += 1
            if name in ("--bundle", "-b"):
                out.bundle = value
        elif name.startswith("-"):
            pass
        else:
            positional.append(rest[j])
        j += 1
    if positional:
        out.container_id = positional[-1]
    return out
