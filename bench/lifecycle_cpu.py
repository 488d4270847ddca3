#!/usr/bin/env python3
"""Where a GPU lifecycle's CPU goes, call by call: ``create``, ``start``, ``state`` and
``delete`` of one container at a time, through bare runc (no GPU), bare runc on a bundle
nvshim edited beforehand (the GPU's mounts, no finishing steps), and nvshim-runtime
served by ``nvshim-runtimed``, the three taking turns round by round, each container on
its own copy of a busybox image with glibc's loader.

For each call it reports the CPU of the processes the engine would start (the runtime
and what it runs: for nvshim, the front and runc), measured with ``RUSAGE_CHILDREN``,
and the daemon's share (the parent and its workers: exactly, from a cgroup of their own
where one can be made, else from ``/proc`` ticks, where a tick is 10 ms, so only the mean
over many calls means anything; ``bench.creates.running_daemon``). The front's cost is the served
call's CPU over runc's on the edited bundle, paired round by round (median and 95%
interval); the daemon's is its mean per call.

With ``--previous DIR`` (a tree holding an earlier ``nvshim`` package, e.g. from ``git
archive`` with its compiled front built in it), that tree served by its own daemon is a
fourth case, paired with this one call by call.

Run as root: ``.venv/bin/python3 bench/lifecycle_cpu.py [--rounds N] [--previous DIR]``.
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

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.creates import (  # noqa: E402
    RUNC,
    children_cpu,
    daemon_cpu,
    edited_bundle,
    installed,
    running_daemon,
)
from bench.paired import median_interval  # noqa: E402
from tests.podman_util import make_busybox_rootfs  # noqa: E402
from tests.runc_util import make_bundle  # noqa: E402
from tests.sim.simhost import build_host  # noqa: E402

CALLS = ("create", "start", "state", "delete")
CASES = ("bare runc, no GPU", "bare runc, nvshim's edits", "nvshim served, 1 GPU")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--previous", help="a tree holding an earlier nvshim package")
    opts = parser.parse_args()
    cases = [*CASES, *(["previous served, 1 GPU"] if opts.previous else [])]
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as w:
        sim = build_host("single", os.path.join(w, "host"))
        golden = make_busybox_rootfs(os.path.join(w, "golden"))
        trees = {2: installed(w, "served", REPO, sim)}
        if opts.previous:
            trees[3] = installed(w, "previous", os.path.abspath(opts.previous), sim)
        env = trees[2][1]
        state = os.path.join(w, "state")
        own: dict[tuple[str, str], list[float]] = {}
        share: dict[tuple[str, str], list[float]] = {}
        with contextlib.ExitStack() as stack:
            daemons = {k: stack.enter_context(running_daemon(os.path.dirname(runtime), tree_env))
                       for k, (runtime, tree_env) in trees.items()}  # fmt: skip
            for n in range(opts.rounds + 1):  # the first round warms the caches
                for k, case in enumerate(cases):
                    cid = f"c{n}-{k}"
                    rootfs = shutil.copytree(golden, os.path.join(w, cid), symlinks=True)
                    gpu = {} if k == 0 else {"NVIDIA_VISIBLE_DEVICES": "0"}
                    bundle = make_bundle(w, rootfs, ["/bin/true"], env=gpu, name=f"b-{cid}")
                    if k == 1:
                        edited_bundle(bundle, cid, env)
                    runtime, call_env = trees.get(k, (RUNC, env))
                    daemon = daemons.get(k, daemons[2])
                    argvs = {
                        "create": ["create", "--pid-file", f"{bundle}/pid", "--bundle", bundle,
                                   cid],
                        "start": ["start", cid],
                        "state": ["state", cid],
                        "delete": ["delete", "--force", cid],
                    }  # fmt: skip
                    for call in CALLS:
                        before = children_cpu(), daemon_cpu(daemon.pid)
                        subprocess.run([runtime, "--root", state, *argvs[call]], env=call_env,
                                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                       check=True)  # fmt: skip
                        after = children_cpu(), daemon_cpu(daemon.pid)
                        if n:
                            own.setdefault((case, call), []).append(after[0] - before[0])
                            share.setdefault((case, call), []).append(after[1] - before[1])
                    shutil.rmtree(rootfs)
    print(f"CPU per call, {opts.rounds} rounds of one lifecycle per case (ms):")
    print(f"  {'call':<8}" + "".join(f"{case:>28}" for case in cases) + "  daemon (mean)")
    for call in CALLS:
        row = "".join(f"{statistics.median(own[(c, call)]) * 1000:28.2f}" for c in cases)
        served = statistics.mean(share[(CASES[2], call)]) * 1000
        print(f"  {call:<8}{row}  {served:6.2f}")

    def fronts(label: str, ours: str, base: str) -> None:
        print(f"{label} (paired; the daemon apart):")
        total = 0.0
        for call in CALLS:
            diffs = [(a - b) * 1000 for a, b in zip(own[(ours, call)], own[(base, call)],
                                                     strict=True)]  # fmt: skip
            low, high = median_interval(diffs)
            total += statistics.median(diffs)
            print(f"  {call:<8} {statistics.median(diffs):+5.2f} ms "
                  f"(95%: {low:+.2f} to {high:+.2f})")  # fmt: skip
        print(f"  per lifecycle {total:+.2f} ms")

    fronts("the front: nvshim served over runc on the edited bundle", CASES[2], CASES[1])
    if opts.previous:
        fronts("this tree over the previous one, served", CASES[2], cases[3])
    for k in daemons:
        mean = sum(statistics.mean(share[(cases[k], c)]) * 1000 for c in CALLS)
        print(f"the daemon of {cases[k]}: {mean:.2f} ms per lifecycle")


if __name__ == "__main__":
    main()
