#!/usr/bin/env python3
"""A 1-GPU create served by nvshim-runtimed (through a slot) and a pass-through ``list``,
paired round by round with bare runc (no GPU), with bare runc creating the bundle nvshim
edited beforehand (runc's own work for the GPU's mounts and devices, which any injecting
runtime adds: the rest is nvshim's own) and, with ``--previous DIR``, with the
nvshim of another checkout served by its own daemon: what a change to the served path
costs, measured in one run (the shared VMs drift too much between runs).

Prints the medians, the paired differences and ratios with the 95% interval of each
median difference (``bench.paired.median_interval``: a create's time spreads by several
ms here, so 40 rounds leave an interval of about +-4 ms; the default is 100), the yardstick
(one ``python3 -IS -c pass``) and how each daemon served the calls.

Every create (runc's too) gets its own copy of a busybox image with glibc's loader, as a
pod's new container of a CUDA image has its own root: runc makes the GPU's mount points
in it, the finishing steps make its links and the ld-cache step writes its cache.
``--shared-root`` is the shape of the figures before 2026-11-28: one root without the
loader for every create, where the step is skipped and the mount points and links are
there from the first create on.

Run as root: ``.venv/bin/python3 bench/served_create.py [--rounds N] [--previous DIR]
[--shared-root]`` (``DIR``: a tree holding an earlier ``nvshim`` package, e.g. from ``git
archive``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.creates import RUNC, edited_bundle, installed, running_daemon  # noqa: E402
from bench.paired import median_interval  # noqa: E402
from nvshim.launch import real_interpreter  # noqa: E402
from tests.podman_util import make_busybox_rootfs  # noqa: E402
from tests.runc_util import make_bundle  # noqa: E402
from tests.sim.simhost import build_host  # noqa: E402


def timed(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, check=True)
    return (time.perf_counter() - start) * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--previous", help="a tree holding an earlier nvshim package")
    shared = "one root for every create, without glibc's loader (the earlier figures' shape)"
    parser.add_argument("--shared-root", action="store_true", help=shared)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as w:
        sim = build_host("single", os.path.join(w, "host"))
        golden = make_busybox_rootfs(os.path.join(w, "rootfs"), glibc_loader=not opts.shared_root)
        ours = {"this tree": installed(w, "this", REPO, sim)}
        if opts.previous:
            ours["previous"] = installed(w, "previous", os.path.abspath(opts.previous), sim)
        state = os.path.join(w, "state")

        env = next(iter(ours.values()))[1]
        creates = {
            "runc, no GPU": (RUNC, env, False, False),
            "runc, edited": (RUNC, env, True, True),
        }
        creates.update(
            (name, (runtime, case_env, True, False)) for name, (runtime, case_env) in ours.items()
        )

        def prepared(cid: str, gpu: bool, edit: bool) -> str:
            """A bundle for ``cid``, made before any create of the round is timed."""
            rootfs = golden
            if not opts.shared_root:  # a new container's own root, as a pod's
                rootfs = shutil.copytree(golden, os.path.join(w, f"rootfs-{cid}"), symlinks=True)
            request = {"NVIDIA_VISIBLE_DEVICES": "0"} if gpu else {}
            bundle = make_bundle(w, rootfs, ["/bin/true"], env=request, name=cid)
            if edit:  # nvshim's edits made beforehand, not timed: runc's own work for them
                edited_bundle(bundle, cid, env)
            return bundle

        def removed(bundle: str, cid: str) -> None:
            subprocess.run([RUNC, "--root", state, "delete", "--force", cid], check=True)
            if not opts.shared_root:
                shutil.rmtree(os.path.join(w, f"rootfs-{cid}"))
            shutil.rmtree(bundle)

        figures: dict[str, list[float]] = {}
        with contextlib.ExitStack() as stack:
            for runtime, case_env in ours.values():
                stack.enter_context(running_daemon(os.path.dirname(runtime), case_env))
            for i in range(opts.rounds + 1):  # the first round warms the caches
                names = list(creates)
                names = names[i % len(names) :] + names[: i % len(names)]  # each goes first in turn
                bundles = {n: prepared(f"c{k}-{i}", *creates[n][2:]) for k, n in enumerate(names)}
                row = {}
                for k, name in enumerate(names):
                    runtime, case_env, _, _ = creates[name]
                    bundle = bundles[name]
                    row[f"create: {name}"] = timed([runtime, "--root", state, "create",
                                                    "--pid-file", f"{bundle}/pid", "--bundle",
                                                    bundle, f"c{k}-{i}"], case_env)  # fmt: skip
                for name, (runtime, case_env) in [("runc", (RUNC, env)), *ours.items()]:
                    row[f"list: {name}"] = timed([runtime, "--root", state, "list"], case_env)
                for k, name in enumerate(names):
                    removed(bundles[name], f"c{k}-{i}")
                for case, value in row.items():
                    if i:
                        figures.setdefault(case, []).append(value)
        yardstick = statistics.median(
            timed([real_interpreter(), "-IS", "-c", "pass"], env) for _ in range(9)
        )
    bare_create, bare_list = figures["create: runc, no GPU"], figures["list: runc"]
    print(f"{opts.rounds} paired rounds on {os.cpu_count()} cores (ms, medians):")

    def paired(label: str, ms: list[float], base: list[float]) -> None:
        diff = [a - b for a, b in zip(ms, base, strict=True)]
        mid, (low, high) = statistics.median(diff), median_interval(diff)
        print(f"  {label}: {mid:+.1f} ms = {mid / yardstick:+.1f} yardsticks "
              f"(95%: {low / yardstick:+.1f} to {high / yardstick:+.1f})")  # fmt: skip

    edited = figures["create: runc, edited"]
    paired("runc on nvshim's edited bundle - runc, no GPU (runc's own work for the GPU)",
           edited, bare_create)  # fmt: skip
    for name in ours:
        create_ms, list_ms = figures[f"create: {name}"], figures[f"list: {name}"]
        added = [a - b for a, b in zip(create_ms, bare_create, strict=True)]
        mid, (low, high) = statistics.median(added), median_interval(added)
        ratio = statistics.median(a / b for a, b in zip(list_ms, bare_list, strict=True))
        print(f"  {name:<10} 1-GPU create {statistics.median(create_ms):6.1f} (runc, no GPU "
              f"{statistics.median(bare_create):5.1f}): {mid:+6.1f} = "
              f"{mid / yardstick:+.1f} yardsticks (95%: "
              f"{low / yardstick:+.1f} to {high / yardstick:+.1f}); "
              f"list {ratio:.2f}x runc")  # fmt: skip
        paired(f"{name} - runc on the same edits (nvshim's own)", create_ms, edited)
    if opts.previous:
        pairs = zip(figures["create: this tree"], figures["create: previous"], strict=True)
        diff = [a - b for a, b in pairs]
        low, high = median_interval(diff)
        print(f"  this tree - previous, 1-GPU create: {statistics.median(diff):+.1f} ms "
              f"(paired; 95%: {low:+.1f} to {high:+.1f})")  # fmt: skip
    print(f"yardstick: python3 -IS -c pass {yardstick:.1f} ms (median of 9, after the rounds)")


if __name__ == "__main__":
    main()
