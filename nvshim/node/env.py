"""The node installer's settings from its environment (the GPU Operator's toolkit
variables, FACTS §10, plus ``NVSHIM_*`` forms) and its command-line options.

Several names for one setting are aliases: the first one set wins. Booleans follow Go's
``ParseBool``. Paths are host paths; the installer reaches them under ``HOST_ROOT_MOUNT``.
A variable nvshim cannot honour gives a warning naming it; a value it cannot parse is one
:class:`~nvshim.errors.UsageError` line, raised before anything is changed. The engine
variables (``RUNTIME_CONFIG``, ``RUNTIME_SOCKET``, ...) are read by
:mod:`nvshim.engines.settings`, the same code ``nvshim configure`` uses.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from nvshim.engines import ENGINES
from nvshim.engines.settings import (
    DEFAULT_CONFIG,
    Settings,
    flag_of,
    from_env,
    resolve_settings,
)
from nvshim.envbool import parse_bool
from nvshim.errors import NvshimError, UsageError
from nvshim.host.rootpath import in_root, resolve_in_root
from nvshim.node.hostview import RootPairs
from nvshim.record import field, record

DEFAULT_HOST_ROOT = "/host"
DEFAULT_PREFIX = "/usr/local/nvshim"
DEFAULT_CDI_DIR = "/var/run/cdi"
DEFAULT_PID_FILE = "/run/nvshim/node.pid"
DEFAULT_READY_FILE = "/run/nvshim/node-ready"
DEFAULT_HOOKS_DIR = "/usr/share/containers/oci/hooks.d"
DEFAULT_HOST_CONFIG = "/etc/nvshim/config.toml"
RESTART_DEFAULT = {"containerd": "signal", "docker": "signal", "crio": "systemd"}
CDI_SPEC_NAME = "nvshim.yaml"
CDI_SHARED_SPEC_NAME = "nvshim-shared.yaml"

# setting -> variables, first set wins
VARS: dict[str, tuple[str, ...]] = {
    "engine": ("NVSHIM_ENGINE", "RUNTIME"),
    "host_root": ("NVSHIM_HOST_ROOT", "HOST_ROOT_MOUNT"),
    "prefix": ("NVSHIM_PREFIX", "TOOLKIT_INSTALL_DIR", "ROOT"),
    "driver_root": ("NVSHIM_DRIVER_ROOT", "NVIDIA_DRIVER_ROOT", "DRIVER_ROOT"),
    "driver_root_ctr": ("NVSHIM_DRIVER_ROOT_CTR_PATH", "DRIVER_ROOT_CTR_PATH"),
    "dev_root": ("NVSHIM_DEV_ROOT", "NVIDIA_DEV_ROOT", "DEV_ROOT"),
    "dev_root_ctr": ("NVSHIM_DEV_ROOT_CTR_PATH", "DEV_ROOT_CTR_PATH"),
    "cdi_enabled": ("NVSHIM_CDI_ENABLED", "CDI_ENABLED", "ENABLE_CDI"),
    "cdi_output_dir": ("NVSHIM_CDI_OUTPUT_DIR", "CDI_OUTPUT_DIR"),
    "cdi_kind": ("NVSHIM_CDI_KIND", "CDI_KIND"),
    "no_daemon": ("NVSHIM_NO_DAEMON", "NO_DAEMON"),
    "no_runtime_config": ("NVSHIM_NO_RUNTIME_CONFIG", "NO_RUNTIME_CONFIG"),
    "pid_file": ("NVSHIM_PID_FILE", "TOOLKIT_PID_FILE", "PID_FILE"),
    "debug": ("NVSHIM_DEBUG_NODE", "TOOLKIT_DEBUG"),
    "drop_in": ("NVSHIM_RUNTIME_DROP_IN_CONFIG", "RUNTIME_DROP_IN_CONFIG"),
    "drop_in_host": ("RUNTIME_DROP_IN_CONFIG_HOST_PATH",),
    "crio_mode": ("NVSHIM_CRIO_CONFIG_MODE", "CRIO_CONFIG_MODE"),
    "crio_hooks_dir": ("NVSHIM_CRIO_HOOKS_DIR", "CRIO_HOOKS_DIR"),
    "accept_env": (
        "NVSHIM_ACCEPT_ENV_UNPRIVILEGED",
        "ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED",
    ),
    "accept_mounts": (
        "NVSHIM_ACCEPT_VOLUME_MOUNTS",
        "ACCEPT_NVIDIA_VISIBLE_DEVICES_AS_VOLUME_MOUNTS",
    ),
    "annotation_prefixes": (
        "NVSHIM_CDI_ANNOTATION_PREFIXES",
        "NVIDIA_CONTAINER_RUNTIME_MODES_CDI_ANNOTATION_PREFIXES",
    ),
    "low_level_runtimes": ("NVSHIM_LOW_LEVEL_RUNTIMES", "NVIDIA_CONTAINER_RUNTIME_RUNTIMES"),
    "ready_file": ("NVSHIM_READY_FILE",),
    "keep": ("NVSHIM_KEEP_INSTALLED",),
    "sharing_config": ("NVSHIM_SHARING_CONFIG",),
    "node_config": ("NVSHIM_NODE_CONFIG",),
    "host_config": ("NVSHIM_HOST_CONFIG",),
    "device_nodes": ("NVSHIM_CREATE_DEVICE_NODES", "CREATE_DEVICE_NODES"),
    "runtimed": ("NVSHIM_RUNTIMED",),
}
ROOT_SETTINGS = ("driver_root", "dev_root", "driver_root_ctr", "dev_root_ctr")
DEVICE_NODE_KINDS = ("control", "none")
BOOLS = (
    "cdi_enabled",
    "no_daemon",
    "no_runtime_config",
    "debug",
    "accept_env",
    "accept_mounts",
    "keep",
    "runtimed",
)
# Variables of the reference installer nvshim reads but cannot act on: (names, why).
UNHONOURED: tuple[tuple[tuple[str, ...], str], ...] = (
    (("RUNTIME_EXECUTABLE_PATH",), "nvshim does not run the engine's binary"),
    (("CONTAINERD_USE_LEGACY_CONFIG",), "the config version is read from the file"),
    (("CRIO_HOOK_FILENAME",), "the hook file is always oci-nvshim-hook.json"),
)
RUNC_V2 = "io.containerd.runc.v2"


@record(frozen=True)
class NodeSettings:
    """One installer run, every path as seen inside the installer (``*_host``: on the
    host)."""

    engine: Settings | None  # None: NO_RUNTIME_CONFIG
    engine_name: str
    host_root: str
    prefix: str  # host path
    driver_root: str  # host path
    driver_root_ctr: str
    dev_root: str  # host path
    dev_root_ctr: str
    cdi_enabled: bool = False
    cdi_output_dir: str = DEFAULT_CDI_DIR  # host path
    cdi_vendor: str = "nvidia.com"
    cdi_class: str = "gpu"
    no_daemon: bool = False
    pid_file: str = DEFAULT_PID_FILE  # host path
    debug: bool = False
    crio_hooks: bool = False
    hooks_dir: str | None = None  # host path
    ready_file: str = DEFAULT_READY_FILE  # in the installer
    keep: bool = False
    sharing_config: str | None = None  # in the installer
    node_config: str | None = None  # in the installer
    host_config: str = DEFAULT_HOST_CONFIG  # host path
    create_device_nodes: bool = False  # CREATE_DEVICE_NODES=control
    runtimed: bool = True  # nvshim-runtimed.service on a systemd host
    policy: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def here(self, path: str) -> str:
        """A host path as the installer reaches it (under the host root, its symlinks
        resolved there: :func:`nvshim.host.rootpath.in_root`)."""
        return in_root(self.host_root, path)

    @property
    def bin_dir(self) -> str:
        """Host path of the launchers the engine runs."""
        return os.path.join(self.prefix, "bin")

    @property
    def runtime_path(self) -> str:
        return os.path.join(self.bin_dir, "nvshim-runtime")

    @property
    def hook_path(self) -> str:
        return os.path.join(self.bin_dir, "nvshim-hook")

    @property
    def crio_runtime_root(self) -> str | None:
        """Host path of the runc state directory of nvshim's own CRI-O handler (every
        container there was created through nvshim), or None."""
        if self.engine is None or self.engine.engine != "crio" or self.engine.set_as_default:
            return None
        from nvshim.engines.crio import OWN_RUNTIME_ROOT

        root = self.engine.override.get("runtime_root")
        return root if root == OWN_RUNTIME_ROOT else None

    @property
    def cdi_spec(self) -> str:
        """Host path of the CDI spec the installer writes."""
        return os.path.join(self.cdi_output_dir, CDI_SPEC_NAME)

    @property
    def cdi_shared_spec(self) -> str:
        """Host path of the shared devices' CDI spec (an MPS sharing config)."""
        return os.path.join(self.cdi_output_dir, CDI_SHARED_SPEC_NAME)


