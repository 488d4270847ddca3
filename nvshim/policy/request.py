"""What a container asks for, read from its OCI spec (all of it hostile input).

Sources, first that yields devices wins: CDI annotations (our vendor/class by device id,
any other vendor's names resolved later from the spec directories: ``nvshim.policy.cdinames``),
``/dev/null`` mounts at ``/var/run/nvidia-container-devices/<id>``, GPU device nodes the
engine already put in ``linux.devices`` (its own CDI, a device plugin's device specs;
unprivileged containers only), then ``NVIDIA_VISIBLE_DEVICES`` (or a legacy CUDA image)
subject to the env policy.
"""

from __future__ import annotations

from nvshim.config import PolicyConfig
from nvshim.errors import NvshimError
from nvshim.record import field, record

MAX_VALUE = 64 * 1024  # bytes of one device-list value
MAX_ID = 128  # characters of one device id
MAX_INDEX_DIGITS = 9
DEVICES_DIR = ("var", "run", "nvidia-container-devices")
VISIBLE = "NVIDIA_VISIBLE_DEVICES"
RDMA_ANNOTATION = "nvshim.io/rdma"  # a GPU-NIC pairing request (nvshim.policy.pairing)
RDMA_ENV = "NVSHIM_RDMA"
# The CRI's marks of a pod sandbox (the pause container): containerd, CRI-O
SANDBOX_MARKS = (
    ("io.kubernetes.cri.container-type", "sandbox"),
    ("io.kubernetes.cri-o.ContainerType", "sandbox"),
)
KINDS = ("unset", "void", "none", "all", "list")
TRUE_WORDS = ("true", "1", "yes")

_DIGITS = frozenset("0123456789")
_UUID_CHARS = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-")


class RequestError(NvshimError):
    """A device request that is malformed or cannot be met."""


@record(frozen=True)
class DeviceList:
    """A parsed device request: ``kind`` in ``KINDS``; ``ids`` only for ``list``."""

    kind: str
    ids: tuple[str, ...] = ()
    # the names as given, before replica suffixes were stripped and repeats dropped
    raw: tuple[str, ...] = field(default=(), compare=False)

    def __str__(self) -> str:
        return ",".join(self.ids) if self.kind == "list" else self.kind

    @property
    def wants_gpu_driver(self) -> bool:
        """True for ``none``, ``all`` and lists: the container is a GPU container."""
        return self.kind in ("none", "all", "list")


@record(frozen=True)
class ContainerRequest:
    """A GPU container's request. When ``denied`` is set the container gets nothing
    (``devices`` is then ``void``) and the reason, naming what was asked, is for the log."""

    source: str  # "cdi" | "mounts" | "env" | "legacy"
    devices: DeviceList
    capabilities: tuple[str, ...]
    privileged: bool
    requirements: dict[str, str] = field(default_factory=dict)
    disable_require: bool = False
    denied: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    rdma: tuple[str, str] | None = None  # (source, value) of a GPU-NIC pairing request
    # CDI names of other vendors/classes (``vendor/class=name``), resolved by select
    cdi_names: tuple[str, ...] = ()
    # GPU and MIG capability device nodes already in linux.devices (source "engine")
    device_nodes: tuple[str, ...] = ()

    @property
    def raw_ids(self) -> tuple[str, ...] | None:
        """Device names as the request gave them (replica suffixes kept), if a list."""
        return self.devices.raw if self.devices.kind == "list" else None


