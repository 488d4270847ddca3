"""nvshim's own configuration, ``/etc/nvshim/config.toml`` (``NVSHIM_CONFIG`` overrides).

One record per TOML table (``HostConfig`` for ``[host]``, ...), one field per key: the
field's Python name is the key's with ``_`` for ``-`` (``log_level`` for ``log-level``),
its annotation the key's type, its default the key's, and ``key(...)`` adds what else a
value must be (choices, a check, the names it had before). ``parse_config`` checks every
value against that once, at load; code reads attributes (``config.runtime.log_level``).

Every key is optional; defaults are safe. Unknown keys produce warnings (with the closest
known name), not failures; a value of the wrong type or outside its choices is an error.
Only the standard library is used here (``tomllib``) so the runtime and hook can load it
under ``python -I -S``. The runtime and hook load it for every container, so the checked
result is cached (``nvshim.filecache``, plain JSON) keyed by the file's exact text:
``tomllib`` (and the ``re`` it needs) is imported only when the file changed.
"""

from __future__ import annotations

import errno
import os

from nvshim.defaults import CAPABILITIES, DEFAULT_CONFIG, DEFAULT_RUNTIMES, PCIE_LEVELS
from nvshim.errors import NvshimError, did_you_mean
from nvshim.memo import Last
from nvshim.record import field, fields, make, record, replace

DEFAULT_PATH = DEFAULT_CONFIG
DEFAULT_INVENTORY_DIR = "/run/nvshim"
PAIRING_SOURCES = ("annotation", "env")
_TYPES = {"str": str, "int": int, "bool": bool, "list[str]": list}
MAX_LOG_BACKUPS = 1000  # each rotation renames every backup: a bound on that work
INT64 = (-(2**63), 2**63 - 1)  # a TOML integer (tomllib reads any size)
MAX_CONFIG_BYTES = 1 << 20


class Key:
    """What a key's value must be besides its type (``key`` makes one)."""

    __slots__ = ("choices", "each", "fold", "check", "minimum", "maximum", "aliases")

    def __init__(
        self, choices=(), each=(), fold=False, check=None, minimum=None, maximum=None, aliases=()
    ):
        self.choices = choices  # the value is one of these
        self.each = each  # every entry of a list is one of these
        self.fold = fold  # compared in upper case (and kept so)
        self.check = check  # value (or each entry) -> what is wrong with it, or None
        self.minimum = minimum  # the least value (of a list: the fewest entries)
        self.maximum = maximum
        self.aliases = aliases  # older names of the key, still read with a warning


def key(default, **rules):
    """A field with ``Key(**rules)`` attached (a list default is copied per record)."""
    if isinstance(default, (list, tuple)):
        return field(default_factory=lambda: list(default), metadata=Key(**rules))
    return field(default=default, metadata=Key(**rules))


def _absolute(value: str) -> str | None:
    """A path key: absolute (the runtime and hook run in a bundle's directory, the
    installer in a pod: a relative path would mean a different file to each)."""
    return None if value.startswith("/") else "is not an absolute path"


def _program(value: str) -> str | None:
    """A ``[runtime] runtimes`` entry: a name looked up on PATH, or an absolute path."""
    if value and (value.startswith("/") or "/" not in value):
        return None
    return "is not a program name or an absolute path"


def _absolute_or_empty(value: str) -> str | None:
    """``[sharing] config``: an absolute path, or empty for none."""
    return _absolute(value) if value else None


def _nic_pattern(value: str) -> str | None:
    """A ``[pairing] nics``/``move-physical`` entry: a PCI address, an HCA name or a netdev
    name, shell wildcards allowed (``ibp*``)."""
    allowed = "_-:.@*?[]!"
    if value and len(value) <= 64 and all(c.isalnum() or c in allowed for c in value):
        return None
    return "is not a PCI address or an HCA/netdev name pattern"


def _netdev_name(value: str) -> str | None:
    """``[pairing] netdev-name``: a netdev name once ``%d`` is a number."""
    if value and (len(value.replace("%d", "0")) > 13 or any(c in value for c in "/=: \t")):
        return "is not a usable name pattern"
    return None


