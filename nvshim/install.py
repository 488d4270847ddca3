"""Put nvshim on a host: the bundle under its prefix, command links, the OCI hook file.

Every install takes a destination root (``/`` on a live host, a staging directory for a
package or image build, the host mount for the node installer) and names only final
paths in what it writes. What it wrote outside the prefix is recorded in the prefix's
manifest, so :func:`uninstall_host` removes exactly that.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil

from nvshim.errors import NvshimError
from nvshim.hookentries import HOOK_ENV
from nvshim.hostbundle import MARKER, bundle_root, check_prefix, read_marker, relocate
from nvshim.launch import CLI_LAUNCHER, LAUNCHERS, write_launchers

DEFAULT_PREFIX = "/usr/local/nvshim"
MANIFEST = "install-manifest.json"
HOOK_FILE = "oci-nvshim-hook.json"


def under(dest_root: str, path: str) -> str:
    """``path`` (absolute, final) as seen below ``dest_root``: the symlinks of its
    directories resolved inside ``dest_root`` (a host root's ``/usr/local`` may be an
    absolute link), the last component not followed."""
    from nvshim.host.rootpath import in_root

    if not os.path.isabs(path):
        raise NvshimError(f"{path}: an install path must be absolute")
    return in_root(dest_root, path)


def check_dirs(dest_root: str, dirs: dict[str, str | None]) -> None:
    """Fail before anything is written when a destination directory (final paths, by
    what they are) cannot be one: it, or the nearest of its parents that exists, is not a
    directory (an install must not stop half done, launchers written but no hook file)."""
    for what, final in dirs.items():
        if not final:
            continue
        current = under(dest_root, final)
        while not os.path.exists(current) and current != os.path.dirname(current):
            current = os.path.dirname(current)
        if not os.path.isdir(current):
            shown = "" if current == under(dest_root, final) else f" ({current})"
            raise NvshimError(f"{what} {final}: not a directory{shown}")


def hook_file_text(hook_path: str) -> str:
    """The podman/CRI-O hooks.d entry running ``nvshim-hook prestart``."""
    entry = {
        "version": "1.0.0",
        "hook": {"path": hook_path, "args": ["nvshim-hook", "prestart"], "env": list(HOOK_ENV)},
        "when": {"always": True},
        "stages": ["prestart"],
    }
    return json.dumps(entry, indent=2) + "\n"


def _swap_in(new: str, target: str) -> None:
    """Move the tree ``new`` to ``target``; an existing tree is replaced, then removed."""
    if not os.path.lexists(target):
        os.rename(new, target)
        return
    old = f"{target}.old-{os.getpid()}"
    os.rename(target, old)
    os.rename(new, target)
    shutil.rmtree(old, ignore_errors=True)


def _same_build(source: str, target: str, prefix: str | None = None) -> bool:
    """Whether ``target`` already holds the bundle ``source`` (relocated to ``prefix``)."""
    if not os.path.isfile(os.path.join(target, MARKER)):
        return False
    there = read_marker(target)
    if prefix is not None and there.get("prefix") != prefix:
        return False
    return there.get("build") == read_marker(source).get("build")


def _copy_bundle(source: str, target: str) -> None:
    """Copy the bundle at ``source`` to ``target`` unless the same build is already there."""
    if os.path.realpath(source) == os.path.realpath(target):
        return
    if _same_build(source, target):
        return
    os.makedirs(os.path.dirname(target), exist_ok=True)
    staging = f"{target}.new-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(source, staging, symlinks=True)
    _swap_in(staging, target)


def versions_dir(prefix: str) -> str:
    """Where a versioned install keeps its trees: ``PREFIX-versions`` (a host path)."""
    return os.path.normpath(prefix) + "-versions"


def version_name(source: str) -> str:
    """The tree name of the bundle at ``source``: its version and build id."""
    marker = read_marker(source)
    return f"{marker.get('version', '0')}-{str(marker.get('build', 'unknown'))[:12]}"


def _install_version(source: str, dest_root: str, prefix: str) -> tuple[str, list[str]]:
    """The bundle as its own tree ``PREFIX-versions/NAME`` (copied and relocated to name
    that path before it appears, so nothing running is ever rewritten), then ``prefix``
    switched to it with one rename of a relative symlink. Returns the tree's host path
    and the paths written."""
    final = os.path.join(versions_dir(prefix), version_name(source))
    check_prefix(source, final)
    tree = under(dest_root, final)
    written: list[str] = []
    if not _same_build(source, tree, final):
        os.makedirs(os.path.dirname(tree), exist_ok=True)
        staging = f"{tree}.new-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        try:
            shutil.copytree(source, staging, symlinks=True)
            written += relocate(staging, final)
            _swap_in(staging, tree)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        written = [tree + path[len(staging) :] for path in written]
    link = under(dest_root, prefix)
    if os.path.isdir(link) and not os.path.islink(link):
        # an unversioned tree (an older install, or the pass-through an uninstall left):
        # moved aside, removed below once nothing runs from it
        os.rename(link, os.path.join(os.path.dirname(tree), f"unversioned-{os.getpid()}"))
    target = os.path.relpath(final, os.path.dirname(prefix))
    if not os.path.islink(link) or os.readlink(link) != target:
        replace_link(link, target)
        written.append(link)
    return final, written


def running_from(tree: str) -> list[int]:
    """Pids of the processes whose executable lies in ``tree`` (every pid namespace this
    one sees; the installer runs with the host's). Compared by inode, so a process in
    another mount namespace counts too."""
    inodes = set()
    for top, _dirs, files in os.walk(tree):
        for name in files:
            with contextlib.suppress(OSError):
                st = os.stat(os.path.join(top, name), follow_symlinks=False)
                if st.st_mode & 0o111:
                    inodes.add((st.st_dev, st.st_ino))
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                st = os.stat(f"/proc/{entry}/exe")
                if (st.st_dev, st.st_ino) in inodes:
                    pids.append(int(entry))
    return pids


def prune_versions(dest_root: str, prefix: str, keep: str | None = None) -> list[str]:
    """Remove the trees of ``PREFIX-versions`` but ``keep`` that no process runs from
    (a running one goes with a later install or uninstall); the directory itself once
    empty. Returns the (destination) paths removed."""
    top = under(dest_root, versions_dir(prefix))
    if not os.path.isdir(top) or os.path.islink(top):
        return []
    removed = []
    for name in sorted(os.listdir(top)):
        path = os.path.join(top, name)
        if name == keep or running_from(path):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    with contextlib.suppress(OSError):
        os.rmdir(top)
        removed.append(top)
    return removed


def replace_link(path: str, points_to: str) -> None:
    """Make ``path`` a symlink to ``points_to``, replacing what is there atomically."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.nvshim-{os.getpid()}"
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(points_to, tmp)
    os.rename(tmp, path)


def install_host(
    dest_root: str = "/",
    prefix: str | None = None,
    bin_dir: str | None = None,
    hooks_dir: str | None = None,
    source: str | None = None,
    versioned: bool = False,
) -> list[str]:
    """Install nvshim below ``dest_root`` and return the (destination) paths written.

    From a bundle (``source``, default the running one): the bundle is copied to
    ``prefix`` (default: where it already is), relocated to name ``prefix``, and
    ``bin_dir`` gets links to its commands. Without a bundle and without ``prefix``, the
    launchers for the running interpreter are written straight into ``bin_dir``.
    ``hooks_dir`` gets the OCI hook file naming the final ``nvshim-hook``.
    ``versioned`` (a live host whose runtime may be running: the node installer):
    ``prefix`` becomes a symlink to ``PREFIX-versions/NAME`` (:func:`_install_version`);
    the caller prunes older trees (:func:`prune_versions`) once the install is complete.
    """
    source = source or bundle_root()
    if prefix is None and source:
        prefix = read_marker(source).get("prefix") or DEFAULT_PREFIX
    check_dirs(dest_root, {"prefix": prefix, "bin dir": bin_dir, "hooks dir": hooks_dir})
    written: list[str] = []
    outside: list[str] = []
    if prefix is None:
        if not bin_dir:
            raise NvshimError("install: give --bin-dir or --prefix")
        written += write_launchers(under(dest_root, bin_dir))
        hook_path = os.path.join(bin_dir, "nvshim-hook")
        outside += [os.path.join(bin_dir, name) for name in LAUNCHERS]
    else:
        target = under(dest_root, prefix)
        if source and versioned:
            written += _install_version(source, dest_root, prefix)[1]
        elif source:
            check_prefix(source, prefix)
            _copy_bundle(source, target)
            written += relocate(target, prefix)
        else:
            written += write_launchers(os.path.join(target, "bin"))
        hook_path = os.path.join(prefix, "bin", "nvshim-hook")
        if bin_dir:
            names = [*LAUNCHERS, *(CLI_LAUNCHER if source else {})]
            for name in names:
                final = os.path.join(bin_dir, name)
                replace_link(under(dest_root, final), os.path.join(prefix, "bin", name))
                written.append(under(dest_root, final))
                outside.append(final)
    if hooks_dir:
        from nvshim.fsutil import atomic_write

        final = os.path.join(hooks_dir, HOOK_FILE)
        path = under(dest_root, final)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_write(path, hook_file_text(hook_path).encode(), mode=0o644)
        written.append(path)
        outside.append(final)
    if prefix is not None:
        _write_manifest(under(dest_root, prefix), prefix, outside, bool(source))
    return written


def _write_manifest(target: str, prefix: str, outside: list[str], bundle: bool) -> None:
    from nvshim.fsutil import atomic_write

    os.makedirs(target, exist_ok=True)
    record = {"prefix": prefix, "bundle": bundle, "files": sorted(set(outside))}
    text = json.dumps(record, indent=2) + "\n"
    atomic_write(os.path.join(target, MANIFEST), text.encode(), mode=0o644)


def _ours(path: str, prefix: str) -> bool:
    """Whether ``path`` still is what an install under ``prefix`` wrote there."""
    if os.path.islink(path):
        return os.readlink(path).startswith(prefix.rstrip("/") + "/")
    if path.endswith(HOOK_FILE) and os.path.isfile(path):
        with open(path, encoding="utf-8", errors="replace") as fh:
            return os.path.join(prefix, "bin", "nvshim-hook") in fh.read()
    return False


def uninstall_host(
    dest_root: str = "/", prefix: str = DEFAULT_PREFIX, switch_to: str | None = None
) -> list[str]:
    """Remove what :func:`install_host` put below ``dest_root`` for ``prefix``.

    Links and hook files are removed only while they are still nvshim's (an operator's
    replacement stays). A versioned install's trees go too, but for one a process still
    runs from (:func:`prune_versions`); ``switch_to`` (a tree in ``PREFIX-versions``)
    keeps ``prefix`` as a link to it instead of removing it. Returns the (destination)
    paths removed; nothing installed is nothing to do.
    """
    target = under(dest_root, prefix)
    manifest = os.path.join(target, MANIFEST)
    removed = []
    if os.path.isfile(manifest):
        with open(manifest, encoding="utf-8") as fh:
            record = json.load(fh)
        for final in record.get("files", []):
            path = under(dest_root, final)
            if _ours(path, prefix):
                os.unlink(path)
                removed.append(path)
    keep = None
    if switch_to is not None:
        keep = os.path.basename(switch_to)
        if os.path.isdir(target) and not os.path.islink(target):
            shutil.rmtree(target)  # an unversioned tree: a link cannot replace it in place
            removed.append(target)
        replace_link(target, os.path.relpath(switch_to, os.path.dirname(prefix)))
    elif os.path.islink(target):
        os.unlink(target)
        removed.append(target)
    elif os.path.isfile(manifest):
        shutil.rmtree(target)
        removed.append(target)
    return removed + prune_versions(dest_root, prefix, keep=keep)
