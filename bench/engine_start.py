#!/usr/bin/env python3
"""nvshim-runtime against bare runc, every case interleaved with its runc twin in one run
(the VMs drift by 3x between runs, so only ratios from one run mean anything):

- the yardstick: one ``python3 -IS -c pass`` of the interpreter nvshim runs on;
- a pass-through call (``list``): the sh front execs runc, no Python;
- a 1-GPU ``create`` (then ``delete``, not timed) of a busybox bundle;
- ``podman run --rm true`` with no GPU and with 1 GPU (podman 4, vfs storage, in a
  private mount namespace; both runtimes behind the same one-line sh wrapper, which
  podman needs to hand nvshim its config).

Run as root: ``.venv/bin/python3 bench/engine_start.py [--rounds N]``. Targets (issue 12):
pass-through <= 1.2x runc; engine level with no GPU <= 1.1x runc; a 1-GPU create adds
<= 2 interpreter starts.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from nvshim.launch import real_interpreter, write_launchers  # noqa: E402
from tests.podman_util import in_podman_namespace, podman_command  # noqa: E402
from tests.runc_util import make_bundle, make_busybox_rootfs  # noqa: E402
from tests.sim.simhost import build_host  # noqa: E402

RUNC = shutil.which("runc") or "/usr/sbin/runc"


def timed(argv: list[str], env: dict[str, str], **kw) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, **kw)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{shlex.join(argv)}: {proc.stderr.strip()}")
    return elapsed


class Pairs:
    """Per case: (runc time, nvshim time) per round."""

    def __init__(self) -> None:
        self.rows: dict[str, list[tuple[float, float]]] = {}

    def add(self, case: str, bare: float, ours: float) -> None:
        self.rows.setdefault(case, []).append((bare, ours))

    def report(self, yardstick: float) -> None:
        print(f"{'case':<34} {'runc':>8} {'nvshim':>8} {'added':>8} {'ratio':>6}  (ms, medians)")
        for case, rows in self.rows.items():
            bare = statistics.median(r[0] for r in rows) * 1000
            ours = statistics.median(r[1] for r in rows) * 1000
            added = statistics.median(r[1] - r[0] for r in rows) * 1000
            ratio = statistics.median(r[1] / r[0] for r in rows)
            line = f"{case:<34} {bare:8.1f} {ours:8.1f} {added:+8.1f} {ratio:6.2f}"
            print(f"{line}  = {added / yardstick:+.1f} interpreter starts")
        print(f"yardstick: python3 -IS -c pass {yardstick:.1f} ms (median)")


def inner(work: str, rounds: int) -> None:
    """The timing loop (inside the private mount namespace podman needs)."""
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "NVSHIM_CONFIG": os.path.join(work, "config.toml"),
        "NVSHIM_CACHE_DIR": os.path.join(work, "cache"),
        "HOME": "/root",
    }
    runtime = os.path.join(work, "bin", "nvshim-runtime")
    rootfs = os.path.join(work, "rootfs")
    wrappers = {}
    for name, target in (("runc", RUNC), ("nvshim", runtime)):
        path = os.path.join(work, f"wrap-{name}")
        with open(path, "w") as fh:
            # podman hands its runtime a clean environment: nvshim's settings go here
            fh.write(
                f"#!/bin/sh\nNVSHIM_CONFIG={env['NVSHIM_CONFIG']}"
                f' NVSHIM_CACHE_DIR={env["NVSHIM_CACHE_DIR"]} exec {target} "$@"\n'
            )
        os.chmod(path, 0o755)
        wrappers[name] = path
    podman = {
        n: podman_command(os.path.join(work, "podman"), runtime=w) for n, w in wrappers.items()
    }
    scratch = "/run/nvshim-bench"  # the namespace's private tmpfs: bundles as containerd keeps them
    state = os.path.join(scratch, "state")
    os.makedirs(state, exist_ok=True)
    pairs = Pairs()
    ystick: list[float] = []
    gpu = {"NVIDIA_VISIBLE_DEVICES": "0"}
    run_opts = ["run", "--rm", "--network", "none", "--ulimit", "nofile=1024:1024"]
    run_opts += ["--ulimit", "nproc=1024:1024", "--rootfs", rootfs]

    def create_once(binary: str, n: str) -> float:
        bundle = make_bundle(scratch, rootfs, ["/bin/true"], env=gpu, name=f"b-{n}")
        cid = f"bench-{os.getpid()}-{n}"
        errors = os.path.join(scratch, "create.err")
        with open(errors, "w") as err:  # a file: the created process keeps its stdio open
            start = time.perf_counter()
            proc = subprocess.run(
                [binary, "--root", state, "create", "--bundle", bundle, cid],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=err,
            )
            elapsed = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(f"{binary} create: {open(errors).read().strip()}")
        subprocess.run([RUNC, "--root", state, "delete", "--force", cid], check=True)
        shutil.rmtree(bundle)
        return elapsed

    for i in range(rounds + 1):
        y = timed([real_interpreter(), "-IS", "-c", "pass"], env)
        bare_list = timed([RUNC, "--root", state, "list"], env)
        our_list = timed([runtime, "--root", state, "list"], env)
        bare_create = create_once(RUNC, f"r{i}")
        our_create = create_once(runtime, f"n{i}")
        bare_pod = timed([*podman["runc"], *run_opts, "/bin/true"], env)
        our_pod = timed([*podman["nvshim"], *run_opts, "/bin/true"], env)
        gpu_pod = timed([*podman["nvshim"], *run_opts[:2], "-e", "NVIDIA_VISIBLE_DEVICES=0",
                         *run_opts[2:], "/bin/true"], env)  # fmt: skip
        if i == 0:
            continue  # warm-up: caches, podman's storage
        ystick.append(y)
        pairs.add("pass-through call (list)", bare_list, our_list)
        pairs.add("create, 1 GPU (runc: no GPU)", bare_create, our_create)
        pairs.add("podman run --rm true, no GPU", bare_pod, our_pod)
        pairs.add("podman run --rm true, 1 GPU", bare_pod, gpu_pod)
    pairs.report(statistics.median(ystick) * 1000)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--inner", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.inner:
        inner(opts.inner, opts.rounds)
        return
    with tempfile.TemporaryDirectory() as work:
        sim = build_host("single", os.path.join(work, "host"))
        bin_dir = os.path.join(work, "bin")
        write_launchers(bin_dir, cache_dir=os.path.join(work, "cache"))
        with open(os.path.join(work, "config.toml"), "w") as fh:
            fh.write(
                f'[host]\ndriver-root = "{sim.driver_root}"\ndev-root = "{sim.dev_root}"\n'
                f'[runtime]\nhook-path = "{bin_dir}/nvshim-hook"\nlog-file = "{work}/log"\n'
                f'state-dir = "{work}/state-nvshim"\n[policy]\naccept-env-unprivileged = true\n'
            )
        make_busybox_rootfs(os.path.join(work, "rootfs"), glibc_loader=False)
        argv = [sys.executable, os.path.abspath(__file__), "--inner", work]
        proc = in_podman_namespace(
            os.path.join(work, "podman"), [*argv, "--rounds", str(opts.rounds)], timeout=3000
        )
        sys.stdout.write(proc.stdout)
        if proc.returncode != 0:
            raise SystemExit(proc.stderr)


if __name__ == "__main__":
    main()
