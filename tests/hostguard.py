"""Proof that the suite leaves the host's nvshim files alone.

The pytest process moves into a private mount namespace before any test runs (every
process the suite starts inherits it) and puts an empty directory of its own over each
host directory nvshim writes by default: ``/var/log`` (``nvshim.log``) and
``/run/nvshim`` (caches, inventory, MPS). At the end those directories must hold nothing
of nvshim's; a path that did not exist must still not exist. The host's own files are
never touched either way.
"""

from __future__ import annotations

import os
import tempfile

GUARDED = {"/var/log": "nvshim", "/run/nvshim": ""}  # directory: name prefix that counts


class HostGuard:
    def __init__(self) -> None:
        self.covers: dict[str, str] = {}  # host dir -> our empty dir mounted over it
        self.absent: list[str] = []
        self.error: str | None = None

    def enter(self) -> None:
        from nvshim.rootfs import kernel

        try:
            kernel.unshare(kernel.CLONE_NEWNS)
            kernel.mount(None, "/", None, kernel.MS_REC | kernel.MS_PRIVATE)
        except OSError as err:
            self.error = f"no private mount namespace ({err}): host paths not guarded"
            return
        for directory in GUARDED:
            if not os.path.isdir(directory):
                self.absent.append(directory)
                continue
            cover = tempfile.mkdtemp(prefix="nvshim-guard-")
            kernel.mount(cover, directory, None, kernel.MS_BIND)
            self.covers[directory] = cover

    def written(self) -> list[str]:
        """Host paths the suite wrote (or created)."""
        out = [d for d in self.absent if os.path.lexists(d)]
        for directory, cover in self.covers.items():
            prefix = GUARDED[directory]
            out += [os.path.join(directory, n) for n in os.listdir(cover) if n.startswith(prefix)]
        return out
