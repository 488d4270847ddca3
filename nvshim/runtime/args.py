"""runc's command line, parsed as runc parses it (urfave/cli v1 over Go's ``flag``).

What runc does, and so what this module does:

- global flags come before the command; Go's ``flag`` takes ``-x`` and ``--x`` alike,
  ``-x=V`` and ``-x V`` for a flag with a value, ``-x`` or ``-x=BOOL`` for a boolean,
  stops at the first argument that is not a flag (``-`` is not one) and consumes ``--``;
- ``create`` and ``run`` first move their own flags (and the argument after each) ahead
  of the other arguments (urfave's ``reorderArgs``), up to ``--``; ``exec`` does not
  (its arguments after the container id are the command);
- no combined short flags (``-db`` is an unknown flag); both forms of one flag
  (``-b`` and ``--bundle``) together are an error;
- a help flag set to true anywhere the parser reads flags is a help request: runc
  prints help and never reads the bundle;
- ``create``/``run`` need exactly one argument, the container id.

The flags are runc 1.1's and 1.2's. A command line runc would refuse (unknown flag, bad
syntax, wrong argument count) is reported as ``error``: nvshim hands it to runc unedited,
and runc refuses it without creating anything.
"""

from __future__ import annotations

BOOL, VALUE = 0, 1
_HELP = {"help": BOOL, "h": BOOL}

GLOBAL_FLAGS = {
    "debug": BOOL,
    "log": VALUE,
    "log-format": VALUE,
    "root": VALUE,
    "criu": VALUE,
    "systemd-cgroup": BOOL,
    "rootless": VALUE,
    "version": BOOL,
    "v": BOOL,
    **_HELP,
}
_CREATE = {
    "bundle": VALUE,
    "b": VALUE,
    "console-socket": VALUE,
    "pidfd-socket": VALUE,
    "pid-file": VALUE,
    "no-pivot": BOOL,
    "no-new-keyring": BOOL,
    "preserve-fds": VALUE,
    **_HELP,
}
COMMAND_FLAGS = {
    "create": _CREATE,
    "delete": {"force": BOOL, "f": BOOL, **_HELP},
    "run": {**_CREATE, "detach": BOOL, "d": BOOL, "keep": BOOL, "no-subreaper": BOOL},
    "exec": {
        "console-socket": VALUE,
        "pidfd-socket": VALUE,
        "cwd": VALUE,
        "env": VALUE,
        "e": VALUE,
        "tty": BOOL,
        "t": BOOL,
        "user": VALUE,
        "u": VALUE,
        "additional-gids": VALUE,
        "g": VALUE,
        "process": VALUE,
        "p": VALUE,
        "detach": BOOL,
        "d": BOOL,
        "pid-file": VALUE,
        "process-label": VALUE,
        "apparmor": VALUE,
        "no-new-privs": BOOL,
        "cap": VALUE,
        "c": VALUE,
        "preserve-fds": VALUE,
        "cgroup": VALUE,
        "ignore-paused": BOOL,
        **_HELP,
    },
}
# two names of one flag (urfave: "Cannot use two forms of the same flag")
ALIASES = {
    "h": "help",
    "v": "version",
    "b": "bundle",
    "d": "detach",
    "e": "env",
    "t": "tty",
    "u": "user",
    "g": "additional-gids",
    "p": "process",
    "c": "cap",
    "f": "force",
}
_TRUE = ("1", "t", "T", "TRUE", "true", "True")
_FALSE = ("0", "f", "F", "FALSE", "false", "False")


class UsageError(Exception):
    """runc would refuse this command line (and print its usage)."""


class Flag:
    """One flag as given: its name (the alias's full name), value and argv span."""

    __slots__ = ("name", "value", "start", "end")

    def __init__(self, name: str, value: str, start: int, end: int) -> None:
        self.name = name
        self.value = value
        self.start = start
        self.end = end


class RuncArgs:
    """A parsed runc command line (no dataclass: import cost).

    ``action``: ``help``, ``version`` or ``error`` (runc's business: hand it on),
    ``create``/``run``/``exec`` (a well-formed call nvshim acts on), or ``other``.
    """

    __slots__ = (
        "action",
        "command",
        "command_index",
        "globals",
        "flags",
        "positional",
        "positional_index",
        "flags_end",
    )

    def __init__(self) -> None:
        self.action = "other"
        self.command: str | None = None
        self.command_index = -1
        self.globals: dict[str, str] = {}
        self.flags: list[Flag] = []
        self.positional: list[str] = []
        self.positional_index = -1  # argv index of the first positional (exec)
        self.flags_end = -1  # argv index where exec's flags end (new flags go there)

    def value(self, name: str, default: str | None = None) -> str | None:
        """The last value given for command flag ``name`` (either form)."""
        for flag in reversed(self.flags):
            if flag.name == name:
                return flag.value
        return default

    def values(self, name: str) -> list[str]:
        return [f.value for f in self.flags if f.name == name]

    @property
    def log(self) -> str | None:
        return self.globals.get("log")

    @property
    def log_format(self) -> str | None:
        return self.globals.get("log-format")

    @property
    def bundle(self) -> str | None:
        return self.value("bundle")

    @property
    def container_id(self) -> str | None:
        return self.positional[0] if self.positional else None


