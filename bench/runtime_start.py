#!/usr/bin/env python3
"""Container start wall time through runc: bare runc, nvshim-runtime without a GPU, and
with 1 and 8 GPUs of a simulated host; plus a non-create call (`state`) both ways.
Every figure is measured in this one run; the added time is reported against bare runc.

`runc run` keeps the finishing steps in a hook (two interpreters per GPU container);
``bench/engine_start.py`` times ``create``, which runs them in the runtime.

Run as root: `.venv/bin/python3 bench/runtime_start.py [--runs N]`.
Targets: non-create calls within 5 ms of bare runc; a 1-GPU create adds < 25 ms median.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.paired import median_added  # noqa: E402
from nvshim.launch import real_interpreter, write_launchers  # noqa: E402
from tests.podman_util import make_busybox_rootfs  # noqa: E402
from tests.runc_util import make_bundle  # noqa: E402
from tests.sim.simhost import build_host  # noqa: E402
from tests.sim.topology import generate_topology  # noqa: E402


def _start_once(
    work_root, golden, binary, request, env, name, prefix=(), annotations=None
) -> float:
    """Wall time of one ``<prefix> <binary> run`` of a fresh busybox bundle (then removed)."""
    work = os.path.join(work_root, f"run-{name}")
    rootfs = os.path.join(work, "rootfs")
    shutil.copytree(golden, rootfs, symlinks=True)
    extra = {"NVIDIA_VISIBLE_DEVICES": request} if isinstance(request, str) else request or {}
    bundle = make_bundle(work, rootfs, ["/bin/true"], env=extra, annotations=annotations)
    state = os.path.join(work, "state")
    command = [*prefix, binary, "--root", state, "run", "--bundle", bundle, name]
    start = time.perf_counter()
    proc = subprocess.run(command, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{binary} ({name}): {proc.stderr.strip()}")
    shutil.rmtree(work)
    return elapsed


def interleaved(work_root, cases, env, runs: int) -> dict[str, list[float]]:
    """Start times of each case ``(label, binary, request, golden rootfs)`` over ``runs``
    rounds after one warm-up round. The cases are interleaved round by round, so drift
    on the machine hits every case alike; compare them through paired differences."""
    times: dict[str, list[float]] = {label: [] for label, *_ in cases}
    for i in range(runs + 1):
        for n, (label, binary, request, golden) in enumerate(cases):
            elapsed = _start_once(work_root, golden, binary, request, env, f"{n}-{i}")
            if i:  # the first round is a warm-up
                times[label].append(elapsed)
    return times


def paired_added_ms(values: list[float], bare: list[float]) -> float:
    """The added time in ms: the median of each round's difference to bare runc."""
    return median_added(values, bare) * 1000


def write_bench_config(directory: str, sim, bin_dir: str, runtime_extra: str = "") -> str:
    """``<directory>/config.toml`` for the simulated host ``sim``: hooks from ``bin_dir``,
    log and state under ``directory``, env requests honoured; returns its path."""
    config = os.path.join(directory, "config.toml")
    with open(config, "w") as fh:
        fh.write(
            f'[host]\ndriver-root = "{sim.driver_root}"\ndev-root = "{sim.dev_root}"\n'
            f'[runtime]\nhook-path = "{bin_dir}/nvshim-hook"\nlog-file = "{directory}/log"\n'
            f'inventory-dir = "{directory}/state"\n{runtime_extra}'
            "[policy]\naccept-env-unprivileged = true\n"
        )
    return config


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    opts = parser.parse_args()
    runc = shutil.which("runc")
    # bundles on tmpfs, as containerd keeps them (/run/containerd/...)
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(dir=shm) as tmp:
        work_root = os.path.join(tmp, "runs")
        sim = build_host(generate_topology(8, False), os.path.join(tmp, "host"))
        bin_dir = os.path.join(tmp, "bin")
        write_launchers(bin_dir)
        config = write_bench_config(tmp, sim, bin_dir)
        env = {"PATH": os.environ["PATH"], "NVSHIM_CONFIG": config}
        static = make_busybox_rootfs(os.path.join(tmp, "static"), glibc_loader=False)
        glibc = make_busybox_rootfs(os.path.join(tmp, "glibc"))
        runtime = os.path.join(bin_dir, "nvshim-runtime")
        cases = [
            ("bare runc", runc, None, static),
            ("nvshim, no GPU", runtime, None, static),
            ("nvshim, 1 GPU", runtime, "0", static),
            ("nvshim, 8 GPUs", runtime, "all", static),
            ("1 GPU, glibc image", runtime, "0", glibc),
        ]
        # warm the inventory cache (as a node would be after its first container)
        subprocess.run(
            [
                sys.executable,
                "-c",
                "from nvshim.config import load_config;"
                "from nvshim.policy.select import load_host_for;"
                "load_host_for(load_config())",
            ],
            env={**env, "PYTHONPATH": REPO},
            check=True,
        )
        times = interleaved(work_root, cases, env, opts.runs)
        bare = times["bare runc"]
        print(f"container start (runc run of busybox /bin/true), median of {opts.runs} rounds:")
        added = {}
        for label, values in times.items():
            added[label] = paired_added_ms(values, bare)
            median = statistics.median(values)
            print(
                f"  {label:<20} {median * 1000:7.1f} ms  added {added[label]:+6.1f} ms"
                f"  ratio {median / statistics.median(bare):5.2f}"
            )
        print(
            "  (busybox is static: nothing in it reads ld.so.cache, so update-ldcache skips "
            "ldconfig;\n   the glibc image has a dynamic loader and gets ldconfig run in it)"
        )

        state_dir = os.path.join(tmp, "state-empty")
        os.makedirs(state_dir)
        pairs = []
        for _ in range(opts.runs * 4):
            round_times = []
            for binary in (runc, runtime):
                start = time.perf_counter()
                subprocess.run(
                    [binary, "--root", state_dir, "list"], env=env, capture_output=True, check=True
                )
                round_times.append(time.perf_counter() - start)
            pairs.append(round_times)
        bare_list = statistics.median(p[0] for p in pairs) * 1000
        shim_list = statistics.median(p[1] for p in pairs) * 1000
        list_added = statistics.median([p[1] - p[0] for p in pairs]) * 1000
        print(
            f"non-create call (`list`), median of {len(pairs)}: bare {bare_list:.1f} ms, "
            f"through nvshim {shim_list:.1f} ms, added {list_added:+.1f} ms "
            f"(ratio {shim_list / bare_list:.2f}; target < 5 ms)"
        )
        print(
            f"1-GPU create adds {added['nvshim, 1 GPU']:.1f} ms median (target < 25 ms);"
            f" with ldconfig (glibc image) {added['1 GPU, glibc image']:.1f} ms"
        )
        yardstick = []
        for _ in range(10):
            start = time.perf_counter()
            subprocess.run([real_interpreter(), "-IS", "-c", "pass"], check=True)
            yardstick.append(time.perf_counter() - start)
        print(f"yardstick: python3 -IS -c pass {statistics.median(yardstick) * 1000:.1f} ms")


if __name__ == "__main__":
    main()
