"""Path helpers for a trusted host root (driver root or dev root), host side only.

These resolve symlinks *inside* a root the operator named (a containerized driver at
``/run/nvidia/driver`` has absolute links that mean paths under that root). They are not
for container rootfs work: the hook has its own fd-based code for that.
"""

from __future__ import annotations

import os

_MAX_LINKS = 40


def host_path(root: str, path: str) -> str:
    """``path`` (absolute, as seen from inside ``root``) as a path on this machine."""
    rel = path.lstrip("/")
    return os.path.join(root, rel) if root not in ("", "/") else "/" + rel


def in_root(root: str, path: str) -> str:
    """``path`` (absolute, as seen from inside ``root``) as a path on this machine, every
    symlink in its directories resolved inside ``root``; the last component is not
    followed (it may be a link the caller replaces). A host mounted at ``/host`` whose
    ``/var/run`` is the absolute link ``/run`` gives ``/host/run/...``, never this
    machine's own ``/run``."""
    head, tail = os.path.split(os.path.normpath("/" + path.lstrip("/")))
    if not tail:
        return os.path.normpath(host_path(root, "/"))
    return host_path(root, os.path.join(resolve_in_root(root, head), tail))


def container_path(root: str, host: str) -> str:
    """Inverse of ``host_path``: drop the root prefix."""
    if root in ("", "/"):
        return host
    prefix = root.rstrip("/")
    if host == prefix:
        return "/"
    if not host.startswith(prefix + "/"):
        raise ValueError(f"{host} is not under {root}")
    return host[len(prefix) :]


def resolve_in_root(root: str, path: str, seen: dict[str, str | None] | None = None) -> str:
    """Follow symlinks of ``path`` treating absolute targets as relative to ``root``.

    Returns the resolved path as seen from inside the root (absolute). Raises OSError
    (ELOOP) on link loops. ``seen``: what each path read as a link (None: not one), kept
    between the calls of one discovery so shared directories are read once.
    """
    parts = [p for p in path.split("/") if p]
    resolved: list[str] = []
    links = 0
    while parts:
        part = parts.pop(0)
        if part == ".":
            continue
        if part == "..":
            if resolved:
                resolved.pop()
            continue
        candidate = "/" + "/".join([*resolved, part])
        if seen is not None and candidate in seen:
            target = seen[candidate]
        else:
            try:
                target = os.readlink(host_path(root, candidate))
            except OSError:
                target = None
            if seen is not None:
                seen[candidate] = target
        if target is None:
            resolved.append(part)
            continue
        links += 1
        if links > _MAX_LINKS:
            raise OSError(40, "too many levels of symbolic links", host_path(root, path))
        if target.startswith("/"):
            resolved = []
        parts = [p for p in target.split("/") if p] + parts
    return "/" + "/".join(resolved)
