#!/usr/bin/env python3
"""nvshim-runtime against bare runc, every case interleaved with its runc twin in one run
(the VMs drift by 3x between runs, so only ratios from one run mean anything):

- the yardstick: one ``python3 -IS -c pass`` of the interpreter nvshim runs on;
- a pass-through call (``list``): the sh front execs runc, no Python;
- a 1-GPU ``create`` (then ``delete``, not timed) of a busybox bundle, served by
  ``nvshim-runtimed`` (as installed), and done in the client's process (no daemon);
  against runc creating the same container with no GPU, and against runc creating the
  bundle nvshim edited (its 21 mounts and 4 device nodes: runc's own work for the GPU,
  which any injecting runtime adds), which leaves nvshim's own time; and with a
  read-only root (``"root": {"readonly": true}``) against runc's read-only twins;
- ``podman run --rm true`` with no GPU and with 1 GPU (podman 4, vfs storage, in a
  private mount namespace; both runtimes behind the same one-line sh wrapper, which
  podman needs to hand nvshim its config);
- a CRI pod sandbox plus a ``true`` container, created, started and waited for, with no
  GPU and with 1 GPU, through a private containerd 1.6 in which ``nvshim configure``
  registered nvshim as the ``nvshim`` runtime handler beside ``runc``.

``nvshim-runtimed`` runs for every nvshim case but the "no daemon" one, as the package
and the node installer deploy it.

Run as root: ``.venv/bin/python3 bench/engine_start.py [--rounds N]`` (on a simulated
host; ``--driver-root R [--dev-root D]``: on the host's real driver, as the real-GPU kit
runs it). Targets (issue 12):
pass-through <= 1.2x runc; engine level with no GPU <= 1.1x runc; a 1-GPU create adds
<= 2 interpreter starts.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.creates import edited_bundle, running_daemon, timed_create  # noqa: E402
from bench.paired import median_added, median_ratio  # noqa: E402
from nvshim.launch import real_interpreter, write_launchers  # noqa: E402
from tests.cri_util import (  # noqa: E402
    CriClient,
    configure_containerd,
    cri_ready_config,
    cri_session,
    image_archive,
)
from tests.engines.containerd_instance import private_containerd  # noqa: E402
from tests.engines.corpus_cases import CORPUS  # noqa: E402
from tests.podman_util import in_podman_namespace, podman_command  # noqa: E402
from tests.runc_util import make_bundle, make_busybox_rootfs, read_log  # noqa: E402
from tests.sim.simhost import build_host  # noqa: E402

RUNC = shutil.which("runc") or "/usr/sbin/runc"
V16 = CORPUS / "containerd-1.6-default" / "input" / "config.toml"
IMAGE = "nvshim.bench/busybox:cri"
PAUSE = "nvshim.bench/pause:cri"


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
            bares, ourses = [r[0] for r in rows], [r[1] for r in rows]
            added = median_added(ourses, bares) * 1000
            ratio = median_ratio(ourses, bares)
            line = f"{case:<34} {bare:8.1f} {ours:8.1f} {added:+8.1f} {ratio:6.2f}"
            print(f"{line}  = {added / yardstick:+.1f} interpreter starts")
        print(f"yardstick: python3 -IS -c pass {yardstick:.1f} ms (median)")


@contextlib.contextmanager
def cri_client(work: str, env: dict[str, str]):
    """A CRI client on a private containerd with handlers ``runc`` and ``nvshim``."""
    os.environ.update(env)  # containerd -> shim -> nvshim-runtime
    rootfs = os.path.join(work, "rootfs")
    archive = image_archive(rootfs, os.path.join(work, "image.tar"), [IMAGE, PAUSE])
    config = os.path.join(work, "containerd.toml")
    with open(config, "w") as fh:
        fh.write(cri_ready_config(V16.read_text(), os.path.join(work, "cri-scratch"), PAUSE))
    configure_containerd(config, os.path.join(work, "bin", "nvshim-runtime"))
    os.environ.update(env)  # again: configure_containerd loads tests/conftest, which sets its own
    with private_containerd(work, Path(config)) as ctd:
        # containerd runs in a mount namespace of its own here (on a node, the host's):
        # its runtime calls are served by a daemon in that namespace
        ns = f"--mount=/proc/{ctd._proc.pid}/ns/mnt"
        stack = contextlib.ExitStack()
        stack.enter_context(running_daemon(os.path.join(work, "bin"), env, ("nsenter", ns)))
        imported = ctd.ctr("-n", "k8s.io", "images", "import", archive)
        if imported.returncode != 0:
            raise SystemExit(f"ctr images import: {imported.stderr.strip()}")
        with stack, cri_session(ctd.socket, IMAGE) as cri:
            yield cri


def cri_start(
    cri: CriClient, logs: str, handler: str, name: str, env: dict[str, str]
) -> tuple[float, str]:
    """Seconds for a pod sandbox on ``handler`` plus a ``true`` container to run to its end,
    and the container's id (the pod is removed afterwards, not timed)."""
    start = time.perf_counter()
    pod = cri.run_pod(name, logs, handler)
    result = cri.run_container(pod, "main", IMAGE, ["true"], env=env, poll=0.002)
    elapsed = time.perf_counter() - start
    errors = cri.cleanup()
    if result.exit_code != 0 or errors:
        raise SystemExit(f"CRI pod {name} on {handler}: exit {result.exit_code}, {errors}")
    return elapsed, result.container_id


