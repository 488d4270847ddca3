"""Enforcement on ``exec``: a process started in a container nvshim prepared gets the
variables the policy set for its first process (``CUDA_VISIBLE_DEVICES``, the MPS
share's ``CUDA_MPS_*``); a user's ``CUDA_VISIBLE_DEVICES`` is kept only when it names
injected devices, as at create.

At create nvshim records those entries in the ``nvshim.io/exec-env`` annotation, read
back from the low-level runtime's state of the container: runc keeps annotations as
labels in its ``state.json``, crun keeps the created ``config.json``. A container
without it is not touched: its process file is handed on byte-identical.
"""

from __future__ import annotations

import os

from nvshim import fastjson
from nvshim.errors import NvshimError
from nvshim.oci.bundle import check_field_case, read_json_object
from nvshim.oci.modify import EXEC_ENV_ANNOTATION, INJECTED_ANNOTATION, merge_env

MAX_STATE = 16 << 20
MAX_PROCESS = 4 << 20
CVD = "CUDA_VISIBLE_DEVICES"


def runtime_root(runtime: str, global_root: str | None) -> str:
    """The state directory of the low-level runtime named ``runtime`` (runc, crun):
    ``--root``, else its default for this user."""
    if global_root:
        return global_root
    if os.geteuid() != 0 and os.environ.get("XDG_RUNTIME_DIR"):
        return os.path.join(os.environ["XDG_RUNTIME_DIR"], runtime)
    return f"/run/{runtime}"


