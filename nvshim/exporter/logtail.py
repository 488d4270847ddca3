"""Counts of container decisions from the decision log, read incrementally.

Each poll reads what was appended since the last one. A rotated or truncated log (a new
inode, or a file shorter than the offset) is read again from its start; the lines written
to the old file between the last poll and its rotation are read from ``<log>.1`` first.
"""

from __future__ import annotations

import os
import threading
from collections import Counter

from nvshim.log import parse_line

MAX_READ = 64 << 20  # per poll: a huge backlog is taken in steps


def decision(record: dict[str, str]) -> str | None:
    """What happened to the container a record describes (None: not a decision line)."""
    if record.get("error"):
        return "refused"
    if record.get("tool") == "nvshim-hook" and record.get("step") not in (None, "prestart"):
        return None
    if record.get("denied"):
        return "denied"
    devices = record.get("devices")
    if devices is None:
        return None
    return "none" if devices == "none" else "injected"


class LogStats:
    """Counters by (tool, decision, source) and refusals by (tool, reason)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.containers: Counter[tuple[str, str, str]] = Counter()
        self.refusals: Counter[tuple[str, str]] = Counter()
        self.unparsed = 0
        self._inode: tuple[int, int] | None = None
        self._offset = 0
        self._partial = b""
        self._lock = threading.Lock()

    def poll(self) -> None:
        """Read and count what was appended since the last poll."""
        with self._lock:
            try:
                st = os.stat(self.path)
            except OSError:
                return
            inode = (st.st_dev, st.st_ino)
            if self._inode is not None and inode != self._inode:
                self._finish_rotated()
            if inode != self._inode or st.st_size < self._offset:
                self._inode, self._offset, self._partial = inode, 0, b""
            self._offset = self._read(self.path, self._offset)

    def _finish_rotated(self) -> None:
        """The rest of the file we were reading, now ``<log>.1`` (when it is that file)."""
        older = f"{self.path}.1"
        try:
            st = os.stat(older)
        except OSError:
            return
        if (st.st_dev, st.st_ino) == self._inode:
            self._read(older, self._offset)
        self._partial = b""

    def _read(self, path: str, offset: int) -> int:
        try:
            with open(path, "rb") as fh:
                fh.seek(offset)
                data = fh.read(MAX_READ)
        except OSError:
            return offset
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        for raw in lines:
            self._count(raw.decode("utf-8", "replace"))
        return offset + len(data)

    def _count(self, line: str) -> None:
        if not line.strip():
            return
        record = parse_line(line)
        if record is None:
            self.unparsed += 1
            return
        what = decision(record)
        if what is None:
            return
        tool = record.get("tool", "unknown")
        self.containers[(tool, what, record.get("source", "unknown"))] += 1
        if what == "refused":
            self.refusals[(tool, record.get("reason", "error"))] += 1
