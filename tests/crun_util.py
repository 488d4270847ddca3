"""crun as nvshim's low-level runtime in tests: Debian's crun, unpacked into the test
cache by tests/setup.sh (installed, it would become podman's default runtime)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

from tests.debroot import CACHE

CRUN = os.path.join(CACHE, "crun", "usr", "bin", "crun")


@contextmanager
def crun_namespace() -> Iterator[tuple[str, ...]]:
    """A command prefix (``nsenter``) into a private mount namespace where crun runs on
    this host: crun 1.8 refuses a hybrid cgroup host (a cgroup2 hierarchy at
    ``/sys/fs/cgroup/unified`` beside the v1 controllers, as on these VMs); without that
    mount, in the namespace only, it uses the v1 controllers as runc does. On another
    host the namespace changes nothing."""
    assert os.access(CRUN, os.X_OK), f"{CRUN}: missing (tests/setup.sh unpacks it)"
    holder = subprocess.Popen(
        ["unshare", "-m", "--propagation", "private", "sh", "-c",
         "umount /sys/fs/cgroup/unified 2>/dev/null; echo ready; exec sleep infinity"],
        stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline() == "ready\n"
        yield ("nsenter", "-t", str(holder.pid), "-m")
    finally:
        holder.kill()
        holder.wait()
