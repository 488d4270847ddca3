#!/usr/bin/env python3
"""What the hand-written stand-ins for the standard library save on a 1-GPU ``create``
(issue 12, item 5): nvshim-runtime as it is, against copies of it in which
``nvshim/record.py`` is ``dataclasses`` and ``nvshim/fastjson.py`` is ``json``. Each
round creates (then deletes, not timed) one container through each, interleaved, so the
VM's drift hits all alike; the figures are medians of each round's difference.

Run as root: ``.venv/bin/python3 bench/stand_ins.py [--rounds N]``. A stand-in stays
only while it saves at least 1 ms per GPU create (its docstring carries the figure).
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

from bench.creates import installed, timed_create  # noqa: E402
from bench.paired import median_added  # noqa: E402
from nvshim.launch import real_interpreter  # noqa: E402
from tests.podman_util import make_busybox_rootfs  # noqa: E402
from tests.runc_util import make_bundle  # noqa: E402
from tests.sim.simhost import build_host  # noqa: E402

# module -> its standard-library twin, same names the callers use
TWINS = {
    "record.py": (
        "from dataclasses import MISSING, FrozenInstanceError, asdict, dataclass, field\n"
        "from dataclasses import fields, replace\n"
        "from dataclasses import is_dataclass as is_record\n\n\n"
        "def record(cls=None, *, frozen=False):\n"
        "    wrap = dataclass(frozen=frozen)\n"
        "    return wrap if cls is None else wrap(cls)\n"
    ),
    "fastjson.py": (
        "import json\n\n\n"
        "def loads(data):\n    return json.loads(data)\n\n\n"
        "def dumps(obj):\n    return json.dumps(obj, separators=(',', ':'))\n"
    ),
}


def variant(work: str, name: str, twin: str | None, sim) -> tuple[str, dict[str, str]]:
    """A copy of the nvshim package (``twin`` swapped for its standard-library twin)
    with its own launchers, config and caches: (nvshim-runtime, env)."""
    root = os.path.join(work, name, "package")
    shutil.copytree(os.path.join(REPO, "nvshim"), os.path.join(root, "nvshim"),
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    if twin:
        with open(os.path.join(root, "nvshim", twin), "w") as fh:
            fh.write(TWINS[twin])
    return installed(work, name, root, sim)


def create_once(work: str, runtime: str, env: dict[str, str], rootfs: str, cid: str) -> float:
    """Wall time of one 1-GPU ``create`` (the container is deleted afterwards)."""
    gpu = {"NVIDIA_VISIBLE_DEVICES": "0"}
    bundle = make_bundle(work, rootfs, ["/bin/true"], env=gpu, name=cid)
    return timed_create(runtime, os.path.join(work, "runc-state"), bundle, cid, env)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as w:
        sim = build_host("single", os.path.join(w, "host"))
        rootfs = make_busybox_rootfs(os.path.join(w, "rootfs"))
        cases = {
            "nvshim as it is": variant(w, "ours", None, sim),
            "record.py -> dataclasses": variant(w, "dataclasses", "record.py", sim),
            "fastjson.py -> json": variant(w, "json", "fastjson.py", sim),
        }
        times: dict[str, list[float]] = {c: [] for c in cases}
        yardstick = []
        for i in range(opts.rounds + 1):
            start = time.perf_counter()
            subprocess.run([real_interpreter(), "-IS", "-c", "pass"], check=True)
            yardstick.append(time.perf_counter() - start)
            for n, (case, (runtime, env)) in enumerate(cases.items()):
                elapsed = create_once(w, runtime, env, rootfs, f"c{n}-{i}")
                if i:  # the first round warms the caches
                    times[case].append(elapsed)
        ours = times["nvshim as it is"]
        print(f"1-GPU create through nvshim-runtime, medians of {opts.rounds} rounds (ms):")
        for case, values in times.items():
            added = median_added(values, ours) * 1000
            print(f"  {case:<26} {statistics.median(values) * 1000:7.1f}  vs ours {added:+6.1f}")
        print(f"yardstick: python3 -IS -c pass {statistics.median(yardstick[1:]) * 1000:.1f} ms")


if __name__ == "__main__":
    main()
