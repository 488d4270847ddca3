"""Validate CDI specs the way container runtimes do, plus the packaged JSON schema.

``validate_spec`` returns one line per problem, each naming the source and where
(``spec.yaml: devices[2].name "-x": must start with a letter or digit``). The rules are
those of the CDI reference library that runtimes embed (strict fields, name rules,
version, empty device edits, duplicates, hook names, env, permissions, ...), a little
stricter where that is safer (repeated permission letters, relative paths that runc
rejects later). ``load_spec_file`` reads ``.json``, ``.yaml`` or ``.yml`` files.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Iterable
from typing import Any

from nvshim.cdi.names import quote, why_invalid
from nvshim.cdi.version import KNOWN_VERSIONS, spec_min_version, version_key
from nvshim.edits import HOOK_NAMES
from nvshim.errors import NvshimError

SPEC_FIELDS = ("cdiVersion", "kind", "annotations", "devices", "containerEdits")
DEVICE_FIELDS = ("name", "annotations", "containerEdits")
EDITS_FIELDS = (
    "env",
    "deviceNodes",
    "netDevices",
    "hooks",
    "mounts",
    "intelRdt",
    "additionalGids",
)
NODE_FIELDS = (
    "path",
    "hostPath",
    "type",
    "major",
    "minor",
    "fileMode",
    "permissions",
    "uid",
    "gid",
)
MOUNT_FIELDS = ("hostPath", "containerPath", "options", "type")
HOOK_FIELDS = ("hookName", "path", "args", "env", "timeout")
INTEL_RDT_FIELDS = ("closID", "l3CacheSchema", "memBwSchema", "schemata", "enableMonitoring")
NET_DEVICE_FIELDS = ("hostInterfaceName", "name")
NODE_TYPES = ("b", "c", "u", "p")
SPEC_SUFFIXES = (".json", ".yaml", ".yml")
MAX_SPEC_BYTES = 64 << 20
MAX_ANNOTATIONS_BYTES = 256 << 10  # Kubernetes' limit, applied by the CDI library

UINT32_MAX = 2**32 - 1
INT64_MAX = 2**63 - 1
_VERSION_RE = re.compile(r"v?[0-9]+\.[0-9]+\.[0-9]+", re.ASCII)
_DNS_SUBDOMAIN_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_ANNOTATION_NAME_RE = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]", re.ASCII)
_PLAIN_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
_MISSING = object()


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    return {dict: "mapping", list: "list", str: "string", int: "integer", float: "number"}.get(
        type(value), type(value).__name__
    )


def _join(where: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{where}[{key}]"
    if not _PLAIN_KEY_RE.fullmatch(key):
        return f"{where}[{quote(key)}]"
    return f"{where}.{key}" if where else key


class _Checker:
    """Walks one spec mapping and collects problem lines."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.problems: list[str] = []
        self.paths: list[str] = []
        self.shape_ok = True  # False once a type error makes version rules unsafe to apply
        self.features: dict[str, str] = {}  # CDI version -> first place that needs it

    # -- reporting -------------------------------------------------------------------------
    def add(self, where: str, message: str, value: Any = _MISSING) -> None:
        if value is _MISSING:
            head = where
        else:
            shown = quote(value) if isinstance(value, str) else repr(value)
            head = f"{where} {shown}"
        self.problems.append(
            f"{self.source}: {head}: {message}" if head else f"{self.source}: {message}"
        )
        self.paths.append(where)

    def need(self, version: str, where: str) -> None:
        self.features.setdefault(version, where)

    # -- generic shapes --------------------------------------------------------------------
    def is_type(self, where: str, value: Any, kind: type, what: str) -> bool:
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if not ok:
            hint = ""
            if kind is str and isinstance(value, (int, float, bool)):
                hint = " (quote it)"
            self.add(where, f"must be {what}, got {_type_name(value)}{hint}")
            self.shape_ok = False
        return ok

    def mapping(self, where: str, value: Any, fields: tuple[str, ...]) -> bool:
        if not self.is_type(where, value, dict, "a mapping"):
            return False
        for key in value:
            if key not in fields:
                self.add(_join(where, str(key)), f"unknown field (known: {', '.join(fields)})")
        return True

    def items(self, where: str, value: Any) -> list[tuple[str, Any]]:
        """The entries of an optional list field (none when absent, null or not a list)."""
        if value is None:
            return []
        if not self.is_type(where, value, list, "a list"):
            return []
        return [(_join(where, i), item) for i, item in enumerate(value)]

    def string(self, where: str, value: Any, required: bool, absolute: bool = False) -> bool:
        if value is _MISSING or value is None:
            if required:
                self.add(where, "missing (required)")
            return False
        if not self.is_type(where, value, str, "a string"):
            return False
        if required and value == "":
            self.add(where, "must not be empty")
            return False
        if absolute and value and not value.startswith("/"):
            self.add(where, "must be an absolute path", value)
            return False
        return True

    def integer(self, where: str, value: Any, low: int, high: int, what: str) -> None:
        if value is None:
            return
        if self.is_type(where, value, int, "an integer") and not low <= value <= high:
            self.add(where, f"must be {what}", value)

    def strings(self, where: str, value: Any) -> None:
        for item_where, item in self.items(where, value):
            self.is_type(item_where, item, str, "a string")

    def env(self, where: str, value: Any) -> None:
        for item_where, item in self.items(where, value):
            if self.is_type(item_where, item, str, "a string") and item.find("=") <= 0:
                self.add(item_where, "must be KEY=value with a non-empty KEY", item)

    # -- spec parts ------------------------------------------------------------------------
    def spec(self, data: Any) -> None:
        if not isinstance(data, dict):
            self.add("", f"a CDI spec must be a mapping, got {_type_name(data)}")
            self.shape_ok = False
            return
        self.mapping("", data, SPEC_FIELDS)
        self.kind(data.get("kind", _MISSING))
        self.annotations("annotations", data.get("annotations"))
        edits = data.get("containerEdits")
        if edits is not None:
            self.edits("containerEdits", edits)
        self.devices(data.get("devices", _MISSING))
        self.version(data)

    def kind(self, kind: Any) -> None:
        if not self.string("kind", kind, required=True):
            return
        vendor, sep, cls = kind.partition("/")
        if not sep or not vendor or not cls:
            self.add("kind", "must have the form vendor/class", kind)
            return
        for what, part in (("vendor", vendor), ("class", cls)):
            reason = why_invalid(what, part)
            if reason:
                self.add("kind", f"{what} {quote(part)}: {reason}", kind)
        if "." in cls:
            self.need("0.6.0", "a dot in the class of kind")

    def annotations(self, where: str, value: Any) -> None:
        if value is None or not self.is_type(where, value, dict, "a mapping of strings"):
            return
        if value:
            self.need("0.6.0", where)
        total = 0
        for key, item in value.items():
            item_where = _join(where, str(key))
            if not isinstance(key, str):
                self.add(item_where, f"key must be a string, got {_type_name(key)}")
                continue
            reason = _annotation_key_problem(key)
            if reason:
                self.add(item_where, f"invalid annotation key: {reason}")
            if self.is_type(item_where, item, str, "a string"):
                total += len(key) + len(item)
        if total > MAX_ANNOTATIONS_BYTES:
            self.add(where, f"total size {total} bytes exceeds {MAX_ANNOTATIONS_BYTES}")

    def devices(self, devices: Any) -> None:
        if devices is _MISSING:
            self.add("devices", "missing (required)")
            return
        entries = self.items("devices", devices)
        if devices is None or (isinstance(devices, list) and not devices):
            self.add("devices", "a spec must list at least one device")
        seen: dict[str, str] = {}
        for where, device in entries:
            name = self.device(where, device)
            if name is None:
                continue
            if name in seen:
                self.add(_join(where, "name"), f"duplicate device name, also at {seen[name]}", name)
            else:
                seen[name] = where

    def device(self, where: str, device: Any) -> str | None:
        if not self.mapping(where, device, DEVICE_FIELDS):
            return None
        name = device.get("name", _MISSING)
        name_where = _join(where, "name")
        if self.string(name_where, name, required=True):
            reason = why_invalid("device name", name)
            if reason:
                self.add(name_where, reason, name)
            elif name[0].isdigit():
                self.need("0.5.0", f"{name_where} starting with a digit")
        self.annotations(_join(where, "annotations"), device.get("annotations"))
        edits_where = _join(where, "containerEdits")
        edits = device.get("containerEdits")
        if edits is None:
            self.add(edits_where, "empty; a device must make at least one edit")
        elif self.edits(edits_where, edits) and _edits_empty(edits):
            self.add(edits_where, "empty; a device must make at least one edit")
        return name if isinstance(name, str) else None

    def edits(self, where: str, edits: Any) -> bool:
        if not self.mapping(where, edits, EDITS_FIELDS):
            return False
        self.env(_join(where, "env"), edits.get("env"))
        for item_where, node in self.items(_join(where, "deviceNodes"), edits.get("deviceNodes")):
            self.device_node(item_where, node)
        for item_where, mount in self.items(_join(where, "mounts"), edits.get("mounts")):
            self.mount(item_where, mount)
        for item_where, hook in self.items(_join(where, "hooks"), edits.get("hooks")):
            self.hook(item_where, hook)
        rdt = edits.get("intelRdt")
        if rdt is not None:
            self.intel_rdt(_join(where, "intelRdt"), rdt)
        gids_where = _join(where, "additionalGids")
        gids = self.items(gids_where, edits.get("additionalGids"))
        for item_where, gid in gids:
            self.integer(item_where, gid, 0, UINT32_MAX, "a group id (0 to 4294967295)")
        if gids:
            self.need("0.7.0", gids_where)
        self.net_devices(_join(where, "netDevices"), edits.get("netDevices"))
        return True

    def device_node(self, where: str, node: Any) -> None:
        if not self.mapping(where, node, NODE_FIELDS):
            return
        self.string(_join(where, "path"), node.get("path", _MISSING), True, absolute=True)
        host = node.get("hostPath")
        if self.string(_join(where, "hostPath"), host, required=False) and host:
            self.need("0.5.0", _join(where, "hostPath"))
        kind = node.get("type")
        if self.string(_join(where, "type"), kind, required=False) and kind not in (
            "",
            *NODE_TYPES,
        ):
            self.add(_join(where, "type"), "must be one of b, c, u, p", kind)
        for key in ("major", "minor"):
            self.integer(_join(where, key), node.get(key), 0, INT64_MAX, "a non-negative number")
        self.integer(_join(where, "fileMode"), node.get("fileMode"), 0, UINT32_MAX, "a file mode")
        for key in ("uid", "gid"):
            self.integer(_join(where, key), node.get(key), 0, UINT32_MAX, "0 to 4294967295")
        perms = node.get("permissions")
        if self.string(_join(where, "permissions"), perms, required=False) and perms:
            self.permissions(_join(where, "permissions"), perms)

    def permissions(self, where: str, perms: str) -> None:
        bad = sorted(set(perms) - set("rwm"))
        if bad:
            self.add(where, f'must be a subset of "rwm" (bad: {"".join(bad)})', perms)
        elif len(set(perms)) != len(perms):
            self.add(where, 'must be a subset of "rwm" without repeats', perms)

    def mount(self, where: str, mount: Any) -> None:
        if not self.mapping(where, mount, MOUNT_FIELDS):
            return
        self.string(_join(where, "hostPath"), mount.get("hostPath", _MISSING), True)
        self.string(_join(where, "containerPath"), mount.get("containerPath", _MISSING), True, True)
        self.strings(_join(where, "options"), mount.get("options"))
        kind = mount.get("type")
        if self.string(_join(where, "type"), kind, required=False) and kind:
            self.need("0.4.0", _join(where, "type"))

    def hook(self, where: str, hook: Any) -> None:
        if not self.mapping(where, hook, HOOK_FIELDS):
            return
        name = hook.get("hookName", _MISSING)
        if self.string(_join(where, "hookName"), name, required=True) and name not in HOOK_NAMES:
            self.add(_join(where, "hookName"), f"must be one of {', '.join(HOOK_NAMES)}", name)
        self.string(_join(where, "path"), hook.get("path", _MISSING), True, absolute=True)
        self.strings(_join(where, "args"), hook.get("args"))
        self.env(_join(where, "env"), hook.get("env"))
        self.integer(_join(where, "timeout"), hook.get("timeout"), 1, UINT32_MAX, "positive")

    def intel_rdt(self, where: str, rdt: Any) -> None:
        self.need("0.7.0", where)
        if not self.mapping(where, rdt, INTEL_RDT_FIELDS):
            return
        clos = rdt.get("closID")
        if self.string(_join(where, "closID"), clos, required=False) and clos not in ("", "/"):
            if len(clos) >= 4096 or clos in (".", "..") or "/" in clos or "\n" in clos:
                self.add(_join(where, "closID"), "must be a valid file name", clos)
        for key in ("l3CacheSchema", "memBwSchema"):
            self.string(_join(where, key), rdt.get(key), required=False)
        if rdt.get("schemata") is not None:
            self.strings(_join(where, "schemata"), rdt["schemata"])
            self.need("1.1.0", _join(where, "schemata"))
        monitoring = rdt.get("enableMonitoring")
        if monitoring is not None and self.is_type(
            _join(where, "enableMonitoring"), monitoring, bool, "true or false"
        ):
            if monitoring:
                self.need("1.1.0", _join(where, "enableMonitoring"))

    def net_devices(self, where: str, value: Any) -> None:
        entries = self.items(where, value)
        if entries:
            self.need("1.1.0", where)
        seen: dict[str, dict[str, str]] = {"hostInterfaceName": {}, "name": {}}
        for item_where, dev in entries:
            if not self.mapping(item_where, dev, NET_DEVICE_FIELDS):
                continue
            for key in NET_DEVICE_FIELDS:
                key_where = _join(item_where, key)
                value = dev.get(key, _MISSING)
                if not self.string(key_where, value, required=True):
                    continue
                if value in seen[key]:
                    self.add(key_where, f"duplicate, also at {seen[key][value]}", value)
                else:
                    seen[key][value] = key_where

    def version(self, data: dict) -> None:
        version = data.get("cdiVersion", _MISSING)
        if not self.string("cdiVersion", version, required=True):
            return
        latest = KNOWN_VERSIONS[-1]
        if version not in KNOWN_VERSIONS:
            if not _VERSION_RE.fullmatch(version):
                self.add(
                    "cdiVersion", f"not a version; known: {', '.join(KNOWN_VERSIONS)}", version
                )
            elif version.startswith("v"):
                self.add(
                    "cdiVersion", f"write {version[1:]} (runtimes differ on a v prefix)", version
                )
            elif version_key(version) > version_key(latest):
                self.add(
                    "cdiVersion",
                    f"newer than {latest}, the newest CDI version nvshim knows; "
                    "runtimes reject versions they do not know",
                    version,
                )
            elif version_key(version) < version_key(KNOWN_VERSIONS[0]):
                self.add(
                    "cdiVersion",
                    f"older than {KNOWN_VERSIONS[0]}, the oldest version runtimes still accept",
                    version,
                )
            else:
                self.add(
                    "cdiVersion",
                    f"not a released CDI version ({', '.join(KNOWN_VERSIONS)})",
                    version,
                )
            return
        if not self.shape_ok:
            return  # the content is malformed: what it needs is not well defined
        need = spec_min_version(data)
        if version_key(need) > version_key(version):
            where = self.features.get(need)
            because = f" (for {where})" if where else ""
            self.add("cdiVersion", f"the content needs at least {need}{because}", version)


