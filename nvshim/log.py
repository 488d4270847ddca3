"""One-line-per-container decision log (runtimes swallow hook and runtime output).

Standard library only; it runs in every GPU container's runtime and hook process. A record
is one line, ``<UTC time> <tool> <id> key=value ...`` (``log-format = "text"``) or one JSON
object (``"json"``), appended with O_APPEND so concurrent writers do not interleave within
a line. It names the pod namespace, pod and container when the engine passed them as
annotations. Size-based rotation keeps ``log-file`` under ``log-max-size`` bytes with
``log-backups`` older files beside it; ``log-target = "journald"`` sends records to the
journal instead. Errors are also written to stderr. :func:`parse_line` reads either
format back (``nvshim exporter``).
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import time

LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}
MAX_LINE = 16384
MAX_VALUE = 512  # an annotation value is container input: bounded
JOURNAL_SOCKET = "/run/systemd/journal/socket"
_SYSLOG_PRIORITY = {"debug": 7, "info": 6, "warning": 4, "error": 3}

# record field -> annotations naming it, first present wins: CRI (containerd), then the
# Kubernetes labels CRI-O and cri-dockerd put on containers.
POD_ANNOTATIONS = {
    "namespace": ("io.kubernetes.cri.sandbox-namespace", "io.kubernetes.pod.namespace"),
    "pod": ("io.kubernetes.cri.sandbox-name", "io.kubernetes.pod.name"),
    "container": ("io.kubernetes.cri.container-name", "io.kubernetes.container.name"),
}
# an error's class -> the refusal reason recorded with it
REASONS = {
    "RequestError": "request",
    "RequirementError": "requirement",
    "SharingError": "sharing",
}


def pod_fields(annotations: object) -> dict[str, str]:
    """``namespace``, ``pod`` and ``container`` from an OCI spec's annotations."""
    if not isinstance(annotations, dict):
        return {}
    out = {}
    for field, keys in POD_ANNOTATIONS.items():
        for key in keys:
            value = annotations.get(key)
            if isinstance(value, str) and value:
                out[field] = value[:MAX_VALUE]
                break
    return out


_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n"}


def _escape(c: str) -> str:
    if c in _ESCAPES:
        return _ESCAPES[c]
    return f"\\x{ord(c):02x}" if c < " " or c == "\x7f" else c


def _quote(value: object) -> str:
    """A value as one word: bare when plain, else quoted with ``\\``, ``\\"``, ``\\n``
    and ``\\xNN`` (other control characters) escaped, so a hostile value cannot start a
    line or rewrite the terminal."""
    text = str(value)
    if text and all(c.isalnum() or c in "-_./:,=+@" for c in text):
        return text
    return '"' + "".join(map(_escape, text)) + '"'


def _stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def format_record(tool: str, container_id: str, fields: dict[str, object]) -> str:
    """A text record (newline included)."""
    parts = [_stamp(), tool, _quote(container_id or "-")]
    parts += [f"{k}={_quote(v)}" for k, v in fields.items() if v is not None]
    return " ".join(parts)[:MAX_LINE] + "\n"


def format_json(tool: str, container_id: str, fields: dict[str, object]) -> str:
    """A JSON record (newline included); an over-long one keeps its head fields only."""
    from nvshim import fastjson

    record = {"time": _stamp(), "tool": tool, "id": container_id or "-"}
    record.update((k, v if isinstance(v, int | bool) else str(v)) for k, v in fields.items())
    line = fastjson.dumps(record)
    if len(line) >= MAX_LINE:
        keep = ("time", "tool", "id", "level", "namespace", "pod", "container", "error")
        line = fastjson.dumps({k: str(record[k])[:MAX_VALUE] for k in keep if k in record})
    return line + "\n"


class Settings:
    """Where and how records go: from nvshim's ``[runtime]`` table, or a bare path."""

    __slots__ = ("path", "fmt", "level", "max_size", "backups", "journald")

    def __init__(self, path, fmt="text", level="info", max_size=0, backups=0, journald=False):
        self.path = path
        self.fmt = fmt
        self.level = LEVELS.get(level, LEVELS["info"])
        self.max_size = max_size if isinstance(max_size, int) and max_size > 0 else 0
        self.backups = backups if isinstance(backups, int) and backups > 0 else 0
        self.journald = journald

    @classmethod
    def of(cls, target) -> Settings:
        """Settings from a Config (its ``[runtime]`` table), a path, or None (no log)."""
        if target is None or isinstance(target, str):
            return cls(target)
        if isinstance(target, cls):
            return target
        rt = target.runtime
        return cls(
            rt.log_file,
            rt.log_format,
            rt.log_level,
            rt.log_max_size,
            rt.log_backups,
            rt.log_target == "journald",
        )


