#!/usr/bin/env python3
"""Creates under load: N containers created at once (default 100) on this machine's
cores, through bare runc (no GPU) and through nvshim-runtime (1 GPU each, of a simulated
host), batch after batch in turn. Reports each batch's wall time until the last create
returned and the CPU time per create (the runtimes' processes, reaped: the containers'
own init processes are not counted for either side), as medians over the rounds and as
the ratio to bare runc (the median of each round's, with its 95% interval: with eight
rounds or fewer, the whole range). The daemon's first round is also shown alone: its
pool, at rest before it, forks most of its workers during that burst.

nvshim-runtime runs twice: served by ``nvshim-runtimed`` (as installed; the daemon's
and its workers' CPU is counted, exactly from a cgroup of their own where one can be
made, else from 10 ms ticks) and alone, in the client's process.

``--previous DIR`` adds a case: the nvshim package of another checkout (an earlier
version) with its own launchers, served by its own daemon. Its ``createContainer`` hook,
where it has one, runs under the container's init, so its CPU is not counted there. The
two trees' batches are also paired round by round (this tree's wall over the previous').

"bare runc, nvshim's edits" is runc creating bundles nvshim edited beforehand (not
timed, no finishing steps), the driver's binds in the spec as NVIDIA's CDI spec has them
(``bench.runc_edits``; nvshim's own create attaches them itself): what the GPU's mounts
and devices cost runc in the burst. The served case's rounds are paired with it too.

``--lifecycle`` times whole lifecycles instead: each container's ``create``, ``start``,
``state`` and ``delete``, one after the other through the runtime under test as an
engine calls them, all N containers at once (CPU per container).

Everything is made under ``--work-dir`` (by default ``/dev/shm``; a node keeps bundles
and runc's state on a tmpfs but the containers' roots on its disk, where a write's fsync
costs).

Run as root: ``.venv/bin/python3 bench/concurrent_create.py [--containers N] [--rounds R]
[--previous DIR] [--lifecycle] [--work-dir DIR]``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
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

from bench.creates import (  # noqa: E402
    RUNC,
    children_cpu,
    daemon_cpu,
    edited_bundle,
    installed,
    running_daemon,
)
from bench.paired import median_interval  # noqa: E402
from nvshim.launch import real_interpreter  # noqa: E402
from tests.podman_util import make_busybox_rootfs  # noqa: E402
from tests.runc_util import make_bundle  # noqa: E402
from tests.sim.simhost import build_host  # noqa: E402


def _create(runtime: str, state: str, bundle: str, cid: str) -> list[str]:
    return [runtime, "--root", state, "create", "--pid-file", f"{bundle}/pid", "--bundle", bundle,
            cid]  # fmt: skip


def _lifecycle(runtime: str, state: str, bundle: str, cid: str, env, out) -> int:
    """A container's calls, one after the other, as an engine makes them: create, start,
    state, delete (the container runs ``true``: it has exited or is killed); the first
    failure's exit status."""
    calls = [_create(runtime, state, bundle, cid), [runtime, "--root", state, "start", cid],
             [runtime, "--root", state, "state", cid],
             [runtime, "--root", state, "delete", "--force", cid]]  # fmt: skip
    for argv in calls:
        code = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
        if code.returncode != 0:
            return code.returncode
    return 0


def batch(
    work: str, runtime: str, env: dict[str, str], golden: str, n: int, gpu: bool, tag: str,
    daemon: int | None = None, edits: dict[str, str] | None = None, lifecycle: bool = False,
):  # fmt: skip
    """Create ``n`` containers at once; (wall seconds, CPU seconds per container,
    counting the daemon ``daemon`` too). ``edits``: nvshim's environment, to have each
    bundle edited for its GPU beforehand (not timed: ``runtime`` is then bare runc).
    ``lifecycle``: each container is also started, its state read and deleted through
    ``runtime`` (timed); else the containers are deleted afterwards (not timed)."""
    state = os.path.join(work, f"state-{tag}")
    request = {"NVIDIA_VISIBLE_DEVICES": "0"} if gpu else {}
    bundles = []
    for i in range(n):  # each its own rootfs: the finishing steps write into it
        rootfs = os.path.join(work, f"{tag}-{i}", "rootfs")
        shutil.copytree(golden, rootfs, symlinks=True)
        bundles.append(make_bundle(os.path.dirname(rootfs), rootfs, ["/bin/true"], env=request))
        if edits is not None:
            edited_bundle(bundles[-1], f"{tag}-{i}", edits)
    out = open(os.path.join(work, f"{tag}.out"), "w")  # created processes keep it open
    cpu = children_cpu() + (daemon_cpu(daemon) if daemon else 0.0)
    start = time.perf_counter()
    if lifecycle:
        with concurrent.futures.ThreadPoolExecutor(n) as pool:
            jobs = [pool.submit(_lifecycle, runtime, state, b, f"{tag}-{i}", env, out)
                    for i, b in enumerate(bundles)]  # fmt: skip
            failed = sum(job.result() != 0 for job in jobs)
    else:
        procs = [
            subprocess.Popen(
                _create(runtime, state, b, f"{tag}-{i}"),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
            )  # fmt: skip
            for i, b in enumerate(bundles)
        ]
        failed = sum(p.wait() != 0 for p in procs)
    wall = time.perf_counter() - start
    cpu = (children_cpu() + (daemon_cpu(daemon) if daemon else 0.0) - cpu) / n
    out.close()
    if failed:
        raise SystemExit(f"{runtime}: {failed} of {n} containers failed (see {out.name})")
    for i in range(n):
        if not lifecycle:
            subprocess.run([RUNC, "--root", state, "delete", "--force", f"{tag}-{i}"], check=True)
        shutil.rmtree(os.path.join(work, f"{tag}-{i}"))
    return wall, cpu