def _edits_empty(edits: dict) -> bool:
    lists = ("env", "deviceNodes", "hooks", "mounts", "additionalGids", "netDevices")
    return not any(edits.get(k) for k in lists) and edits.get("intelRdt") is None


def _annotation_key_problem(key: str) -> str | None:
    """Why ``key`` is not a Kubernetes qualified name (as the CDI library checks), or None."""
    key = key.lower()
    prefix, slash, name = key.rpartition("/")
    if slash:
        if "/" in prefix:
            return f"{quote(key)} has more than one /"
        if not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN_RE.fullmatch(prefix):
            return f"prefix {quote(prefix)} must be a DNS subdomain"
    if not name or len(name) > 63 or not _ANNOTATION_NAME_RE.fullmatch(name):
        return f"name {quote(name)} must be 1-63 of A-Z a-z 0-9 - _ . inside alphanumerics"
    return None


def validate_spec(data: Any, source: str = "<spec>", schema: bool = True) -> list[str]:
    """Every problem runtimes would reject ``data`` (a loaded CDI spec) for, one line each.

    With ``schema`` the packaged CDI JSON schema is applied too (problems at a place
    already reported are not repeated). An empty list means the spec is valid.
    """
    checker = _Checker(source)
    checker.spec(data)
    problems = checker.problems
    if schema:
        reported = checker.paths
        for where, line in _schema_problems(data, source):
            if where is not None and any(_overlaps(where, p) for p in reported):
                continue
            problems.append(line)
    return problems


