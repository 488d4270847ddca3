"""Check of the CDI specs: present, valid as runtimes read them, and matching this host
(regenerated in memory with the options the file was evidently written with)."""

from __future__ import annotations

import json
from typing import Any

from nvshim.doctor import check, fail, ok, warn
from nvshim.doctor.context import Context, files_in
from nvshim.errors import NvshimError

HOOK_NAME = "nvshim-hook"


def _strategies(spec: dict[str, Any]) -> tuple[str, ...]:
    names = [d.get("name", "") for d in spec.get("devices", ()) if d.get("name") != "all"]
    found = []
    for name in names:
        strategy = "uuid" if name.startswith(("GPU-", "MIG-")) else "index"
        if strategy not in found:
            found.append(strategy)
    return tuple(found) or ("index",)


def _hook_path(spec: dict[str, Any], default: str) -> str:
    for hook in (spec.get("containerEdits") or {}).get("hooks") or ():
        args = hook.get("args") or ()
        if args and args[0] == HOOK_NAME:
            return hook.get("path", default)
    return default


def _capabilities(spec: dict[str, Any], host) -> list[str]:
    """The driver capabilities whose files the spec mounts."""
    mounted = {m.get("hostPath") for m in (spec.get("containerEdits") or {}).get("mounts") or ()}
    caps = {f.capability for f in host.files if f.capability and f.host_path in mounted}
    return sorted(caps)


def regenerate(spec: dict[str, Any], host, hook_path: str) -> dict[str, Any]:
    """The spec nvshim would write for ``host`` with the file's kind, names, capabilities
    and hook path."""
    from nvshim.cdi.writer import build_spec

    vendor, _, cls = spec.get("kind", "/").partition("/")
    return build_spec(
        host,
        _capabilities(spec, host),
        _hook_path(spec, hook_path),
        vendor=vendor,
        cls=cls,
        strategies=_strategies(spec),
    )


def _canon(value: object) -> object:
    return json.loads(json.dumps(value, sort_keys=True))


# key -> (what names an entry, what of it must match). Device nodes match by path
# alone (their numbers are the device-nodes check's business); hooks ignore env, which
# carries the NVSHIM_CONFIG of whoever wrote the spec.
_IDENT = {
    "deviceNodes": (lambda e: e.get("path"), lambda e: e.get("path")),
    "mounts": (lambda e: e.get("hostPath"), _canon),
    "hooks": (
        lambda e: " ".join(map(str, (e.get("args") or [])[1:2])) or e.get("path"),
        lambda e: _canon([e.get("hookName"), e.get("path"), e.get("args")]),
    ),
}


def _edit_diff(where: str, old: dict, new: dict) -> list[str]:
    out = []
    for key, (name_of, compare) in _IDENT.items():
        a = {name_of(e): e for e in old.get(key) or ()}
        b = {name_of(e): e for e in new.get(key) or ()}
        changed = [k for k in a if k in b and compare(a[k]) != compare(b[k])]
        for label, keys in (
            ("not on this host", [k for k in a if k not in b]),
            ("missing", [k for k in b if k not in a]),
            ("differs", changed),
        ):
            if keys:
                out.append(f"{where}: {key} {keys[0]} {label}")
    for key in ("env", "additionalGids"):
        if _canon(old.get(key)) != _canon(new.get(key)):
            out.append(f"{where}: {key} differs")
    return out


def nvml_names(snap, strategies: tuple[str, ...]) -> set[str]:
    """The device names NVML's devices get under ``strategies`` (plus ``all``)."""
    names = {"all"}
    for g in snap.gpus:
        devices = [(f"{g.index}:{m.index}", m.uuid) for m in g.migs] if g.mig_enabled else []
        devices = devices or [(str(g.index), g.uuid)]
        for index_name, uuid in devices:
            if "index" in strategies:
                names.add(index_name)
            if "uuid" in strategies:
                names.add(uuid)
    return names


def spec_differences(spec: dict[str, Any], host, snap, hook_path: str) -> list[str]:
    """How the spec differs from what this host needs now (empty: current). Device names
    come from NVML; a device discovery skipped (its node is missing) is not compared."""
    fresh = regenerate(spec, host, hook_path)
    have = {d["name"]: d.get("containerEdits") or {} for d in spec.get("devices") or ()}
    want = {d["name"]: d["containerEdits"] for d in fresh["devices"]}
    names = nvml_names(snap, _strategies(spec))
    diffs = [f"device {n} no longer exists" for n in have if n not in names]
    diffs += [f"device {n} missing" for n in sorted(names) if n not in have]
    diffs += _edit_diff("spec", spec.get("containerEdits") or {}, fresh["containerEdits"])
    complete = names == set(want) | {"all"}
    for name in have:
        if name in want and (name != "all" or complete):
            diffs += _edit_diff(f"device {name}", have[name], want[name])
    return diffs


def spec_files(ctx: Context) -> list[str]:
    """The spec files runtimes would load from the CDI dirs."""
    from nvshim.cdi.registry import LOADED_SUFFIXES

    return files_in(ctx.cdi_dirs, LOADED_SUFFIXES)


@check("cdi-spec", "CDI specs are present, valid and match this host")
def cdi_spec(ctx: Context):
    from nvshim.cdi.validate import load_spec_file, validate_spec

    kind = f"{ctx.config.policy.cdi_vendor}/{ctx.config.policy.cdi_class}"
    regen = f"nvshim cdi generate -o {ctx.cdi_dirs[-1]}/nvidia.yaml"
    mine: list[tuple[str, dict]] = []
    for path in spec_files(ctx):
        try:
            spec = load_spec_file(path)
        except NvshimError as err:
            return fail("cdi-spec", str(err), f"remove or rewrite it ({regen})")
        if not isinstance(spec, dict) or not str(spec.get("kind", "")).startswith(
            kind.split("/")[0] + "/"
        ):
            continue
        problems = validate_spec(spec, path)
        if problems:
            return fail("cdi-spec", problems[0], f"runtimes skip the whole file: {regen}")
        if spec.get("kind") == kind:
            mine.append((path, spec))
    if not mine:
        return warn(
            "cdi-spec",
            f"no spec of kind {kind} in {', '.join(ctx.cdi_dirs)}: CDI requests fail",
            regen,
        )
    host = ctx.host()
    hook_path = ctx.config.runtime.hook_path
    for path, spec in mine:
        diffs = spec_differences(spec, host, ctx.snapshot(), hook_path)
        if diffs:
            more = f" (+{len(diffs) - 2} more)" if len(diffs) > 2 else ""
            return fail(
                "cdi-spec",
                f"{path} is stale: {'; '.join(diffs[:2])}{more}",
                f"regenerate it (nvshim cdi refresh, or {regen})",
            )
    devices = sum(len(s["devices"]) for _p, s in mine)
    return ok("cdi-spec", f"{len(mine)} spec(s) of {kind}, {devices} devices, current")
