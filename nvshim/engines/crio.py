"""CRI-O: ``crio.runtime.runtimes.<name>`` in a drop-in of its own (by default).

Every key of the runtime CRI-O uses by default (``runtime_root``, ``monitor_*``,
``allowed_annotations`` ...) is copied, read from ``crio.conf`` and the other drop-ins the
way CRI-O reads them (main file, then the drop-in directory in name order); only
``runtime_path`` and ``runtime_type`` are nvshim's.
"""

from __future__ import annotations

import os

from nvshim.engines import common
from nvshim.engines.common import decode, read_bytes
from nvshim.engines.doc import MISSING, Document, type_name
from nvshim.engines.records import Edit, recorded_before
from nvshim.engines.settings import Settings
from nvshim.engines.tomldoc import TomlDoc
from nvshim.errors import NvshimError

RUNTIME = ("crio", "runtime")
BUILTIN_DEFAULTS = ("crun", "runc")
# The node installer's handler keeps its containers' runtime state here (``runtime_root``),
# apart from the default runtime's: a container is nvshim's exactly when it is listed here,
# which the uninstall's pass-through needs (CRI-O keeps no bundle naming the runtime binary).
OWN_RUNTIME_ROOT = "/run/nvshim-runc"


def load(path: str, text: str) -> Document:
    return TomlDoc(text, path)


def files(s: Settings) -> list[str]:
    return [s.config]


def source_files(config: str) -> list[str]:
    """The files CRI-O reads, in its order, that bear on ``config``'s runtime: for a
    drop-in, ``crio.conf`` and the other drop-ins; for ``crio.conf``, itself and
    ``crio.conf.d``."""
    config = os.path.abspath(config)
    directory = os.path.dirname(config)
    if directory.endswith(".d"):
        main, dropins = directory[: -len(".d")], directory
    else:
        main, dropins = config, config + ".d"
    try:
        names = sorted(os.listdir(dropins))
    except OSError:
        names = []
    found = [main] + [os.path.join(dropins, n) for n in names]
    return [p for p in found if os.path.isfile(p) and (p != config or p == main)]


def _status_config() -> TomlDoc | None:
    """The running CRI-O's effective config (``crio status config``); None when it fails."""
    import subprocess

    try:
        out = subprocess.run(
            ["crio", "status", "config"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    try:
        return TomlDoc(out.stdout, "crio status config")
    except NvshimError:
        return None


def source_docs(s: Settings) -> list[Document]:
    """Where the default runtime is read from, in ``--config-source`` order: ``crio status
    config`` when it works, else the files CRI-O reads."""
    for source in (x.strip() for x in s.config_source.split(",")):
        if source == "command":
            found = _status_config()
            if found is not None:
                return [found]
        elif source == "file":
            break
    return [TomlDoc(decode(p, read_bytes(p)), p) for p in source_files(s.config)]


def _effective(docs: list[Document]) -> tuple[str | None, dict]:
    """CRI-O's default runtime name and runtime tables over ``docs``; a wrong type where
    they are read (CRI-O would refuse it too) is one error naming file, line and key."""
    default = None
    runtimes: dict = {}
    for doc in docs:
        name = doc.get(RUNTIME + ("default_runtime",))
        if name is not MISSING and not isinstance(name, str):
            raise doc.type_error(RUNTIME + ("default_runtime",), "a string", type_name(name))
        if isinstance(name, str) and name:
            default = name
        found = doc.get(RUNTIME + ("runtimes",))
        if isinstance(found, dict):
            for key, table in found.items():
                if not isinstance(table, dict):
                    keys = RUNTIME + ("runtimes", key)
                    raise doc.type_error(keys, "a table", type_name(table))
                runtimes[key] = {**runtimes.get(key, {}), **table}
    return default, runtimes


def runtime_table(s: Settings, history: list[dict]) -> dict:
    """The nvshim handler: every key of CRI-O's default runtime (the one before nvshim's
    when nvshim made itself the default), nvshim's binary, type ``oci``."""
    default, runtimes = _effective(source_docs(s))
    if default == s.runtime_name:
        default = recorded_before(history, RUNTIME + ("default_runtime",))
    entry: dict = {"runtime_path": s.runtime_path, "runtime_type": "oci"}
    for candidate in (default, *BUILTIN_DEFAULTS):
        if candidate and candidate != s.runtime_name and candidate in runtimes:
            for key, value in runtimes[candidate].items():
                if key not in entry:
                    entry[key] = value
            break
    entry.update(s.override)
    return entry


def plan(
    s: Settings, docs: dict[str, Document], history: dict[str, list[dict]]
) -> tuple[dict[str, list], list[str]]:
    """Edits for the drop-in, and a note when ``--enable-cdi`` has nothing to do."""
    warnings = []
    if s.enable_cdi:
        warnings.append(
            "CRI-O reads CDI specs without a setting (cdi_spec_dirs): nothing to enable"
        )
    edits = []
    if s.set_as_default:
        edits.append(
            Edit(
                RUNTIME + ("default_runtime",),
                s.runtime_name,
                what=f"made {s.runtime_name!r} the default runtime",
            )
        )
    edits.append(
        Edit(
            RUNTIME + ("runtimes", s.runtime_name),
            runtime_table(s, history.get(s.config, [])),
            kind="owned",
            what=f"runtime {s.runtime_name!r} -> {s.runtime_path}",
            claim=common.claim_by_key(s.runtime_path, "runtime_path"),
        )
    )
    return {s.config: edits}, warnings


def claims(s: Settings, path: str, doc: Document) -> list[dict]:
    """Records to undo when nvshim has none: its handler and default."""
    owner = s.runtime_name
    return [
        {"owner": owner, "guess": True, "kind": "parent", "keys": ["crio"]},
        {"owner": owner, "guess": True, "kind": "parent", "keys": ["crio", "runtime"]},
        {"owner": owner, "guess": True, "kind": "parent", "keys": ["crio", "runtime", "runtimes"]},
        {
            "owner": owner,
            "guess": True,
            "kind": "owned",
            "keys": ["crio", "runtime", "runtimes", s.runtime_name],
            "claim": common.claim_by_key(s.runtime_path, "runtime_path"),
        },
        {
            "owner": owner,
            "guess": True,
            "kind": "set",
            "keys": ["crio", "runtime", "default_runtime"],
            "after": s.runtime_name,
        },
    ]
