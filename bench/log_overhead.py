#!/usr/bin/env python3
"""What the decision log's pod fields, levels and rotation cost a 1-GPU container start:
nvshim-runtime from a baseline revision (default ``main``) against this tree, paired
round by round, with CRI pod annotations on every bundle.

Cases: the baseline; this tree with the text log (rotation on, 10 MiB); this tree with
``log-format = "json"``; this tree with rotation forced often (4 KiB). Each case runs in
its own mount namespace with a private ``/run/nvshim`` so the cases do not evict each
other's config cache. Prints each case's median added time against the baseline.

A second, finer figure: the cost of one ``log_decision`` call in-process, the baseline's
against this tree's (text, json), in interleaved blocks.

Run as root: `.venv/bin/python3 bench/log_overhead.py [--runs N] [--base REV]`.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from runtime_start import _start_once, write_bench_config  # noqa: E402

from nvshim.launch import LAUNCHERS, import_roots, launcher_text  # noqa: E402
from tests.podman_util import make_busybox_rootfs  # noqa: E402
from tests.sim.simhost import build_host  # noqa: E402
from tests.sim.topology import generate_topology  # noqa: E402

POD = {
    "io.kubernetes.cri.sandbox-namespace": "ml-team",
    "io.kubernetes.cri.sandbox-name": "trainer-5d8f7b9c4-x2x7q",
    "io.kubernetes.cri.container-name": "worker",
}
# a private /run/nvshim per case: "$1" is the case's cache dir, the rest the command
PRIVATE_RUN = [
    "unshare",
    "--mount",
    "--propagation",
    "private",
    "--",
    "sh",
    "-c",
    'mkdir -p /run/nvshim && mount --bind "$1" /run/nvshim && shift && exec "$@"',
    "sh",
]


def _launchers(bin_dir: str, tree: str) -> str:
    """nvshim-runtime and nvshim-hook launchers importing nvshim from ``tree``."""
    os.makedirs(bin_dir)
    roots = [tree if root == REPO else root for root in import_roots()]
    for name, module in LAUNCHERS.items():
        path = os.path.join(bin_dir, name)
        with open(path, "w") as fh:
            fh.write(launcher_text(module, roots=roots))
        os.chmod(path, 0o755)
    return os.path.join(bin_dir, "nvshim-runtime")


def _per_call(log_decision, target, annotations, calls: int = 200) -> float:
    fields = {"source": "cdi", "request": "0", "devices": "GPU-1", "capabilities": "utility"}
    extra = {"annotations": annotations} if annotations is not None else {}
    start = time.perf_counter()
    for n in range(calls):
        log_decision(target, "nvshim-runtime", f"container-{n}", **extra, **fields)
    return (time.perf_counter() - start) / calls


def micro(base_tree: str, tmp: str, blocks: int = 30) -> None:
    """Per-call cost of the baseline's log_decision and this tree's, in-process."""
    from nvshim import log
    from nvshim.config import Config, RuntimeConfig

    spec = importlib.util.spec_from_file_location("base_log", f"{base_tree}/nvshim/log.py")
    base_log = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(base_log)
    text = Config(runtime=RuntimeConfig(log_file=f"{tmp}/micro-text.log"))
    json_file = f"{tmp}/micro-json.log"
    json_config = Config(runtime=RuntimeConfig(log_file=json_file, log_format="json"))
    cases = {
        "baseline": (base_log.log_decision, f"{tmp}/micro-base.log", None),
        "text": (log.log_decision, text, POD),
        "json": (log.log_decision, json_config, POD),
    }
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(blocks):
        for label, (func, target, pod) in cases.items():
            times[label].append(_per_call(func, target, pod))
    base = statistics.median(times["baseline"])
    print(f"one log_decision call, median of {blocks} blocks of 200:")
    for label, values in times.items():
        median = statistics.median(values)
        print(f"  {label:<9} {median * 1e6:6.1f} us  ({(median - base) * 1e6:+5.1f} us)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--base", default="main")
    opts = parser.parse_args()
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(dir=shm) as tmp:
        base_tree = os.path.join(tmp, "base")
        os.makedirs(base_tree)
        archive = subprocess.run(
            ["git", "-C", REPO, "archive", opts.base, "nvshim"], capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", base_tree], input=archive, check=True)
        micro(base_tree, tmp)
        sim = build_host(generate_topology(8, False), os.path.join(tmp, "host"))
        golden = make_busybox_rootfs(os.path.join(tmp, "static"), glibc_loader=False)
        cases = {}
        for label, tree, extra in (
            (f"baseline ({opts.base})", base_tree, ""),
            ("text log", REPO, ""),
            ("json log", REPO, 'log-format = "json"\n'),
            ("rotating every ~20 lines", REPO, "log-max-size = 4096\nlog-backups = 2\n"),
        ):
            case = os.path.join(tmp, f"case{len(cases)}")
            runtime = _launchers(os.path.join(case, "bin"), tree)
            config = write_bench_config(case, sim, os.path.join(case, "bin"), extra)
            os.makedirs(os.path.join(case, "run"))
            env = {"PATH": os.environ["PATH"], "NVSHIM_CONFIG": config}
            cases[label] = (runtime, env, PRIVATE_RUN + [os.path.join(case, "run")])
        times: dict[str, list[float]] = {label: [] for label in cases}
        for i in range(opts.runs + 2):  # two warm-up rounds fill every cache
            for n, (label, (runtime, env, prefix)) in enumerate(cases.items()):
                elapsed = _start_once(
                    os.path.join(tmp, "runs"), golden, runtime, "0", env, f"{n}-{i}", prefix, POD
                )
                if i >= 2:
                    times[label].append(elapsed)
        base = times[next(iter(cases))]
        print(f"1-GPU container start with CRI pod annotations, {opts.runs} paired rounds:")
        for label, values in times.items():
            added = statistics.median([v - b for v, b in zip(values, base, strict=True)])
            print(
                f"  {label:<26} median {statistics.median(values) * 1000:6.1f} ms"
                f"  vs baseline {added * 1000:+5.2f} ms"
                f"  ratio {statistics.median(values) / statistics.median(base):.3f}"
            )


if __name__ == "__main__":
    main()
