"""README.md's quick-start demo (tests/demo.sh runs tests.sim.demo) on every shipped simulated
host: it passes, shows each command it runs, writes only into its scratch directory, and
the next commands it suggests run as printed."""

from __future__ import annotations

import os
import shlex
import subprocess

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the simulated host needs mknod")


def quick_start() -> list[str]:
    """README.md's quick-start command that runs the demo, as argv (``bash tests/demo.sh``)."""
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as fh:
        (line,) = [ln for ln in fh if ln.startswith("bash tests/demo.sh")]
    return line.split("#", 1)[0].split()


HOSTS = sorted(n[:-5] for n in os.listdir(f"{REPO}/tests/sim/hosts") if n.endswith(".yaml"))


@pytest.mark.parametrize("host", HOSTS)
def test_demo_on_every_simulated_host(host, tmp_path):
    scratch = tmp_path / "demo"
    env = {k: v for k, v in os.environ.items() if k not in ("NVSHIM_CACHE_DIR", "NVSHIM_CONFIG")}
    proc = subprocess.run(
        [*quick_start(), "--host", host, "--dir", str(scratch)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    assert "$ nvshim cdi generate -o" in out and "$ podman --cdi-spec-dir" in out
    assert f"{scratch}/bin/nvshim-runtime --root" in out  # the runc step's command shown
    assert "(the whole spec:" in out and "cdiVersion: " not in out  # a summary, not the spec
    assert "CUDA_VISIBLE_DEVICES=GPU-" in out or "CUDA_VISIBLE_DEVICES=MIG-" in out
    # the next steps, each run as printed (from the checkout, where .venv/bin is)
    suggested = [ln.strip() for ln in out.split("next, try:\n", 1)[1].splitlines() if ln]
    assert len(suggested) == 4
    for line in suggested:
        words = shlex.split(line)
        variables = dict(w.split("=", 1) for w in words if "=" in w.split("/")[0])
        command = [w for w in words if "=" not in w.split("/")[0]]
        assert command[0] == ".venv/bin/nvshim"
        done = subprocess.run(
            [os.path.join(REPO, command[0]), *command[1:]], cwd=REPO,
            env={**env, **variables}, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode in (0, 1), (line, done.stdout[-2000:], done.stderr[-2000:])
        assert "Traceback" not in done.stderr
        for value in variables.values():
            assert value.startswith(str(scratch) + "/")
