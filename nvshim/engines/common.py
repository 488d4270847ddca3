"""Safe writing of engine configuration files: lock, backup, record, atomic write, diff.

Beside each configuration file nvshim keeps (only while it has changes there):

- ``<file>.nvshim.bak``: the file as it was before the first ``configure``;
- ``<file>.nvshim.state``: JSON record of what nvshim set (key, value before, value after)
  and the SHA-256 of the bytes it last wrote, so ``unconfigure`` can give back the exact
  original when nothing else changed the file, and otherwise undo only nvshim's own keys;
- ``<file>.nvshim.lock``: held with ``flock`` for the whole read-modify-write.

Engines read every file in a drop-in directory (CRI-O parses all of ``crio.conf.d``), so
for a file in a ``*.d`` directory these live one level up, named after the directory.
"""

from __future__ import annotations

import contextlib
import difflib
import errno
import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from typing import Any

from nvshim.errors import NvshimError
from nvshim.fsutil import atomic_write, remove_temp_files
from nvshim.record import field, record

BACKUP_SUFFIX = ".nvshim.bak"
STATE_SUFFIX = ".nvshim.state"
LOCK_SUFFIX = ".nvshim.lock"
STATE_FORMAT = 1


def sidecar_base(path: str) -> str:
    """The path nvshim's backup, state and lock names for ``path`` start with."""
    directory, name = os.path.split(os.path.abspath(path))
    if directory.endswith(".d") and directory != "/":
        parent, dirname = os.path.split(directory)
        return os.path.join(parent, f"{dirname}.{name}")
    return os.path.join(directory, name)


def backup_path(path: str) -> str:
    return sidecar_base(path) + BACKUP_SUFFIX


def state_path(path: str) -> str:
    return sidecar_base(path) + STATE_SUFFIX


def sha256(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


def read_bytes(path: str) -> bytes | None:
    """The file's bytes, or ``None`` when it does not exist."""
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise NvshimError(f"{path}: is a directory, expected a file") from None
    except OSError as err:
        raise NvshimError(f"{path}: cannot read: {err.strerror}") from None


def decode(path: str, data: bytes | None) -> str:
    """``data`` as text (empty for a missing file); non-UTF-8 is a one-line error."""
    if data is None:
        return ""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise NvshimError(f"{path}:{line}: not valid UTF-8") from None


@contextlib.contextmanager
def locked(path: str) -> Iterator[None]:
    """Hold an exclusive lock for ``path`` (a lock file beside it, removed on release).
    Temporary files a writer killed mid-write left beside ``path`` are removed."""
    lock = sidecar_base(path) + LOCK_SUFFIX
    os.makedirs(os.path.dirname(lock), exist_ok=True)
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
    while True:
        try:
            fd = os.open(lock, flags, 0o600)
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise NvshimError(f"{lock}: is a symbolic link; refusing to lock") from None
            raise NvshimError(f"{path}: cannot create its lock {lock}: {err.strerror}") from None
        fcntl.flock(fd, fcntl.LOCK_EX)
        # The holder before us may have removed the file: then lock the new one instead.
        try:
            now = os.stat(lock, follow_symlinks=False)
        except FileNotFoundError:
            now = None
        mine = os.fstat(fd)
        if now is not None and (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):
            break
        os.close(fd)
    for target in (path, state_path(path), backup_path(path)):
        remove_temp_files(target)  # a writer killed mid-write left them; we hold the lock
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock)
        os.close(fd)


@record
class FileState:
    """What nvshim recorded about one configuration file."""

    original_sha256: str | None  # None: the file did not exist
    written_sha256: str | None = None
    pristine: bool = True  # nothing but nvshim changed the file since the original
    created_dirs: list[str] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> bytes:
        data = {
            "format": STATE_FORMAT,
            "original_sha256": self.original_sha256,
            "written_sha256": self.written_sha256,
            "pristine": self.pristine,
            "created_dirs": self.created_dirs,
            "records": [{k: v for k, v in r.items() if k != "claim"} for r in self.records],
        }
        return (json.dumps(data, indent=2) + "\n").encode()