def _capabilities(value: str) -> str | None:
    """``[policy] default-capabilities``: driver capabilities, comma-separated, or ``all``
    (any case, as ``NVIDIA_DRIVER_CAPABILITIES``, which is read at use)."""
    known = ("all", *CAPABILITIES)
    names = [n.strip() for n in value.split(",") if n.strip()]
    if not names:
        return f"names no capability; known: {', '.join(known)}"
    for name in names:
        if name.lower() not in known:
            hint = did_you_mean(name, known)
            return f"names {name!r}, not a capability{hint}; known: {', '.join(known)}"
    return None


def _cdi_name(part: str):
    """The check of a key holding the CDI name part ``part`` (``vendor``, ``class``)."""

    def check(value: str) -> str | None:
        from nvshim.cdi.names import why_invalid

        reason = why_invalid(part, value)
        return reason and f"is not a CDI {part} name: {reason}"

    return check


@record(frozen=True)
class HostConfig:
    """``[host]``: where the driver's files and the device nodes are."""

    driver_root: str = key("/", check=_absolute)  # /run/nvidia/driver: a containerized driver
    dev_root: str = key("/", check=_absolute)  # root of /dev, /proc and /sys


@record(frozen=True)
class RuntimeConfig:
    """``[runtime]``: nvshim-runtime's low-level runtimes, log, hook and inventory directory."""

    runtimes: list[str] = key(DEFAULT_RUNTIMES, check=_program, minimum=1)
    log_file: str = key("/var/log/nvshim.log", check=_absolute)
    log_format: str = key("text", choices=("text", "json"))
    log_level: str = key("info", choices=("debug", "info", "warning", "error"))
    log_max_size: int = key(10 * 1024 * 1024, minimum=0)
    log_backups: int = key(3, minimum=0, maximum=MAX_LOG_BACKUPS)
    log_target: str = key("file", choices=("file", "journald"))
    hook_path: str = key("/usr/bin/nvshim-hook", check=_absolute)
    inventory_dir: str = key(DEFAULT_INVENTORY_DIR, check=_absolute, aliases=("state-dir",))


@record(frozen=True)
class PolicyConfig:
    """``[policy]``: which requests a container may make (docs/security.md)."""

    accept_env_unprivileged: bool = False
    fail_refused_env: bool = True  # a refused env request naming devices fails the container
    accept_volume_mounts: bool = True
    cdi_annotation_prefixes: list[str] = key(["cdi.k8s.io/"])
    # where CDI names of other vendors are looked up (nvshim.policy.cdinames)
    cdi_spec_dirs: list[str] = key(["/etc/cdi", "/var/run/cdi"], check=_absolute)
    default_capabilities: str = key("utility,compute", check=_capabilities)
    cdi_vendor: str = key("nvidia.com", check=_cdi_name("vendor"))
    cdi_class: str = key("gpu", check=_cdi_name("class"))


@record(frozen=True)
class SharingConfig:
    """``[sharing]``: the device plugin's sharing config and the MPS daemons."""

    config: str = key("/etc/nvshim/sharing.yaml", check=_absolute_or_empty)
    config_name: str = ""
    config_default: str = ""
    mig_strategy: str = key("", choices=("", "none", "single", "mixed"))
    mps_root: str = key("/run/nvshim/mps", check=_absolute)
    on_daemon_down: str = key("fail", choices=("fail", "warn"))


@record(frozen=True)
class PairingConfig:
    """``[pairing]``: GPU-NIC pairing for GPUDirect RDMA (nvshim.policy.pairing)."""

    enabled: bool = False
    request_sources: list[str] = key(PAIRING_SOURCES, each=PAIRING_SOURCES)
    nics: list[str] = key([], check=_nic_pattern)
    worst_affinity: str = key("PXB", choices=PCIE_LEVELS, fold=True)
    on_no_nic: str = key("fail", choices=("fail", "warn"))
    exclusive: bool = False
    netdev_handover: bool = False
    netdev_name: str = key("", check=_netdev_name)
    move_physical: list[str] = key([], check=_nic_pattern)


