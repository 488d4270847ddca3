"""Apply container edits to an OCI runtime spec (``config.json``), keeping everything else:
unknown fields, key order, other env entries. Standard library only (runtime hot path)."""

from __future__ import annotations

from nvshim.edits import ContainerEdits, dedupe_keep_last, env_key

TYPE_CHECKING = False  # typing costs ~5 ms at import, per container
if TYPE_CHECKING:
    from typing import Any

INJECTED_ANNOTATION = "nvshim.io/injected"
# the env entries the policy set, for processes started later by exec (nvshim.runtime.execenv)
EXEC_ENV_ANNOTATION = "nvshim.io/exec-env"


def _table(parent: dict[str, Any], key: str) -> dict[str, Any]:
    value = parent.get(key)
    if not isinstance(value, dict):
        value = {}
        parent[key] = value
    return value


def _array(parent: dict[str, Any], key: str) -> list[Any]:
    value = parent.get(key)
    if not isinstance(value, list):
        value = []
        parent[key] = value
    return value


def merge_env(existing: list[str], updates: list[str]) -> list[str]:
    """``existing`` with ``updates`` applied; one entry per key, the last value winning
    (as runc's process setup does), at the key's first position."""
    entries = [e for e in [*existing, *updates] if isinstance(e, str)]
    return dedupe_keep_last(entries, env_key)


def spec_binds(spec: dict[str, Any]) -> set[tuple[Any, Any]]:
    """(destination, source) of each mount ``spec`` holds: an edit's mount found there
    was applied already (e.g. by the engine's own CDI support)."""
    mounts = spec.get("mounts")
    if not isinstance(mounts, list):
        return set()
    return {(m.get("destination"), m.get("source")) for m in mounts if isinstance(m, dict)}


def apply_edits(spec: dict[str, Any], edits: ContainerEdits, injected: list[str]) -> dict[str, Any]:
    """Apply ``edits`` to ``spec`` in place (and return it).

    Device nodes go to ``linux.devices`` with an allow rule each in
    ``linux.resources.devices`` (runc turns those into cgroup v1 or v2 rules); mounts are
    appended; env entries replace same-named ones; hooks are appended to their stage with
    their explicit env. ``injected`` (device UUIDs) is recorded in an annotation so the
    standalone prestart hook knows the work is done.
    """
    process = _table(spec, "process")
    process["env"] = merge_env(_array(process, "env"), edits.env)

    linux = _table(spec, "linux")
    if edits.device_nodes:
        devices = [d for d in _array(linux, "devices") if isinstance(d, dict)]
        ours = {d.path for d in edits.device_nodes}
        devices = [d for d in devices if d.get("path") not in ours]
        rules = _array(_table(linux, "resources"), "devices")
        for node in edits.device_nodes:
            rule = {
                "allow": True,
                "type": node.type or "c",
                "major": node.major,
                "minor": node.minor,
                "access": node.permissions or "rwm",
            }
            entry: dict[str, Any] = {"path": node.path, "type": node.type or "c"}
            entry["major"] = node.major
            entry["minor"] = node.minor
            if node.file_mode is not None:
                entry["fileMode"] = node.file_mode
            entry["uid"] = node.uid if node.uid is not None else 0
            entry["gid"] = node.gid if node.gid is not None else 0
            devices.append(entry)
            if rule not in rules:
                rules.append(rule)
        linux["devices"] = devices

    if edits.mounts:
        present = spec_binds(spec)
        mounts = _array(spec, "mounts")
        for m in edits.mounts:
            if (m.container_path, m.host_path) in present:
                continue
            options = list(m.options)
            if not m.type and "bind" not in options and "rbind" not in options:
                options.append("bind")
            mounts.append(
                {
                    "destination": m.container_path,
                    "type": m.type or "bind",
                    "source": m.host_path,
                    "options": options,
                }
            )

    if edits.hooks:
        from nvshim.hookentries import fold_finishers

        hooks = _table(spec, "hooks")
        for hook in fold_finishers(edits.hooks):
            stage = _array(hooks, hook.hook_name)
            if hook.to_oci() not in stage:
                stage.append(hook.to_oci())

    if edits.additional_gids:
        user = _table(process, "user")
        gids = [g for g in _array(user, "additionalGids") if isinstance(g, int)]
        user["additionalGids"] = gids + [g for g in edits.additional_gids if g not in gids]

    annotations = _table(spec, "annotations")
    annotations[INJECTED_ANNOTATION] = ",".join(injected) or "none"
    if edits.env:
        from nvshim import fastjson

        annotations[EXEC_ENV_ANNOTATION] = fastjson.dumps(merge_env([], edits.env))
    return spec