def _first(setting: str, env: Mapping[str, str]) -> tuple[str, str] | None:
    for name in VARS[setting]:
        if name in env:
            return name, env[name]
    return None


@record(frozen=True)
class DriverRoots:
    """The driver root and the dev root: host paths, and where they are reached here."""

    driver_root: str  # host path
    driver_root_ctr: str
    dev_root: str  # host path
    dev_root_ctr: str

    @property
    def pairs(self) -> RootPairs:
        """(here, on the host) of the driver root and of the dev root, as
        :func:`nvshim.node.hostview.rebase_host` takes them."""
        return (self.driver_root_ctr, self.driver_root), (self.dev_root_ctr, self.dev_root)


def driver_roots(
    host_root: str, env: Mapping[str, str] | None = None, need: bool = False
) -> DriverRoots:
    """The driver root and dev root from the installer's variables: host paths (``/`` and
    the driver root by default), reached here at ``*_CTR_PATH`` if set, else under
    ``host_root``. ``need``: each root a variable names must be a directory here (else one
    :class:`~nvshim.errors.UsageError` line naming the variable)."""
    env = os.environ if env is None else env
    given: dict[str, tuple[str, str]] = {}  # setting -> (variable, value), set and not empty
    path: dict[str, str] = {}
    for setting in ROOT_SETTINGS:
        found = _first(setting, env)
        if found and found[1]:
            given[setting] = found
            path[setting] = _path(*found, None if setting.endswith("_ctr") else host_root)
    driver = path.get("driver_root", "/")
    dev = path.get("dev_root", driver)  # the reference's default too
    roots = DriverRoots(
        driver_root=driver,
        driver_root_ctr=path.get("driver_root_ctr") or _under(host_root, driver),
        dev_root=dev,
        dev_root_ctr=path.get("dev_root_ctr") or _under(host_root, dev),
    )
    for root in ("driver_root", "dev_root") if need else ():
        source = given.get(root + "_ctr") or given.get(root)
        here = getattr(roots, root + "_ctr")
        if source and not os.path.isdir(here):
            name, raw = source
            where = "" if here == raw else f" {here} is"
            raise UsageError(f"{name}={raw!r}:{where} not a directory")
    return roots


