"""Apply an engine's edits to a document while recording them, and undo exactly those.

A record remembers the key, who set it (the runtime name), the value nvshim wrote and the
value before. Undoing restores the value before only where the key still holds nvshim's
value: a key someone changed since is theirs now and is kept.

Record kinds:

- ``set``: a plain key (``default_runtime_name``, ``enable_cdi`` ...);
- ``owned``: a table that is nvshim's own (its runtime entry), always removed on undo;
- ``item``: one member nvshim added to an array (an ``imports`` entry);
- ``parent``: a table nvshim had to create to hold the others, removed once empty.

Engines also make records up (``guess: true``) for files nvshim has no record of.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nvshim.engines.doc import MISSING, Document, Keys, dotted, same, type_name
from nvshim.errors import InputFileError
from nvshim.record import record


@record(frozen=True)
class Edit:
    """One thing an engine wants in a document.

    ``kind`` is ``set``, ``owned`` or ``item`` (see the module doc) or ``init`` (set only
    when absent, never undone: the config ``version`` of a new file). ``claim`` decides
    whether an existing ``owned`` table nobody recorded may be taken over (it must look
    like nvshim's); ``what`` describes the edit for the report.
    """

    keys: Keys
    value: Any
    kind: str = "set"
    what: str = ""
    claim: Callable[[Any], bool] | None = None


def recorded_before(records: list[dict], keys: Keys) -> Any:
    """The value ``keys`` had before nvshim first set it (``None`` if unknown or unset)."""
    rec = _find(records, keys, ("set",))
    return rec.get("before") if rec else None


def _find(records: list[dict], keys: Keys, kinds: tuple[str, ...]) -> dict | None:
    for rec in records:
        if tuple(rec["keys"]) == keys and rec["kind"] in kinds:
            return rec
    return None


def _add_parents(records: list[dict], rec: dict, created: list[Keys], owner: str) -> None:
    """Record tables created for ``rec`` just before it, outer first (undone after it)."""
    at = records.index(rec)
    for keys in created:
        if _find(records, keys, ("parent",)) is None:
            records.insert(at, {"owner": owner, "kind": "parent", "keys": list(keys)})
            at += 1


def apply_edits(doc: Document, edits: list[Edit], records: list[dict], owner: str) -> list[str]:
    """Make ``doc`` hold ``edits``, adding to ``records``; return what changed, in words."""
    done: list[str] = []
    for edit in edits:
        current = doc.get(edit.keys)
        if edit.kind == "init":
            if current is MISSING:
                doc.set(edit.keys, edit.value)
                done.append(edit.what or f"set {dotted(edit.keys)}")
            continue
        if edit.kind == "item":
            if _apply_item(doc, edit, current, records, owner):
                done.append(edit.what or f"added {edit.value!r} to {dotted(edit.keys)}")
            continue
        if same(current, edit.value):
            continue
        rec = _find(records, edit.keys, ("set", "owned"))
        if (
            rec is None
            and edit.kind == "owned"
            and current is not MISSING
            and edit.claim is not None
            and not edit.claim(current)
        ):
            raise InputFileError(
                f"{doc.path}: {dotted(edit.keys)} exists and was not added by nvshim;"
                " choose another --runtime-name or remove it first"
            )
        if rec is None:
            rec = {"owner": owner, "kind": edit.kind, "keys": list(edit.keys)}
            if current is not MISSING:
                rec["before"] = current
            records.append(rec)
        created = doc.set(edit.keys, edit.value)
        rec["after"] = edit.value
        _add_parents(records, rec, created, owner)
        done.append(edit.what or f"set {dotted(edit.keys)}")
    return done


def _apply_item(doc: Document, edit: Edit, current: Any, records: list, owner: str) -> bool:
    if current is MISSING:
        rec = {"owner": owner, "kind": "item", "keys": list(edit.keys), "after": edit.value}
        rec["created"] = True
        records.append(rec)
        _add_parents(records, rec, doc.set(edit.keys, [edit.value]), owner)
        return True
    if not isinstance(current, list):
        raise doc.type_error(edit.keys, "an array", type_name(current))
    if any(same(x, edit.value) for x in current):
        return False
    doc.list_add(edit.keys, edit.value)
    records.append({"owner": owner, "kind": "item", "keys": list(edit.keys), "after": edit.value})
    return True


def revert_records(doc: Document, records: list[dict]) -> tuple[list[str], list[str]]:
    """Undo ``records`` (newest first); return (what was undone, what was kept and why)."""
    undone: list[str] = []
    kept: list[str] = []
    for rec in reversed(records):
        keys: Keys = tuple(rec["keys"])
        kind = rec["kind"]
        current = doc.get(keys)
        name = dotted(keys)
        if kind == "owned":
            if current is MISSING:
                continue
            claim = rec.get("claim")
            if claim is not None and not claim(current):
                kept.append(f"kept {name}: not nvshim's")
                continue
            undone.append(_put_back(doc, keys, rec, name, show_value=False))
        elif kind == "set":
            if current is MISSING:
                continue
            if not same(current, rec["after"]):
                if not rec.get("guess"):
                    kept.append(f"kept {name} = {current!r}: changed since nvshim set it")
                continue
            undone.append(_put_back(doc, keys, rec, name, show_value=True))
        elif kind == "item":
            if isinstance(current, list) and any(same(x, rec["after"]) for x in current):
                doc.list_remove(keys, rec["after"])
                undone.append(f"removed {rec['after']!r} from {name}")
                if rec.get("created") and doc.get(keys) == []:
                    doc.delete(keys)
        elif kind == "parent":
            if isinstance(current, dict) and not current:
                doc.delete(keys)
    return undone, kept


def _put_back(doc, keys, rec: dict, name: str, show_value: bool) -> str:
    """Restore the recorded ``before`` value of ``keys`` (or delete the key nvshim added);
    the line saying what was done."""
    if "before" not in rec:
        doc.delete(keys)
        return f"removed {name}"
    doc.set(keys, rec["before"])
    return f"restored {name} = {rec['before']!r}" if show_value else f"restored {name}"
