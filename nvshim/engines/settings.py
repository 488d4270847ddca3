"""What a ``configure``/``unconfigure`` run does: options, environment and defaults merged.

Precedence: command-line option, then ``NVSHIM_*`` variable, then the installer variables
the GPU Operator uses (``RUNTIME_CONFIG``, ``CONTAINERD_CONFIG`` ...; FACTS §10, first
found wins), then the default. Booleans from the GPU Operator's variables follow Go's
``ParseBool``; ``NVSHIM_*`` ones also take yes/no/on/off.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from nvshim.engines import ENGINES
from nvshim.envbool import parse_bool
from nvshim.errors import UsageError
from nvshim.record import record

DEFAULT_CONFIG = {
    "containerd": "/etc/containerd/config.toml",
    "docker": "/etc/docker/daemon.json",
    "crio": "/etc/crio/crio.conf.d/99-nvshim.toml",
}
DEFAULT_SOCKET = {
    "containerd": "/run/containerd/containerd.sock",
    "docker": "/run/docker.sock",
    "crio": "/run/crio/crio.sock",
}
SYSTEMD_UNIT = {"containerd": "containerd", "docker": "docker", "crio": "crio"}
DEFAULT_RUNTIME_NAME = "nvshim"
DEFAULT_RUNTIME_PATH = "/usr/bin/nvshim-runtime"
RESTART_MODES = ("none", "signal", "systemd")

# setting -> engine -> variables, first found wins ("*" applies to every engine)
ENV: dict[str, dict[str, tuple[str, ...]]] = {
    "engine": {"*": ("NVSHIM_ENGINE",)},
    "config": {
        "containerd": ("NVSHIM_CONTAINERD_CONFIG", "RUNTIME_CONFIG", "CONTAINERD_CONFIG"),
        "docker": ("NVSHIM_DOCKER_CONFIG", "RUNTIME_CONFIG", "DOCKER_CONFIG"),
        "crio": ("NVSHIM_CRIO_CONFIG", "RUNTIME_CONFIG", "CRIO_CONFIG"),
    },
    "socket": {
        "containerd": ("NVSHIM_CONTAINERD_SOCKET", "RUNTIME_SOCKET", "CONTAINERD_SOCKET"),
        "docker": ("NVSHIM_DOCKER_SOCKET", "RUNTIME_SOCKET", "DOCKER_SOCKET"),
        "crio": ("NVSHIM_CRIO_SOCKET", "RUNTIME_SOCKET", "CRIO_SOCKET"),
    },
    "runtime_name": {
        "containerd": ("NVSHIM_RUNTIME_NAME", "NVIDIA_RUNTIME_NAME", "CONTAINERD_RUNTIME_CLASS"),
        "docker": ("NVSHIM_RUNTIME_NAME", "NVIDIA_RUNTIME_NAME", "DOCKER_RUNTIME_NAME"),
        "*": ("NVSHIM_RUNTIME_NAME", "NVIDIA_RUNTIME_NAME"),
    },
    "set_as_default": {
        "containerd": (
            "NVSHIM_SET_AS_DEFAULT",
            "NVIDIA_RUNTIME_SET_AS_DEFAULT",
            "CONTAINERD_SET_AS_DEFAULT",
        ),
        "docker": (
            "NVSHIM_SET_AS_DEFAULT",
            "NVIDIA_RUNTIME_SET_AS_DEFAULT",
            "DOCKER_SET_AS_DEFAULT",
        ),
        "*": ("NVSHIM_SET_AS_DEFAULT", "NVIDIA_RUNTIME_SET_AS_DEFAULT"),
    },
    "runtime_path": {"*": ("NVSHIM_RUNTIME_PATH",)},
    "enable_cdi": {"*": ("NVSHIM_ENABLE_CDI", "RUNTIME_ENABLE_CDI")},
    "drop_in": {"containerd": ("NVSHIM_CONTAINERD_DROP_IN",)},
    "restart": {"*": ("NVSHIM_RESTART", "RUNTIME_RESTART_MODE")},
    "containerd_version": {"*": ("NVSHIM_CONTAINERD_VERSION",)},
    # the GPU Operator's toolkit installer names (FACTS: its environment)
    "config_source": {
        "*": ("NVSHIM_CONFIG_SOURCE", "RUNTIME_CONFIG_SOURCES", "RUNTIME_CONFIG_SOURCE")
    },
    "runtime_config_override": {
        "containerd": (
            "NVSHIM_RUNTIME_CONFIG_OVERRIDE",
            "RUNTIME_CONFIG_OVERRIDE",
            "CONTAINERD_RUNTIME_CONFIG_OVERRIDE",
        ),
        "*": ("NVSHIM_RUNTIME_CONFIG_OVERRIDE", "RUNTIME_CONFIG_OVERRIDE"),
    },
    "take_over": {"*": ("NVSHIM_TAKE_OVER",)},
    "cgroup_driver": {"*": ("NVSHIM_CGROUP_DRIVER",)},
}
CONFIG_SOURCES = ("command", "file")
CGROUP_DRIVERS = ("systemd", "cgroupfs")

_NAME_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$")
_ENGINE_OWN_RUNTIMES = ("runc", "crun")
_BOOLEANS = ("set_as_default", "enable_cdi", "take_over")


@record(frozen=True)
class Settings:
    """A resolved run: which engine and file, what to register, how to restart."""

    engine: str
    config: str
    drop_in: str | None = None
    runtime_name: str = DEFAULT_RUNTIME_NAME
    runtime_path: str = DEFAULT_RUNTIME_PATH
    set_as_default: bool = False
    enable_cdi: bool = False
    dry_run: bool = False
    restart: str = "none"
    socket: str = ""
    containerd_version: str | None = None
    config_source: str = "file"  # "command,file": read the engine's effective config first
    runtime_config_override: str | None = None  # JSON object merged into the options
    take_over: bool = False  # re-point a reference `nvidia` entry at nvshim-runtime
    cgroup_driver: str | None = None  # systemd/cgroupfs; None: detected from the host
    host_root: str = "/"  # the engine's root filesystem as seen here (`nvshim node`)

    def cgroup_driver_or_host(self) -> str:
        """``cgroup_driver``, else the host's (for a runtime with nothing to copy)."""
        return self.cgroup_driver or host_cgroup_driver()

    @property
    def override(self) -> dict:
        """``runtime_config_override`` parsed (checked by ``resolve_settings``)."""
        import json

        return json.loads(self.runtime_config_override) if self.runtime_config_override else {}

    @property
    def unit(self) -> str:
        """The systemd unit of the engine."""
        return SYSTEMD_UNIT[self.engine]

    def on_host(self, path: str) -> str:
        """``path`` (as seen here, under ``host_root``) as the engine sees it."""
        from nvshim.host.rootpath import container_path

        try:
            return container_path(self.host_root, path)
        except ValueError:
            return path


