"""One timed ``create`` through a runtime, as the benches take it."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

RUNC = shutil.which("runc") or "/usr/sbin/runc"


def timed_create(runtime: str, state: str, bundle: str, cid: str, env: dict[str, str]) -> float:
    """Wall time of ``runtime create`` of ``bundle`` with a pid file, as engines call it.
    The container is then deleted with runc and the bundle removed (not timed)."""
    errors = os.path.join(os.path.dirname(bundle), f"{cid}.err")
    with open(errors, "w") as err:  # a file: the created process keeps its stdio open
        start = time.perf_counter()
        proc = subprocess.run(
            [runtime, "--root", state, "create", "--pid-file", os.path.join(bundle, "pid"),
             "--bundle", bundle, cid],
            env=env, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
        )  # fmt: skip
        elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{runtime} create: {open(errors).read().strip()}")
    os.unlink(errors)
    subprocess.run([RUNC, "--root", state, "delete", "--force", cid], check=True)
    shutil.rmtree(bundle)
    return elapsed