def _show(text: str, limit: int = 64) -> str:
    """A safe, bounded rendering of hostile text for one-line messages."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


def parse_device_id(raw: str, what: str = VISIBLE) -> str:
    """One device id in canonical form, its replica suffix ``::<n>`` removed.

    Accepted: an index, ``<gpu>:<mig>``, ``GPU-<uuid>``, ``MIG-<uuid>`` and legacy
    ``MIG-GPU-<uuid>/<gi>/<ci>`` (indexes lose leading zeros). Anything else raises
    RequestError naming ``what`` and the id.
    """
    entry = raw.strip()
    if len(entry) > MAX_ID:
        raise RequestError(f"{what}: device id longer than {MAX_ID} characters: {_show(entry)}")
    base, sep, replica = entry.partition("::")
    if sep and not (replica and _is_number(replica, 6)):
        raise RequestError(f"{what}: invalid replica suffix in device id {_show(entry)}")
    canonical = _canonical_id(base)
    if canonical is None:
        raise RequestError(f"{what}: invalid device id {_show(entry)}")
    return canonical


def _is_number(text: str, max_digits: int = MAX_INDEX_DIGITS) -> bool:
    return 0 < len(text) <= max_digits and set(text) <= _DIGITS


def _is_uuid_body(text: str) -> bool:
    return bool(text) and set(text) <= _UUID_CHARS


def _canonical_id(base: str) -> str | None:
    if _is_number(base):
        return str(int(base))
    gpu, colon, mig = base.partition(":")
    if colon:
        if _is_number(gpu) and _is_number(mig):
            return f"{int(gpu)}:{int(mig)}"
        return None
    if base.startswith("GPU-"):
        return base if _is_uuid_body(base[4:]) else None
    if base.startswith("MIG-GPU-") and "/" in base:
        uuid, *rest = base[4:].split("/")
        ok = len(rest) == 2 and _is_uuid_body(uuid[4:]) and all(_is_number(x) for x in rest)
        return f"MIG-{uuid}/{int(rest[0])}/{int(rest[1])}" if ok else None
    if base.startswith("MIG-"):
        return base if _is_uuid_body(base[4:]) else None
    return None


def parse_device_ids(names: list[str], what: str, keywords: bool = True) -> DeviceList:
    """A list of device names (already split): ``all`` anywhere means all; ``none`` and
    ``void`` only alone, and only with ``keywords`` (CDI names and device mounts have no
    such devices); ids are de-duplicated in order."""
    names = [n.strip() for n in names]
    names = [n for n in names if n]
    if not names:
        return DeviceList("void")
    if len(names) == 1 and names[0] in ("none", "void") and keywords:
        return DeviceList(names[0])
    ids: list[str] = []
    seen: set[str] = set()
    is_all = False
    for name in names:
        if name == "all":
            is_all = True
            continue
        if name in ("none", "void"):
            if not keywords:
                raise RequestError(f"{what}: {name!r} is not a device name")
            raise RequestError(f"{what}: {name!r} cannot be combined with other devices")
        canonical = parse_device_id(name, what)
        if canonical not in seen:
            seen.add(canonical)
            ids.append(canonical)
    return DeviceList("all") if is_all else DeviceList("list", tuple(ids), tuple(names))


def parse_visible_devices(value: str | None, what: str = VISIBLE) -> DeviceList:
    """Parse an ``NVIDIA_VISIBLE_DEVICES`` value (FACTS §3).

    None is ``unset``; empty, blank or ``void`` is ``void``; ``none``; ``all``; else a
    comma list of ids (see ``parse_device_id``), blanks around entries tolerated, replica
    suffixes stripped, duplicates dropped. Malformed input raises RequestError.
    """
    if value is None:
        return DeviceList("unset")
    if not isinstance(value, str):
        raise RequestError(f"{what}: not a string")
    if len(value.encode("utf-8", "surrogatepass")) > MAX_VALUE:
        raise RequestError(f"{what}: value longer than {MAX_VALUE} bytes")
    return parse_device_ids(value.split(","), what)


def is_privileged(spec: dict) -> bool:
    """True when CAP_SYS_ADMIN is in the spec's bounding capability set."""
    process = spec.get("process") if isinstance(spec, dict) else None
    caps = process.get("capabilities") if isinstance(process, dict) else None
    bounding = caps.get("bounding") if isinstance(caps, dict) else None
    return isinstance(bounding, list) and "CAP_SYS_ADMIN" in bounding


