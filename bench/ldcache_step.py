#!/usr/bin/env python3
"""The ld-cache step's cost in the process that runs it (nvshim-runtime's create, a
daemon worker, the hook): this tree against another one, paired round by round. Each
round runs ``update_ldcache`` on fresh copies of a busybox image with a glibc loader,
``--image-libs`` libraries of its own in ``/usr/lib/x86_64-linux-gnu`` and the ld cache
the host ldconfig made for them, and a driver library its cache does not reach
(bind-mounted from one host file, as runc mounts it, with the links create-symlinks
makes), in a private mount namespace, in one interpreter per
tree holding what a daemon worker holds (``nvshim.runtimed.server.preload``, and an fd
for each of the slots' FIFOs); it reports the wall time of the step and the CPU it
costs, the caller's (``RUSAGE_SELF``: a fork's page-table copy lands here) and its
children's (ldconfig, and a forked child's copy-on-write faults), and which wrote the
cache.

Run as root: ``.venv/bin/python3 bench/ldcache_step.py --previous DIR [--rounds R]
[--image-libs N] [--work-dir DIR]`` (``--previous``: a tree holding an earlier nvshim
package, e.g. from ``git archive``; ``--work-dir``: where the roots are made, by default
``/dev/shm``; a node's container roots are on its disk, where a write's fsync costs).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIB = "/usr/lib/x86_64-linux-gnu"
CALLS = 15  # per round and tree


def inner(tree: str, image_libs: int, base: str) -> None:
    """In a private mount namespace: CALLS ld-cache steps of ``tree``'s nvshim; one JSON
    line of per-call medians (ms) and the writer."""
    sys.path[:0] = [tree, REPO]
    from nvshim.hook.ldconfig import open_host_ldconfig, update_ldcache
    from nvshim.rootfs.fsroot import RootFS
    from nvshim.runtime.slots import SLOTS
    from nvshim.runtimed.server import preload
    from tests.podman_util import make_busybox_rootfs
    from tests.runc_util import build_stub_library

    preload()  # what a daemon worker holds: a fork copies the page tables of all of it
    # and the fds it inherits (two FIFOs a slot)
    held = [os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC) for _ in range(2 * SLOTS)]
    work = tempfile.mkdtemp(dir=base)
    try:
        golden = make_busybox_rootfs(os.path.join(work, "golden"))
        image_library(golden, work, image_libs)
        driver = build_stub_library(os.path.join(work, "libcuda.so.550.90.12"), "libcuda.so.1")
        open(os.path.join(golden + LIB, "libcuda.so.550.90.12"), "w").close()
        os.symlink("libcuda.so.550.90.12", os.path.join(golden + LIB, "libcuda.so.1"))
        os.symlink("libcuda.so.1", os.path.join(golden + LIB, "libcuda.so"))
        wall, own, kids, writers = [], [], [], set()
        for i in range(CALLS + 1):
            root = os.path.join(work, f"root{i}")
            shutil.copytree(golden, root, symlinks=True)
            target = os.path.join(root + LIB, "libcuda.so.550.90.12")
            subprocess.run(["mount", "--bind", "-o", "ro", driver, target], check=True)
            fd = open_host_ldconfig()
            with RootFS(root) as fs:
                s0, k0 = (resource.getrusage(w) for w in (resource.RUSAGE_SELF,
                                                         resource.RUSAGE_CHILDREN))  # fmt: skip
                t0 = time.perf_counter()
                fields = update_ldcache(fs, [LIB], fd)
                t1 = time.perf_counter()
                s1, k1 = (resource.getrusage(w) for w in (resource.RUSAGE_SELF,
                                                         resource.RUSAGE_CHILDREN))  # fmt: skip
            os.close(fd)
            if fields.get("ldcache") != "updated":
                raise SystemExit(f"{tree}: the cache was not updated: {fields}")
            writers.add(str(fields.get("writer", "ldconfig")))
            if i:  # the first call warms the imports
                wall.append((t1 - t0) * 1000)
                own.append((s1.ru_utime + s1.ru_stime - s0.ru_utime - s0.ru_stime) * 1000)
                kids.append((k1.ru_utime + k1.ru_stime - k0.ru_utime - k0.ru_stime) * 1000)
            subprocess.run(["umount", target], check=True)
            shutil.rmtree(root)
        print(json.dumps([*(statistics.median(v) for v in (wall, own, kids)),
                          ",".join(sorted(writers))]))  # fmt: skip
    finally:
        for fd in held:
            os.close(fd)
        shutil.rmtree(work, ignore_errors=True)


def image_library(root: str, work: str, count: int) -> None:
    """``count`` libraries of the image's own in LIB (one compiled stub, its SONAME
    patched), and the cache the host ldconfig makes for the image."""
    from tests.runc_util import build_stub_library

    template = "libimageQQQQQQ.so.1"
    stub = build_stub_library(os.path.join(work, "template.so"), template)
    with open(stub, "rb") as fh:
        data = fh.read()
    os.makedirs(root + LIB, exist_ok=True)
    for i in range(count):
        name = f"libimage{i:06d}.so.1"
        with open(os.path.join(root + LIB, name), "wb") as fh:
            fh.write(data.replace(template.encode(), name.encode()))
    subprocess.run(["ldconfig", "-r", root], check=True)


def run_tree(tree: str, image_libs: int, base: str) -> list:
    proc = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", sys.executable, __file__,
         "--inner", tree, "--image-libs", str(image_libs), "--work-dir", base],
        capture_output=True, text=True,
    )  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"{tree}: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--previous", help="a tree holding an earlier nvshim (required)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--image-libs", type=int, default=100)
    parser.add_argument("--work-dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None,
                        help="where the roots are made (default /dev/shm)")  # fmt: skip
    parser.add_argument("--inner", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.inner:
        inner(opts.inner, opts.image_libs, opts.work_dir)
        return
    if not opts.previous:
        parser.error("--previous DIR is required")
    trees = {"this tree": REPO, "previous": os.path.abspath(opts.previous)}
    figures: dict[str, list[list]] = {name: [] for name in trees}
    for _ in range(opts.rounds):
        for name, tree in trees.items():
            figures[name].append(run_tree(tree, opts.image_libs, opts.work_dir))
    where = opts.work_dir or tempfile.gettempdir()
    print(f"ld-cache step, an image of {opts.image_libs} libraries and its cache, roots in "
          f"{where}, {opts.rounds} rounds of {CALLS} calls (ms, medians of the rounds' "
          "medians):")  # fmt: skip
    for name, rows in figures.items():
        wall, own, kids = (statistics.median(r[j] for r in rows) for j in range(3))
        writer = ",".join(sorted({r[3] for r in rows}))
        print(f"  {name:<10} wall {wall:5.2f}  CPU: caller {own:5.2f} + children {kids:5.2f}"
              f" = {own + kids:5.2f}  (written by {writer})")  # fmt: skip
    wall = [a[0] / b[0] for a, b in zip(figures["this tree"], figures["previous"], strict=True)]
    print(f"  wall, this tree / previous, per round: {', '.join(f'{r:.2f}' for r in wall)}")


if __name__ == "__main__":
    main()
