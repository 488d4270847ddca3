"""``/proc/<pid>/mountinfo`` entries: mount point, filesystem type and super options.
No ``re``: the hook imports it for every GPU container."""

from __future__ import annotations

import os

from nvshim.rootfs.kernel import host_proc

_OCTAL = frozenset("01234567")

TYPE_CHECKING = False  # typing costs ~5 ms at import, per container
if TYPE_CHECKING:
    from collections.abc import Iterator


def unescape(field: str) -> str:
    """A mountinfo field with its ``\\NNN`` octal escapes (space, tab, newline,
    backslash) decoded."""
    if "\\" not in field:
        return field
    out: list[str] = []
    i = 0
    while i < len(field):
        code = field[i + 1 : i + 4]
        if field[i] == "\\" and len(code) == 3 and set(code) <= _OCTAL:
            out.append(chr(int(code, 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mounts(path: str | None = None) -> Iterator[tuple[str, str, list[str]]]:
    """``(mount point, fstype, super options)`` for each line of a mountinfo file;
    the calling thread's own (through the host procfs, ``kernel.host_proc``: a thread may
    have a mount namespace of its own) by default."""
    if path is None:
        fd = os.open("thread-self/mountinfo", os.O_RDONLY | os.O_CLOEXEC, dir_fd=host_proc())
        source: int | str = fd
    else:
        source = path
    with open(source, encoding="utf-8", errors="surrogateescape") as fh:
        for line in fh:
            left, _, right = line.partition(" - ")
            fields, rest = left.split(), right.split()
            if len(fields) < 5 or not rest:
                continue
            options = rest[2].split(",") if len(rest) >= 3 else []
            yield unescape(fields[4]), rest[0], options
