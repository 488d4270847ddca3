"""nvshim's own configuration, ``/etc/nvshim/config.toml`` (``NVSHIM_CONFIG`` overrides).

Every key is optional; defaults are safe. Unknown keys produce warnings (with the closest
known name), not failures; a value of the wrong type or outside its choices is an error.
Only the standard library is used here (``tomllib``) so the runtime and hook can load it
under ``python -I -S``. The runtime and hook load it for every container, so the parsed
result is cached (``nvshim.filecache``) keyed by the file's exact text: ``tomllib`` (and
the ``re`` it needs) is imported only when the file changed.
"""

from __future__ import annotations

import os

from nvshim.defaults import DEFAULT_CONFIG, DEFAULT_RUNTIMES
from nvshim.errors import NvshimError, did_you_mean
from nvshim.record import field, record

DEFAULT_PATH = DEFAULT_CONFIG

DEFAULTS: dict[str, dict[str, object]] = {
    "host": {
        "driver-root": "/",
        "dev-root": "/",
    },
    "runtime": {
        "runtimes": list(DEFAULT_RUNTIMES),
        "log-file": "/var/log/nvshim.log",
        "log-format": "text",
        "log-level": "info",
        "log-max-size": 10 * 1024 * 1024,
        "log-backups": 3,
        "log-target": "file",
        "hook-path": "/usr/bin/nvshim-hook",
        "state-dir": "/run/nvshim",
    },
    "policy": {
        "accept-env-unprivileged": False,
        "fail-refused-env": True,  # a refused env request naming devices fails the container
        "accept-volume-mounts": True,
        "cdi-annotation-prefixes": ["cdi.k8s.io/"],
        # where CDI names of other vendors are looked up (nvshim.policy.cdinames)
        "cdi-spec-dirs": ["/etc/cdi", "/var/run/cdi"],
        "default-capabilities": "utility,compute",
        "cdi-vendor": "nvidia.com",
        "cdi-class": "gpu",
    },
    "sharing": {
        "config": "/etc/nvshim/sharing.yaml",
        "config-name": "",
        "config-default": "",
        "mig-strategy": "",
        "mps-root": "/run/nvshim/mps",
        "on-daemon-down": "fail",
    },
    "pairing": {  # GPU-NIC pairing for GPUDirect RDMA (nvshim.policy.pairing)
        "enabled": False,
        "request-sources": ["annotation", "env"],
        "nics": [],
        "worst-affinity": "PXB",
        "on-no-nic": "fail",
        "exclusive": False,
        "netdev-handover": False,
        "netdev-name": "",
        "move-physical": [],
    },
}

# keys whose value is one of a fixed set (checked at load, like the types)
CHOICES: dict[tuple[str, str], tuple[str, ...]] = {
    ("runtime", "log-format"): ("text", "json"),
    ("runtime", "log-level"): ("debug", "info", "warning", "error"),
    ("runtime", "log-target"): ("file", "journald"),
    ("sharing", "mig-strategy"): ("", "none", "single", "mixed"),
    ("sharing", "on-daemon-down"): ("fail", "warn"),
    ("pairing", "on-no-nic"): ("fail", "warn"),
}


@record
class Config:
    """The effective configuration: defaults overlaid with the file's values."""

    values: dict[str, dict[str, object]]
    path: str | None = None
    warnings: list[str] = field(default_factory=list)

    def get(self, section: str, key: str):
        return self.values[section][key]

    @property
    def driver_root(self) -> str:
        return self.get("host", "driver-root")

    @property
    def dev_root(self) -> str:
        return self.get("host", "dev-root")


def config_path() -> str:
    return os.environ.get("NVSHIM_CONFIG") or DEFAULT_PATH


def default_values() -> dict[str, dict[str, object]]:
    """A fresh copy of ``DEFAULTS`` (lists copied too)."""
    return {
        section: {k: list(v) if isinstance(v, list) else v for k, v in table.items()}
        for section, table in DEFAULTS.items()
    }


def load_config(path: str | None = None) -> Config:
    """Load the configuration; a missing default file means all defaults.

    A file named explicitly (argument or ``NVSHIM_CONFIG``) must exist. Bad TOML or a
    value of the wrong type raises NvshimError naming the file and key.
    """
    explicit = path is not None or bool(os.environ.get("NVSHIM_CONFIG"))
    path = path or config_path()
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        if explicit:
            raise NvshimError(f"{path}: configuration file not found") from None
        return Config(default_values(), None, [])
    except OSError as err:
        raise NvshimError(f"{path}: cannot read: {err.strerror}") from None
    from nvshim import __version__, filecache

    cache = filecache.entry_path("config")
    # what the result depends on: the file's exact text, the code and its defaults
    key = {
        "path": path,
        "text": raw.decode("utf-8", "surrogateescape"),
        "version": __version__,
        "defaults": DEFAULTS,
    }
    cached = filecache.load(cache, key)
    if isinstance(cached, dict):
        return Config(cached["values"], path, cached["warnings"])
    config = parse_config(raw, path)
    filecache.store(cache, key, {"values": config.values, "warnings": config.warnings})
    return config


def parse_config(raw: bytes, path: str) -> Config:
    """The configuration from a TOML file's bytes (``path`` names it in messages)."""
    import tomllib

    values = default_values()
    warnings: list[str] = []
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise NvshimError(f"{path}: invalid TOML: not UTF-8") from None
    except tomllib.TOMLDecodeError as err:
        raise NvshimError(f"{path}: invalid TOML: {err}") from None
    for section, table in data.items():
        if section not in values:
            hint = did_you_mean(section, values)
            warnings.append(f"{path}: unknown section [{section}] ignored{hint}")
            continue
        if not isinstance(table, dict):
            raise NvshimError(f"{path}: [{section}] must be a table")
        for key, value in table.items():
            if key not in values[section]:
                hint = did_you_mean(key, values[section])
                warnings.append(f"{path}: unknown key {section}.{key} ignored{hint}")
                continue
            choices = CHOICES.get((section, key))
            if choices and value not in choices:
                shown = ", ".join(repr(c) for c in choices)
                raise NvshimError(f"{path}: {section}.{key} must be one of {shown}, got {value!r}")
            want = type(DEFAULTS[section][key])
            if not isinstance(value, want) or (want is not bool and isinstance(value, bool)):
                raise NvshimError(
                    f"{path}: {section}.{key} must be a {want.__name__}, got {value!r}"
                )
            if want is list and not all(isinstance(v, str) for v in value):
                raise NvshimError(f"{path}: {section}.{key} must be a list of strings")
            values[section][key] = value
    return Config(values, path, warnings)


def render_config(config: Config) -> str:
    """The effective configuration as TOML text (for ``nvshim config show``)."""
    lines = [f"# effective configuration (file: {config.path or 'none, defaults'})"]
    for section, table in config.values.items():
        lines.append(f"\n[{section}]")
        for key, value in table.items():
            lines.append(f"{key} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, int):
        return str(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
