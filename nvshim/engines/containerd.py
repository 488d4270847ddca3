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
import subprocess

from nvshim.engines import common
from nvshim.engines.doc import MISSING, Document, Keys, dotted, type_name
from nvshim.engines.records import Edit, recorded_before
from nvshim.engines.settings import Settings, parse_version
from nvshim.engines.tomldoc import TomlDoc
from nvshim.errors import InputFileError, UsageError
from nvshim.record import replace

RUNC_V2 = "io.containerd.runc.v2"
RUNC_TYPES = (RUNC_V2, "io.containerd.runc.v1")
V1_LINUX = "io.containerd.runtime.v1.linux"
# io.containerd.runtime.v1.linux options (its RuncOptions, and the per-task CreateOptions
# people write beside them) -> runc v2 options; Runtime, the runc binary, is replaced by
# BinaryName = nvshim-runtime. RuntimeRoot (what v1 reads) wins over a Root beside it.
V1_OPTIONS = {
    "RuntimeRoot": "Root",
    **{name: name for name in ("Root", "NoPivotRoot", "NoNewKeyring", "ShimCgroup", "IoUid",
                               "IoGid", "CriuPath", "CriuImagePath", "CriuWorkPath",
                               "SystemdCgroup")},
}  # fmt: skip
V1_ENTRY_KEYS = ("runtime_engine", "runtime_root")  # v1 only: folded into the options
LEGACY_DEFAULT = "default"  # containerd 1.x names its legacy default_runtime table so
REFERENCE_BINARY = "nvidia-container-runtime"
CDI_ANNOTATIONS = "cdi.k8s.io/*"
CRI_PLUGIN: dict[int, Keys] = {
    1: ("plugins", "cri"),
    2: ("plugins", "io.containerd.grpc.v1.cri"),
    3: ("plugins", "io.containerd.cri.v1.runtime"),
}
DEEP_MERGE_IMPORTS = (2, 1)  # first containerd that merges imported files table by table
FIRST_CDI = (1, 7)


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
        raise InputFileError(
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


def _rendered(template: str) -> Document:
    """The ``config.toml`` k3s/RKE2 rendered beside ``config.toml.tmpl`` (what its base
    template holds, the default runtime's options included)."""
    path = template.removesuffix(".tmpl")
    return TomlDoc(common.decode(path, common.read_bytes(path)), path)


def template_version(s: Settings) -> int:
    """The config version of a k3s/RKE2 ``config.toml.tmpl`` whose ``{{ template "base" . }}``
    writes it: the version of the rendered ``config.toml`` beside it, else the one for the
    installed containerd."""
    rendered = _rendered(s.config)
    return new_file_version(s) if rendered.is_empty() else config_version(rendered)


BASE_TEMPLATE = '{{ template "base" . }}\n'


def load(path: str, text: str) -> Document:
    """The document of ``path``; a missing k3s/RKE2 ``config.toml.tmpl`` starts as the
    base template, so it renders what k3s would plus nvshim's runtime."""
    if path.endswith(".tmpl") and not text.strip():
        text = BASE_TEMPLATE
    return TomlDoc(text, path)


def files(s: Settings) -> list[str]:
    """The files a run may write: the main config, then the drop-in if any."""
    return [s.config] + ([os.path.abspath(s.drop_in)] if s.drop_in else [])


def _merge(base: dict, over: dict, deep: bool) -> dict:
    """``over`` (a later file) on ``base`` as containerd merges imports: key by key all
    the way down from 2.1 (``deep``); before, each plugin table (and every other top-level
    key) replaced whole."""
    out = dict(base)
    for key, value in over.items():
        mine = out.get(key)
        if isinstance(mine, dict) and isinstance(value, dict) and (deep or key == "plugins"):
            out[key] = _merge(mine, value, deep) if deep else {**mine, **value}
        else:
            out[key] = value
    return out


def _plain_tree(doc: Document) -> dict:
    found = doc.get(())
    return found if isinstance(found, dict) else {}


def _effective(docs: list[Document], cri: Keys, deep: bool = True) -> tuple[str, dict, dict]:
    """Default runtime name, runtime tables and the merged CRI table seen through ``docs``
    (later ones win). The legacy ``containerd.default_runtime`` table counts as the
    runtime ``default``, as containerd 1.x reads it."""
    merged: dict = {}
    for doc in docs:
        merged = _merge(merged, _plain_tree(doc), deep)
    table: object = merged
    for key in cri:
        table = table.get(key) if isinstance(table, dict) else None
    cri_table = table if isinstance(table, dict) else {}
    section = cri_table.get("containerd")
    section = section if isinstance(section, dict) else {}
    runtimes = section.get("runtimes")
    runtimes = dict(runtimes) if isinstance(runtimes, dict) else {}
    default = section.get("default_runtime_name")
    legacy = section.get("default_runtime")
    if isinstance(legacy, dict) and legacy.get("runtime_type"):
        runtimes.setdefault(LEGACY_DEFAULT, legacy)
        if not default:
            default = LEGACY_DEFAULT
    return (default if isinstance(default, str) and default else "runc"), runtimes, merged


def _options(table: dict, merged: dict, cri: Keys, warnings: list[str]) -> dict:
    """The runc v2 options equivalent to ``table``'s: as they are for runc types (and any
    other type, with a warning), translated from ``io.containerd.runtime.v1.linux``'s the
    way containerd reads them (its legacy CRI and ``linux`` plugin settings when the
    runtime has no options)."""
    kind = table.get("runtime_type") or RUNC_V2
    options = table.get("options")
    options = dict(options) if isinstance(options, dict) else {}
    if kind in RUNC_TYPES:
        return options
    if kind != V1_LINUX:
        warnings.append(
            f"the default runtime's type is {kind}: its options are copied into a"
            f" {RUNC_V2} entry; check them (--runtime-config-override)"
        )
        return options
    out: dict = {}
    for old, new in V1_OPTIONS.items():
        if old in options:
            out.setdefault(new, options[old])
    dropped = sorted(set(options) - set(V1_OPTIONS) - {"Runtime"})
    if dropped:
        warnings.append(
            f"the default runtime's {V1_LINUX} options {', '.join(dropped)} have no"
            f" {RUNC_V2} equivalent: not carried over"
        )
    linux = _at(merged, ("plugins", "linux")) or _at(merged, ("plugins", V1_LINUX))
    legacy = not options  # containerd reads the entry's own keys and the CRI table then
    if legacy and _at(merged, cri).get("systemd_cgroup") is True:
        out["SystemdCgroup"] = True
    for root in (table.get("runtime_root") if legacy else None, linux.get("runtime_root")):
        if "Root" not in out and isinstance(root, str) and root:
            out["Root"] = root
    engine = options.get("Runtime") or table.get("runtime_engine") or linux.get("runtime")
    if isinstance(engine, str) and os.path.basename(engine) not in ("", "runc"):
        warnings.append(
            f"the default runtime runs {engine}: nvshim-runtime runs the low-level runtime"
            " its own config names ([runtime] runtimes)"
        )
    shim = [key for key in ("no_shim", "shim_debug") if linux.get(key) is True]
    if shim:
        warnings.append(
            f"{' and '.join(shim)} of the {V1_LINUX} plugin have no {RUNC_V2} equivalent"
        )
    if _at(merged, cri + ("containerd",)).get("no_pivot") is True:
        out.setdefault("NoPivotRoot", True)
    return out


def _at(tree: dict, keys: Keys) -> dict:
    for key in keys:
        tree = tree.get(key) if isinstance(tree, dict) else None
    return tree if isinstance(tree, dict) else {}


def runtime_table(
    s: Settings,
    docs: list[Document],
    cri: Keys,
    history: list[dict],
    warnings: list[str] | None = None,
    deep: bool = True,
) -> dict:
    """The nvshim runtime entry: the default (or ``runc``) entry, retargeted. When nvshim
    is the default already, the default before it (from ``history``) is copied; with
    ``take_over``, the reference's entry of that name is the one copied."""
    warnings = [] if warnings is None else warnings
    default, runtimes, merged = _effective(docs, cri, deep)
    if default == s.runtime_name and not s.take_over:
        default = recorded_before(history, cri + ("containerd", "default_runtime_name"))
    source: dict = {}
    taken = _taken_over(history, cri + ("containerd", "runtimes", s.runtime_name))
    if s.take_over and taken is not None:  # configured before: the reference's entry
        runtimes = {**runtimes, s.runtime_name: taken}
    candidates = ((s.runtime_name,) if s.take_over else ()) + (default, "runc")
    for candidate in candidates:
        table = runtimes.get(candidate) if candidate else None
        if not isinstance(table, dict):
            continue
        if candidate == s.runtime_name and not (s.take_over and _is_reference(table)):
            continue
        source = table
        break
    entry: dict = {"runtime_type": RUNC_V2}
    skip = ("runtime_type", "options")
    skip += V1_ENTRY_KEYS if source.get("runtime_type") == V1_LINUX else ()
    for key, value in source.items():
        if key not in skip:
            entry[key] = value
    if s.enable_cdi:
        annotations = entry.get("container_annotations")
        annotations = list(annotations) if isinstance(annotations, list) else []
        if CDI_ANNOTATIONS not in annotations:
            annotations.append(CDI_ANNOTATIONS)
        entry["container_annotations"] = annotations
    copied = _options(source, merged, cri, warnings) if source else {}
    if not source and s.cgroup_driver_or_host() == "systemd":
        copied["SystemdCgroup"] = True
    entry["options"] = {"BinaryName": s.runtime_path}
    for options in (copied, s.override):  # BinaryName stays nvshim's
        entry["options"].update((k, v) for k, v in options.items() if k != "BinaryName")
    return entry


def _refuse_reference(s: Settings, doc: Document) -> None:
    """A reference entry of ``--runtime-name`` is taken over only when asked."""
    if not isinstance(doc, TomlDoc) or doc.is_empty():
        return
    keys = CRI_PLUGIN[config_version(doc)] + ("containerd", "runtimes", s.runtime_name)
    entry = doc.get(keys)
    if _is_reference(entry):
        raise InputFileError(
            f"{doc.path}: {dotted(keys)} runs the NVIDIA Container Toolkit's"
            f" {entry['options']['BinaryName']}: add --take-over to point it at nvshim-runtime"
            " (keeping its options; unconfigure gives it back), or choose another"
            " --runtime-name"
        )


def _taken_over(history: list[dict], keys: Keys) -> dict | None:
    """The reference entry an earlier ``--take-over`` replaced (from the records)."""
    for rec in history:
        if rec["kind"] == "owned" and tuple(rec["keys"]) == keys:
            before = rec.get("before")
            return before if _is_reference(before) else None
    return None


def _is_reference(table: object) -> bool:
    """An entry the NVIDIA Container Toolkit wrote: its binary is nvidia-container-runtime."""
    if not isinstance(table, dict) or not isinstance(table.get("options"), dict):
        return False
    binary = table["options"].get("BinaryName")
    return isinstance(binary, str) and os.path.basename(binary).startswith(REFERENCE_BINARY)


def _is_ours(s: Settings):
    def claim(table: object) -> bool:
        if not isinstance(table, dict) or not isinstance(table.get("options"), dict):
            return False
        if s.take_over and _is_reference(table):
            return True
        return common.points_at_nvshim(s.runtime_path, table["options"].get("BinaryName"))

    return claim


def runtime_edits(
    s: Settings,
    sources: list[Document],
    version: int,
    history: list[dict],
    warnings: list[str] | None = None,
    deep: bool = True,
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
            runtime_table(s, sources, cri, history, warnings, deep),
            kind="owned",
            what=f"runtime {s.runtime_name!r} -> {s.runtime_path}",
            claim=_is_ours(s),
        )
    )
    return edits


