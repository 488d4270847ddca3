"""The host as the installer sees it (under the host root mount) turned into the host as
the engine sees it: discovery runs on the installer's paths, and every path it found is
moved from those roots to the host's own before a CDI spec is written."""

from __future__ import annotations

import os

from nvshim.host.model import Host


def _moved(path: str, seen: str, real: str) -> str:
    if path == seen or path.startswith(seen.rstrip("/") + "/"):
        rest = path[len(seen.rstrip("/")) :]
        return os.path.normpath(real.rstrip("/") + rest) if rest else real
    return path


def _walk(value, pair: tuple[str, str]):
    if isinstance(value, dict):
        return {
            k: _moved(v, *pair) if k == "host_path" and isinstance(v, str) else _walk(v, pair)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return type(value)(_walk(v, pair) for v in value)
    return value


# (seen here, the host's own path) of the driver root and of the dev root
RootPairs = tuple[tuple[str, str], tuple[str, str]]


def rebase_host(host: Host, driver: tuple[str, str], dev: tuple[str, str]) -> Host:
    """``host`` with driver files moved from ``driver[0]`` (installer view) to
    ``driver[1]`` (the host's own path) and device nodes from ``dev[0]`` to ``dev[1]``."""
    data = host.to_dict()
    moved = {k: _walk(v, driver if k == "files" else dev) for k, v in data.items()}
    moved["driver_root"] = _moved(data["driver_root"], *driver)
    moved["dev_root"] = _moved(data["dev_root"], *dev)
    return Host.from_dict(moved)
