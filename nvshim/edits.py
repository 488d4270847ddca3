"""Container edits: the one representation that flows through nvshim.

Shaped like CDI's ``containerEdits``: device nodes, mounts, environment, hooks and
additional GIDs. Discovery produces edits, policy selects and amends them, and the
three sinks (CDI writer, OCI spec modifier, prestart hook) consume them.
"""

from __future__ import annotations

from nvshim.record import field, record, replace

HOOK_NAMES = (
    "prestart",
    "createRuntime",
    "createContainer",
    "startContainer",
    "poststart",
    "poststop",
)

TYPE_CHECKING = False  # typing costs ~5 ms at import, per container
if TYPE_CHECKING:
    from typing import Any


@record(frozen=True)
class DeviceNode:
    """A device node to create in the container (``path``) from the host (``host_path``)."""

    path: str
    host_path: str | None = None
    type: str | None = "c"
    major: int | None = None
    minor: int | None = None
    permissions: str | None = None
    uid: int | None = None
    gid: int | None = None
    file_mode: int | None = None

    @property
    def source(self) -> str:
        """The node's path on the host."""
        return self.host_path or self.path

    def to_cdi(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path}
        if self.host_path and self.host_path != self.path:
            out["hostPath"] = self.host_path
        for key, value in (
            ("type", self.type),
            ("major", self.major),
            ("minor", self.minor),
            ("permissions", self.permissions),
            ("uid", self.uid),
            ("gid", self.gid),
        ):
            if value is not None:
                out[key] = value
        return out

    @classmethod
    def from_cdi(cls, data: dict[str, Any]) -> DeviceNode:
        return cls(
            path=data["path"],
            host_path=data.get("hostPath"),
            type=data.get("type"),
            major=data.get("major"),
            minor=data.get("minor"),
            permissions=data.get("permissions"),
            uid=data.get("uid"),
            gid=data.get("gid"),
        )


@record(frozen=True)
class Mount:
    """A bind (or typed) mount of ``host_path`` at ``container_path``."""

    host_path: str
    container_path: str
    options: tuple[str, ...] = ()
    type: str | None = None

    def to_cdi(self) -> dict[str, Any]:
        out: dict[str, Any] = {"hostPath": self.host_path, "containerPath": self.container_path}
        if self.options:
            out["options"] = list(self.options)
        if self.type:
            out["type"] = self.type
        return out

    @classmethod
    def from_cdi(cls, data: dict[str, Any]) -> Mount:
        return cls(
            host_path=data["hostPath"],
            container_path=data["containerPath"],
            options=tuple(data.get("options") or ()),
            type=data.get("type"),
        )


@record(frozen=True)
class Hook:
    """An OCI hook entry to run at ``hook_name``; ``env`` is always explicit."""

    hook_name: str
    path: str
    args: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    timeout: int | None = None

    def to_oci(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path}
        if self.args:
            out["args"] = list(self.args)
        out["env"] = list(self.env)
        if self.timeout is not None:
            out["timeout"] = self.timeout
        return out

    def to_cdi(self) -> dict[str, Any]:
        return {"hookName": self.hook_name, **self.to_oci()}

    @classmethod
    def from_cdi(cls, data: dict[str, Any]) -> Hook:
        return cls(
            hook_name=data["hookName"],
            path=data["path"],
            args=tuple(data.get("args") or ()),
            env=tuple(data.get("env") or ()),
            timeout=data.get("timeout"),
        )


def env_key(entry: str) -> str:
    """The variable name of a ``KEY=value`` entry."""
    return entry.split("=", 1)[0]


