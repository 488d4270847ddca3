"""Docker: ``runtimes.<name>`` in ``daemon.json``, optional ``default-runtime`` and CDI.

``features.cdi`` is merged into an existing ``features`` map (the reference toolkit once
replaced the whole map); every other key is left as it is.
"""

from __future__ import annotations

from nvshim.engines import common
from nvshim.engines.doc import MISSING, Document, type_name
from nvshim.engines.jsondoc import JsonDoc
from nvshim.engines.records import Edit
from nvshim.engines.settings import Settings

CDI = ("features", "cdi")


def load(path: str, text: str) -> Document:
    return JsonDoc(text, path)


def files(s: Settings) -> list[str]:
    return [s.config]


def plan(
    s: Settings, docs: dict[str, Document], history: dict[str, list[dict]]
) -> tuple[dict[str, list], list[str]]:
    """Edits for ``daemon.json`` (no warnings)."""
    check_edited(docs[s.config])
    edits = [
        Edit(
            ("runtimes", s.runtime_name),
            {"path": s.runtime_path, "args": []},
            kind="owned",
            what=f"runtime {s.runtime_name!r} -> {s.runtime_path}",
            claim=common.claim_by_key(s.runtime_path, "path"),
        )
    ]
    if s.set_as_default:
        edits.append(
            Edit(
                ("default-runtime",),
                s.runtime_name,
                what=f"made {s.runtime_name!r} the default runtime",
            )
        )
    if s.enable_cdi:
        edits.append(Edit(CDI, True, what="enabled CDI"))
    return {s.config: edits}, []


def check_edited(doc: Document) -> None:
    """The keys nvshim may set have the types Docker reads (else dockerd refuses the
    file, and an edit would hide that, or unconfigure bring it back): one error naming
    file, line and key."""
    for keys, want, kind in ((("default-runtime",), "a string", str), (CDI, "a boolean", bool)):
        value = doc.get(keys)
        if value is not MISSING and not isinstance(value, kind):
            raise doc.type_error(keys, want, type_name(value))


def claims(s: Settings, path: str, doc: Document) -> list[dict]:
    """Records to undo when nvshim has none: its runtime entry and default."""
    return [
        {"owner": s.runtime_name, "guess": True, "kind": "parent", "keys": ["runtimes"]},
        {
            "owner": s.runtime_name,
            "guess": True,
            "kind": "owned",
            "keys": ["runtimes", s.runtime_name],
            "claim": common.claim_by_key(s.runtime_path, "path"),
        },
        {
            "owner": s.runtime_name,
            "guess": True,
            "kind": "set",
            "keys": ["default-runtime"],
            "after": s.runtime_name,
        },
    ]