def source_docs(s: Settings, main: Document, edited: list[Document]) -> list[Document]:
    """Where the default runtime is read from: ``containerd config dump`` when
    ``--config-source`` lists ``command`` first and it works, else the files (the main
    file, the files it imports, then the file being edited); each checked (``check_read``)."""
    docs = edited
    for source in (x.strip() for x in s.config_source.split(",")):
        if source == "command":
            dumped = _config_dump(s.config)
            if dumped is not None:
                docs = [dumped, *edited[1:]]
                break
        elif source == "file":
            base = [_rendered(s.config)] if getattr(main, "template", False) else []
            imported = imported_docs(s.config, main, skip=edited, root=s.host_root)
            docs = [*base, main, *imported, *edited[1:]]
            break
    for doc in docs:
        check_read(doc)
    return docs


def check_read(doc: Document) -> None:
    """The keys nvshim reads to copy the default runtime have the types containerd
    decodes them into (else containerd would refuse the file, and nvshim copy nothing):
    ``imports`` an array of strings; in the CRI table ``default_runtime_name`` a string,
    each runtime a table and its ``options`` a table. One error naming file, line, key."""
    imports = doc.get(("imports",))
    if imports is not MISSING:
        wrong = [i for i in imports if not isinstance(i, str)] if isinstance(imports, list) else []
        if wrong or not isinstance(imports, list):
            found = f"an entry that is {type_name(wrong[0])}" if wrong else type_name(imports)
            raise doc.type_error(("imports",), "an array of strings", found)
    if doc.is_empty() or getattr(doc, "template", False):
        return
    section = CRI_PLUGIN[config_version(doc)] + ("containerd",)
    default = doc.get(section + ("default_runtime_name",))
    if default is not MISSING and not isinstance(default, str):
        raise doc.type_error(section + ("default_runtime_name",), "a string", type_name(default))
    runtimes = doc.get(section + ("runtimes",))
    for name, table in runtimes.items() if isinstance(runtimes, dict) else ():
        keys = section + ("runtimes", name)
        if not isinstance(table, dict):
            raise doc.type_error(keys, "a table", type_name(table))
        options = table.get("options", {})
        if not isinstance(options, dict):
            raise doc.type_error(keys + ("options",), "a table", type_name(options))