def host_cgroup_driver(root: str = "/") -> str:
    """``systemd`` when systemd runs the host (kubelet and the engines then use its cgroup
    driver), else ``cgroupfs``."""
    return "systemd" if os.path.isdir(os.path.join(root, "run/systemd/system")) else "cgroupfs"


# setting -> its command-line flag where the two names differ (docs/commands.md "Conventions")
FLAGS = {"engine": "--engine", "config": "--engine-config"}


def flag_of(setting: str) -> str:
    """The command-line flag of ``setting``: ``config`` is ``--engine-config``."""
    return FLAGS.get(setting, "--" + setting.replace("_", "-"))


def from_env(setting: str, engine: str, env: Mapping[str, str]) -> tuple[str, str] | None:
    table = ENV[setting]
    for name in table.get(engine, ()) + table.get("*", ()):
        if name in env:
            return name, env[name]
    return None


def resolve_settings(
    engine: str | None, options: Mapping[str, Any], env: Mapping[str, str] | None = None
) -> Settings:
    """Merge command-line ``options`` (``None`` = not given) with ``env`` and defaults."""
    env = os.environ if env is None else env
    source = "--engine"
    if engine is None:
        found = from_env("engine", "*", env)
        if found is None:
            raise UsageError("--engine is required: containerd, docker or crio")
        source, engine = found
    if engine not in ENGINES:
        raise UsageError(f"{source} {engine!r}: expected one of {', '.join(ENGINES)}")

    values: dict[str, Any] = {"engine": engine}
    sources: dict[str, str] = {}
    for setting in ENV:
        if setting == "engine":
            continue
        given = options.get(setting)
        if given is not None:
            values[setting] = given
            sources[setting] = flag_of(setting)
            continue
        found = from_env(setting, engine, env)
        if found is None:
            continue
        name, raw = found
        sources[setting] = name
        values[setting] = parse_bool(name, raw) if setting in _BOOLEANS else raw
    values.setdefault("config", DEFAULT_CONFIG[engine])
    values.setdefault("socket", DEFAULT_SOCKET[engine])
    for flag in ("dry_run",):
        if options.get(flag) is not None:
            values[flag] = bool(options[flag])
    settings = Settings(**values)
    _validate(settings, sources)
    return settings


