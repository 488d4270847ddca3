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
    """`` (did you mean 'X'?)`` for the known name closest to a misspelt ``name``, or ``""``:
    the one form of every nvshim program, click's included (:func:`usage_line`)."""
    import difflib

    if not isinstance(name, str):
        return ""
    by_lower = {str(k).lower(): str(k) for k in known}  # "INFO" is close to "info"
    close = difflib.get_close_matches(name.lower(), by_lower, n=1, cutoff=0.6)
    return f" (did you mean '{by_lower[close[0]]}'?)" if close else ""


class UsageError(NvshimError):
    """A command-line mistake: an option, argument or a variable standing for an option
    (exit 2). ``help_command``: the command whose ``--help`` shows the fix; the program
    sets it where the error is caught (:func:`error_line` then ends the line with it)."""

    exit_code = 2
    help_command: str | None = None


def empty_path(hint: str) -> UsageError:
    """The error for an empty path given to option ``hint`` (``'--dev-root'``), worded as
    click words it for the options it parses (nvshim.options)."""
    return UsageError(f"invalid value for {hint}: empty path")


class InputFileError(NvshimError):
    """An input file whose contents are not what they should be (exit 1, as every failure
    of the work: a bad file is not a usage error). The message starts with its path."""


def error_line(program: str, err: NvshimError) -> str:
    """The one line ``program`` prints for ``err`` (see :func:`usage_line`)."""
    command = getattr(err, "help_command", None)
    return usage_line(program, str(err), command) if command else f"{program}: error: {err}"


def usage_line(program: str, message: str, command: str) -> str:
    """A usage error as every nvshim program prints it, one line (docs/commands.md
    "Conventions"): ``PROGRAM: error: WHAT (did you mean 'X'?); try 'COMMAND --help'``.
    ``message`` may be click's (``No such option '--x'. Did you mean '--y'?``)."""
    text = " ".join(message.split()).replace(". (Did you mean", " (did you mean")
    head, sep, tail = text.partition(" Did you mean ")
    text = head.rstrip(".")
    if sep:
        names = [n.strip(" '") for n in tail.rstrip("?").removeprefix("one of:").split(",")]
        shown = ", ".join(f"'{name}'" for name in names)  # click quotes them or not, by version
        text += f" (did you mean {'one of: ' if len(names) > 1 else ''}{shown}?)"
    if text[:1].isupper() and text[1:2].islower():  # click's "No such option"; not a variable
        text = text[:1].lower() + text[1:]
    return f"{program}: error: {text}; try '{command} --help'"
