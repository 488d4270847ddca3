"""The node installer image for tests: built once per set of inputs with
packaging/container/build.py into a podman storage under the test cache, and a
``NodeContainer`` that runs it (privileged, host PID) and stops it with ``podman stop``,
all inside a private mount namespace so podman's run state stays out of the host's /run."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.debroot import REPO, bundle_dir, cached, debian_root_tar, tree_digest
from tests.podman_util import _NAMESPACE_SCRIPT, PODMAN_BASE_ENV

TAG = "localhost/nvshim-node:test"
SUITE = "bookworm"
BUILDER = "packaging/container/build.py"

# Inside the namespace: start the container, say so, wait for a line on stdin, then
# `podman stop` it (SIGTERM, then the grace period), keep its log and remove it.
_DRIVER = r"""set -e
P="podman --root $STORE --runroot /run/podman-test/runroot --tmpdir /run/podman-test/tmp"
P="$P --storage-driver vfs --events-backend none --cgroup-manager cgroupfs --runtime runc"
$P image exists "$TAG" || "$PY" "$BUILDER" --import-only "$ROOTFS" --tag "$TAG" \
    --podman-root "$STORE" --podman-runroot /run/podman-test/runroot >/dev/null
$P run -d --name nvshim-node --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 \
    "$@" >/dev/null
echo started
read line
$P stop -t 120 nvshim-node >/dev/null
$P logs nvshim-node >"$LOG" 2>&1 || true
$P inspect --format '{{.State.ExitCode}}' nvshim-node
$P rm nvshim-node >/dev/null
"""


def node_image() -> str:
    """The image's root tarball (built and cached by inputs); ``NodeContainer`` imports
    it with the same builder (podman storage is tied to its path, so it is not cached)."""
    bundle = bundle_dir()
    base = debian_root_tar(SUITE)
    inputs = {"bundle": bundle, "base": base, "builder": tree_digest((BUILDER,))}

    def build(path: str) -> None:
        os.makedirs(path)
        subprocess.run(
            [sys.executable, os.path.join(REPO, BUILDER), "--base-tar", base, "--bundle", bundle]
            + ["--rootfs-tar", os.path.join(path, "rootfs.tar"), "--no-import"],
            check=True,
            capture_output=True,
        )

    return os.path.join(cached("node-image", inputs, build), "rootfs.tar")


class NodeContainer:
    """``podman run -d`` of the image with ``args`` (options, then none: the entrypoint
    runs), stopped with ``podman stop`` by :meth:`stop`."""

    def __init__(self, rootfs: str, args: list[str], log: str, scratch: str) -> None:
        self.log = log
        store = os.path.join(scratch, "podman-storage")
        hostrun = os.path.join(scratch, "podman-host-run")
        os.makedirs(hostrun, exist_ok=True)
        argv = ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c"]
        argv += [_NAMESPACE_SCRIPT, "podman-ns", "", hostrun, "0"]
        argv += ["/bin/sh", "-c", _DRIVER, "driver", *args, TAG]
        self.proc = subprocess.Popen(
            argv,
            env={
                **PODMAN_BASE_ENV,
                **{"STORE": store, "LOG": log, "ROOTFS": rootfs, "TAG": TAG},
                **{"PY": sys.executable, "BUILDER": os.path.join(REPO, BUILDER)},
            },
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        first = self.proc.stdout.readline().strip()
        if first != "started":
            self.proc.wait(30)
            raise RuntimeError(f"podman run failed: {self.proc.stderr.read()}")

    def stop(self, timeout: float = 180) -> int:
        """``podman stop``; the installer's exit code."""
        out, err = self.proc.communicate("stop\n", timeout=timeout)
        if self.proc.returncode != 0:
            raise RuntimeError(f"podman stop failed: {err}")
        return int(out.strip().splitlines()[-1])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.stop()