def _validate(s: Settings, sources: Mapping[str, str]) -> None:
    def src(setting: str) -> str:
        return sources.get(setting, flag_of(setting))

    if not s.config:
        raise UsageError(f"{src('config')}: empty path")
    if s.drop_in is not None:
        if s.engine != "containerd":
            raise UsageError(
                "--drop-in is for containerd only (CRI-O's --engine-config is a drop-in)"
            )
        if not s.drop_in.strip():
            raise UsageError(
                f"{src('drop_in')}: empty path (an empty drop-in would lose the runtime)"
            )
        if os.path.abspath(s.drop_in) == os.path.abspath(s.config):
            raise UsageError(f"{src('drop_in')}: must differ from the main config {s.config}")
    if not _NAME_RE.match(s.runtime_name):
        raise UsageError(
            f"{src('runtime_name')} {s.runtime_name!r}: use letters, digits, '-', '_' or '.'"
            " (at most 63, starting and ending with a letter or digit)"
        )
    if s.runtime_name in _ENGINE_OWN_RUNTIMES:
        raise UsageError(
            f"{src('runtime_name')} {s.runtime_name!r}: that name is the engine's own runtime"
        )
    if not os.path.isabs(s.runtime_path) or any(c in s.runtime_path for c in "\n\r\0"):
        raise UsageError(f"{src('runtime_path')} {s.runtime_path!r}: must be an absolute path")
    if s.restart not in RESTART_MODES:
        raise UsageError(
            f"{src('restart')} {s.restart!r}: expected one of {', '.join(RESTART_MODES)}"
        )
    if s.restart == "signal" and not s.socket:
        raise UsageError(f"{src('socket')}: empty path")
    sources_given = [x.strip() for x in s.config_source.split(",")]
    if not all(x in CONFIG_SOURCES for x in sources_given):
        raise UsageError(
            f"{src('config_source')} {s.config_source!r}: expected a list of command and file"
        )
    if s.cgroup_driver is not None and s.cgroup_driver not in CGROUP_DRIVERS:
        raise UsageError(
            f"{src('cgroup_driver')} {s.cgroup_driver!r}: expected systemd or cgroupfs"
        )
    if s.runtime_config_override:
        _check_override(src("runtime_config_override"), s.runtime_config_override)
    if s.containerd_version:
        if parse_version(s.containerd_version) is None:
            raise UsageError(
                f"{src('containerd_version')}={s.containerd_version!r}: expected like 1.7.2"
            )


def _check_override(source: str, text: str) -> None:
    import json

    try:
        value = json.loads(text)
    except ValueError as err:
        raise UsageError(f"{source}: not JSON: {err}") from None
    if not isinstance(value, dict):
        raise UsageError(f"{source}: must be a JSON object, got {type(value).__name__}")
    null = _null_at(value)
    if null is not None:  # TOML has no null: the edit could not be written
        raise UsageError(f"{source}: {null or 'an entry'} is null, which TOML cannot hold")


def _null_at(value: Any, where: str = "") -> str | None:
    """The dotted key of the first null in ``value`` ("" for ``value`` itself), or None."""
    if value is None:
        return where
    if not isinstance(value, (dict, list)):
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, item in items:
        found = _null_at(item, f"{where}.{key}" if where else str(key))
        if found is not None:
            return found
    return None


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