def _overlaps(a: str, b: str) -> bool:
    """True when one of two problem locations contains the other."""
    if a == b or not a or not b:
        return True
    short, long = sorted((a, b), key=len)
    return long.startswith(short) and long[len(short)] in ".["


def _inlined(node: Any, docs: dict[str, dict], doc: str) -> Any:
    """``node`` of schema file ``doc`` with every ``$ref`` replaced by what it names
    (``FILE#/definitions/NAME`` or ``#/...`` within ``doc``): CDI's schema has no
    recursion, and jsonschema resolving a reference at each use of it took most of a
    large spec's validation."""
    if isinstance(node, list):
        return [_inlined(item, docs, doc) for item in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str):  # draft 7: a $ref's siblings are ignored
        name, _, pointer = ref.partition("#")
        target_doc = name or doc
        target: Any = docs[target_doc]
        for part in pointer.strip("/").split("/") if pointer.strip("/") else ():
            target = target[part]
        return _inlined(target, docs, target_doc)
    return {key: _inlined(value, docs, doc) for key, value in node.items()}


@functools.lru_cache(maxsize=1)
def _schema_validator() -> Any:
    import jsonschema

    here = os.path.join(os.path.dirname(__file__), "schema")
    docs = {}
    for name in ("schema.json", "defs.json"):
        with open(os.path.join(here, name), encoding="utf-8") as fh:
            docs[name] = json.load(fh)
    root = _inlined(docs["schema.json"], docs, "schema.json")
    root.pop("definitions", None)  # inlined where used
    return jsonschema.Draft7Validator(root)


