"""The one error type nvshim shows to users: a single line, no traceback."""


class NvshimError(Exception):
    """A user-facing failure. ``str(err)`` is the one line printed before a non-zero exit."""

    exit_code = 1

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(" ".join(message.split()) if "\n" in message else message)
        if exit_code is not None:
            self.exit_code = exit_code


def one_line(err: BaseException) -> str:
    """The line shown for ``err``: an NvshimError's message, else its type and message."""
    return str(err) if isinstance(err, NvshimError) else f"{type(err).__name__}: {err}"


def did_you_mean(name: object, known) -> str:
    """`` (did you mean X?)`` for the known name closest to a misspelt ``name``, or ``""``."""
    import difflib

    if not isinstance(name, str):
        return ""
    by_lower = {str(k).lower(): str(k) for k in known}  # "INFO" is close to "info"
    close = difflib.get_close_matches(name.lower(), by_lower, n=1, cutoff=0.6)
    return f" (did you mean {by_lower[close[0]]}?)" if close else ""


class UsageError(NvshimError):
    """Bad input given on the command line or in a file named on it; ``help_command``:
    the command whose ``--help`` shows the fix (a parser's error), else None."""

    exit_code = 2
    help_command: str | None = None


def error_line(program: str, err: NvshimError) -> str:
    """The one line ``program`` prints for ``err`` (see :func:`usage_line`)."""
    command = getattr(err, "help_command", None)
    return usage_line(program, str(err), command) if command else f"{program}: error: {err}"


def usage_line(program: str, message: str, command: str) -> str:
    """A usage error as every nvshim program prints it, one line (docs/commands.md
    "Conventions"): ``PROGRAM: error: WHAT (did you mean X?); try 'COMMAND --help'``.
    ``message`` may be click's (``No such option '--x'. Did you mean '--y'?``)."""
    text = " ".join(message.split()).replace(". (Did you mean", " (did you mean")
    head, sep, tail = text.partition(" Did you mean ")
    text = head.rstrip(".")
    if sep:
        text += f" (did you mean {tail.rstrip('?')}?)"
    text = text[:1].lower() + text[1:]
    return f"{program}: error: {text}; try '{command} --help'"
