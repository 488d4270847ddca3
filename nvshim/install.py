"""Put nvshim on a host: the bundle under its prefix, command links, the OCI hook file.

Every install takes a destination root (``/`` on a live host, a staging directory for a
package or image build, the host mount for the node installer) and names only final
paths in what it writes. What it wrote outside the prefix is recorded in the prefix's
manifest, so :func:`uninstall_host` removes exactly that.
"""

from __future__ import annotations

import json
import os
import shutil

from nvshim.bundle import MARKER, bundle_root, check_prefix, read_marker, relocate
from nvshim.errors import NvshimError
from nvshim.launch import CLI_LAUNCHER, HOOK_ENV, LAUNCHERS, write_launchers

DEFAULT_PREFIX = "/usr/local/nvshim"
MANIFEST = "install-manifest.json"
HOOK_FILE = "oci-nvshim-hook.json"


def under(dest_root: str, path: str) -> str:
    """``path`` (absolute, final) as seen below ``dest_root``."""
    if not os.path.isabs(path):
        raise NvshimError(f"{path}: an install path must be absolute")
    return os.path.join(dest_root, os.path.normpath(path).lstrip("/"))


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


def _copy_bundle(source: str, target: str) -> None:
    """Copy the bundle at ``source`` to ``target`` unless the same build is already there."""
    if os.path.realpath(source) == os.path.realpath(target):
        return
    if os.path.isfile(os.path.join(target, MARKER)):
        if read_marker(target).get("build") == read_marker(source).get("build"):
            return
    os.makedirs(os.path.dirname(target), exist_ok=True)
    staging = f"{target}.new-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(source, staging, symlinks=True)
    _swap_in(staging, target)


def _link(path: str, points_to: str) -> None:
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
) -> list[str]:
    """Install nvshim below ``dest_root`` and return the (destination) paths written.

    From a bundle (``source``, default the running one): the bundle is copied to
    ``prefix`` (default: where it already is), relocated to name ``prefix``, and
    ``bin_dir`` gets links to its commands. Without a bundle and without ``prefix``, the
    launchers for the running interpreter are written straight into ``bin_dir``.
    ``hooks_dir`` gets the OCI hook file naming the final ``nvshim-hook``.
    """
    source = source or bundle_root()
    if prefix is None and source:
        prefix = read_marker(source).get("prefix") or DEFAULT_PREFIX
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
        if source:
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
                _link(under(dest_root, final), os.path.join(prefix, "bin", name))
                written.append(under(dest_root, final))
                outside.append(final)
    if hooks_dir:
        from nvshim.fsutil import atomic_write

        final = os.path.join(hooks_dir, HOOK_FILE)
        path = under(dest_root, final)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_write(path, hook_file_text(hook_path).encode(), mode=0o644, backup=False)
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
    atomic_write(os.path.join(target, MANIFEST), text.encode(), mode=0o644, backup=False)


def _ours(path: str, prefix: str) -> bool:
    """Whether ``path`` still is what an install under ``prefix`` wrote there."""
    if os.path.islink(path):
        return os.readlink(path).startswith(prefix.rstrip("/") + "/")
    if path.endswith(HOOK_FILE) and os.path.isfile(path):
        with open(path, encoding="utf-8", errors="replace") as fh:
            return os.path.join(prefix, "bin", "nvshim-hook") in fh.read()
    return False


def uninstall_host(dest_root: str = "/", prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Remove what :func:`install_host` put below ``dest_root`` for ``prefix``.

    Links and hook files are removed only while they are still nvshim's (an operator's
    replacement stays). Returns the (destination) paths removed; nothing installed is
    nothing to do.
    """
    target = under(dest_root, prefix)
    manifest = os.path.join(target, MANIFEST)
    if not os.path.isfile(manifest):
        return []
    with open(manifest, encoding="utf-8") as fh:
        record = json.load(fh)
    removed = []
    for final in record.get("files", []):
        path = under(dest_root, final)
        if _ours(path, prefix):
            os.unlink(path)
            removed.append(path)
    shutil.rmtree(target)
    removed.append(target)
    return removed
