"""One-line-per-container decision log (runtimes swallow hook and runtime output).

Standard library only. Each record is a single line ``<UTC time> <tool> <id> key=value ...``
appended with O_APPEND so concurrent writers do not interleave within a line. Errors are
also written to stderr.
"""

from __future__ import annotations

import os
import sys
import time


def _quote(value: object) -> str:
    text = str(value)
    if text and all(c.isalnum() or c in "-_./:,=+@" for c in text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def format_record(tool: str, container_id: str, fields: dict[str, object]) -> str:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    parts = [stamp, tool, _quote(container_id or "-")]
    parts += [f"{k}={_quote(v)}" for k, v in fields.items() if v is not None]
    return " ".join(parts)[:16384] + "\n"


def log_decision(
    log_file: str | None,
    tool: str,
    container_id: str,
    error: str | None = None,
    echo: bool = True,
    **fields: object,
) -> None:
    """Append one decision line; an ``error`` also goes to stderr (unless ``echo`` is
    False: the caller reports it itself). Never raises."""
    if error is not None:
        fields = {**fields, "error": error}
        if echo:
            print(f"{tool}: error: {error}", file=sys.stderr)
    line = format_record(tool, container_id, fields)
    if not log_file:
        return
    try:
        fd = os.open(log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
    except OSError:
        try:
            os.makedirs(os.path.dirname(log_file) or ".", exist_ok=True)
            fd = os.open(log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
        except OSError as err:
            print(f"{tool}: warning: cannot write log {log_file}: {err.strerror}", file=sys.stderr)
            return
    try:
        os.write(fd, line.encode("utf-8", "replace"))
    finally:
        os.close(fd)