def _go_parse(tokens: list[str], known: dict[str, int], offset: int):
    """Go ``flag.FlagSet.Parse``: (flags, index of the first non-flag token).
    ``offset``: argv index of ``tokens[0]`` (for the spans); None spans when reordered."""
    flags: list[Flag] = []
    i = 0
    while i < len(tokens):
        s = tokens[i]
        if len(s) < 2 or s[0] != "-":
            break
        minus = 1
        if s[1] == "-":
            minus = 2
            if len(s) == 2:
                return flags, i + 1
        name = s[minus:]
        if not name or name[0] in "-=":
            raise UsageError(f"bad flag syntax: {s}")
        start = i
        i += 1
        value = None
        eq = name.find("=", 1)
        if eq > 0:
            name, value = name[:eq], name[eq + 1 :]
        kind = known.get(name)
        if kind is None:
            raise UsageError(f"flag provided but not defined: -{name}")
        if kind == BOOL:
            if value is None:
                value = "true"
            elif value in _TRUE:
                value = "true"
            elif value in _FALSE:
                value = "false"
            else:
                raise UsageError(f"invalid boolean value {value!r} for -{name}")
        elif value is None:
            if i >= len(tokens):
                raise UsageError(f"flag needs an argument: -{name}")
            value = tokens[i]
            i += 1
        flags.append(Flag(ALIASES.get(name, name), value, start + offset, i + offset))
    return flags, i


def _check_forms(tokens: list[str], flags: list[Flag]) -> None:
    """urfave's normalizeFlags: both names of one flag given is an error."""
    seen: dict[str, set[str]] = {}
    for flag in flags:
        token = tokens[flag.start].lstrip("-").split("=", 1)[0]
        seen.setdefault(flag.name, set()).add(token)
    for forms in seen.values():
        if len(forms) > 1:
            raise UsageError(f"Cannot use two forms of the same flag: {' '.join(sorted(forms))}")


def _is_flag(arg: str, known: dict[str, int]) -> bool:
    """urfave's argIsFlag (what reorderArgs moves)."""
    if arg in ("-", "--") or not arg.startswith("-"):
        return False
    if arg.startswith("--"):
        arg = arg.replace("-", "", 2)
    if arg.startswith("-"):
        arg = arg.replace("-", "", 1)
    return arg.split("=")[0] in known


def reorder(args: list[str], known: dict[str, int]) -> list[int]:
    """urfave's reorderArgs, as indices into ``args`` (-1 stands for a moved ``--``)."""
    reordered: list[int] = []
    remaining: list[int] = []
    may_be_value = False
    for i, arg in enumerate(args):
        if may_be_value and not _is_flag(arg, known):
            may_be_value = False
            reordered.append(i)
        elif arg == "--":
            remaining = [i, *remaining, *range(i + 1, len(args))]
            break
        elif _is_flag(arg, known):
            reordered.append(i)
            may_be_value = "=" not in arg
        else:
            remaining.append(i)
    return reordered + remaining


def _truthy(flags: list[Flag], name: str) -> bool:
    value = None
    for flag in flags:
        if flag.name == name:
            value = flag.value
    return value == "true"


def parse_runc_args(argv: list[str]) -> RuncArgs:
    """Parse ``argv`` (without the program name) as runc would."""
    out = RuncArgs()
    try:
        flags, i = _go_parse(argv, GLOBAL_FLAGS, 0)
        _check_forms(argv, flags)
    except UsageError:
        out.action = "error"
        return out
    out.globals = {f.name: f.value for f in flags}
    if _truthy(flags, "help"):
        out.action = "help"
        return out
    if _truthy(flags, "version"):
        out.action = "version"
        return out
    if i >= len(argv):
        out.action = "help"  # no command: runc prints its help
        return out
    out.command = argv[i]
    out.command_index = i
    known = COMMAND_FLAGS.get(out.command)
    if known is None:
        return out
    base = i + 1
    rest = argv[base:]
    if out.command == "exec":  # urfave's SkipArgReorder
        order = list(range(len(rest)))
    else:
        order = reorder(rest, known)
    tokens = [rest[k] for k in order]
    try:
        flags, j = _go_parse(tokens, known, 0)
        for flag in flags:  # spans back to argv (exact for exec, which keeps the order)
            flag.start, flag.end = base + order[flag.start], base + order[flag.end - 1] + 1
        _check_forms(argv, flags)
    except UsageError:
        out.action = "error"
        return out
    out.flags = flags
    out.positional = tokens[j:]
    if j < len(tokens):
        out.positional_index = base + order[j]
    ended = j > 0 and tokens[j - 1] == "--" and (not flags or flags[-1].end <= base + order[j - 1])
    out.flags_end = base + (j - 1 if ended else j) if out.command == "exec" else -1
    if _truthy(flags, "help"):
        out.action = "help"
    elif out.command == "exec":
        out.action = "exec" if out.positional and out.positional[0] else "error"
    elif len(out.positional) != 1 or not out.positional[0]:
        out.action = "error"  # runc: exactly one argument, a non-empty id
    else:
        out.action = out.command
    return out
