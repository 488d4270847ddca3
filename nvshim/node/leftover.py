"""What an uninstall leaves for the containers that still run through nvshim.

A containerd shim keeps the runtime binary it was started with (``options.BinaryName``,
also in the ``runtime`` file of the container's bundle directory, the shim's working
directory) and calls it for every exec, kill, state and delete until the container is
gone. Removing ``nvshim-runtime`` would strand those containers (exec fails, delete hangs
in Terminating), so the uninstall switches the prefix to a pass-through tree
``PREFIX-versions/pass-through`` holding one sh script at that path: it hands every call
to the low-level runtime, and after a delete it looks at containerd's task directory
(the calling shim's bundle's parent's parent): when no bundle there names this path
while the runtime still keeps its state, it removes the script, its tree and the prefix
link, with the exec markers and NIC claims the uninstall kept for those containers (of
two last deletes at once, the later one always sees the other gone). The next install
replaces it.

CRI-O has no shim: CRI-O itself (and conmon, for execs) calls the runtime of the
container's handler, and it keeps the handler it read at start until it restarts (1.36: a
SIGHUP does not drop it), so after an uninstall that does not restart it, its calls for
nvshim's containers reach the pass-through. nvshim's CRI-O handler keeps its runc state
in a directory of its own (``runtime_root``, :data:`nvshim.engines.crio.OWN_RUNTIME_ROOT`):
the containers listed there, running or exited, are nvshim's; the ``delete`` that empties
it removes the pass-through.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable

from nvshim.node.env import NodeSettings

TREE = "pass-through"
SHIM_PREFIX = "containerd-shim"

_SCRIPT = """#!/bin/sh
# Left by the nvshim node installer's uninstall for containers created through nvshim
# that still run: their shims call this path for exec, kill, state and delete. Every
# call goes to the low-level runtime; the delete of the last such container removes
# this script, its tree and the prefix link.
self={self}
crio_root={crio_root}
link={link}
target={target}
tree={tree}
rt=
for name in {runtimes}; do
    rt=$(command -v "$name") && break
    rt=
done
if [ -z "$rt" ]; then
    echo "nvshim pass-through: none of {runtimes_text} found in PATH" >&2
    exit 1
fi
case " $* " in
*" delete "*) ;;
*) exec "$rt" "$@" ;;
esac
"$rt" "$@"
rc=$?
# Another container still ours? Its bundle (beside the calling shim's, in containerd's
# task directory) names this path and the runtime still has its state.
root=/run/runc
prev=
for arg; do
    [ "$prev" = --root ] && root=$arg
    case $arg in --root=*) root=${{arg#--root=}} ;; esac
    prev=$arg
done
if [ -n "$crio_root" ] && [ "$root" = "$crio_root" ]; then
    # CRI-O: nvshim's handler's own state directory lists every container still ours
    for state in "$root"/*; do
        [ -e "$state" ] && exit $rc
    done
else
    # (only a shim of ours decides: its working directory is a bundle naming this path)
    [ "$(cat "/proc/$PPID/cwd/runtime" 2>/dev/null)" = "$self" ] || exit $rc
    tasks=$(readlink "/proc/$PPID/cwd") || exit $rc
    tasks=${{tasks%/*}}
    tasks=${{tasks%/*}}
    [ -n "$tasks" ] || exit $rc
    for bundle in "$tasks"/*/*; do
        [ "$(cat "$bundle/runtime" 2>/dev/null)" = "$self" ] || continue
        [ -d "$root/${{bundle##*/}}" ] && exit $rc
    done
fi
[ "$(readlink "$link")" = "$target" ] && rm -f "$link"
rm -rf "$tree" {state}
rmdir "${{tree%/*}}" {parents} $crio_root 2>/dev/null
exit $rc
"""


def shim_users(runtime_path: str) -> list[str]:
    """Bundle directories of the running containerd shims started with ``runtime_path``
    (every process this pid namespace shows: the installer runs with the host's)."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if SHIM_PREFIX not in os.path.basename(os.readlink(f"/proc/{entry}/exe")):
                continue
            with open(f"/proc/{entry}/cwd/runtime", "rb") as fh:
                named = fh.read(4097)
            bundle = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        if named.decode(errors="replace") == runtime_path:
            found.add(bundle)
    return sorted(found)


def crio_users(s: NodeSettings) -> list[str]:
    """Containers (ids) of nvshim's own CRI-O handler that runc still keeps, running or
    exited: CRI-O calls the handler's runtime for their exec, kill and delete."""
    if s.crio_runtime_root is None:
        return []
    try:
        return sorted(os.listdir(s.here(s.crio_runtime_root)))
    except OSError:
        return []


def users(s: NodeSettings) -> list[str]:
    """Containers that still call nvshim's runtime: containerd shims' bundles, CRI-O
    containers of nvshim's handler."""
    return shim_users(s.runtime_path) + crio_users(s)


def script_text(s: NodeSettings, runtimes: list[str], state: list[str]) -> str:
    """The pass-through script for this install's paths (host paths); ``state``: what the
    containers keep (``nvshim.node.steps.container_state``), removed with the last one,
    with the directories holding it when they are left empty."""
    from nvshim.install import versions_dir

    parents = sorted({os.path.dirname(path) for path in state})
    tree = os.path.join(versions_dir(s.prefix), TREE)
    quoted = [shlex.quote(r) for r in runtimes]
    return _SCRIPT.format(
        self=shlex.quote(s.runtime_path),
        crio_root=shlex.quote(s.crio_runtime_root or ""),
        link=shlex.quote(s.prefix),
        target=shlex.quote(os.path.relpath(tree, os.path.dirname(s.prefix))),
        tree=shlex.quote(tree),
        runtimes=" ".join(quoted),
        runtimes_text=", ".join(runtimes).replace('"', ""),
        state=" ".join(shlex.quote(path) for path in state),
        parents=" ".join(shlex.quote(path) for path in parents),
    )


def leave(s: NodeSettings, runtimes: list[str], state: list[str]) -> str:
    """Write the pass-through tree (``script_text``); return its host path (for
    ``uninstall_host``)."""
    from nvshim.fsutil import atomic_write
    from nvshim.install import versions_dir

    tree = os.path.join(versions_dir(s.prefix), TREE)
    path = s.here(os.path.join(tree, "bin", "nvshim-runtime"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    atomic_write(path, script_text(s, runtimes, state).encode(), mode=0o755)
    return tree


def settle(s: NodeSettings, say: Callable[[str], None]) -> list[str]:
    """After the engine restart: the containers still running through nvshim. With none
    the pass-through goes now (prefix link and tree); returns the paths removed."""
    from nvshim.install import prune_versions

    found = users(s)
    if found:
        names = ", ".join(os.path.basename(b)[:12] for b in found[:5])
        more = f" and {len(found) - 5} more" if len(found) > 5 else ""
        say(
            f"{len(found)} container(s) still run through nvshim ({names}{more}):"
            f" {s.runtime_path} stays as a pass-through to the low-level runtime until"
            " the last of them is deleted"
        )
        return []
    link = s.here(s.prefix)
    removed = []
    if os.path.islink(link):
        os.unlink(link)
        removed.append(link)
    return removed + prune_versions(s.host_root, s.prefix)
