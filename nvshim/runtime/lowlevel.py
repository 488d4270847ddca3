"""Which low-level runtime to exec, found fast: the pass-through path runs for every runc
call an engine makes, so it avoids parsing TOML (and heavy imports) when it can.

The resolved path is cached per configuration file under ``CACHE_DIR``, keyed by the
file's identity (inode, size, mtime) and ``PATH``; any change falls back to a full load.
"""

from __future__ import annotations

import os
import sys

from nvshim.runtime import DEFAULT_RUNTIMES

CACHE_DIR = "/run/nvshim"
DEFAULT_CONFIG = "/etc/nvshim/config.toml"
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


def _cache_file(config_path: str) -> str:
    import zlib

    return os.path.join(CACHE_DIR, f"runtime-{zlib.crc32(config_path.encode()):08x}")


def _key(config_path: str, st: os.stat_result) -> str:
    path = os.environ.get("PATH") or _DEFAULT_PATH
    return f"{config_path}\0{st.st_ino}\0{st.st_size}\0{st.st_mtime_ns}\0{path}"


def resolve(config=None) -> str:
    """The low-level runtime for this call. Raises NvshimError when none is found."""
    if config is not None:
        return _or_fail(
            find_runtime(config.get("runtime", "runtimes")), config.get("runtime", "runtimes")
        )
    config_path = os.environ.get("NVSHIM_CONFIG") or DEFAULT_CONFIG
    try:
        st = os.stat(config_path)
    except FileNotFoundError:
        if not os.environ.get("NVSHIM_CONFIG"):
            return _or_fail(find_runtime(DEFAULT_RUNTIMES), DEFAULT_RUNTIMES)
        st = None
    if st is not None:
        key = _key(config_path, st)
        try:
            with open(_cache_file(config_path), encoding="utf-8") as fh:
                cached_key, _, runtime = fh.read().rpartition("\0")
            if cached_key == key and os.access(runtime, os.X_OK):
                return runtime
        except (OSError, ValueError):
            pass
    from nvshim.config import load_config

    runtimes = load_config().get("runtime", "runtimes")
    runtime = _or_fail(find_runtime(runtimes), runtimes)
    if st is not None:
        _store(config_path, key, runtime)
    return runtime


def _store(config_path: str, key: str, runtime: str) -> None:
    try:
        os.makedirs(CACHE_DIR, mode=0o755, exist_ok=True)
        target = _cache_file(config_path)
        tmp = f"{target}.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(f"{key}\0{runtime}")
        os.rename(tmp, target)
    except OSError:
        pass  # no cache: the next call parses the configuration again


def _or_fail(runtime: str | None, candidates) -> str:
    if runtime is None:
        from nvshim.errors import NvshimError

        raise NvshimError(f"no low-level runtime found (tried {', '.join(candidates)})")
    return runtime
