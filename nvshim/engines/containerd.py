"""containerd: the nvshim runtime in the CRI plugin's runtime table (config versions 1-3).

The runtime entry copies the current default runtime (or ``runc``) so pods on nvshim
behave like the others (``SystemdCgroup`` above all), then points ``options.BinaryName``
at nvshim. With ``--drop-in`` the settings go to their own file, listed in ``imports``;
that needs containerd 2.1 or later, which merges imported tables key by key.
"""

from __future__ import annotations

import functools
import glob
import os
import re
import subprocess

from nvshim.engines import common
from nvshim.engines.doc import MISSING, Document, Keys
from nvshim.engines.records import Edit, recorded_before
from nvshim.engines.settings import Settings
from nvshim.engines.tomldoc import TomlDoc
from nvshim.errors import UsageError

RUNC_V2 = "io.containerd.runc.v2"
CDI_ANNOTATIONS = "cdi.k8s.io/*"
CRI_PLUGIN: dict[int, Keys] = {
    1: ("plugins", "cri"),
    2: ("plugins", "io.containerd.grpc.v1.cri"),
    3: ("plugins", "io.containerd.cri.v1.runtime"),
}
DEEP_MERGE_IMPORTS = (2, 1)  # first containerd that merges imported files table by table
FIRST_CDI = (1, 7)

_VERSION_RE = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?")


def parse_version(text: str) -> tuple[int, int, int] | None:
    """``(major, minor, patch)`` from ``containerd --version`` output or a bare ``1.7.2``."""
    words = text.split()
    # "containerd github.com/containerd/containerd 1.6.20~ds1 <revision>": the third word
    candidates = words[2:3] + words if len(words) >= 3 else words
    for word in candidates:
        match = _VERSION_RE.match(word)
        if match:
            return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)
    return None


@functools.lru_cache(maxsize=8)
def installed_version(binary: str = "containerd") -> tuple[int, int, int] | None:
    """The version of the containerd on ``PATH`` (``None`` when there is none)."""
    try:
        out = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=20, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_version(out.stdout) if out.returncode == 0 else None


def containerd_version(s: Settings) -> tuple[int, int, int] | None:
    """The version in use: ``--containerd-version``/``NVSHIM_CONTAINERD_VERSION`` or detected."""
    if s.containerd_version:
        found = parse_version(s.containerd_version)
        if found is None:
            raise UsageError(f"containerd version {s.containerd_version!r}: expected like 1.7.2")
        return found
    return installed_version()


def _show(version: tuple[int, int, int]) -> str:
    return ".".join(map(str, version))


def config_version(doc: Document) -> int:
    """The file's config ``version`` (missing means 1); unknown versions are refused."""
    value = doc.get(("version",))
    if value is MISSING:
        return 1
    if isinstance(value, bool) or not isinstance(value, int):
        raise doc.type_error(("version",), "an integer", repr(value))
    if value not in CRI_PLUGIN:
        line = doc.line_of(("version",))
        where = f"{doc.path}:{line}" if line else doc.path
        raise UsageError(
            f"{where}: containerd config version {value} is not supported"
            " (nvshim knows versions 1, 2 and 3)"
        )
    return value


def new_file_version(s: Settings) -> int:
    """The config version to write into a missing or empty file."""
    version = containerd_version(s)
    if version is None:
        raise UsageError(
            "cannot tell which config version to write: containerd is not on PATH;"
            " set NVSHIM_CONTAINERD_VERSION (e.g. 1.7.2)"
        )
    return 3 if version[0] >= 2 else 2


def load(path: str, text: str) -> Document:
    return TomlDoc(text, path)


def files(s: Settings) -> list[str]:
    """The files a run may write: the main config, then the drop-in if any."""
    return [s.config] + ([os.path.abspath(s.drop_in)] if s.drop_in else [])


def _effective(docs: list[Document], cri: Keys) -> tuple[str, dict]:
    """Default runtime name and runtime tables seen through ``docs`` (later ones win)."""
    default = "runc"
    runtimes: dict = {}
    for doc in docs:
        name = doc.get(cri + ("containerd", "default_runtime_name"))
        if isinstance(name, str) and name:
            default = name
        found = doc.get(cri + ("containerd", "runtimes"))
        if isinstance(found, dict):
            for key, table in found.items():
                if isinstance(table, dict) and isinstance(runtimes.get(key), dict):
                    runtimes[key] = {**runtimes[key], **table}
                else:
                    runtimes[key] = table
    return default, runtimes


def runtime_table(s: Settings, docs: list[Document], cri: Keys, history: list[dict]) -> dict:
    """The nvshim runtime entry: the default (or ``runc``) runc entry, retargeted. When
    nvshim is the default already, the default before it (from ``history``) is copied."""
    default, runtimes = _effective(docs, cri)
    if default == s.runtime_name:
        default = recorded_before(history, cri + ("containerd", "default_runtime_name"))
    source: dict = {}
    for candidate in (default, "runc"):
        table = runtimes.get(candidate) if candidate else None
        if candidate == s.runtime_name or not isinstance(table, dict):
            continue
        if table.get("runtime_type", RUNC_V2) in (RUNC_V2, ""):
            source = table
            break
    entry: dict = {"runtime_type": RUNC_V2}
    for key, value in source.items():
        if key not in ("runtime_type", "options"):
            entry[key] = value
    if s.enable_cdi:
        annotations = entry.get("container_annotations")
        annotations = list(annotations) if isinstance(annotations, list) else []
        if CDI_ANNOTATIONS not in annotations:
            annotations.append(CDI_ANNOTATIONS)
        entry["container_annotations"] = annotations
    copied = source.get("options")
    copied = copied if isinstance(copied, dict) else {}
    entry["options"] = {"BinaryName": s.runtime_path}
    entry["options"].update((k, v) for k, v in copied.items() if k != "BinaryName")
    return entry