def inner(work: str, rounds: int) -> None:
    """The timing loop (inside the private mount namespace podman needs)."""
    with contextlib.ExitStack() as stack:
        timing_loop(work, rounds, stack)


def timing_loop(work: str, rounds: int, stack: contextlib.ExitStack) -> None:
    """Every case and its runc twin, ``rounds`` times after one warm-up round."""
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "NVSHIM_CONFIG": os.path.join(work, "config.toml"),
        "NVSHIM_CACHE_DIR": os.path.join(work, "cache"),
        "HOME": "/root",
    }
    runtime = os.path.join(work, "bin", "nvshim-runtime")
    stack.enter_context(running_daemon(os.path.join(work, "bin"), env))
    alone = {**env, "NVSHIM_CACHE_DIR": os.path.join(work, "cache-alone")}  # no daemon there
    runtime_alone = os.path.join(work, "bin-alone", "nvshim-runtime")
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
    gpu_ids: list[str] = []
    gpu = {"NVIDIA_VISIBLE_DEVICES": "0"}
    run_opts = ["run", "--rm", "--network", "none", "--ulimit", "nofile=1024:1024"]
    run_opts += ["--ulimit", "nproc=1024:1024", "--rootfs", rootfs]
    cri = stack.enter_context(cri_client(work, {**env, "NVSHIM_CACHE_DIR": f"{work}/cache-cri"}))
    logs = os.path.join(work, "pod-logs")
    os.makedirs(logs, exist_ok=True)

    def made(n: str, edited: bool = False, readonly: bool = False) -> tuple[str, str]:
        """A bundle and its container id; ``edited``: nvshim's edits made in it."""
        bundle = make_bundle(
            scratch, rootfs, ["/bin/true"], env=gpu, name=f"b-{n}", readonly=readonly
        )
        cid = f"bench-{os.getpid()}-{n}"
        if edited:
            edited_bundle(bundle, cid, alone)
        return bundle, cid

    def create_once(binary: str, bundle_cid: tuple[str, str], call_env=env) -> float:
        return timed_create(binary, state, *bundle_cid, call_env)

    for i in range(rounds + 1):
        # the edited bundles first: the edit (a Python process) run right before a timed
        # runc slows that runc by 3 to 5 ms on the 2-core VM
        edited, edited_ro = made(f"e{i}", edited=True), made(f"p{i}", edited=True, readonly=True)
        y = timed([real_interpreter(), "-IS", "-c", "pass"], env)
        bare_list = timed([RUNC, "--root", state, "list"], env)
        our_list = timed([runtime, "--root", state, "list"], env)
        bare_create = create_once(RUNC, made(f"r{i}"))
        our_create = create_once(runtime, made(f"n{i}"))
        edited_create = create_once(RUNC, edited)
        alone_create = create_once(runtime_alone, made(f"a{i}"), call_env=alone)
        bare_ro_create = create_once(RUNC, made(f"q{i}", readonly=True))
        ro_create = create_once(runtime, made(f"o{i}", readonly=True))
        edited_ro_create = create_once(RUNC, edited_ro)
        bare_pod = timed([*podman["runc"], *run_opts, "/bin/true"], env)
        our_pod = timed([*podman["nvshim"], *run_opts, "/bin/true"], env)
        gpu_pod = timed([*podman["nvshim"], *run_opts[:2], "-e", "NVIDIA_VISIBLE_DEVICES=0",
                         *run_opts[2:], "/bin/true"], env)  # fmt: skip
        bare_cri, _ = cri_start(cri, logs, "runc", f"runc-{i}", {})
        our_cri, _ = cri_start(cri, logs, "nvshim", f"nvshim-{i}", {})
        gpu_cri, gpu_id = cri_start(cri, logs, "nvshim", f"gpu-{i}", gpu)
        gpu_ids.append(gpu_id)
        if i == 0:
            continue  # warm-up: caches, podman's storage
        ystick.append(y)
        pairs.add("pass-through call (list)", bare_list, our_list)
        pairs.add("create, 1 GPU (runc: no GPU)", bare_create, our_create)
        pairs.add("create, 1 GPU (runc: same edits)", edited_create, our_create)
        pairs.add("create, 1 GPU, no daemon", bare_create, alone_create)
        pairs.add("create, 1 GPU, read-only root", bare_ro_create, ro_create)
        pairs.add("create, 1 GPU, read-only (same edits)", edited_ro_create, ro_create)
        pairs.add("podman run --rm true, no GPU", bare_pod, our_pod)
        pairs.add("podman run --rm true, 1 GPU", bare_pod, gpu_pod)
        pairs.add("CRI pod + container, no GPU", bare_cri, our_cri)
        pairs.add("CRI pod + container, 1 GPU", bare_cri, gpu_cri)
    given = {r["id"] for r in read_log(os.path.join(work, "log")) if r.get("devices")}
    if not given.issuperset(gpu_ids):
        raise SystemExit("a CRI GPU container got no GPU (see the nvshim log)")
    pairs.report(statistics.median(ystick) * 1000)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--inner", help=argparse.SUPPRESS)
    parser.add_argument("--driver-root", help="a real driver root (default: a simulated host)")
    parser.add_argument("--dev-root", default="/", help="with --driver-root (default /)")
    opts = parser.parse_args()
    if opts.inner:
        inner(opts.inner, opts.rounds)
        return
    with tempfile.TemporaryDirectory() as work:
        if opts.driver_root:  # the real-GPU kit: the host's own driver and devices
            roots = (opts.driver_root, opts.dev_root)
        else:
            sim = build_host("single", os.path.join(work, "host"))
            roots = (sim.driver_root, sim.dev_root)
        bin_dir = os.path.join(work, "bin")
        write_launchers(bin_dir, cache_dir=os.path.join(work, "cache"))
        alone = os.path.join(work, "bin-alone")
        write_launchers(alone, cache_dir=os.path.join(work, "cache-alone"))
        with open(os.path.join(work, "config.toml"), "w") as fh:
            fh.write(
                f'[host]\ndriver-root = "{roots[0]}"\ndev-root = "{roots[1]}"\n'
                f'[runtime]\nhook-path = "{bin_dir}/nvshim-hook"\nlog-file = "{work}/log"\n'
                f'inventory-dir = "{work}/state-nvshim"\n[policy]\naccept-env-unprivileged = true\n'
            )
        rootfs = make_busybox_rootfs(os.path.join(work, "rootfs"), glibc_loader=False)
        if not os.path.lexists(os.path.join(rootfs, "bin", "sleep")):  # the pause image's
            os.symlink("busybox", os.path.join(rootfs, "bin", "sleep"))
        argv = [sys.executable, os.path.abspath(__file__), "--inner", work]
        proc = in_podman_namespace(
            os.path.join(work, "podman"), [*argv, "--rounds", str(opts.rounds)], timeout=3000
        )
        sys.stdout.write(proc.stdout)
        if proc.returncode != 0:
            raise SystemExit(proc.stderr)


if __name__ == "__main__":
    main()