def _path(name: str, raw: str, host_root: str | None = None) -> str:
    """An absolute path; one already under ``host_root`` is taken as its host path."""
    if not raw.startswith("/") or any(c in raw for c in "\n\r\0"):
        raise UsageError(f"{name}={raw!r}: expected an absolute path")
    path = os.path.normpath(raw)
    if host_root and host_root != "/" and path.startswith(host_root.rstrip("/") + "/"):
        path = path[len(host_root.rstrip("/")) :]
    return path


def _under(host_root: str, path: str) -> str:
    """A host directory as the installer reaches it, every symlink resolved in the root."""
    return in_root(host_root, resolve_in_root(host_root, path))


def _list(raw: str) -> list[str]:
    return [item.strip() for item in raw.split(",") if item.strip()]


def _warn_unhonoured(env: Mapping[str, str], warnings: list[str]) -> None:
    for names, why in UNHONOURED:
        for name in names:
            if name in env:
                warnings.append(f"{name} is not honoured: {why}")
                break
    for name in ("CONTAINERD_RUNTIME_TYPE",):
        if name in env and env[name] != RUNC_V2:
            warnings.append(f"{name}={env[name]!r} is not honoured: nvshim registers {RUNC_V2}")


def _engine_settings(
    values: dict[str, Any], env: Mapping[str, str], options: Mapping[str, Any]
) -> Settings:
    """The configure settings: options first, then ``nvshim configure``'s variables, then
    the installer's defaults (host paths under the host root)."""
    engine = values["engine"]
    host_root = values["host_root"]
    wanted: dict[str, Any] = {}
    for key, default in (
        ("restart", RESTART_DEFAULT[engine]),
        ("set_as_default", True),
        ("runtime_path", os.path.join(values["prefix"], "bin", "nvshim-runtime")),
    ):
        if options.get(key) is not None:
            wanted[key] = options[key]
        elif from_env(key, engine, env) is None:
            wanted[key] = default
    for key in ("config", "socket", "runtime_name"):
        if options.get(key) is not None:
            wanted[key] = options[key]
    drop_in = values.get("drop_in")
    if drop_in:
        if engine == "crio":
            wanted.setdefault("config", drop_in)  # CRI-O's nvshim file is a drop-in already
        else:
            wanted["drop_in"] = drop_in
    settings = resolve_settings(engine, wanted, env)
    found = from_env("config", engine, env)
    config = settings.config
    if found is not None and options.get("config") is None:
        config = _path(found[0], found[1], host_root)
    socket = settings.socket
    found = from_env("socket", engine, env)
    if found is not None and options.get("socket") is None:
        socket = _path(found[0], found[1], host_root)
    from nvshim import record as records

    if engine == "crio" and not settings.set_as_default and "runtime_root" not in settings.override:
        # its own runc state directory (nvshim.engines.crio.OWN_RUNTIME_ROOT): the uninstall
        # tells nvshim's containers from the others by it (not as the default runtime:
        # pods without a runtime class must keep their state where runc's handler looks)
        from nvshim.engines.crio import OWN_RUNTIME_ROOT

        override = {**settings.override, "runtime_root": OWN_RUNTIME_ROOT}
        settings = records.replace(settings, runtime_config_override=json.dumps(override))
    return records.replace(
        settings,
        config=in_root(host_root, config or DEFAULT_CONFIG[engine]),
        socket=in_root(host_root, socket) if socket else socket,
        drop_in=in_root(host_root, settings.drop_in) if settings.drop_in else None,
        host_root=host_root,
    )


