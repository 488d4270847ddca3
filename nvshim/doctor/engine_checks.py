"""Checks of the container engine's side: nvshim's runtime entry in the config file, the
running engine having loaded it, and the OCI hook file of the prestart mode."""

from __future__ import annotations

import json
import os

from nvshim.doctor import Skip, check, fail, ok, warn
from nvshim.doctor.context import Context, files_in
from nvshim.doctor.launcher import launcher_problem
from nvshim.errors import NvshimError

HOOK_NAME = "nvshim-hook"


def _configure_fix(s) -> str:
    return (
        f"nvshim configure --engine {s.engine} --engine-config {s.config}"
        f" --runtime-path {s.runtime_path} --restart signal"
    )


@check("engine-runtime", "the engine config has nvshim's runtime, executable and isolated")
def engine_runtime(ctx: Context):
    from nvshim.doctor.engine import configured_entry

    s = ctx.engine()
    try:
        binary = configured_entry(s)
    except NvshimError as err:
        return fail("engine-runtime", str(err), f"fix the file, then {_configure_fix(s)}")
    if binary is None:
        return fail(
            "engine-runtime",
            f"{s.config}: no runtime {s.runtime_name!r}",
            _configure_fix(s),
        )
    problem = launcher_problem(binary)
    if problem:
        return fail(
            "engine-runtime",
            f"runtime {s.runtime_name!r}: {problem}",
            "nvshim install --bin-dir DIR (isolated launchers), then " + _configure_fix(s),
        )
    return ok("engine-runtime", f"{s.engine} runtime {s.runtime_name!r} -> {binary}")


@check("engine-loaded", "the running engine has loaded nvshim's runtime")
def engine_loaded(ctx: Context):
    from nvshim.doctor.engine import configured_entry, loaded_entry, started_after
    from nvshim.engines.restart import socket_owner

    s = ctx.engine()
    restart = f"restart {s.engine} (systemctl restart {s.unit}, or nvshim configure --restart)"
    try:
        loaded = loaded_entry(s)
    except LookupError as why:
        try:
            owner = socket_owner(s.socket)[0]
        except NvshimError:
            owner = None
        newer = started_after(owner, s.config) if owner else None
        if newer is None:
            raise Skip(f"cannot ask {s.engine}: {why}") from None
        if not newer:
            return fail("engine-loaded", f"{s.config} changed after {s.engine} started", restart)
        return ok("engine-loaded", f"{s.engine} started after {s.config} was written")
    except NvshimError as err:
        return fail("engine-loaded", str(err), f"start {s.engine}")
    try:
        wanted = configured_entry(s)
    except NvshimError:
        wanted = None
    if loaded is None:
        return fail(
            "engine-loaded",
            f"the running {s.engine} has no runtime {s.runtime_name!r}"
            + (f" although {s.config} has it" if wanted else ""),
            restart if wanted else _configure_fix(s),
        )
    if wanted is not None and loaded != wanted:
        return fail(
            "engine-loaded",
            f"the running {s.engine} uses {loaded}, {s.config} says {wanted}",
            restart,
        )
    return ok("engine-loaded", f"the running {s.engine} has {s.runtime_name!r} -> {loaded}")


def hook_files(ctx: Context) -> list[tuple[str, dict]]:
    """OCI hook files (hooks.d JSON) in the hooks dirs that run ``nvshim-hook``."""

    def scan():
        found = []
        for path in files_in(ctx.hooks_dirs, (".json",)):
            try:
                with open(path, encoding="utf-8") as fh:
                    data = json.load(fh)
            except (OSError, ValueError, UnicodeDecodeError) as err:
                data = {"error": str(err)}
            hook = data.get("hook") if isinstance(data, dict) else None
            hook_path = hook.get("path") if isinstance(hook, dict) else None
            if "error" in data or (
                isinstance(hook_path, str) and os.path.basename(hook_path) == HOOK_NAME
            ):
                found.append((path, data))
        return found

    return ctx.once("hook_files", scan)


def _hook_problem(path: str, data: dict) -> str | None:
    if "error" in data:
        return f"{path}: not valid JSON ({data['error']})"
    hook = data["hook"]
    if data.get("version") != "1.0.0":
        return f"{path}: version {data.get('version')!r}, expected 1.0.0"
    stages = data.get("stages")
    if not isinstance(stages, list) or "prestart" not in stages:
        return f"{path}: stages {stages!r} lack prestart"
    if "when" not in data:
        return f"{path}: no 'when' (the hook would never run)"
    problem = launcher_problem(hook["path"])
    return f"{path}: {problem}" if problem else None