def requirements_of(env: dict[str, str]) -> tuple[dict[str, str], bool]:
    """The ``NVIDIA_REQUIRE_*`` variables of ``env`` and whether
    ``NVIDIA_DISABLE_REQUIRE`` turns them off."""
    requirements = {k: v for k, v in env.items() if k.startswith("NVIDIA_REQUIRE_")}
    return requirements, env.get("NVIDIA_DISABLE_REQUIRE", "").strip().lower() in TRUE_WORDS


def spec_env(spec: dict) -> dict[str, str]:
    """``process.env`` as a dict; later entries win (as execve); malformed entries skipped."""
    process = spec.get("process") if isinstance(spec, dict) else None
    entries = process.get("env") if isinstance(process, dict) else None
    env: dict[str, str] = {}
    if not isinstance(entries, list):
        return env
    for entry in entries:
        if isinstance(entry, str) and "=" in entry:
            key, _, value = entry.partition("=")
            if key:
                env[key] = value
    return env


def cdi_annotation_names(spec: dict, policy: PolicyConfig) -> list[tuple[str, str]]:
    """Every CDI name the CDI annotations (``<prefix>...`` = ``vendor/class=name,...``)
    carry, as ``(what, name)``; an entry that is not a valid qualified CDI name raises
    RequestError (annotations are hostile: nothing unparsed goes further)."""
    from nvshim.cdi.names import parse_qualified_name

    annotations = spec.get("annotations")
    if not isinstance(annotations, dict):
        return []
    prefixes = [p for p in policy.cdi_annotation_prefixes if p]
    names: list[tuple[str, str]] = []
    for key, value in annotations.items():
        if not (isinstance(key, str) and isinstance(value, str)):
            continue
        if not any(key.startswith(p) for p in prefixes):
            continue
        what = f"annotation {_show(key)}"
        if len(value) > MAX_VALUE:
            raise RequestError(f"{what}: value longer than {MAX_VALUE} bytes")
        for entry in value.split(","):
            try:
                parse_qualified_name(entry.strip())
            except ValueError as err:
                raise RequestError(f"{what}: {err}") from None
            names.append((what, entry.strip()))
    return names


def devices_from_annotations(spec: dict, policy: PolicyConfig) -> DeviceList | None:
    """Our devices named by CDI annotations; None when no annotation names one. Names of
    other vendors are left to ``foreign_cdi_names``."""
    kind = f"{policy.cdi_vendor}/{policy.cdi_class}"
    names = [n.partition("=")[2] for _, n in cdi_annotation_names(spec, policy)
             if n.partition("=")[0] == kind]  # fmt: skip
    if not names:
        return None
    return parse_device_ids(names, f"annotation {kind}", keywords=False)


def foreign_cdi_names(spec: dict, policy: PolicyConfig) -> tuple[str, ...]:
    """CDI names in the annotations of any other vendor or class, in order, once each."""
    kind = f"{policy.cdi_vendor}/{policy.cdi_class}"
    names = [n for _, n in cdi_annotation_names(spec, policy) if n.partition("=")[0] != kind]
    return tuple(dict.fromkeys(names))


def gpu_device_nodes(spec: dict) -> tuple[str, ...]:
    """Paths of GPU (``/dev/nvidia<N>``) and MIG capability (``/dev/nvidia-caps/
    nvidia-cap<N>``) device nodes in ``linux.devices``: what the engine injected itself."""
    linux = spec.get("linux")
    entries = linux.get("devices") if isinstance(linux, dict) else None
    if not isinstance(entries, list):
        return ()
    found = []
    for entry in entries:
        path = entry.get("path") if isinstance(entry, dict) else None
        if isinstance(path, str) and is_gpu_node_path(path):
            found.append(path)
    return tuple(dict.fromkeys(found))