def _schema_problems(data: Any, source: str) -> list[tuple[str | None, str]]:
    """``(where, line)`` for each JSON schema violation; one line if jsonschema is missing."""
    try:
        validator = _schema_validator()
    except ImportError:
        return [(None, f"{source}: JSON schema not checked: Python package jsonschema is missing")]
    out = []
    for error in sorted(validator.iter_errors(data), key=lambda e: list(map(str, e.absolute_path))):
        where = ""
        for part in error.absolute_path:
            where = _join(where, part if isinstance(part, int) else str(part))
        message = " ".join(error.message.split())
        if len(message) > 160:
            message = message[:157] + "..."
        head = f"{source}: {where}: " if where else f"{source}: "
        out.append((where, f"{head}schema: {message}"))
    return out


# -- loading files ---------------------------------------------------------------------------


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _json_object(pairs: list[tuple[str, Any]]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {quote(key)}")
        out[key] = value
    return out


@functools.lru_cache(maxsize=1)
def _yaml_loader() -> Any:
    """A safe YAML loader (libyaml when present) that rejects duplicate mapping keys."""
    import yaml

    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class StrictLoader(base):  # type: ignore[misc, valid-type]
        pass

    def construct_mapping(loader: Any, node: Any, deep: bool = False) -> Any:
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = loader.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:
                continue  # unhashable: the base constructor reports it
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {quote(key)}", key_node.start_mark
                )
        return loader.construct_mapping(node, deep=deep)

    StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    return StrictLoader