@check("oci-hook", "the OCI hook file of the prestart mode is valid")
def oci_hook(ctx: Context):
    files = hook_files(ctx)
    if not files:
        raise Skip(f"prestart mode not configured (no nvshim hook in {', '.join(ctx.hooks_dirs)})")
    problems = [p for p in (_hook_problem(path, data) for path, data in files) if p]
    fix = "nvshim install --hooks-dir DIR writes it afresh"
    if problems:
        return fail("oci-hook", "; ".join(problems[:2]), fix)
    wanted = ctx.config.runtime.hook_path
    other = [p for p, d in files if d["hook"]["path"] != wanted]
    if other:
        return warn(
            "oci-hook",
            f"{other[0]} runs a hook other than [runtime] hook-path {wanted}",
            "make them the same: CDI specs and the runtime use hook-path",
        )
    return ok("oci-hook", f"{len(files)} hook file(s) -> {files[0][1]['hook']['path']}")


def _daemon_socket():
    """nvshim-runtimed's socket path, and a connection to it (None: nobody answers)."""
    from nvshim.runtime import DAEMON_SOCKET
    from nvshim.runtime.client import connect
    from nvshim.trusted import CACHE_DIR

    path = os.path.join(CACHE_DIR, DAEMON_SOCKET)
    return path, connect(path)


@check("runtime-daemon", "nvshim-runtimed answers, so GPU creates skip the imports")
def runtime_daemon(ctx: Context):
    from nvshim.trusted import CACHE_DIR

    path, sock = _daemon_socket()
    if sock is None:
        state = "a stale socket, nobody answers" if os.path.lexists(path) else "not running"
        return warn(
            "runtime-daemon",
            f"{path}: {state}; nvshim-runtime does each GPU create in-process (slower)",
            "systemctl enable --now nvshim-runtimed (or run nvshim-runtimed as root)",
        )
    from nvshim.trusted import peer_credentials

    pid, _, _ = peer_credentials(sock)
    sock.close()
    import nvshim
    from nvshim.runtime.slots import slots_name

    slots = os.path.join(CACHE_DIR, slots_name(nvshim.__version__, nvshim.__file__))
    if not os.path.isdir(slots):
        return warn(
            "runtime-daemon",
            f"nvshim-runtimed (pid {pid}) answers at {path} but keeps no slots at {slots}: "
            "each GPU create starts an interpreter",
            "see its log (journalctl -u nvshim-runtimed): a kernel before 5.6, or another nvshim",
        )
    return ok("runtime-daemon", f"nvshim-runtimed (pid {pid}) answers at {path}")


def _daemon_answers() -> bool:
    """Whether nvshim-runtimed answers at its socket."""
    sock = _daemon_socket()[1]
    if sock is None:
        return False
    sock.close()
    return True


@check("exec-markers", "no exec marker outlives its container")
def exec_markers(ctx: Context):
    import time

    from nvshim.runtime import MARKER_DIR
    from nvshim.runtime.markers import MIN_AGE, stale_markers
    from nvshim.trusted import CACHE_DIR

    directory = os.path.join(CACHE_DIR, MARKER_DIR)
    stale, unknown = stale_markers(CACHE_DIR, time.time(), MIN_AGE)
    kept = (
        f"; {len(unknown)} name no state root (an older nvshim's, or another runtime's):"
        " they go when their container is deleted through nvshim-runtime, or at reboot"
        if unknown
        else ""
    )
    if stale and _daemon_answers():  # it sweeps them: the front leaves it a GPU delete's
        return ok(
            "exec-markers",
            f"{len(stale)} exec marker(s) in {directory} of containers that are gone,"
            f" for nvshim-runtimed's next sweep{kept}",
        )
    if stale:
        names = " ".join(os.path.join(directory, name) for name, _, _ in stale[:5])
        more = " ..." if len(stale) > 5 else ""
        return warn(
            "exec-markers",
            f"{len(stale)} exec marker(s) in {directory} outlived their container"
            f" (e.g. {stale[0][0]}: no {os.path.join(stale[0][1], stale[0][0])}){kept}",
            f"start nvshim-runtimed (it removes them), or rm -f -- {names}{more}",
        )
    try:
        count = sum(1 for _ in os.scandir(directory))
    except OSError:
        count = 0
    return ok("exec-markers", f"{count} exec marker(s) in {directory}, none stale{kept}")


@check("exec-enforcement", "the low-level runtime keeps the state exec enforcement reads")
def exec_enforcement(ctx: Context):
    from nvshim.runtime.execenv import runtime_root
    from nvshim.runtime.lowlevel import find_runtime

    runtimes = ctx.config.runtime.runtimes
    runtime = find_runtime(runtimes, ctx.env.get("PATH"))
    if runtime is None:
        raise Skip(f"no low-level runtime found here (tried {', '.join(runtimes)})")
    name = os.path.basename(runtime)
    kept = {"runc": "state.json", "crun": "config.json"}.get(name)
    if kept is not None:
        where = f"{runtime_root(name, None)}/ID/{kept}"
        return ok("exec-enforcement", f"{runtime}: read from {name}'s {where}")
    return warn(
        "exec-enforcement",
        f"{runtime} is neither runc nor crun: nvshim looks for a GPU container's"
        " nvshim.io/exec-env annotation where runc keeps it, so an exec's --env or process"
        " file may set CUDA_VISIBLE_DEVICES and CUDA_MPS_* unchecked",
        "name runc or crun first in [runtime] runtimes",
    )