def is_gpu_node_path(path: str) -> bool:
    """``/dev/nvidia<N>`` or ``/dev/nvidia-caps/nvidia-cap<N>`` (N: up to 9 digits)."""
    for prefix in ("/dev/nvidia-caps/nvidia-cap", "/dev/nvidia"):
        if path.startswith(prefix):
            return _is_number(path[len(prefix) :])
    return False


def _components(path: str) -> list[str]:
    return [c for c in path.split("/") if c not in ("", ".")]


def devices_from_mounts(spec: dict) -> DeviceList | None:
    """Devices named by ``/dev/null`` mounts at ``/var/run/nvidia-container-devices/<id>``.

    A ``/dev/null`` mount whose destination mentions that directory must be exactly
    ``/var/run/nvidia-container-devices/<id>`` after dropping ``.`` and repeated slashes;
    ``..`` anywhere, a nested or missing id, or another location raises RequestError.
    """
    mounts = spec.get("mounts")
    if not isinstance(mounts, list):
        return None
    names: list[str] = []
    for mount in mounts:
        if not isinstance(mount, dict):
            continue
        source, dest = mount.get("source"), mount.get("destination")
        if not (isinstance(source, str) and isinstance(dest, str)):
            continue
        if _components(source) != ["dev", "null"]:
            continue
        parts = _components(dest)
        if not any(DEVICES_DIR[-1] in p for p in parts):
            continue
        what = f"mount {_show(dest)}"
        if ".." in parts:
            raise RequestError(f"{what}: '..' is not allowed in a device mount destination")
        if len(parts) != 4 or tuple(parts[:3]) != DEVICES_DIR:
            raise RequestError(f"{what}: must be /var/run/nvidia-container-devices/<device id>")
        names.append(parts[3])
    if not names:
        return None
    return parse_device_ids(names, "device mounts", keywords=False)


def _is_legacy(env: dict[str, str]) -> bool:
    return bool(env.get("CUDA_VERSION")) and not env.get("NVIDIA_REQUIRE_CUDA")


def is_sandbox(spec: dict) -> bool:
    """Whether the CRI marked this container as a pod sandbox (the pause container)."""
    annotations = spec.get("annotations")
    if not isinstance(annotations, dict):
        return False
    return any(annotations.get(key) == value for key, value in SANDBOX_MARKS)


