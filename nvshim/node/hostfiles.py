"""nvshim's own files on the host, under the install prefix: the launchers the engine
runs (naming host paths) and, in CRI-O hook mode, the OCI hook file."""

from __future__ import annotations

import contextlib
import os

from nvshim.node.env import NodeSettings

HOOK_FILE = "oci-nvshim-hook.json"


def install(s: NodeSettings) -> list[str]:
    """Install under ``s.prefix`` on the host; return the installer paths written."""
    from nvshim.cli.install import hook_file_text
    from nvshim.fsutil import atomic_write
    from nvshim.launch import write_launchers

    written = write_launchers(s.here(s.bin_dir))
    if s.hooks_dir:
        target = s.here(os.path.join(s.hooks_dir, HOOK_FILE))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        atomic_write(target, hook_file_text(s.hook_path).encode(), mode=0o644, backup=False)
        written.append(target)
    return written


def uninstall(s: NodeSettings) -> list[str]:
    """Remove what :func:`install` wrote; return the paths removed."""
    from nvshim.launch import LAUNCHERS

    removed = []
    victims = [s.here(os.path.join(s.bin_dir, name)) for name in LAUNCHERS]
    if s.hooks_dir:
        victims.append(s.here(os.path.join(s.hooks_dir, HOOK_FILE)))
    for path in victims:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
            removed.append(path)
    for directory in (s.here(s.bin_dir), s.here(s.prefix)):
        with contextlib.suppress(OSError):
            os.rmdir(directory)
    return removed