def resolve_node(
    options: Mapping[str, Any], env: Mapping[str, str] | None = None, acting: bool = False
) -> NodeSettings:
    """Every setting of an installer run from ``options`` (``None``: not given) and ``env``;
    ``acting`` (install, run, uninstall: not ``show``): the host root must be a directory."""
    env = os.environ if env is None else env
    warnings: list[str] = []
    values: dict[str, Any] = {}
    for setting in VARS:
        given = options.get(setting)
        if given is not None:
            values[setting] = given
            continue
        found = _first(setting, env)
        if found is None:
            continue
        name, raw = found
        values[setting] = parse_bool(name, raw) if setting in BOOLS else raw
        values.setdefault("_source", {})[setting] = name

    def src(setting: str) -> str:
        return values.get("_source", {}).get(setting, flag_of(setting))

    engine = values.setdefault("engine", "docker")
    if engine not in ENGINES:
        raise UsageError(f"{src('engine')}={engine!r}: expected one of {', '.join(ENGINES)}")
    host_root = _path(src("host_root"), values.get("host_root") or DEFAULT_HOST_ROOT)
    if acting and not os.path.isdir(host_root):  # else every host path is a wrong one
        raise UsageError(f"{src('host_root')}={host_root!r}: not a directory")
    values["host_root"] = host_root
    paths = {}
    for setting, default in (
        ("prefix", DEFAULT_PREFIX),
        ("cdi_output_dir", DEFAULT_CDI_DIR),
        ("pid_file", DEFAULT_PID_FILE),
        ("crio_hooks_dir", DEFAULT_HOOKS_DIR),
        ("drop_in", None),
        ("drop_in_host", None),
        ("host_config", DEFAULT_HOST_CONFIG),
    ):
        raw = values.get(setting) or default
        paths[setting] = _path(src(setting), raw, host_root) if raw else None
    for setting in ("ready_file", "sharing_config", "node_config"):
        raw = values.get(setting)
        paths[setting] = _path(src(setting), raw) if raw else None
    if paths["drop_in_host"]:
        if paths["drop_in"] and paths["drop_in"] != paths["drop_in_host"]:
            warnings.append(
                "RUNTIME_DROP_IN_CONFIG is ignored: nvshim writes the drop-in through the"
                f" host root at RUNTIME_DROP_IN_CONFIG_HOST_PATH ({paths['drop_in_host']})"
            )
        paths["drop_in"] = paths["drop_in_host"]
    values["prefix"] = paths["prefix"]
    values["drop_in"] = paths["drop_in"]
    roots = driver_roots(host_root, env)

    crio_mode = values.get("crio_mode") or "config"
    if crio_mode not in ("config", "hook"):
        raise UsageError(f"{src('crio_mode')}={crio_mode!r}: expected config or hook")
    crio_hooks = engine == "crio" and crio_mode == "hook"

    kind = values.get("cdi_kind") or "nvidia.com/gpu"
    vendor, _, cls = kind.partition("/")
    from nvshim.cdi.names import validate_class, validate_vendor

    try:
        validate_vendor(vendor)
        validate_class(cls)
    except ValueError as err:
        raise UsageError(f"{src('cdi_kind')}={kind!r}: {err}") from None

    policy: dict[str, Any] = {}

    def put(key: str, setting: str, value: Any) -> None:
        """A value for the host's config, checked as the config's own would be there."""
        from nvshim.config import check_value

        section = "runtime" if key == "runtimes" else "policy"
        try:
            policy[key] = check_value(section, key, value, src(setting))
        except NvshimError as err:
            raise UsageError(str(err)) from None

    if "accept_env" in values:
        put("accept-env-unprivileged", "accept_env", values["accept_env"])
    if "accept_mounts" in values:
        put("accept-volume-mounts", "accept_mounts", values["accept_mounts"])
    if values.get("annotation_prefixes") is not None:
        put("cdi-annotation-prefixes", "annotation_prefixes", _list(values["annotation_prefixes"]))
    if values.get("low_level_runtimes") is not None:
        runtimes = _list(values["low_level_runtimes"])
        if not runtimes:
            raise UsageError(f"{src('low_level_runtimes')}: empty list")
        put("runtimes", "low_level_runtimes", runtimes)

    kinds = _list(values.get("device_nodes") or "none")
    bad = [k for k in kinds if k not in DEVICE_NODE_KINDS]
    if bad:
        raise UsageError(
            f"{src('device_nodes')}={values['device_nodes']!r}: expected control or none"
        )

    no_config = bool(values.get("no_runtime_config")) or crio_hooks
    _warn_unhonoured(env, warnings)
    engine_settings = None if no_config else _engine_settings(values, env, options)
    return NodeSettings(
        engine=engine_settings,
        engine_name=engine,
        host_root=host_root,
        prefix=paths["prefix"],
        driver_root=roots.driver_root,
        driver_root_ctr=roots.driver_root_ctr,
        dev_root=roots.dev_root,
        dev_root_ctr=roots.dev_root_ctr,
        cdi_enabled=bool(values.get("cdi_enabled", False)),
        cdi_output_dir=paths["cdi_output_dir"],
        cdi_vendor=vendor,
        cdi_class=cls,
        no_daemon=bool(values.get("no_daemon", False)),
        pid_file=paths["pid_file"],
        debug=bool(values.get("debug", False)),
        crio_hooks=crio_hooks,
        hooks_dir=paths["crio_hooks_dir"] if crio_hooks else None,
        ready_file=paths["ready_file"] or DEFAULT_READY_FILE,
        keep=bool(values.get("keep", False)),
        sharing_config=paths["sharing_config"],
        node_config=paths["node_config"],
        host_config=paths["host_config"],
        create_device_nodes="control" in kinds,
        runtimed=bool(values.get("runtimed", True)),
        policy=policy,
        warnings=warnings,
    )


def describe(s: NodeSettings) -> str:
    """The resolved settings as one JSON object (``nvshim node show``)."""
    from nvshim.record import asdict

    data = asdict(s)
    if s.engine is not None:
        data["engine"] = asdict(s.engine)
    return json.dumps(data, indent=2, sort_keys=True)