def _config_dump(config: str) -> Document | None:
    """The effective config from ``containerd --config CONFIG config dump``; None when
    containerd is missing or fails."""
    try:
        out = subprocess.run(
            ["containerd", "--config", config, "config", "dump"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    try:
        return TomlDoc(out.stdout, f"containerd config dump ({config})")
    except InputFileError:
        return None


def check_shadowing(s: Settings, main: Document, version: int, deep: bool) -> None:
    """Refuse to edit ``main``'s CRI table when, before containerd 2.1, a file it imports
    holds the CRI plugin table: that one replaces the main file's whole (the reference's
    ``--drop-in-config`` writes such a copy), so the edit would never take effect."""
    if deep:
        return
    plugin = CRI_PLUGIN[version]
    for doc in imported_docs(s.config, main, skip=[], root=s.host_root):
        if doc.get(plugin) is not MISSING:
            raise InputFileError(
                f"{doc.path} (imported by {s.config}) holds the {dotted(plugin)} table, which"
                " replaces the main file's whole before containerd 2.1: configure that file"
                f" instead (--engine-config {doc.path})"
            )


def imported_docs(
    config: str, main: Document, skip: list[Document], root: str = "/"
) -> list[Document]:
    """The files ``main``'s ``imports`` name, in containerd's order (each glob sorted,
    relative to the main file's directory, imports of imports followed once). ``root``:
    where containerd's ``/`` is seen from here (the paths in ``imports`` are its own)."""
    from nvshim.host.rootpath import container_path, host_path

    seen = {os.path.abspath(config)} | {os.path.abspath(d.path) for d in skip}
    out: list[Document] = []

    def follow(doc: Document, base: str) -> None:
        patterns = doc.get(("imports",))
        if not isinstance(patterns, list):
            return
        for pattern in patterns:
            if not isinstance(pattern, str) or not pattern:
                continue
            full = host_path(root, os.path.normpath(os.path.join(base, pattern)))
            for path in sorted(glob.glob(full)) if glob.has_magic(full) else [full]:
                if path in seen or not os.path.isfile(path):
                    continue
                seen.add(path)
                sub = TomlDoc(common.decode(path, common.read_bytes(path)), path)
                out.append(sub)
                follow(sub, container_path(root, os.path.dirname(path)))

    follow(main, container_path(root, os.path.dirname(os.path.abspath(config))))
    return out


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
    if getattr(main, "template", False) and main.get(("version",)) is MISSING:
        main_version = template_version(s)  # the base template writes the version
        if s.enable_cdi:  # the base template writes the CRI table: a second header breaks it
            s = replace(s, enable_cdi=False)
            warnings.append(
                f"{s.config}: enable_cdi not set in a template (the base template writes"
                " the CRI table); k3s and RKE2 set it themselves from their CDI option"
            )
    elif main.is_empty():
        main_version = new_file_version(s)
        edits[s.config].append(Edit(("version",), main_version, kind="init"))
    else:
        main_version = config_version(main)
    installed = containerd_version(s)
    if s.enable_cdi and installed is not None and installed < FIRST_CDI:
        warnings.append(
            f"containerd {_show(installed)} has no CDI support: enable_cdi takes effect"
            " from containerd 1.7; here --enable-cdi still passes the cdi.k8s.io/*"
            " annotations through to nvshim-runtime, which injects those devices"
        )
    if isinstance(main, TomlDoc) and main.text.startswith("# File generated by k3s"):
        warnings.append(
            f"{s.config} is generated by k3s and rewritten when k3s restarts;"
            " put these settings in config.toml.tmpl beside it"
        )
    deep = installed is not None and installed >= DEEP_MERGE_IMPORTS
    deep = deep or getattr(main, "template", False)  # base and template render as one file
    if not s.take_over:
        _refuse_reference(s, docs[os.path.abspath(s.drop_in)] if s.drop_in else main)
    if not s.drop_in:
        check_shadowing(s, main, main_version, deep)
        sources = source_docs(s, main, [main])
        edits[s.config] += runtime_edits(
            s, sources, main_version, history.get(s.config, []), warnings, deep
        )
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
        raise InputFileError(
            f"{drop_in}: config version {sub_version} differs from {s.config}"
            f" (version {main_version}); they must match"
        )
    sources = source_docs(s, main, [main, sub])
    edits[drop_in] += runtime_edits(
        s, sources, sub_version, history.get(drop_in, []), warnings, deep
    )
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
