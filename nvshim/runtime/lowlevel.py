"""Which low-level runtime to exec: the first of the configured ``runtimes`` found
(absolute, or on ``PATH``). Pass-through calls reach this only when their cache
(``nvshim.runtime.passthrough``) misses.
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


def resolve(config=None) -> str:
    """The low-level runtime for this call. Raises NvshimError when none is found."""
    if config is None:
        from nvshim.config import load_config

        config = load_config()
    runtimes = config.get("runtime", "runtimes")
    runtime = find_runtime(runtimes)
    if runtime is None:
        from nvshim.errors import NvshimError

        raise NvshimError(f"no low-level runtime found (tried {', '.join(runtimes)})")
    return runtime
