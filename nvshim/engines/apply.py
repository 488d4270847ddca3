"""``configure`` and ``unconfigure``: read under the lock, edit, write safely, restart.

Each returns a :class:`Report` (lines to print). Nothing is written on ``dry_run`` or on
any error; an error leaves every file as it was.
"""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Iterator
from types import ModuleType

from nvshim import record as records
from nvshim.engines import containerd, crio, docker
from nvshim.engines.common import (
    FileState,
    backup_path,
    commit_file,
    decode,
    load_state,
    locked,
    make_dirs,
    read_bytes,
    remove_empty_dirs,
    remove_state,
    save_state,
    sha256,
    sidecar_base,
    unified_diff,
    write_file,
)
from nvshim.engines.records import apply_edits, revert_records
from nvshim.engines.restart import find_systemctl, restart, socket_owner
from nvshim.engines.settings import Settings
from nvshim.host.rootpath import in_root
from nvshim.record import field, record

ENGINE_MODULES: dict[str, ModuleType] = {
    "containerd": containerd,
    "docker": docker,
    "crio": crio,
}


@record
class Report:
    """What a run did (or would do), line by line, and whether any file changed."""

    lines: list[str] = field(default_factory=list)
    changed: bool = False
    pending: bool = False  # a dry run found something to change


@record
class _Change:
    path: str
    old: bytes | None
    new: bytes | None
    state: FileState | None
    records: list[dict]
    summary: list[str]
    exact: bool = False  # unconfigure: the original bytes come back


def _resolved(s: Settings) -> Settings:
    """Settings with the files' real paths (writing through a symlink must not replace it)."""
    return records.replace(
        s,
        config=os.path.realpath(s.config),
        drop_in=os.path.realpath(s.drop_in) if s.drop_in else None,
    )


@contextlib.contextmanager
def _lock(s: Settings, anchor: str) -> Iterator[list[str]]:
    """Hold the lock of ``anchor``'s files (none on a dry run); yields the directories
    made for its lock file, removed again (with any the body adds) where empty once the
    lock is released: a failed run, or one with nothing to do, leaves no new directory."""
    if s.dry_run:
        yield []
        return
    made = make_dirs(os.path.dirname(sidecar_base(anchor)))
    try:
        with locked(anchor):
            yield made
    finally:
        remove_empty_dirs(made)


def _check_restart(s: Settings) -> None:
    """Fail before writing anything when the restart asked for cannot happen."""
    if s.restart == "signal":
        socket_owner(s.socket)
    elif s.restart == "systemd":
        find_systemctl(s.host_root)


def configure(s: Settings) -> Report:
    """Register the nvshim runtime with ``s.engine``."""
    s = _resolved(s)
    engine = ENGINE_MODULES[s.engine]
    paths = engine.files(s)
    report = Report()
    with _lock(s, paths[0]) as made:
        raws = {path: read_bytes(path) for path in paths}
        docs = {path: engine.load(path, decode(path, raws[path])) for path in paths}
        states = {path: load_state(path) for path in paths}
        history = {path: st.records if st else [] for path, st in states.items()}
        plan, warnings = engine.plan(s, docs, history)
        if not os.path.exists(in_root(s.host_root, s.runtime_path)):
            warnings.append(f"{s.runtime_path} does not exist yet (see `nvshim install`)")
        changes = []
        for path in paths:
            state = states[path]
            records = copy.deepcopy(history[path])
            summary = apply_edits(docs[path], plan.get(path, []), records, s.runtime_name)
            if summary:
                new = docs[path].render()
                changes.append(_Change(path, raws[path], new, state, records, summary))
        report.lines += [f"warning: {w}" for w in warnings]
        if not changes:
            report.lines.append(
                f"no change: {', '.join(paths)} already has runtime {s.runtime_name!r} as asked"
            )
            return report
        if s.dry_run:
            return _dry_run(report, changes)
        _check_restart(s)
        for change in changes:
            report.lines.append(_commit_configure(change, made if change.path == paths[0] else []))
    report.changed = True
    report.lines.append(restart(s))
    return report