@record
class ContainerEdits:
    """Edits to apply to a container; ``merge`` de-duplicates, later entries win."""

    env: list[str] = field(default_factory=list)
    device_nodes: list[DeviceNode] = field(default_factory=list)
    mounts: list[Mount] = field(default_factory=list)
    hooks: list[Hook] = field(default_factory=list)
    additional_gids: list[int] = field(default_factory=list)

    def is_empty(self) -> bool:
        return not (
            self.env or self.device_nodes or self.mounts or self.hooks or self.additional_gids
        )

    def merge(self, *others: ContainerEdits) -> ContainerEdits:
        """Return a new edits object holding ``self`` then ``others``, de-duplicated.

        Env entries are keyed by variable name, device nodes and mounts by container
        path (a later one replaces an earlier one in place), hooks and GIDs by value.
        """
        parts = (self, *others)
        return ContainerEdits(
            env=dedupe_keep_last([e for p in parts for e in p.env], env_key),
            device_nodes=dedupe_keep_last(
                [d for p in parts for d in p.device_nodes], lambda d: d.path
            ),
            mounts=dedupe_keep_last(
                [m for p in parts for m in p.mounts], lambda m: m.container_path
            ),
            hooks=dedupe_keep_last([h for p in parts for h in p.hooks], lambda h: h),
            additional_gids=dedupe_keep_last([g for p in parts for g in p.additional_gids], int),
        )

    def with_env(self, **values: str) -> ContainerEdits:
        """A copy with the given variables set (replacing earlier values), its other
        lists copied as they are (``merge`` made them: nothing to de-duplicate)."""
        env = dedupe_keep_last([*self.env, *(f"{k}={v}" for k, v in values.items())], env_key)
        return ContainerEdits(
            env=env,
            device_nodes=list(self.device_nodes),
            mounts=list(self.mounts),
            hooks=list(self.hooks),
            additional_gids=list(self.additional_gids),
        )

    def env_dict(self) -> dict[str, str]:
        return dict(e.split("=", 1) if "=" in e else (e, "") for e in self.env)

    def to_cdi(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.env:
            out["env"] = list(self.env)
        if self.device_nodes:
            out["deviceNodes"] = [d.to_cdi() for d in self.device_nodes]
        if self.mounts:
            out["mounts"] = [m.to_cdi() for m in self.mounts]
        if self.hooks:
            out["hooks"] = [h.to_cdi() for h in self.hooks]
        if self.additional_gids:
            out["additionalGids"] = list(self.additional_gids)
        return out

    @classmethod
    def from_cdi(cls, data: dict[str, Any] | None) -> ContainerEdits:
        data = data or {}
        return cls(
            env=list(data.get("env") or ()),
            device_nodes=[DeviceNode.from_cdi(d) for d in data.get("deviceNodes") or ()],
            mounts=[Mount.from_cdi(m) for m in data.get("mounts") or ()],
            hooks=[Hook.from_cdi(h) for h in data.get("hooks") or ()],
            additional_gids=list(data.get("additionalGids") or ()),
        )

    def rebased(self, strip_prefix: str) -> ContainerEdits:
        """A copy whose container paths drop ``strip_prefix`` (a containerized driver root)."""
        if strip_prefix in ("", "/"):
            return self
        prefix = strip_prefix.rstrip("/")

        def strip(path: str) -> str:
            return path[len(prefix) :] if path.startswith(prefix + "/") else path

        return replace(
            self,
            device_nodes=[replace(d, path=strip(d.path)) for d in self.device_nodes],
            mounts=[replace(m, container_path=strip(m.container_path)) for m in self.mounts],
        )


def dedupe_keep_last(items: list, key) -> list:
    """Keep the first position of each key but the last value given for it (as runc's
    process setup treats repeated env keys)."""
    index: dict[Any, int] = {}
    out: list = []
    for item in items:
        k = key(item)
        if k in index:
            out[index[k]] = item
        else:
            index[k] = len(out)
            out.append(item)
    return out


def min_cdi_version(edits: ContainerEdits) -> str:
    """The minimum CDI version able to carry these edits."""
    from nvshim.cdi.version import edits_min_version

    return edits_min_version(edits.to_cdi())