def measure(w: str, cases: dict, golden: str, opts) -> dict[str, list[tuple[float, float]]]:
    """Each case's (wall, CPU per create) per round, the cases taking turns."""
    for runtime, env, gpu, pid, edits in cases.values():  # warm the inventory and config caches
        if gpu:
            batch(w, runtime, env, golden, 2, True, "warm", pid, edits, opts.lifecycle)
    figures: dict[str, list[tuple[float, float]]] = {c: [] for c in cases}
    for r in range(opts.rounds):
        for n, (case, (binary, env, gpu, pid, edits)) in enumerate(cases.items()):
            tag = f"r{r}c{n}"
            figures[case].append(
                batch(w, binary, env, golden, opts.containers, gpu, tag, pid, edits, opts.lifecycle)
            )
    return figures


def _paired(label: str, ours: list, theirs: list) -> None:
    """Print the median of two cases' per-round wall ratios, with its 95% interval."""
    ratios = [a[0] / b[0] for a, b in zip(ours, theirs, strict=True)]
    low, high = median_interval(ratios)
    print(f"  {label}, wall per round: {statistics.median(ratios):.2f}x "
          f"(95%: {low:.2f} to {high:.2f})")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--containers", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--previous", help="a checkout of an earlier nvshim")
    parser.add_argument("--lifecycle", action="store_true",
                        help="time each container's create, start, state and delete")  # fmt: skip
    parser.add_argument("--work-dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None,
                        help="where everything is made (default /dev/shm)")  # fmt: skip
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=opts.work_dir) as w:
        sim = build_host("single", os.path.join(w, "host"))
        golden = make_busybox_rootfs(os.path.join(w, "golden"))
        served, alone = installed(w, "served", REPO, sim), installed(w, "alone", REPO, sim)
        plain = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
        with contextlib.ExitStack() as stack:
            daemon = stack.enter_context(running_daemon(os.path.dirname(served[0]), served[1]))
            cases = {
                "bare runc, no GPU": (RUNC, plain, False, None, None),
                "bare runc, nvshim's edits": (RUNC, plain, True, None, served[1]),
                "nvshim-runtime + daemon, 1 GPU": (*served, True, daemon.pid, None),
                "nvshim-runtime alone, 1 GPU": (*alone, True, None, None),
            }
            if opts.previous:  # served by its own daemon, as this tree's
                previous = installed(w, "previous", os.path.abspath(opts.previous), sim)
                theirs = stack.enter_context(
                    running_daemon(os.path.dirname(previous[0]), previous[1])
                )
                cases["previous nvshim + daemon, 1 GPU"] = (*previous, True, theirs.pid, None)
            figures = measure(w, cases, golden, opts)
        start = time.perf_counter()
        subprocess.run([real_interpreter(), "-IS", "-c", "pass"], check=True)
        yardstick = (time.perf_counter() - start) * 1000
        bare = figures["bare runc, no GPU"]
        what = "lifecycles (create, start, state, delete)" if opts.lifecycle else "creates"
        print(f"{opts.containers} {what} at once on {os.cpu_count()} cores, "
              f"medians of {opts.rounds} rounds:")  # fmt: skip
        for case, values in figures.items():
            wall = statistics.median(v[0] for v in values)
            cpu = statistics.median(v[1] for v in values)
            ratios = [v[0] / b[0] for v, b in zip(values, bare, strict=True)]
            low, high = median_interval(ratios)
            print(f"  {case:<30} all done in {wall:6.2f} s ({statistics.median(ratios):4.2f}x "
                  f"runc, 95%: {low:.2f} to {high:.2f}), CPU per container "
                  f"{cpu * 1000:6.1f} ms")  # fmt: skip
        for case, values in figures.items():  # the pool at rest met the first burst
            if "daemon" in case:
                ratio = values[0][0] / bare[0][0]
                print(f"  {case:<30} first round alone: {ratio:4.2f}x runc, CPU per container "
                      f"{values[0][1] * 1000:6.1f} ms (its workers forked in it)")  # fmt: skip
        ours = figures["nvshim-runtime + daemon, 1 GPU"]
        edited = figures["bare runc, nvshim's edits"]  # what nvshim adds over runc's own part
        _paired("nvshim + daemon / bare runc with its edits", ours, edited)
        if opts.previous:  # the two trees' rounds paired: what changed, without runc's spread
            _paired("this tree / previous", ours, figures["previous nvshim + daemon, 1 GPU"])
        print(f"yardstick: python3 -IS -c pass {yardstick:.1f} ms (one run, after the batches)")


if __name__ == "__main__":
    main()
