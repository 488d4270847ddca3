"""Which low-level runtime to exec: the first of the configured ``runtimes`` found
(absolute, or on ``PATH``). Pass-through calls reach this only when the sh front's cache
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
    runtimes = config.get("runtime", "runtimes")
    runtime = find_runtime(runtimes)
    if runtime is None:
        from nvshim.errors import NvshimError

        raise NvshimError(f"no low-level runtime found (tried {', '.join(runtimes)})")
    return runtime


def resolve(config=None) -> str:
    """The low-level runtime for a call that reached Python (``config``: the one loaded
    for it, else loaded here). On the way the sh front's cache is brought up to date
    (``nvshim.runtime.passthrough``): after one create through Python, the front
    decides alone whether the next one may ask for a GPU."""
    from nvshim.runtime.passthrough import resolve_and_remember

    if config is None:
        return resolve_and_remember()
    runtime = runtime_for(config)
    from nvshim.errors import NvshimError

    try:  # reads the configuration again, after noting its identity (a cheap cache hit)
        resolve_and_remember()
    except NvshimError:
        pass
    return runtime