def load_state(path: str) -> FileState | None:
    """The record for ``path``, or ``None`` (none, or unreadable: then ``unconfigure``
    falls back to removing only what is recognisably its own, and :func:`commit_file`
    refuses to write)."""
    raw = read_bytes(state_path(path))
    if raw is None:
        return None
    try:
        data = json.loads(raw)
        if data.get("format") != STATE_FORMAT:
            return None
        return FileState(
            original_sha256=data["original_sha256"],
            written_sha256=data["written_sha256"],
            pristine=bool(data["pristine"]),
            created_dirs=list(data.get("created_dirs", [])),
            records=list(data["records"]),
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def save_state(path: str, state: FileState) -> None:
    atomic_write(state_path(path), state.to_json(), mode=0o600)


def remove_state(path: str, keep_backup: bool = False) -> None:
    """Forget ``path``: remove its state (and backup unless ``keep_backup``)."""
    victims = [state_path(path)] + ([] if keep_backup else [backup_path(path)])
    for victim in victims:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(victim)


def write_backup(path: str, data: bytes) -> str:
    """Keep ``data`` (the original of ``path``) beside it with the original's mode and owner."""
    st = os.stat(path)
    target = backup_path(path)
    atomic_write(target, data, mode=st.st_mode & 0o7777)
    with contextlib.suppress(PermissionError):
        os.chown(target, st.st_uid, st.st_gid)
    return target


def make_dirs(directory: str) -> list[str]:
    """Create ``directory`` and missing parents (mode 0755); return those this call
    created, outer first. A directory another process creates meanwhile is not ours."""
    missing: list[str] = []
    current = os.path.abspath(directory)
    while not os.path.isdir(current):
        missing.append(current)
        current = os.path.dirname(current)
    created = []
    for path in reversed(missing):
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            if not os.path.isdir(path):
                raise
            continue
        created.append(path)
    return created


def remove_empty_dirs(dirs: list[str]) -> None:
    """Remove the directories nvshim created, innermost first, where they are empty."""
    for path in reversed(dirs):
        with contextlib.suppress(OSError):
            os.rmdir(path)


def write_file(path: str, data: bytes | None) -> None:
    """Replace ``path`` atomically (mode and owner kept), or remove it when ``data`` is None."""
    if data is None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    atomic_write(path, data)


def commit_file(
    path: str,
    old: bytes | None,
    new: bytes | None,
    state: FileState | None,
    records: list[dict[str, Any]] | None = None,
    created: list[str] | None = None,
) -> tuple[FileState, list[str]]:
    """Replace ``old`` (what ``path`` holds now) with ``new`` the safe way: the first time,
    keep the original beside it (or note the directories made for it, ``created`` plus
    any missing now); mark the file not pristine when someone else changed it since
    nvshim wrote it; save the record first, then write. Returns the record and notes.
    When a write fails (a full or read-only file system), the backup, record and
    directories this call made are taken back before the error goes on. A state file
    there that ``state`` None says :func:`load_state` could not read is refused first:
    taking it for a first time would replace the backup of the true original."""
    if state is None and os.path.lexists(state_path(path)):
        raise NvshimError(
            f"{state_path(path)}: not a state record nvshim can read; nothing written "
            f"(the original stays in {backup_path(path)}; remove the record to start afresh)"
        )
    notes = []
    undo = _Undo(path)
    try:
        if state is None:
            state = FileState(original_sha256=sha256(old))
            if old is not None:
                undo.backup = not os.path.lexists(backup_path(path))
                notes.append(f"original kept in {write_backup(path, old)}")
        elif sha256(old) not in (state.written_sha256, state.original_sha256):
            # someone else edited it since nvshim wrote it (the original itself is still
            # pristine: a run stopped between recording and writing left it in place)
            state.pristine = False
        if old is None:
            undo.dirs = make_dirs(os.path.dirname(path))
            made = [*(created or []), *undo.dirs]
            state.created_dirs += [d for d in made if d not in state.created_dirs]
        state.written_sha256 = sha256(new)
        if records is not None:
            state.records = records
        save_state(path, state)  # first: a crash before the write leaves a harmless record
        write_file(path, new)
    except BaseException:
        undo.run()
        raise
    return state, notes


class _Undo:
    """What a failed :func:`commit_file` takes back: the record as it was before, the
    backup and the directories it made."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.state = read_bytes(state_path(path))  # None: there was none
        self.backup = False
        self.dirs: list[str] = []

    def run(self) -> None:
        with contextlib.suppress(OSError):
            if self.state is None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(state_path(self.path))
            else:
                atomic_write(state_path(self.path), self.state, mode=0o600)
        if self.backup:
            with contextlib.suppress(OSError):
                os.unlink(backup_path(self.path))
        remove_empty_dirs(self.dirs)


def unified_diff(path: str, old: bytes | None, new: bytes | None) -> str:
    """A unified diff between two versions of ``path`` (``None``: absent)."""
    before = decode(path, old).splitlines(keepends=True)
    after = decode(path, new).splitlines(keepends=True)
    lines = difflib.unified_diff(
        before,
        after,
        fromfile=path if old is not None else "/dev/null",
        tofile=path if new is not None else "/dev/null",
    )
    out = []
    for line in lines:
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def points_at_nvshim(runtime_path: str, binary: object) -> bool:
    """True when an engine's runtime entry names this nvshim-runtime (or any of that name)."""
    return isinstance(binary, str) and (
        binary == runtime_path or os.path.basename(binary) == "nvshim-runtime"
    )


def claim_by_key(runtime_path: str, key: str):
    """A claim test for runtime entries whose binary sits under ``key`` (a flat table)."""

    def claim(entry: object) -> bool:
        return isinstance(entry, dict) and points_at_nvshim(runtime_path, entry.get(key))

    return claim
