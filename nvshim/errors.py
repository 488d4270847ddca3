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


class UsageError(NvshimError):
    """Bad input given on the command line or in a file named on it."""

    exit_code = 2