def _dry_run(report: Report, changes: list[_Change]) -> Report:
    report.pending = True
    for change in changes:
        report.lines.append(unified_diff(change.path, change.old, change.new).rstrip("\n"))
    report.lines.append("dry run: nothing written")
    return report


def _commit_configure(change: _Change, made: list[str]) -> str:
    """Write one change (``made``: the directories made for it, recorded for unconfigure)."""
    _, notes = commit_file(
        change.path, change.old, change.new, change.state, change.records, created=made
    )
    return f"{change.path}: " + "; ".join(change.summary + notes)


def unconfigure(s: Settings, restart_now: bool = True) -> Report:
    """Take the nvshim runtime out of ``s.engine``'s configuration again. Without
    ``restart_now`` the caller restarts the engine (``report.changed`` says whether to)."""
    s = _resolved(s)
    engine = ENGINE_MODULES[s.engine]
    paths = engine.files(s)
    report = Report()
    with _lock(s, paths[0]) as made:
        changes: list[_Change] = []
        for path in paths:
            change = _plan_unconfigure(s, engine, path, report)
            if change is not None:
                changes.append(change)
        if not changes:
            return report
        if s.dry_run:
            return _dry_run(report, changes)
        _check_restart(s)
        for change in changes:
            report.lines.append(_commit_unconfigure(s, change, made))
    report.changed = True
    if restart_now:
        report.lines.append(restart(s))
    return report


def _plan_unconfigure(s: Settings, engine: ModuleType, path: str, report: Report):
    raw = read_bytes(path)
    state = load_state(path)
    mine = [r for r in state.records if r["owner"] == s.runtime_name] if state else []
    others = [r for r in state.records if r["owner"] != s.runtime_name] if state else []
    if raw is None:
        if state is not None and not others and not s.dry_run:
            remove_state(path)
        report.lines.append(f"{path}: not present, nothing to remove")
        return None
    if state is not None and not others and state.pristine:
        backup = read_bytes(backup_path(path))
        if sha256(raw) == state.written_sha256 and (
            state.original_sha256 is None or sha256(backup) == state.original_sha256
        ):
            what = "restored the original" if backup is not None else "removed (nvshim made it)"
            return _Change(path, raw, backup, state, [], [what], exact=True)
    doc = engine.load(path, decode(path, raw))
    records = mine if mine else engine.claims(s, path, doc)
    undone, kept = revert_records(doc, records)
    new = doc.render()
    if state is not None and state.original_sha256 is None and not others:
        if not new.strip():
            new = None  # nvshim created the file and nothing else is in it
    if new == raw:
        if state is not None and not others and not s.dry_run:
            remove_state(path, keep_backup=True)
        report.lines += [f"{path}: {k}" for k in kept]
        report.lines.append(f"{path}: no runtime {s.runtime_name!r} from nvshim, nothing to remove")
        return None
    return _Change(path, raw, new, state, others, undone + kept)


def _commit_unconfigure(s: Settings, change: _Change, made: list[str]) -> str:
    """Write one change; the directories nvshim made for a file it removes go into
    ``made``, for :func:`_lock` to remove once the lock file in them is gone."""
    path, state = change.path, change.state
    write_file(path, change.new)
    if state is not None:
        if change.new is None:
            made += [d for d in state.created_dirs if d not in made]
        if change.records:  # another runtime name nvshim added is still there
            state.records = change.records
            state.pristine = state.pristine and sha256(change.old) == state.written_sha256
            state.written_sha256 = sha256(change.new)
            save_state(path, state)
        else:
            remove_state(path, keep_backup=not change.exact)
    summary = list(change.summary)
    if state is not None and not change.exact and not change.records:
        if os.path.exists(backup_path(path)):
            summary.append(f"the pre-nvshim copy stays in {backup_path(path)}")
    return f"{path}: " + "; ".join(summary)