def state_file(root: str, container_id: str, name: str = "state.json") -> dict | None:
    """The JSON object in file ``name`` of ``container_id``'s state directory under
    ``root`` (runc's ``state.json``, crun's ``config.json``); None when there is no such
    container or the id is not one runc accepts."""
    if "/" in container_id or container_id in ("", ".", ".."):
        return None
    path = os.path.join(root, container_id, name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(MAX_STATE + 1)
    try:
        state = fastjson.loads(data) if len(data) <= MAX_STATE else None
    except ValueError:
        state = None
    return state if isinstance(state, dict) else None


def container_labels(root: str, container_id: str) -> dict[str, str] | None:
    """The labels (annotations) runc keeps for ``container_id``, or None. runc writes
    each as ``KEY=VALUE``, in Go's random map order: an annotation whose key holds ``=``
    (``nvshim.io/exec-env=["A`` = ``1"]``) gives a label that reads as one of nvshim's,
    so one of nvshim's seen twice is an error."""
    state = state_file(root, container_id)
    config = state.get("config") if state is not None else None
    labels = config.get("labels") if isinstance(config, dict) else None
    if not isinstance(labels, list):
        return None
    out = {}
    for label in labels:
        if isinstance(label, str) and "=" in label:
            key, _, value = label.partition("=")
            if key in out and key in (EXEC_ENV_ANNOTATION, INJECTED_ANNOTATION):
                raise NvshimError(f"container {container_id}: annotation {key} given twice")
            out[key] = value
    return out


def crun_annotations(root: str, container_id: str) -> dict[str, str] | None:
    """The annotations of the spec crun created ``container_id`` from (the copy in its
    state directory), or None."""
    config = state_file(root, container_id, "config.json")
    annotations = config.get("annotations") if config is not None else None
    if not isinstance(annotations, dict):
        return None
    return {k: v for k, v in annotations.items() if isinstance(v, str)}


def container_annotations(crun: bool, global_root: str | None, container_id: str):
    """The annotations the low-level runtime keeps for ``container_id`` (``crun``: crun's
    layout, else runc's), or None."""
    if crun:
        return crun_annotations(runtime_root("crun", global_root), container_id)
    return container_labels(runtime_root("runc", global_root), container_id)


def enforced_entries(labels: dict[str, str]) -> tuple[list[str], list[str]] | None:
    """(the recorded env entries, the injected device UUIDs) of a prepared container."""
    raw = labels.get(EXEC_ENV_ANNOTATION)
    if raw is None:
        return None
    try:
        entries = fastjson.loads(raw)
    except ValueError:
        entries = None
    if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
        raise NvshimError(f"annotation {EXEC_ENV_ANNOTATION}: not a list of strings")
    injected = labels.get(INJECTED_ANNOTATION, "")
    uuids = [u for u in injected.split(",") if u and u != "none"]
    return entries, uuids


def exec_env(user_env: list[str], entries: list[str], uuids: list[str]) -> list[str]:
    """The entries to set over ``user_env`` (an exec process's own env)."""
    from nvshim.policy.visible import cuda_visible_devices

    user = {}
    for entry in user_env:
        key, sep, value = entry.partition("=")
        if sep:
            user[key] = value
    out = []
    for entry in entries:
        key, _, value = entry.partition("=")
        if key == CVD and CVD in user:
            value, _ = cuda_visible_devices(user[CVD], uuids)
        out.append(f"{key}={value}")
    return out


def _process_fd(data: bytes, keep_below: int) -> int:
    """An inheritable memory file holding ``data``, numbered at or above ``keep_below``
    (clear of the fds the engine asks runc to pass on)."""
    import fcntl

    fd = os.memfd_create("nvshim-process.json", 0)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    high = fcntl.fcntl(fd, fcntl.F_DUPFD, keep_below)
    os.close(fd)
    os.set_inheritable(high, True)
    return high


def _keep_below(args) -> int:
    """The lowest fd number runc does not hand to the container process."""
    total = 3
    for raw in (args.value("preserve-fds"), os.environ.get("LISTEN_FDS")):
        try:
            total += max(0, int(raw, 0)) if raw else 0
        except ValueError:
            pass
    return total + 64


def _spelt(argv: list[str], flag, name: str, crun: bool) -> str:
    """How to spell flag ``name`` for a value nvshim adds: as the caller spelt ``flag``
    (``-e``, ``--env``...; runc refuses two forms of one flag), or ``--name`` for crun,
    whose getopt reads ``-e=V`` as ``-e`` with the value ``=V``."""
    if crun:
        return f"--{name}"
    if flag is None:
        return f"-{name}"
    return "-" + argv[flag.start].lstrip("-").split("=", 1)[0]


def _process_object(path: str) -> dict | None:
    """The process file's object (None: unreadable, runc reports it); NvshimError for one
    nvshim cannot edit exactly as runc reads it (runc would run it as it is, the enforced
    variables lost): larger than ``MAX_PROCESS``, not UTF-8 (Go's decoder takes it), not a
    JSON object (``read_json_object``), or with an env key in another case (Go matches
    field names case-insensitively, the last wins)."""
    try:
        with open(path, "rb") as fh:
            process = read_json_object(fh, MAX_PROCESS, path)
    except OSError:
        return None
    check_field_case(process, ("env",), path, "")
    return process


def rewrite_exec(args, argv: list[str], runtime: str) -> tuple[list[str], list[int]]:
    """``argv`` of an ``exec`` call to the low-level ``runtime`` with the enforced
    variables added (unchanged, the same list, for a container nvshim did not prepare),
    and the fds that argv names: they must reach the runtime at those numbers."""
    crun = os.path.basename(runtime) == "crun"
    labels = container_annotations(crun, args.globals.get("root"), args.container_id or "")
    found = enforced_entries(labels) if labels is not None else None
    if found is None:
        return argv, []
    entries, uuids = found
    process_flags = [f for f in args.flags if f.name == "process"]
    if process_flags:
        path = process_flags[-1].value
        process = _process_object(path)
        if process is None:
            return argv, []  # runc reports the unreadable file itself
        env = process.get("env")
        env = [e for e in env if isinstance(e, str)] if isinstance(env, list) else []
        process["env"] = merge_env(env, exec_env(env, entries, uuids))
        fd = _process_fd(fastjson.dumps(process).encode(), _keep_below(args))
        spans = {i for f in process_flags for i in range(f.start, f.end)}
        last = process_flags[-1].start
        out = []
        for i, token in enumerate(argv):
            if i == last:  # one process flag: runc refuses -p and --process together
                out.append(f"{_spelt(argv, process_flags[-1], 'process', crun)}=/proc/self/fd/{fd}")
            elif i not in spans:
                out.append(token)
        return out, [fd]
    given = [f for f in args.flags if f.name == "env"]
    flag = _spelt(argv, given[-1] if given else None, "env", crun)
    added = [f"{flag}={e}" for e in exec_env(args.values("env"), entries, uuids)]
    return [*argv[: args.flags_end], *added, *argv[args.flags_end :]], []
