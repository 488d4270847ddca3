"""Build and run real runc bundles for tests.

``make_bundle`` starts from what ``runc spec`` generates (so the config is the one runc
itself considers standard) and adjusts it for a test host: no terminal, a writable
root (unless asked otherwise), rlimits at or below the current hard limits
(CAP_SYS_RESOURCE is missing), and the given process, env, annotations, mounts, hooks
and capabilities.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import resource
import shlex
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from nvshim.record import asdict
from tests.podman_util import make_busybox_rootfs

__all__ = ["make_bundle", "make_busybox_rootfs", "runc_run", "runc_spec"]

# nvshim's caches stay under the suite's own directory (tests/conftest.py sets it)
CACHE_ENV = {k: v for k, v in os.environ.items() if k == "NVSHIM_CACHE_DIR"}
RUNC_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", **CACHE_ENV}


@functools.cache
def _template() -> str:
    runc = shutil.which("runc") or "/usr/sbin/runc"
    with tempfile.TemporaryDirectory() as work:
        subprocess.run([runc, "spec"], cwd=work, check=True, capture_output=True)
        with open(os.path.join(work, "config.json"), encoding="utf-8") as fh:
            return fh.read()


def runc_spec() -> dict[str, Any]:
    """A fresh copy of the spec ``runc spec`` writes."""
    return copy.deepcopy(json.loads(_template()))


def _rlimits(limits: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for limit in limits:
        name = limit.get("type", "")
        number = getattr(resource, name, None)
        if number is not None:
            _, hard_now = resource.getrlimit(number)
            if hard_now != resource.RLIM_INFINITY:
                limit = {**limit, "hard": min(limit["hard"], hard_now)}
                limit["soft"] = min(limit["soft"], limit["hard"])
        out.append(limit)
    return out


def make_bundle(
    tmp_path: str | os.PathLike,
    rootfs: str | os.PathLike,
    args: list[str],
    env: list[str] | dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    mounts: list[dict[str, Any]] | None = None,
    hooks: Any = None,
    capabilities: list[str] | None = None,
    *,
    name: str = "bundle",
    readonly: bool = False,
) -> str:
    """Write ``<tmp_path>/<name>/config.json`` for ``rootfs``; return the bundle dir.

    ``env``: ``KEY=value`` entries or a dict (PATH is added when missing). ``mounts``: OCI
    mount objects appended to runc's defaults. ``hooks``: a ``{stage: [hook, ...]}``
    mapping or a list of ``nvshim.edits.Hook``; a hook is an OCI hook object or a
    ``Hook``. ``capabilities``: the capability set to use for every set (default: runc's).
    ``readonly``: the root is read-only (``"root": {"readonly": true}``).
    """
    spec = runc_spec()
    bundle = os.path.join(os.fspath(tmp_path), name)
    os.makedirs(bundle, exist_ok=True)
    spec["root"] = {"path": os.path.abspath(rootfs), "readonly": readonly}
    process = spec["process"]
    process["terminal"] = False
    process["args"] = list(args)
    entries = [f"{k}={v}" for k, v in env.items()] if isinstance(env, dict) else list(env or [])
    if not any(e.startswith("PATH=") for e in entries):
        entries.insert(0, "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    process["env"] = entries
    process["rlimits"] = _rlimits(process.get("rlimits", []))
    if capabilities is not None:
        process["capabilities"] = {
            key: list(capabilities) for key in ("bounding", "effective", "permitted")
        }
    if annotations:
        spec["annotations"] = dict(annotations)
    if mounts:
        spec["mounts"].extend(mounts)
    if hooks:
        spec["hooks"] = _hooks(hooks)
    with open(os.path.join(bundle, "config.json"), "w", encoding="utf-8") as fh:
        json.dump(spec, fh, indent=1)
    return bundle


def _hooks(hooks: Any) -> dict[str, list[dict[str, Any]]]:
    if not isinstance(hooks, dict):
        grouped: dict[str, list[Any]] = {}
        for hook in hooks:
            grouped.setdefault(hook.hook_name, []).append(hook)
        hooks = grouped
    return {
        stage: [h.to_oci() if hasattr(h, "to_oci") else dict(h) for h in entries]
        for stage, entries in hooks.items()
    }


def runc_run(
    bundle: str,
    container_id: str,
    runtime: str = "runc",
    root: str | None = None,
    *,
    env: dict[str, str] | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess:
    """``<runtime> --root ROOT run --bundle BUNDLE ID``; text stdout/stderr captured.

    ``root`` (runc's state dir) defaults to ``<bundle>/../runc-state``. ``env`` adds
    variables for the runtime process (e.g. ``NVSHIM_CONFIG`` for nvshim-runtime).
    """
    state = root or os.path.join(os.path.dirname(os.path.abspath(bundle)), "runc-state")
    os.makedirs(state, exist_ok=True)
    binary = shutil.which(runtime) or runtime
    return subprocess.run(
        [binary, "--root", state, "run", "--bundle", bundle, container_id],
        env={**RUNC_ENV, **(env or {})},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def build_stub_library(path: str | os.PathLike, soname: str, body: str = "") -> str:
    """Compile a tiny shared object at ``path`` (gcc) with ``soname`` (none if empty);
    ``body`` is extra C source."""
    path = os.fspath(path)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    source = f"int nvshim_stub_{abs(hash(soname)) % 10**8}(void) {{ return 0; }}\n{body}\n"
    subprocess.run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            *([f"-Wl,-soname,{soname}"] if soname else []),
            "-o",
            path,
            "-x",
            "c",
            "-",
        ],
        input=source,
        text=True,
        check=True,
        capture_output=True,
    )
    return path


def tree_snapshot(path: str | os.PathLike) -> dict[str, tuple]:
    """Every entry under ``path`` (not following symlinks) with its type, mode, owner,
    size, content (regular files up to 1 MiB) or link target, and device numbers; the
    mount state of each directory is included as its st_dev."""
    base = os.fspath(path)
    out: dict[str, tuple] = {}
    if not os.path.lexists(base):
        return out
    for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
        for name in ["", *dirnames, *filenames]:
            full = os.path.join(dirpath, name) if name else dirpath
            rel = os.path.relpath(full, base)
            if rel in out:
                continue
            st = os.lstat(full)
            extra: object = None
            if os.path.islink(full):
                extra = os.readlink(full)
            elif os.path.isfile(full) and st.st_size <= 1 << 20:
                with open(full, "rb") as fh:
                    extra = fh.read()
            out[rel] = (st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_rdev, st.st_dev, extra)
    return out


# --- helpers for nvshim-hook tests -------------------------------------------------------

HOOK_TEST_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LC_ALL": "C.UTF-8",
    **CACHE_ENV,
}

_APPLY_SCRIPT = """import json, sys
sys.path[0:0] = {roots!r}
from nvshim.config import load_config
from nvshim.edits import ContainerEdits, DeviceNode, Hook, Mount
from nvshim.hook import apply
from nvshim.hook.main import apply_edits
from nvshim.hook.steps import Context, finishing_steps, run_steps
from nvshim.hook.state import load_spec, read_state, rootfs_path
edits_file, config_file, out_file, mode = sys.argv[1:5]
state = read_state(sys.stdin.buffer)
with open(edits_file) as fh:
    data = json.load(fh)
edits = ContainerEdits(
    env=data["env"],
    device_nodes=[DeviceNode(**d) for d in data["device_nodes"]],
    mounts=[Mount(**{{**m, "options": tuple(m["options"])}}) for m in data["mounts"]],
    hooks=[Hook(**{{**h, "args": tuple(h["args"]), "env": tuple(h["env"])}})
           for h in data["hooks"]],
)
ctx = Context(load_config(config_file))
root = rootfs_path(load_spec(state.bundle), state.bundle)
if mode == "full":
    fields = apply_edits(state, root, edits, ctx)
else:  # no cgroup: for runs outside a container
    steps, _ = finishing_steps(edits.hooks)
    mounts = apply.plan_mounts(edits.mounts)
    nodes = apply.plan_nodes(edits.device_nodes)
    fields = run_steps(state.pid, root, steps, ctx, lambda r: {{
        "mounts": apply.attach_mounts(r, mounts), "device_nodes": apply.make_nodes(r, nodes)}})
with open(out_file, "w") as fh:
    json.dump(fields, fh)
"""


def write_hook_config(
    directory: str | os.PathLike,
    dev_root: str | None = None,
    driver_root: str | None = None,
    **policy: object,
) -> tuple[str, str]:
    """An nvshim config for hook tests (log file and state dir in ``directory``, extra
    ``[policy]`` keys as keyword arguments); returns (config path, log file path)."""
    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    log = os.path.join(directory, "nvshim.log")
    lines = ["[host]"]
    if dev_root:
        lines.append(f'dev-root = "{dev_root}"')
    if driver_root:
        lines.append(f'driver-root = "{driver_root}"')
    lines += [
        "[runtime]",
        f'log-file = "{log}"',
        f'inventory-dir = "{directory}/state"',
        "[policy]",
    ]
    for key, value in policy.items():
        lines.append(f"{key.replace('_', '-')} = {json.dumps(value)}")
    path = os.path.join(directory, "config.toml")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
    return path, log


def apply_edits_hook(
    directory: str | os.PathLike, edits: Any, config: str, *, cgroup: bool = True
) -> tuple[dict[str, Any], str]:
    """A prestart hook entry that applies constructed ``edits`` (a ContainerEdits) with
    nvshim.hook's application code; returns (OCI hook object, path of its JSON result)."""
    from nvshim.hookentries import HOOK_ENV
    from nvshim.launch import import_roots, real_interpreter

    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    edits_file = os.path.join(directory, "edits.json")
    with open(edits_file, "w", encoding="utf-8") as fh:
        json.dump(asdict(edits), fh)  # every field (CDI has no file mode)
    script = os.path.join(directory, "apply_hook.py")
    with open(script, "w", encoding="utf-8") as fh:
        fh.write(_APPLY_SCRIPT.format(roots=import_roots()))
    out = os.path.join(directory, "applied.json")
    args = ["python3", "-I", "-S", script, edits_file, config, out, "full" if cgroup else "bare"]
    return {"path": real_interpreter(), "args": args, "env": [*HOOK_ENV, *_cache_env()]}, out


def run_hook_direct(
    argv: list[str],
    bundle: str,
    *,
    env: dict[str, str] | None = None,
    private_ns: bool = True,
    container_id: str = "direct",
    then: str = "",
) -> subprocess.CompletedProcess:
    """Run a hook command as a runtime would, outside runc.

    A shell feeds the OCI state on stdin naming itself (``$$``) as the container's
    init; the hook, its child, therefore works in its own mount namespace, which is a
    private one (``unshare``) so mounts vanish with it. ``then``: shell commands run
    afterwards in the same namespace (to look at what the hook mounted). Exit status:
    the hook's.
    """
    head = json.dumps(
        {
            "ociVersion": "1.0.2",
            "id": container_id,
            "status": "creating",
            "bundle": os.path.abspath(bundle),
            "pid": 0,
        }
    )[:-2]
    script = f'printf %s {shlex.quote(head)}"$$}}" | "$@"; rc=$?; {then or ":"}; exit $rc'
    prefix = ["unshare", "--mount", "--propagation", "private"] if private_ns else []
    return subprocess.run(
        [*prefix, "/bin/sh", "-c", script, "sh", *argv],
        env=env if env is not None else dict(HOOK_TEST_ENV),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def read_log(path: str) -> list[dict[str, str]]:
    """Records of an nvshim decision log: ``time``, ``tool``, ``id`` and the fields."""
    records = []
    if not os.path.exists(path):
        return records
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            parts = shlex.split(line)
            record = {"time": parts[0], "tool": parts[1], "id": parts[2]}
            for part in parts[3:]:
                key, _, value = part.partition("=")
                record[key] = value
            records.append(record)
    return records


def in_private_mount_ns(fn) -> dict[str, Any]:
    """Run ``fn()`` in a forked child inside a private mount namespace (its mounts vanish
    with it). Returns ``{"ok": result}`` (JSON data) or ``{"error": "Type: message"}``."""
    from nvshim.rootfs import kernel

    def private_mounts() -> None:
        kernel.unshare(kernel.CLONE_NEWNS)
        kernel.mount(None, "/", None, kernel.MS_REC | kernel.MS_PRIVATE)

    return in_forked_child(fn, private_mounts)


def in_forked_child(fn, setup) -> dict[str, Any]:
    """``setup()`` then ``fn()`` in a forked child; ``{"ok": result}`` (JSON data) or
    ``{"error": "Type: message"}``."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            try:
                setup()
                reply = json.dumps({"ok": fn()})
            except BaseException as err:  # noqa: BLE001
                reply = json.dumps({"error": f"{type(err).__name__}: {err}"})
            os.write(write_end, reply.encode())
        finally:
            os._exit(0)
    os.close(write_end)
    data = b""
    while chunk := os.read(read_end, 65536):
        data += chunk
    os.close(read_end)
    os.waitpid(pid, 0)
    return json.loads(data or b'{"error": "child died"}')


def hook_env_names() -> str:
    """The ``hook_env`` field the hook logs for entries made by ``hook_entry`` here."""
    from nvshim.hookentries import hook_env

    return ",".join(sorted(entry.split("=", 1)[0] for entry in hook_env()))


def _cache_env() -> list[str]:
    return [f"{k}={v}" for k, v in CACHE_ENV.items()]


def counting_interpreter(path: str | os.PathLike, log: str | os.PathLike) -> str:
    """An interpreter at ``path`` that appends a line to ``log`` for every start, then
    runs the real one: launchers written with it show how many Pythons a call started."""
    from nvshim.launch import real_interpreter

    with open(path, "w") as fh:
        fh.write(f'#!/bin/sh\necho start >> {log}\nexec {real_interpreter()} "$@"\n')
    os.chmod(path, 0o755)
    return os.fspath(path)


def start_daemon(
    bin_dir: str, env: dict[str, str], log: str, *flags: str, prefix: tuple[str, ...] = ()
) -> subprocess.Popen:
    """``nvshim-runtimed FLAGS`` of the launchers in ``bin_dir`` with ``env``, its messages
    in ``log``, once it listens. ``prefix``: a command it runs under (``nsenter`` into an
    engine's mount namespace). Raises RuntimeError (its messages) when it does not start."""
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [*prefix, os.path.join(bin_dir, "nvshim-runtimed"), *flags],
            env=env, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
        )  # fmt: skip
    deadline = time.monotonic() + 60
    while "listening on" not in (text := Path(log).read_text()):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"nvshim-runtimed did not start: {text}")
        time.sleep(0.02)
    return proc


def served_by(log: str | os.PathLike) -> list[str]:
    """How ``nvshim-runtimed --verbose`` got each call it served: ``socket`` (the
    client) or ``slot K`` (the sh front itself)."""
    with open(log) as fh:
        return [ln.split(" by ", 1)[1].split(" served: ")[0] for ln in fh if " served: " in ln]


def daemon_calls(log: str | os.PathLike, kind: str = "served") -> list[str]:
    """What ``nvshim-runtimed`` logged in ``log`` for each call it ``served`` (with
    ``--verbose``: the call, then ``imports=N``) or ``declined`` (the reason)."""
    marker = f"{kind}: "
    with open(log) as fh:
        return [ln.rstrip("\n").split(marker, 1)[1] for ln in fh if marker in ln]