def _is_ours(s: Settings):
    def claim(table: object) -> bool:
        if not isinstance(table, dict) or not isinstance(table.get("options"), dict):
            return False
        return common.points_at_nvshim(s.runtime_path, table["options"].get("BinaryName"))

    return claim


def runtime_edits(
    s: Settings, sources: list[Document], version: int, history: list[dict]
) -> list[Edit]:
    """What the runtime needs (config ``version``), copying from ``sources``."""
    cri = CRI_PLUGIN[version]
    edits: list[Edit] = []
    if s.enable_cdi:
        edits.append(Edit(cri + ("enable_cdi",), True, what="enabled CDI"))
    if s.set_as_default:
        edits.append(
            Edit(
                cri + ("containerd", "default_runtime_name"),
                s.runtime_name,
                what=f"made {s.runtime_name!r} the default runtime",
            )
        )
    edits.append(
        Edit(
            cri + ("containerd", "runtimes", s.runtime_name),
            runtime_table(s, sources, cri, history),
            kind="owned",
            what=f"runtime {s.runtime_name!r} -> {s.runtime_path}",
            claim=_is_ours(s),
        )
    )
    return edits


def _covered_by_imports(main: Document, main_path: str, drop_in: str) -> bool:
    """Whether ``imports`` of ``main`` already names ``drop_in`` (both as containerd sees
    them)."""
    imports = main.get(("imports",))
    if not isinstance(imports, list):
        return False
    base = os.path.dirname(main_path)
    for pattern in imports:
        if isinstance(pattern, str) and pattern:
            full = os.path.normpath(os.path.join(base, pattern))
            if full == drop_in or (glob.has_magic(full) and _glob_match(full, drop_in)):
                return True
    return False


def _glob_match(pattern: str, path: str) -> bool:
    """Go ``filepath.Match`` semantics: ``*`` never crosses a ``/``."""
    from fnmatch import fnmatchcase

    pparts, parts = pattern.split("/"), path.split("/")
    return len(pparts) == len(parts) and all(map(fnmatchcase, parts, pparts))


def plan(
    s: Settings, docs: dict[str, Document], history: dict[str, list[dict]]
) -> tuple[dict[str, list], list[str]]:
    """Edits per file and warnings for one ``configure`` run (``history``: the records
    of earlier runs, per file)."""
    warnings: list[str] = []
    main = docs[s.config]
    edits: dict[str, list] = {s.config: []}
    if main.is_empty():
        main_version = new_file_version(s)
        edits[s.config].append(Edit(("version",), main_version, kind="init"))
    else:
        main_version = config_version(main)
    installed = containerd_version(s)
    if s.enable_cdi and installed is not None and installed < FIRST_CDI:
        warnings.append(
            f"containerd {_show(installed)} has no CDI support: enable_cdi takes effect"
            " from containerd 1.7"
        )
    if isinstance(main, TomlDoc) and main.text.startswith("# File generated by k3s"):
        warnings.append(
            f"{s.config} is generated by k3s and rewritten when k3s restarts;"
            " put these settings in config.toml.tmpl beside it"
        )
    if not s.drop_in:
        edits[s.config] += runtime_edits(s, [main], main_version, history.get(s.config, []))
        return edits, warnings

    drop_in = os.path.abspath(s.drop_in)
    if installed is None or installed < DEEP_MERGE_IMPORTS:
        found = f"containerd {_show(installed)}" if installed else "an unknown containerd"
        raise UsageError(
            f"--drop-in needs containerd 2.1 or later ({found} here): older versions replace"
            " a whole plugin table from an imported file, so a partial CRI table there would"
            " hide the main file's CRI settings; leave out --drop-in to edit the main file"
        )
    sub = docs[drop_in]
    if sub.is_empty():
        sub_version = main_version if not main.is_empty() else new_file_version(s)
        edits[drop_in] = [Edit(("version",), sub_version, kind="init")]
    else:
        sub_version = config_version(sub)
        edits[drop_in] = []
    if sub_version != main_version:
        raise UsageError(
            f"{drop_in}: config version {sub_version} differs from {s.config}"
            f" (version {main_version}); they must match"
        )
    edits[drop_in] += runtime_edits(s, [main, sub], sub_version, history.get(drop_in, []))
    shown = s.on_host(drop_in)  # the path containerd reads
    if not _covered_by_imports(main, s.on_host(s.config), shown):
        edits[s.config].append(Edit(("imports",), shown, kind="item", what=f"imported {shown}"))
    return edits, warnings


def claims(s: Settings, path: str, doc: Document) -> list[dict]:
    """Records to undo when nvshim has none for ``path``: what is recognisably its own."""
    if doc.is_empty():
        return []
    if s.drop_in and path == s.config:
        drop_in = os.path.abspath(s.drop_in)
        return [
            {
                "owner": s.runtime_name,
                "guess": True,
                "kind": "item",
                "keys": ["imports"],
                "after": s.on_host(drop_in),
            }
        ]
    cri = CRI_PLUGIN[config_version(doc)]
    return [
        {
            "owner": s.runtime_name,
            "guess": True,
            "kind": "set",
            "keys": list(cri + ("containerd", "default_runtime_name")),
            "after": s.runtime_name,
        },
        {
            "owner": s.runtime_name,
            "guess": True,
            "kind": "owned",
            "keys": list(cri + ("containerd", "runtimes", s.runtime_name)),
            "claim": _is_ours(s),
        },
    ]
