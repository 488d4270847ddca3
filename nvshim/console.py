"""What every command prints besides its result, without click (so a command may run
without importing it): warnings on stderr, the config and the discovered host with theirs."""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing costs ~3 ms to import
if TYPE_CHECKING:
    from nvshim.config import Config
    from nvshim.host.model import Host


def warn(message: str) -> None:
    """Print ``nvshim: warning: <message>`` on stderr."""
    sys.stderr.write(f"nvshim: warning: {message}\n")


def load_config_warn() -> Config:
    """Load nvshim's config, printing its warnings to stderr."""
    from nvshim.config import load_config

    config = load_config()
    for warning in config.warnings:
        warn(warning)
    return config


def roots(config: Config, driver_root: str | None, dev_root: str | None) -> tuple[str, str]:
    """``--driver-root`` and ``--dev-root``, the config's ``[host]`` roots where not given;
    an empty one is a usage error (not the config's in disguise)."""
    from nvshim.errors import empty_path

    for name, value in (("--driver-root", driver_root), ("--dev-root", dev_root)):
        if value is not None and not value:
            raise empty_path(f"'{name}'")
    return driver_root or config.host.driver_root, dev_root or config.host.dev_root


def discover(driver_root: str, dev_root: str, quiet: bool = False) -> Host:
    """Discover the host (always fresh, no cache) and print its warnings unless quiet."""
    from nvshim.host.discover import discover_host

    host = discover_host(driver_root, dev_root)
    if not quiet:
        for warning in host.warnings:
            warn(warning)
    return host


def debugging() -> bool:
    """Whether NVSHIM_DEBUG asks for tracebacks: unset or empty is no, else a boolean as
    the ``NVSHIM_*`` settings take them (anything else a UsageError naming it). Only the
    operator's ``nvshim`` commands read it, never the runtime or the hook."""
    import os

    raw = os.environ.get("NVSHIM_DEBUG")
    if raw is None:
        return False
    from nvshim.envbool import parse_bool

    return parse_bool("NVSHIM_DEBUG", raw)


def guarded(func, *args, help_command: str = "nvshim") -> None:
    """Run ``func(*args)`` as a command: an NvshimError or OSError becomes one line and
    its exit code, an unexpected error one line and 70 (a traceback with NVSHIM_DEBUG).
    A usage error raised inside the command ends as the parser's do, with where the help
    is: ``help_command``, unless it names its own command. A NVSHIM_DEBUG that is no
    boolean is such a usage error, before the command runs."""
    from nvshim.errors import NvshimError, UsageError, error_line

    try:
        debugging()
        func(*args)
    except NvshimError as err:
        if isinstance(err, UsageError) and err.help_command is None:
            err.help_command = help_command
        sys.stderr.write(error_line("nvshim", err) + "\n")
        sys.exit(err.exit_code)
    except OSError as err:
        where = f"{err.filename}: " if err.filename else ""
        sys.stderr.write(f"nvshim: error: {where}{err.strerror or err}\n")
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as err:  # noqa: BLE001 - a bug must still be one line unless debugging
        if debugging():  # checked before the command ran; ``--debug`` sets "1"
            raise
        sys.stderr.write(
            f"nvshim: internal error: {type(err).__name__}: {err} "
            "(set NVSHIM_DEBUG=1 for a traceback)\n"
        )
        sys.exit(70)
