"""Is an executable that runtimes start as root fit for it? Present, executable, and when
it is a Python launcher (or nvshim-runtime's compiled front, which names the interpreter
in its payload), a real interpreter (not a version-manager shim) started ``-I``."""

from __future__ import annotations

import os
import re

_EXEC_RE = re.compile(r"^\s*exec\s+(\S+)((?:\s+-\S+)*)", re.MULTILINE)


def _is_elf(path: str) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(4) == b"\x7fELF"
    except OSError:
        return False


def _interpreter_problem(interpreter: str, flags: str, what: str) -> str | None:
    if "shims" in interpreter.split("/"):
        return f"{what} starts Python through a version-manager shim ({interpreter})"
    if not os.path.isabs(interpreter) or not os.access(interpreter, os.X_OK):
        return f"{what}: interpreter {interpreter} is not an executable absolute path"
    if not _is_elf(os.path.realpath(interpreter)):
        return f"{what}: interpreter {interpreter} is a script (a shim?), not a real binary"
    if not any(f.startswith("-") and not f.startswith("--") and "I" in f for f in flags.split()):
        return f"{what}: Python is not started isolated (-I): PYTHON* variables reach it"
    return None


def _compiled_front_problem(path: str) -> str | None:
    """For nvshim-runtime's compiled front: a build never filled in, or the interpreter it
    names (any other binary: None)."""
    from nvshim.runtime.frontbin import UNSET, fields_of

    try:
        with open(path, "rb") as fh:
            data = fh.read(16 << 20)
    except OSError as err:
        return f"{path}: {err.strerror}"
    fields = fields_of(data)
    if fields is None:
        if UNSET in data:
            return f"{path}: an nvshim-runtime front never filled in (nvshim install writes it)"
        return None
    return _interpreter_problem(fields.get("interpreter", ""), "-IS", path)


def launcher_problem(path: str) -> str | None:
    """Why ``path`` is unfit as a runtime or hook binary (None: fit)."""
    if not os.path.isabs(path):
        return f"{path}: not an absolute path"
    if not os.path.exists(path):
        return f"{path} does not exist"
    if not os.path.isfile(path) or not os.access(path, os.X_OK):
        return f"{path} is not an executable file"
    if _is_elf(path):
        return _compiled_front_problem(path)
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            head = fh.read(8192)
    except OSError as err:
        return f"{path}: {err.strerror}"
    if not head.startswith("#!"):
        return f"{path}: neither a binary nor a script with #!"
    interpreter, _, flags = head[2:].splitlines()[0].strip().partition(" ")
    if os.path.basename(interpreter).startswith("python"):
        return _interpreter_problem(interpreter, flags, path)
    found = _EXEC_RE.search(head)  # a shell launcher: the interpreter it execs
    if found and os.path.basename(found.group(1)).startswith("python"):
        return _interpreter_problem(found.group(1), found.group(2), path)
    return None