@record(frozen=True)
class Config:
    """The effective configuration: one record per table, defaults where the file is
    silent; ``path`` the file (None: none, all defaults), ``warnings`` what it got."""

    host: HostConfig = field(default_factory=HostConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    sharing: SharingConfig = field(default_factory=SharingConfig)
    pairing: PairingConfig = field(default_factory=PairingConfig)
    path: str | None = None
    warnings: list[str] = field(default_factory=list)


# table name -> its record class, in file order
SECTIONS = {f.name: f.default_factory for f in fields(Config) if f.name not in ("path", "warnings")}


def toml_name(name: str) -> str:
    """A field's key in the file: ``log_level`` -> ``log-level``."""
    return name.replace("_", "-")


def amended(config: Config, section: str, /, **changes) -> Config:
    """``config`` with fields of one table changed (by code, after the checks: a caller
    passes values of the field's type)."""
    return replace(config, **{section: replace(getattr(config, section), **changes)})


def config_path() -> str:
    return os.environ.get("NVSHIM_CONFIG") or DEFAULT_PATH


# the last configuration this process loaded from a file, kept while the file's text
# (and this code) are the same. Records are frozen.
_last = Last()


def load_config(path: str | None = None) -> Config:
    """Load the configuration; a missing default file means all defaults.

    A file named explicitly (argument or ``NVSHIM_CONFIG``) must exist. Bad TOML or a
    value of the wrong type raises NvshimError naming the file and key.
    """
    explicit = path is not None or bool(os.environ.get("NVSHIM_CONFIG"))
    path = path or config_path()
    try:
        raw = _read(path)
    except FileNotFoundError:
        if explicit:
            raise NvshimError(f"{path}: configuration file not found") from None
        return assemble({}, None, [])
    except OSError as err:
        raise NvshimError(f"{path}: cannot read: {err.strerror}") from None
    from nvshim import __version__, filecache

    # what the result depends on: the file's exact text, and the code that checked it (its
    # keys, defaults and choices: this file, as it is now)
    code = os.stat(__file__)
    memo = (path, raw, __version__, code.st_mtime_ns, code.st_size)
    kept = _last.get(memo)  # a long-lived process (nvshim-runtimed's workers)
    if kept is not None:
        return kept
    cache = filecache.entry_path("config")
    key = {
        "path": path,
        "text": raw.decode("utf-8", "surrogateescape"),
        "version": __version__,
        "code": [code.st_mtime_ns, code.st_size],
    }
    cached = filecache.load(cache, key)
    config = None
    if isinstance(cached, dict):
        try:
            config = assemble(cached["tables"], path, list(cached["warnings"]))
        except (KeyError, TypeError):
            pass  # not what this code writes: parse again
    if config is None:
        config = parse_config(raw, path)
        tables = {name: _table(getattr(config, name)) for name in SECTIONS}
        filecache.store(cache, key, {"tables": tables, "warnings": config.warnings})
    return _last.keep(memo, config)


def _read(path: str) -> bytes:
    """The file's bytes: never waiting on a FIFO (a FIFO or socket is refused; a device
    is read without blocking) nor reading without end (``/dev/zero``)."""
    import stat

    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    with os.fdopen(fd, "rb") as fh:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
            raise NvshimError(f"{path}: not a regular file (a FIFO or socket)")
        raw = fh.read(MAX_CONFIG_BYTES + 1)
    if len(raw) > MAX_CONFIG_BYTES:
        raise NvshimError(f"{path}: larger than {MAX_CONFIG_BYTES >> 20} MiB, not an nvshim config")
    return raw


def assemble(tables: dict, path: str | None, warnings: list[str]) -> Config:
    """A Config from checked values (``{table: {field name: value}}``, as cached; a table
    or field left out: defaults), built without compiling the records' ``__init__``."""
    sections = {name: make(cls, tables.get(name, {})) for name, cls in SECTIONS.items()}
    return make(Config, {**sections, "path": path, "warnings": warnings})


def _table(section) -> dict[str, object]:
    return {f.name: getattr(section, f.name) for f in fields(section)}


def parse_config(raw: bytes, path: str) -> Config:
    """The configuration from a TOML file's bytes (``path`` names it in messages): every
    value checked against its field (type, choices, checks); unknown keys warned about."""
    import tomllib

    warnings: list[str] = []
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise NvshimError(f"{path}: invalid TOML: not UTF-8") from None
    except tomllib.TOMLDecodeError as err:
        raise NvshimError(f"{path}: invalid TOML: {err}") from None
    tables = {}
    for section, table in data.items():
        cls = SECTIONS.get(section)
        if cls is None:
            hint = did_you_mean(section, SECTIONS)
            warnings.append(f"{path}: unknown section [{section}] ignored{hint}")
            continue
        if not isinstance(table, dict):
            raise NvshimError(f"{path}: [{section}] must be a table")
        tables[section] = _read_table(cls, section, table, path, warnings)
    return assemble(tables, path, warnings)


def _read_table(cls, section: str, table: dict, path: str, warnings: list[str]) -> dict:
    """The checked values of one table, by field name."""
    by_key = {toml_name(f.name): f for f in fields(cls)}
    old = {a: f for f in fields(cls) if f.metadata for a in f.metadata.aliases}
    values: dict[str, object] = {}
    for name, value in table.items():
        spec = by_key.get(name) or old.get(name)
        if spec is None:
            hint = did_you_mean(name, by_key)
            warnings.append(f"{path}: unknown key {section}.{name} ignored{hint}")
            continue
        new = f"{section}.{toml_name(spec.name)}"
        if name not in by_key:
            if toml_name(spec.name) in table:
                warnings.append(f"{path}: {section}.{name} ignored: {new} is set (its new name)")
                continue
            warnings.append(f"{path}: {section}.{name} is deprecated: name it {new}")
        where = f"{path}: {new}"
        values[spec.name] = _checked(value, cls.__annotations__[spec.name], spec.metadata, where)
    return values


def check_value(section: str, key: str, value, where: str):
    """``value`` for ``[section] key`` as the file's is checked (NvshimError naming
    ``where``): for code that writes the config from other input (the node installer's
    variables)."""
    cls = SECTIONS[section]
    spec = {toml_name(f.name): f for f in fields(cls)}[key]
    return _checked(value, cls.__annotations__[spec.name], spec.metadata, where)


def _checked(value, annotation: str, rules: Key | None, where: str):
    """``value`` if it has the field's type and passes its rules (NvshimError naming
    ``where`` otherwise), folded to upper case where the key says so."""
    want = _TYPES[annotation]
    if not isinstance(value, want) or (want is not bool and isinstance(value, bool)):
        article = "an" if want is int else "a"
        raise NvshimError(f"{where} must be {article} {want.__name__}, got {value!r}")
    if want is list and not all(isinstance(v, str) for v in value):
        raise NvshimError(f"{where} must be a list of strings")
    if want is int and not INT64[0] <= value <= INT64[1]:
        raise NvshimError(f"{where} must be a 64-bit integer, got {value!r}")
    if rules is None:
        return value
    if rules.fold:
        value = value.strip().upper()
    if rules.choices:
        _one_of(value, rules.choices, where)
    if want is list and rules.minimum is not None and len(value) < rules.minimum:
        raise NvshimError(f"{where} must list at least {rules.minimum} (got {value!r})")
    if want is int and rules.minimum is not None and value < rules.minimum:
        raise NvshimError(f"{where} must be at least {rules.minimum}, got {value!r}")
    if rules.maximum is not None and value > rules.maximum:
        raise NvshimError(f"{where} must be at most {rules.maximum}, got {value!r}")
    for entry in value if want is list else [value]:
        if rules.each:
            _one_of(entry, rules.each, f"{where} entry")
        problem = rules.check(entry) if rules.check else None
        if problem:
            raise NvshimError(f"{where}: {entry!r} {problem}")
    return value


def _one_of(value, choices, where: str) -> None:
    if value not in choices:
        shown = ", ".join(repr(c) for c in choices)
        hint = did_you_mean(value, [c for c in choices if c])
        raise NvshimError(f"{where} must be one of {shown}, got {value!r}{hint}")


def render_config(config: Config) -> str:
    """The effective configuration as TOML text (for ``nvshim config show``)."""
    lines = [f"# effective configuration (file: {config.path or 'none, defaults'})"]
    for section in SECTIONS:
        lines.append(f"\n[{section}]")
        for name, value in _table(getattr(config, section)).items():
            lines.append(f"{toml_name(name)} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, int):
        return str(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