def request_from_spec(spec: dict, policy: PolicyConfig) -> ContainerRequest | None:
    """The container's GPU request, or None for a container that asks for no GPU.

    ``policy`` is the ``[policy]`` table of the configuration. A pod sandbox never asks
    (pod annotations an engine passes through reach it too). Env requests (including
    legacy CUDA images, which mean ``all``) are honoured for privileged containers, and
    for unprivileged ones only with ``accept-env-unprivileged``; otherwise the request
    comes back with ``denied`` set, or, when it names devices and
    ``fail-refused-env`` is on, raises RequestError (the container fails, the reason in
    the engine's error: a device plugin's envvar request never silently yields a
    container without its GPU). Malformed requests raise RequestError, except an env
    request that would be denied anyway.
    """
    if not isinstance(spec, dict):
        raise RequestError("config.json: not a JSON object")
    if is_sandbox(spec):
        return None
    env = spec_env(spec)
    privileged = is_privileged(spec)
    denied: str | None = None
    asked = ""
    source = "cdi"
    devices = devices_from_annotations(spec, policy)
    foreign = foreign_cdi_names(spec, policy)
    nodes: tuple[str, ...] = ()
    if devices is None and foreign:
        devices = DeviceList("list")  # what they name comes from the spec directories
    if devices is None and policy.accept_volume_mounts:
        source = "mounts"
        devices = devices_from_mounts(spec)
    if devices is None and not privileged:  # privileged: linux.devices holds every node
        nodes = gpu_device_nodes(spec)
        if nodes:
            source, devices = "engine", DeviceList("list")
    if devices is None:
        honoured = privileged or policy.accept_env_unprivileged
        if VISIBLE in env:
            source = "env"
            asked = f"{VISIBLE}={_show(env[VISIBLE])}"
            try:
                devices = parse_visible_devices(env[VISIBLE])
            except RequestError as err:
                if honoured:
                    raise
                devices, asked = DeviceList("none"), str(err)
        elif _is_legacy(env):
            source, devices = "legacy", DeviceList("all")
            asked = f"legacy CUDA image (CUDA_VERSION={_show(env['CUDA_VERSION'])}) means all"
        else:
            return None
        if not devices.wants_gpu_driver:
            return None
        if not honoured:
            denied = (
                f"{asked} not honoured: unprivileged container and "
                "policy.accept-env-unprivileged is false"
            )
            if devices.kind == "list" and policy.fail_refused_env:
                raise RequestError(
                    f"{denied}; ask through a CDI annotation or device mounts (the device"
                    " plugin's cdi-annotations or volume-mounts strategy), or set"
                    " policy.accept-env-unprivileged"
                )
            devices = DeviceList("void")
    warnings: list[str] = []
    from nvshim.policy.capabilities import parse_capabilities

    capabilities = parse_capabilities(
        env.get("NVIDIA_DRIVER_CAPABILITIES"), policy.default_capabilities, warnings
    )
    requirements, disable_require = requirements_of(env)
    return ContainerRequest(
        source=source,
        devices=devices,
        capabilities=capabilities,
        privileged=privileged,
        requirements=requirements,
        disable_require=disable_require,
        denied=denied,
        env=env,
        warnings=tuple(warnings),
        rdma=rdma_ask(spec, env),
        cdi_names=foreign,
        device_nodes=nodes,
    )


# The words whose absence from a config.json's text proves ``request_from_spec`` returns
# None for it: the sh front (``nvshim.runtime.front``) greps for them and hands a
# create/run whose config.json has none straight to the low-level runtime. Every source
# above (and every name of nvshim's own, ``nvshim.io/...`` annotations and ``NVSHIM_...``
# env) must be covered; a JSON escape (``\u004e``, ``\/``) could hide a name from a
# fixed-string match, so any such escape counts as a word too. A new source adds its word
# here and its specs to the corpus of tests/test_policy_request.py, which checks this.
TRIGGERS = (
    "NVIDIA_", "CUDA_VERSION", DEVICES_DIR[-1], "nvshim.io/", "NVSHIM_", "/dev/nvidia", "\\u",
    "\\/",
)  # fmt: skip


def request_triggers(policy: PolicyConfig) -> tuple[str, ...]:
    """``TRIGGERS``, the configured CDI kind (``<cdi-vendor>/<cdi-class>``) and the CDI
    annotation prefixes (a name of any vendor is a request). A word holding a character
    JSON writes only escaped (a quote, a backslash, a control character) adds a lone
    backslash: then any escape at all sends the spec to Python."""
    kind = f"{policy.cdi_vendor}/{policy.cdi_class}"
    prefixes = [p for p in policy.cdi_annotation_prefixes if p]
    words = (*TRIGGERS, kind, *prefixes)
    if any(c in '"\\' or ord(c) < 0x20 for word in (kind, *prefixes) for c in word):
        words += ("\\",)
    return words


def rdma_ask(spec: dict, env: dict[str, str]) -> tuple[str, str] | None:
    """The pairing request: the ``nvshim.io/rdma`` annotation, else ``NVSHIM_RDMA``."""
    annotations = spec.get("annotations")
    if isinstance(annotations, dict) and isinstance(annotations.get(RDMA_ANNOTATION), str):
        return ("annotation", annotations[RDMA_ANNOTATION])
    if RDMA_ENV in env:
        return ("env", env[RDMA_ENV])
    return None
