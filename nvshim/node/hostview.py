"""The host as the installer sees it (under the host root mount) turned into the host as
the engine sees it: discovery runs on the installer's paths, and every path it found is
moved from those roots to the host's own before a CDI spec is written."""

from __future__ import annotations

import os

from nvshim.host.model import Host


def _moved(path: str, pairs: list[tuple[str, str]]) -> str:
    for seen, real in pairs:
        if path == seen or path.startswith(seen.rstrip("/") + "/"):
            rest = path[len(seen.rstrip("/")) :]
            return os.path.normpath(real.rstrip("/") + rest) if rest else real
    return path


def rebase_host(host: Host, driver: tuple[str, str], dev: tuple[str, str]) -> Host:
    """``host`` with every host path under ``driver[0]``/``dev[0]`` (installer view) moved
    under ``driver[1]``/``dev[1]`` (the host's own paths); the longer root first."""
    pairs = sorted([driver, dev], key=lambda p: len(p[0]), reverse=True)

    def walk(value, key=None):
        if isinstance(value, dict):
            return {k: walk(v, k) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return type(value)(walk(v) for v in value)
        if key in ("host_path", "driver_root", "dev_root") and isinstance(value, str):
            return _moved(value, pairs)
        return value

    return Host.from_dict(walk(host.to_dict()))
