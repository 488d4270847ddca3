#!/usr/bin/env python3
"""Build the nvshim node installer image (no registry needed).

    python3 packaging/container/build.py [--tag nvshim-node:VERSION] [--suite bookworm]
        [--base-tar TAR] [--bundle DIR] [--rootfs-tar OUT.tar] [--podman-root DIR]
        [--save OUT.oci.tar] [--no-import | --import-only ROOTFS.tar]

A Debian root (``mmdebstrap --variant=minbase SUITE``, or ``--base-tar``) gets nvshim's
self-contained host bundle at ``/opt/nvshim`` (built from this checkout with
packaging/bundle/build.py, or ``--bundle``) staged in with ``nvshim install --root``, and
``podman import`` turns the tree into an image whose entrypoint is
``/opt/nvshim/bin/nvshim node run``. ``--save`` also writes an OCI archive to load on nodes
(``ctr -n k8s.io images import``, ``podman load``). Needs root, mmdebstrap (unless
``--base-tar``), patchelf and podman (unless ``--no-import``). Prints the image tag.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from nvshim import __version__  # noqa: E402

PREFIX = "/opt/nvshim"
ENTRYPOINT = f'["{PREFIX}/bin/nvshim", "node", "run"]'
LABELS = {
    "org.opencontainers.image.title": "nvshim node installer",
    "org.opencontainers.image.version": __version__,
}


def missing_tools(args) -> list[str]:
    """The tools this build needs that are not on PATH, each with where it comes from."""
    needed = {"tar": "tar"}
    if not args.import_only:
        if not args.base_tar:
            needed["mmdebstrap"] = "mmdebstrap (or pass --base-tar ROOT.tar)"
        if not args.bundle:
            needed["patchelf"] = "patchelf (or pass --bundle DIR)"
    if not args.no_import:
        needed["podman"] = "podman"
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    return [what for tool, what in needed.items() if not shutil.which(tool, path=path)]


def run(*cmd: str) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"build: {' '.join(cmd[:4])}... failed:\n{proc.stderr or proc.stdout}")
    return proc.stdout


def base_root(args, work: str) -> str:
    """A Debian root tarball: the one given, or a fresh mmdebstrap of ``--suite``."""
    if args.base_tar:
        return args.base_tar
    tar = os.path.join(work, "base.tar")
    run("mmdebstrap", "--quiet", "--variant=minbase", args.suite, tar)
    return tar


def bundle(args, work: str) -> str:
    if args.bundle:
        return args.bundle
    out = os.path.join(work, "bundle")
    run(sys.executable, os.path.join(REPO, "packaging", "bundle", "build.py"), out, "--prefix", out)
    return out


def rootfs_tar(args, work: str) -> str:
    """The image's root: Debian plus the bundle staged at PREFIX; as a tarball."""
    root = os.path.join(work, "root")
    os.makedirs(root)
    run("tar", "-C", root, "-xf", base_root(args, work))
    source = bundle(args, work)
    nvshim = os.path.join(source, "bin", "nvshim")
    run(nvshim, "install", "--root", root, "--prefix", PREFIX, "--bin-dir", "/usr/local/bin")
    # the image is not a host: keep it small and free of things a node must not inherit
    for sub in ("var/cache/apt", "var/lib/apt/lists", "usr/share/doc", "usr/share/man"):
        shutil.rmtree(os.path.join(root, sub), ignore_errors=True)
    out = args.rootfs_tar or os.path.join(work, "rootfs.tar")
    run("tar", "-C", root, "--numeric-owner", "--sort=name", "-cf", out, ".")
    return out


def podman(args, *cmd: str) -> str:
    base = ["podman"]
    if args.podman_root:
        base += ["--root", args.podman_root, "--storage-driver", "vfs"]
        base += ["--runroot", args.podman_runroot or os.path.join(args.podman_root, "run")]
        base += ["--events-backend", "none", "--cgroup-manager", "cgroupfs"]
    return run(*base, *cmd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tag", default=f"localhost/nvshim-node:{__version__}")
    parser.add_argument("--suite", default="bookworm", help="Debian suite of the base")
    parser.add_argument("--base-tar", help="a Debian root tarball instead of mmdebstrap")
    parser.add_argument("--bundle", help="a built host bundle instead of building one")
    parser.add_argument("--rootfs-tar", help="keep the image's root tarball here")
    parser.add_argument("--podman-root", help="podman storage root (default: podman's)")
    parser.add_argument("--podman-runroot", help=argparse.SUPPRESS)
    parser.add_argument("--save", help="also write an OCI archive of the image here")
    parser.add_argument("--no-import", action="store_true", help="only build --rootfs-tar")
    parser.add_argument("--import-only", metavar="TAR", help="import a root built before")
    args = parser.parse_args()
    if args.no_import and not args.rootfs_tar:
        parser.error("--no-import needs --rootfs-tar")
    missing = missing_tools(args)
    if missing:
        sys.exit(
            f"build: not installed: {', '.join(missing)} (apt-get install the Debian packages)"
        )
    with tempfile.TemporaryDirectory(prefix="nvshim-image-") as work:
        tar = args.import_only or rootfs_tar(args, work)
        if args.no_import:
            print(tar)
            return
        changes = [f"ENTRYPOINT {ENTRYPOINT}", "CMD []", "WORKDIR /"]
        changes += [f"LABEL {k}={v}" for k, v in LABELS.items()]
        argv = [a for c in changes for a in ("--change", c)]
        podman(args, "import", *argv, tar, args.tag)
        if args.save:
            podman(args, "save", "--format", "oci-archive", "-o", args.save, args.tag)
    print(args.tag)


if __name__ == "__main__":
    main()