def log_decision(
    target,
    tool: str,
    container_id: str,
    error: object = None,
    echo: bool = True,
    annotations: object = None,
    **fields: object,
) -> None:
    """Append one decision line; an ``error`` (message or exception) also goes to stderr
    (unless ``echo`` is False: the caller reports it itself). ``target``: nvshim's Config,
    a log file path, or None. ``annotations``: the container's, for its pod names.
    Never raises."""
    settings = Settings.of(target)
    level = "info"
    head: dict[str, object] = pod_fields(annotations)
    if error is not None:
        level = "error"
        message = str(error)
        head["reason"] = REASONS.get(type(error).__name__, "error")
        fields = {**fields, "error": message}
        if echo:
            print(f"{tool}: error: {message}", file=sys.stderr)
    elif fields.get("denied") or fields.get("mps_warning"):
        level = "warning"
    if LEVELS[level] < settings.level or not (settings.path or settings.journald):
        return
    fields = {"level": level, **head, **{k: v for k, v in fields.items() if v is not None}}
    if settings.journald:
        _journal(tool, container_id, level, format_record(tool, container_id, fields), fields)
        return
    if settings.fmt == "json":
        line = format_json(tool, container_id, fields)
    else:
        line = format_record(tool, container_id, fields)
    # an error is the one line the engine shows: a log that cannot take it adds none
    _append(settings, tool, line.encode("utf-8", "replace"), quiet=error is not None)


def open_log(path: str) -> int:
    """The log file, opened for appending (made if missing) without following a symlink
    at its name or waiting on a FIFO, and kept only if what was opened is a regular
    file: the checks are made on the open file, never on the name again."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, 0o640)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        fd = os.open(path, flags, 0o640)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file")
    os.set_blocking(fd, True)
    return fd


def _append(settings: Settings, tool: str, data: bytes, quiet: bool = False) -> None:
    path = settings.path
    try:
        fd = open_log(path)
    except OSError as err:
        if not quiet:
            print(f"{tool}: warning: cannot write log {path}: {err.strerror}", file=sys.stderr)
        return
    try:
        if settings.max_size and os.fstat(fd).st_size + len(data) > settings.max_size:
            old, fd = fd, -1
            try:
                _rotate(settings, old)
            finally:
                os.close(old)
            fd = open_log(path)
        os.write(fd, data)
    except OSError as err:
        if not quiet:
            print(f"{tool}: warning: cannot write log {path}: {err.strerror}", file=sys.stderr)
    finally:
        if fd >= 0:
            os.close(fd)


def _rotate(settings: Settings, fd: int) -> None:
    """Shift ``path`` to ``path.1`` (``.1`` to ``.2``...; the oldest dropped) under an
    exclusive lock on ``fd`` (the full file), unless another writer did already."""
    import fcntl

    path = settings.path
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        current = os.stat(path)
        mine = os.fstat(fd)
        if (current.st_dev, current.st_ino) == (mine.st_dev, mine.st_ino):
            if settings.backups:
                for n in range(settings.backups - 1, 0, -1):
                    try:
                        os.rename(f"{path}.{n}", f"{path}.{n + 1}")
                    except FileNotFoundError:
                        pass
                os.rename(path, f"{path}.1")
            else:
                os.unlink(path)
    except FileNotFoundError:
        pass
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def _journal(tool: str, container_id: str, level: str, message: str, fields: dict) -> None:
    """One journal entry through the native protocol (datagram to journald's socket)."""
    import _socket

    entry = {
        "MESSAGE": message.rstrip("\n"),
        "PRIORITY": _SYSLOG_PRIORITY[level],
        "SYSLOG_IDENTIFIER": tool,
        "NVSHIM_CONTAINER_ID": container_id or "-",
    }
    for key in ("namespace", "pod", "container", "reason"):
        if fields.get(key):
            entry[f"NVSHIM_{key.upper()}"] = fields[key]
    data = "".join(f"{k}={str(v).replace(chr(10), ' ')}\n" for k, v in entry.items())
    try:
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_DGRAM)
        try:
            sock.sendto(data.encode("utf-8", "replace"), JOURNAL_SOCKET)
        finally:
            sock.close()
    except OSError as err:
        print(f"{tool}: warning: cannot write to the journal: {err.strerror}", file=sys.stderr)


def parse_line(line: str) -> dict[str, str] | None:
    """A record (text or JSON) back as a dict with ``time``, ``tool``, ``id`` and its
    fields; None for a line that is neither."""
    line = line.strip()
    if line.startswith("{"):
        import json

        try:
            record = json.loads(line)
        except ValueError:
            return None
        return {str(k): str(v) for k, v in record.items()} if isinstance(record, dict) else None
    words = _split(line)
    if words is None or len(words) < 3:
        return None
    record = {"time": words[0], "tool": words[1], "id": words[2]}
    for word in words[3:]:
        key, sep, value = word.partition("=")
        if not sep:
            return None
        record[key] = value
    return record


def _split(line: str) -> list[str] | None:
    """Words of a text record: spaces split, ``"..."`` quotes with ``\\`` escapes."""
    words, word, quoted, i = [], [], False, 0
    escapes = {"n": "\n", '"': '"', "\\": "\\"}
    while i < len(line):
        c = line[i]
        if quoted and c == "\\" and line[i + 1 : i + 2] == "x":
            try:
                word.append(chr(int(line[i + 2 : i + 4], 16)))
            except ValueError:
                return None
            i += 4
            continue
        if quoted and c == "\\" and i + 1 < len(line):
            word.append(escapes.get(line[i + 1], line[i + 1]))
            i += 2
            continue
        if c == '"':
            quoted = not quoted
        elif c == " " and not quoted:
            words.append("".join(word))
            word = []
        else:
            word.append(c)
        i += 1
    if quoted:
        return None
    words.append("".join(word))
    return [w for w in words if w]
