#!/usr/bin/env python3
"""What the hand-written stand-ins save per interpreter start: ``import dataclasses`` vs
``import nvshim.record`` and ``import json`` vs ``import nvshim.fastjson``, each paired
with ``python3 -IS -c pass`` round by round (the runtime and the hook run ``-IS``).

Run: ``.venv/bin/python3 bench/import_cost.py [--rounds N]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from nvshim.launch import real_interpreter  # noqa: E402

ON_PATH = f"import sys; sys.path.insert(0, {REPO!r}); "
CASES = {
    "pass": "pass",
    "import dataclasses": "import dataclasses",
    "import nvshim.record": ON_PATH + "import nvshim.record",
    "import json": "import json",
    "import nvshim.fastjson": ON_PATH + "import nvshim.fastjson",
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=40)
    opts = parser.parse_args()
    python = real_interpreter()
    times: dict[str, list[float]] = {case: [] for case in CASES}
    for _ in range(opts.rounds):
        for case, code in CASES.items():
            start = time.perf_counter()
            subprocess.run([python, "-IS", "-c", code], check=True)
            times[case].append(time.perf_counter() - start)
    base = times["pass"]
    print(f"python3 -IS -c pass: {statistics.median(base) * 1000:.1f} ms")
    for case, values in times.items():
        if case != "pass":
            added = statistics.median(v - b for v, b in zip(values, base, strict=True)) * 1000
            print(f"{case:<24} {added:+6.1f} ms over pass")


if __name__ == "__main__":
    main()