def parse_spec_text(text: str, source: str, fmt: str) -> Any:
    """Parse spec text as ``json`` or ``yaml``; a syntax error raises NvshimError with the line."""
    if fmt == "json":
        try:
            return json.loads(text, object_pairs_hook=_json_object, parse_constant=_reject_constant)
        except json.JSONDecodeError as err:
            raise NvshimError(
                f"{source}: line {err.lineno}, column {err.colno}: invalid JSON: {err.msg}"
            ) from None
        except ValueError as err:
            raise NvshimError(f"{source}: invalid JSON: {err}") from None
    import yaml

    try:
        return yaml.load(text, Loader=_yaml_loader())  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        what = " ".join(str(err.problem or err.context or "syntax error").split())
        if err.problem and err.context and err.context_mark and err.context_mark is not mark:
            started = err.context_mark
            what += (
                f" ({' '.join(err.context.split())}"
                f" at line {started.line + 1}, column {started.column + 1})"
            )
        raise NvshimError(f"{source}: {where}invalid YAML: {what}") from None
    except yaml.YAMLError as err:
        raise NvshimError(f"{source}: invalid YAML: {' '.join(str(err).split())}") from None


def load_spec_file(path: str) -> dict:
    """Read a CDI spec file (``.json``, ``.yaml`` or ``.yml``) into a mapping.

    Unreadable files, bad syntax (with line and column), duplicate keys and a top level
    that is not a mapping raise NvshimError naming the file.
    """
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in SPEC_SUFFIXES:
        raise NvshimError(f"{path}: not a CDI spec file name (expected .json, .yaml or .yml)")
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_SPEC_BYTES + 1)
    except OSError as err:
        raise NvshimError(f"{path}: cannot read: {err.strerror or err}") from None
    if len(raw) > MAX_SPEC_BYTES:
        raise NvshimError(f"{path}: larger than {MAX_SPEC_BYTES >> 20} MiB, not a CDI spec")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise NvshimError(f"{path}: not UTF-8 text (bad byte at offset {err.start})") from None
    data = parse_spec_text(text, path, "json" if suffix == ".json" else "yaml")
    if data is None:
        raise NvshimError(f"{path}: empty, not a CDI spec")
    if not isinstance(data, dict):
        raise NvshimError(f"{path}: a CDI spec must be a mapping, got {_type_name(data)}")
    return data


def validate_files(paths: Iterable[str], schema: bool = True) -> list[str]:
    """Load and validate each file; all problems, one line each (empty: all valid)."""
    problems: list[str] = []
    for path in paths:
        try:
            data = load_spec_file(path)
        except NvshimError as err:
            problems.append(str(err))
            continue
        problems.extend(validate_spec(data, path, schema=schema))
    return problems
