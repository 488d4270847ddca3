#!/usr/bin/env python3
"""The node installer image: its size, and the time from container start to ready on a
simulated GPU host (and from `podman stop` to the uninstall's end), next to the same
installer run as a plain process from the virtualenv.

Each round makes a fresh scratch host root (a simulated single-GPU host, containerd's
default config; CDI on, no engine restart) and runs both cases, interleaved; the ratio is
taken pair by pair. The image is built (and cached) as the tests build it; its import is
not timed. Run as root: `.venv/bin/python3 bench/node_install.py [--rounds 5]`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.paired import median_ratio  # noqa: E402
from tests.debroot import bundle_dir  # noqa: E402
from tests.node_image import NodeContainer, node_image  # noqa: E402
from tests.node_util import Scratch, start_node, wait_for  # noqa: E402


def du(path: str) -> int:
    total = 0
    for top, _dirs, files in os.walk(path):
        for name in files:
            full = os.path.join(top, name)
            if not os.path.islink(full):
                total += os.lstat(full).st_size
    return total


def stamps(log: str) -> dict[str, float]:
    """Seconds from the installer's first log line to its "ready" and "uninstalled" lines."""
    import datetime

    times = {}
    for line in Path(log).read_text().splitlines():
        stamp, _, text = line.partition(" nvshim node: ")
        if not text:
            continue
        when = datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()
        times.setdefault("start", when)
        for key in ("ready", "uninstalled", "SIGTERM"):
            if text.startswith(key):
                times[key] = when
    return times


def container_round(
    scratch: Scratch, rootfs: str, work: str, n: int
) -> tuple[float, float, float, float]:
    ready = Path(work) / f"ready-{n}"
    ready.mkdir()
    env = scratch.env(CDI_ENABLED="true", NVSHIM_READY_FILE="/run/nvshim-ready/ready")
    env["HOST_ROOT_MOUNT"] = "/host"
    args = ["--privileged", "--pid=host", "--network=none", "-v", f"{scratch.root}:/host"]
    args += ["-v", f"{ready}:/run/nvshim-ready"]
    args += [a for k, v in env.items() for a in ("-e", f"{k}={v}")]
    start = time.perf_counter()
    node = NodeContainer(rootfs, args, os.path.join(work, f"log-{n}"), work)
    wait_for((ready / "ready").exists, timeout=120)
    up = time.perf_counter() - start
    start = time.perf_counter()
    code = node.stop()
    down = time.perf_counter() - start
    log = os.path.join(work, f"log-{n}")
    if code != 0:
        sys.exit(f"installer exited {code}: {Path(log).read_text()}")
    inner = stamps(log)
    return up, down, inner["ready"] - inner["start"], inner["uninstalled"] - inner["SIGTERM"]


def process_round(scratch: Scratch, work: str, n: int) -> tuple[float, float, float, float]:
    log = Path(work) / f"plain-{n}.log"
    start = time.perf_counter()
    proc = start_node(scratch.env(CDI_ENABLED="true"), log)
    wait_for(scratch.ready.exists, proc=proc, log=log)
    up = time.perf_counter() - start
    start = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    proc.wait(120)
    down = time.perf_counter() - start
    inner = stamps(str(log))
    return up, down, inner["ready"] - inner["start"], inner["uninstalled"] - inner["SIGTERM"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    opts = parser.parse_args()
    rootfs = node_image()
    with tempfile.TemporaryDirectory(prefix="nvb", dir="/tmp") as work:
        # import once (not timed): later rounds find the image in this storage
        warm = Scratch(Path(work) / "warm")
        container_round(warm, rootfs, work, -1)
        image = subprocess.run(
            ["podman", "--root", os.path.join(work, "podman-storage"), "--storage-driver", "vfs"]
            + ["image", "inspect", "--format", "{{.Size}}", "localhost/nvshim-node:test"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        pairs = []
        for n in range(opts.rounds):
            boxed = container_round(Scratch(Path(work) / f"c{n}"), rootfs, work, n)
            plain = process_round(Scratch(Path(work) / f"p{n}"), work, n)
            pairs.append((boxed, plain))
        shutil.rmtree(os.path.join(work, "podman-storage"), ignore_errors=True)
    mib = 1024 * 1024
    print("node installer image")
    print(f"  image (podman, uncompressed): {int(image) / mib:.0f} MiB" if image.isdigit() else "")
    print(f"  root tarball: {os.path.getsize(rootfs) / mib:.0f} MiB")
    print(f"  host bundle it installs: {du(bundle_dir()) / mib:.0f} MiB")
    print(f"{opts.rounds} interleaved rounds, median seconds (image: podman, vfs storage)")
    print(f"{'case':44} {'image':>7} {'process':>8} {'ratio':>6}")
    names = (
        "start -> ready (podman run / exec)",
        "stop -> gone (podman stop+rm / SIGTERM)",
        "installer: first log line -> ready",
        "installer: SIGTERM -> uninstalled",
    )
    for i, name in enumerate(names):
        boxed = [p[0][i] for p in pairs]
        plain = [p[1][i] for p in pairs]
        ratio = median_ratio(boxed, plain)
        print(
            f"{name:44} {statistics.median(boxed):7.2f} {statistics.median(plain):8.2f}"
            f" {ratio:6.2f}"
        )


if __name__ == "__main__":
    main()
