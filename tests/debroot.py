"""Cached build products for the tests: Debian roots (mmdebstrap) and the host bundle.

Each product lives under ``$NVSHIM_TEST_CACHE`` (default ``/tmp/nvshim-test-cache``) in a
directory named by a digest of its inputs, so a second run (or a second checkout with the
same inputs) reuses it and a changed input rebuilds it. Builds take a file lock, so
concurrent runs never build the same product twice or see a half-built one.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.environ.get("NVSHIM_TEST_CACHE", "/tmp/nvshim-test-cache")
# What goes into the bundle: the package, its metadata and the builder (and the unit the
# package links to: tree_digest counts a link by its target).
# Builds kept per product: enough for a few checkouts side by side.
KEEP = 3
BUNDLE_INPUTS = (
    "nvshim", "setup.py", "pyproject.toml", "README.md", "packaging/bundle",
    "packaging/systemd/nvshim-runtimed.service",
)  # fmt: skip


def cached(name: str, inputs: object, build: Callable[[str], None]) -> str:
    """The product ``name`` for ``inputs`` (JSON-able), built by ``build(path)`` once.

    ``build`` writes into the path it is given; the product appears under its final
    name only when the build succeeded.
    """
    key = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]
    os.makedirs(CACHE, exist_ok=True)
    final = os.path.join(CACHE, f"{name}-{key}")
    with open(final + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(final):
            work = final + ".building"
            shutil.rmtree(work, ignore_errors=True)
            if os.path.lexists(work):
                os.unlink(work)
            build(work)
            os.rename(work, final)
            _prune(name, final)
    return final


def _prune(name: str, keep: str, newest: int = KEEP) -> None:
    """Remove all but the ``newest`` builds of product ``name`` (``keep`` always stays),
    so a cache that sees many source changes stays bounded."""
    prefix = f"{name}-"
    builds = []
    for entry in os.listdir(CACHE):
        path = os.path.join(CACHE, entry)
        rest = entry[len(prefix) :]
        if entry.startswith(prefix) and len(rest) == 16 and "." not in rest and path != keep:
            builds.append((os.lstat(path).st_mtime, path))
    for _mtime, path in sorted(builds, reverse=True)[newest - 1 :]:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
        if os.path.exists(path + ".lock"):
            os.unlink(path + ".lock")


def tree_digest(paths: tuple[str, ...], root: str = REPO) -> str:
    """Digest of the files under ``paths`` (relative to ``root``), caches skipped."""
    from nvshim.hostbundle import tree_digest as digest

    return digest(root, paths, skip=("__pycache__",))


def debian_root_tar(suite: str, variant: str = "minbase", include: tuple[str, ...] = ()) -> str:
    """A tarball of a fresh Debian ``suite`` root made by mmdebstrap (cached)."""

    def build(path: str) -> None:
        cmd = ["mmdebstrap", "--quiet", f"--variant={variant}"]
        if include:
            cmd.append("--include=" + ",".join(include))
        subprocess.run([*cmd, suite, path + ".tar"], check=True, capture_output=True)
        os.rename(path + ".tar", path)

    return cached(f"debian-{suite}-{variant}", [suite, variant, sorted(include)], build)


def unpack(tar: str, dest: str) -> str:
    """Unpack a root tarball into ``dest`` (created); return ``dest``."""
    os.makedirs(dest, exist_ok=True)
    subprocess.run(["tar", "-C", dest, "-xf", tar], check=True)
    return dest


def bundle_dir() -> str:
    """The host bundle built from this checkout by docs/install.md's build line (its
    directory put in for ``/tmp/nvshim-bundle``), cached by its inputs, prefixed at its
    own cache path. Copy it with ``nvshim.install.install_host`` to use it elsewhere."""
    import shlex

    from tests.docs_commands import documented

    inputs = {"sources": tree_digest(BUNDLE_INPUTS), "python": os.path.realpath(sys.executable)}
    line = documented("docs/install.md", ".venv/bin/python3 packaging/bundle/build.py")

    def build(path: str) -> None:
        final = path[: -len(".building")]
        argv = [path if word == "/tmp/nvshim-bundle" else word for word in shlex.split(line)]
        subprocess.run([*argv, "--prefix", final], cwd=REPO, check=True, capture_output=True)

    return cached("bundle", inputs, build)
