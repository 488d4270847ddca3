"""Helpers for `nvshim node` tests: a scratch host root holding a simulated GPU host and an
engine config, the installer run as a process with only the variables a test gives, and
snapshots of a tree to prove what changed (or that nothing did)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
from pathlib import Path

from tests.conftest import NVSHIM
from tests.engines.corpus_cases import CORPUS

CONTAINERD_16 = CORPUS / "containerd-1.6-default" / "input" / "config.toml"
SIM_DIR = "/sim"  # where the simulated host lives inside the scratch host root


class Scratch:
    """A scratch host root: ``root`` / etc/containerd/config.toml (containerd 1.6's
    default) and a simulated host at ``root``/sim."""

    def __init__(self, tmp_path: Path, sim_name: str = "single", extra_files=None) -> None:
        from tests.sim.simhost import build_host

        self.root = tmp_path / "host"
        self.config = self.root / "etc/containerd/config.toml"
        self.config.parent.mkdir(parents=True)
        self.original = CONTAINERD_16.read_bytes()
        self.config.write_bytes(self.original)
        self.sim = build_host(
            sim_name, str(self.root / SIM_DIR.lstrip("/")), extra_files=extra_files
        )
        self.ready = tmp_path / "ready"

    def env(self, **extra: str) -> dict[str, str]:
        """The installer's environment: the scratch root, the sim host, no restart."""
        base = {
            "RUNTIME": "containerd",
            "HOST_ROOT_MOUNT": str(self.root),
            "NVIDIA_DRIVER_ROOT": SIM_DIR,
            "NVIDIA_DEV_ROOT": SIM_DIR,
            "RUNTIME_RESTART_MODE": "none",
            "NVSHIM_CONTAINERD_VERSION": "1.6.20",
            "NVSHIM_READY_FILE": str(self.ready),
        }
        return {**base, **extra}

    def path(self, host_path: str) -> Path:
        """A host path inside the scratch root."""
        return self.root / host_path.lstrip("/")

    def snapshot(self) -> dict[str, str]:
        """Every entry of the root except the sim host: path -> content hash or kind."""
        return snapshot(self.root, skip=self.root / SIM_DIR.lstrip("/"))


def snapshot(root: Path, skip: Path | None = None) -> dict[str, str]:
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        if skip is not None and Path(dirpath) == skip.parent:
            dirnames[:] = [d for d in dirnames if Path(dirpath, d) != skip]
        for name in dirnames:
            out[os.path.relpath(os.path.join(dirpath, name), root)] = "dir"
        for name in filenames:
            full = os.path.join(dirpath, name)
            if os.path.islink(full) or not os.path.isfile(full):
                out[os.path.relpath(full, root)] = "special"
                continue
            with open(full, "rb") as fh:
                out[os.path.relpath(full, root)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def clean_env(extra: dict[str, str]) -> dict[str, str]:
    """PATH and the test's variables only (no GPU Operator variable leaks in)."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "NVSHIM_CONFIG": os.devnull, **extra}


def node(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``nvshim node ARGS`` to completion."""
    return subprocess.run(
        [NVSHIM, "node", *args], env=clean_env(env), capture_output=True, text=True, timeout=timeout
    )


STARTED: list[subprocess.Popen] = []


def reap_started() -> None:
    """Kill every installer :func:`start_node` started that still runs (a failed test's)."""
    for proc in STARTED:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    STARTED.clear()


def start_node(env: dict[str, str], log: Path, nvshim: str = NVSHIM) -> subprocess.Popen:
    """Start ``nvshim node run`` (``nvshim``: another build's command, such as a
    bundle's) in the background, its output going to ``log``."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [nvshim, "node", "run"],
            env=clean_env(env),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    STARTED.append(proc)
    return proc


def wait_for(predicate, timeout: float = 60.0, proc: subprocess.Popen | None = None, log=None):
    """Wait until ``predicate()`` is true; fail early when ``proc`` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            text = Path(log).read_text() if log else ""
            raise AssertionError(f"installer exited ({proc.returncode}) before that:\n{text}")
        time.sleep(0.05)
    text = Path(log).read_text() if log else ""
    raise AssertionError(f"timed out waiting:\n{text}")
