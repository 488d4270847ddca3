#!/usr/bin/env python3
"""The Python a served 1-GPU create runs before runc, timed in one process as a worker of
``nvshim-runtimed`` runs it: edit the bundle (``prepare_bundle``), bring the front's
cache up to date (``resolve``) and the finishing steps' host halves, call after call in
one interpreter (its memos warm). No runc, no container, no mount namespace: the part of
a create that is nvshim's own Python, which ``bench/served_create.py`` cannot resolve
under runc's spread (a few tenths of a ms against runc's 20 ms).

With ``--previous DIR`` (a tree holding an earlier ``nvshim`` package, e.g. from
``git archive``; it must have the same three calls) both trees take turns, round by
round, each in a fresh interpreter per round. Prints each tree's median per call, and
the per-round ratio with its 95% interval (``bench.paired.median_interval``).

Run as root (the params step mounts a private tmpfs):
``.venv/bin/python3 bench/worker_python.py [--rounds R] [--calls N] [--previous DIR]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.creates import installed, roots  # noqa: E402
from bench.paired import median_interval  # noqa: E402
from tests.podman_util import make_busybox_rootfs  # noqa: E402
from tests.runc_util import make_bundle  # noqa: E402
from tests.sim.simhost import build_host  # noqa: E402

WARM = 5  # calls not counted: the first ones fill the memos and caches

# run in the tree's own interpreter: argv[1] its sys.path, argv[2] the bundles (JSON)
CHILD = """
import json, os, sys, time
sys.path[:0] = sys.argv[1].split(":")
from nvshim.hook.steps import Context, prepare_steps
from nvshim.runtime.create import prepare_bundle
from nvshim.runtime.passthrough import resolve

def one(bundle):
    start = time.perf_counter()
    prepared = prepare_bundle(bundle, os.path.basename(bundle), True, None)
    resolve(prepared.config, prepared.runtime)
    ctx = Context(prepared.config)
    try:
        prepare_steps(prepared.steps, ctx)
    finally:
        ctx.close()
    return (time.perf_counter() - start) * 1e6

json.dump([one(b) for b in json.load(open(sys.argv[2]))], sys.stdout)
"""


def timed_calls(work: str, tree: str, env: dict[str, str], rootfs: str, name: str, n: int):
    """Microseconds of each of ``n`` counted calls in one fresh interpreter of ``tree``."""
    bundles = [
        make_bundle(
            work, rootfs, ["/bin/true"], env={"NVIDIA_VISIBLE_DEVICES": "0"}, name=f"{name}-{i}"
        )  # fmt: skip
        for i in range(n + WARM)
    ]
    listing = os.path.join(work, f"{name}.json")
    with open(listing, "w") as fh:
        json.dump(bundles, fh)
    out = subprocess.run(
        [sys.executable, "-I", "-c", CHILD, ":".join(roots(tree)), listing],
        env=env, check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    return json.loads(out)[WARM:]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--previous", help="a tree holding an earlier nvshim package")
    opts = parser.parse_args()
    trees = {"this tree": REPO}
    if opts.previous:
        trees["previous"] = os.path.abspath(opts.previous)
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as w:
        sim = build_host("single", os.path.join(w, "host"))
        rootfs = make_busybox_rootfs(os.path.join(w, "rootfs"), glibc_loader=False)
        envs = {}
        for name, tree in trees.items():
            _, env = installed(w, name.replace(" ", "-"), tree, sim)
            cache = os.path.join(w, name.replace(" ", "-"), "cache")
            envs[name] = {**env, "NVSHIM_CACHE_DIR": cache}
        calls: dict[str, list[float]] = {name: [] for name in trees}
        medians: dict[str, list[float]] = {name: [] for name in trees}
        for r in range(opts.rounds):
            order = list(trees.items())
            for name, tree in order[::-1] if r % 2 else order:  # the trees take turns first
                us = timed_calls(w, tree, envs[name], rootfs, f"{name[0]}{r}", opts.calls)
                calls[name] += us
                medians[name].append(statistics.median(us))
    print(f"{opts.rounds} rounds of {opts.calls} calls on {os.cpu_count()} cores "
          f"(one interpreter per tree and round, {WARM} calls first not counted):")  # fmt: skip
    for name in trees:
        print(f"  {name:<10} {statistics.median(calls[name]):7.0f} us a call (median)")
    if opts.previous:
        ratios = [a / b for a, b in zip(medians["this tree"], medians["previous"], strict=True)]
        low, high = median_interval(ratios)
        print(f"  this tree / previous: {statistics.median(ratios):.2f}x "
              f"(per round; 95%: {low:.2f} to {high:.2f})")  # fmt: skip


if __name__ == "__main__":
    main()
