#!/usr/bin/env python3
"""A normal 1-GPU create while hostile ones keep nvshim-runtimed's pool busy (issue 22).

The hostile image holds a FIFO at ``/etc/ld.so.conf.d/evil.conf``, which used to block
the ld-cache step (and the worker serving it) for 60 s. ``--max-workers`` clients create
such containers back to back, so that many hostile creates are always in flight, while
the bench times a normal 1-GPU create of a busybox bundle through ``nvshim-runtime``
(slot-served when a worker is free, else declined at once and done in-process), paired
with bare runc creating the same bundle with no GPU. Rounds alternate unloaded and
loaded; the figure is each state's median added time (nvshim minus runc, per pair) and
their ratio (target: loaded within 2x of unloaded).

Run as root: ``.venv/bin/python3 bench/hostile_create.py [--max-workers N] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.creates import RUNC, installed  # noqa: E402
from tests.podman_util import make_busybox_rootfs  # noqa: E402
from tests.runc_util import make_bundle, start_daemon  # noqa: E402
from tests.sim.simhost import build_host  # noqa: E402

GPU = {"NVIDIA_VISIBLE_DEVICES": "0"}


def create(
    runtime: str, state: str, bundle: str, cid: str, env: dict[str, str]
) -> tuple[float, int]:
    """(seconds, exit status) of ``runtime create``; the container is deleted (not timed)."""
    with open(os.path.join(os.path.dirname(bundle), f"{cid}.out"), "w") as out:
        start = time.perf_counter()
        code = subprocess.run(
            [runtime, "--root", state, "create", "--pid-file", f"{bundle}/pid", "--bundle",
             bundle, cid], env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
        ).returncode  # fmt: skip
        took = time.perf_counter() - start
    subprocess.run([RUNC, "--root", state, "delete", "--force", cid], capture_output=True)
    return took, code


def hostile_client(n: int, w: str, golden: str, runtime: str, env, load, stop, counts) -> None:
    """Create hostile containers back to back while ``load`` is set."""
    rootfs = os.path.join(w, f"hostile-{n}", "rootfs")
    shutil.copytree(golden, rootfs, symlinks=True)
    os.makedirs(f"{rootfs}/etc/ld.so.conf.d", exist_ok=True)
    os.mkfifo(f"{rootfs}/etc/ld.so.conf.d/evil.conf")
    i = 0
    while not stop.is_set():
        if not load.wait(0.1):
            continue
        i += 1
        cid = f"hostile-{n}-{i}"
        bundle = make_bundle(os.path.join(w, f"hostile-{n}"), rootfs, ["/bin/true"], env=GPU,
                             name=cid)  # fmt: skip
        took, code = create(runtime, os.path.join(w, "state"), bundle, cid, env)
        counts.append((took, code))
        shutil.rmtree(bundle, ignore_errors=True)


def normal(w: str, golden: str, runtime: str, env, tag: str) -> tuple[float, float]:
    """(nvshim 1-GPU create, bare runc create) of one fresh copy of the image."""
    times = []
    for who, binary, request in (("nv", runtime, GPU), ("runc", RUNC, {})):
        rootfs = os.path.join(w, f"{tag}-{who}", "rootfs")
        shutil.copytree(golden, rootfs, symlinks=True)
        cid = f"{tag}-{who}"
        bundle = make_bundle(os.path.dirname(rootfs), rootfs, ["/bin/true"], env=request, name=cid)
        took, code = create(binary, os.path.join(w, "state"), bundle, cid, env)
        if code != 0:
            raise SystemExit(
                f"{binary} create failed: {open(f'{os.path.dirname(bundle)}/{cid}.out').read()}"
            )
        times.append(took)
        shutil.rmtree(os.path.dirname(rootfs))
    return times[0], times[1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-workers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=15)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as w:
        os.chmod(w, 0o755)
        sim = build_host("single", os.path.join(w, "host"))
        golden = make_busybox_rootfs(os.path.join(w, "golden"))
        runtime, env = installed(w, "served", REPO, sim)
        old = time.time() - 60  # the front's cache must be newer than the configuration
        os.utime(env["NVSHIM_CONFIG"], (old, old))
        subprocess.run([runtime, "--version"], env=env, check=True, capture_output=True)
        log = os.path.join(w, "daemon.err")
        n = str(opts.max_workers)
        daemon = start_daemon(os.path.dirname(runtime), env, log, "--verbose", "--workers", n,
                              "--max-workers", n)  # fmt: skip
        load, stop, counts = threading.Event(), threading.Event(), []
        clients = [threading.Thread(target=hostile_client,
                                    args=(i, w, golden, runtime, env, load, stop, counts))
                   for i in range(opts.max_workers)]  # fmt: skip
        for t in clients:
            t.start()
        figures: dict[str, list[tuple[float, float]]] = {"unloaded": [], "loaded": []}
        try:
            normal(w, golden, runtime, env, "warm")
            for r in range(opts.rounds):
                figures["unloaded"].append(normal(w, golden, runtime, env, f"u{r}"))
                load.set()
                time.sleep(0.3)  # the hostile clients have creates in flight
                figures["loaded"].append(normal(w, golden, runtime, env, f"l{r}"))
                load.clear()
        finally:
            stop.set()
            load.clear()
            for t in clients:
                t.join(timeout=120)
            daemon.terminate()
            daemon.wait(timeout=60)
        text = open(log).read()
        added = {k: statistics.median(v - b for v, b in pairs) for k, pairs in figures.items()}
        runc = {k: statistics.median(b for _, b in pairs) for k, pairs in figures.items()}
        hostile = [t for t, _ in counts]
        print(f"{opts.max_workers} hostile 1-GPU creates in flight (ld.so.conf.d FIFO), "
              f"{opts.rounds} rounds, {os.cpu_count()} cores:")  # fmt: skip
        for k in ("unloaded", "loaded"):
            print(f"  {k:<9} normal 1-GPU create adds {added[k] * 1000:7.1f} ms to runc's "
                  f"{runc[k] * 1000:6.1f} ms (median of pairs)")  # fmt: skip
        print(
            f"  loaded/unloaded added time: {added['loaded'] / added['unloaded']:.2f}x"
            " (target <= 2x)"
        )
        print(
            f"  hostile creates: {len(hostile)}, all failed: {all(c != 0 for _, c in counts)}, "
            f"median {statistics.median(hostile) * 1000 if hostile else 0:.1f} ms; "
            f"daemon declined {text.count('declined: all')} calls as busy, served "
            f"{text.count(' by slot ')} by slot and {text.count(' by socket ')} by socket"
        )


if __name__ == "__main__":
    main()
