"""Shared fixtures: simulated hosts (built once per session), isolated launchers, and an
nvshim config pointing at a simulated host."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile

import pytest

# nvshim's caches (config, runtime, exec markers) go to this session's own directory:
# every process the suite starts inherits it or gets it from tests/runc_util.CACHE_ENV.
CACHE_DIR = os.environ["NVSHIM_CACHE_DIR"] = tempfile.mkdtemp(prefix="nvshim-test-cache-")

from tests.hostguard import HostGuard  # noqa: E402
from tests.k8s.fixtures import k8s, k8s_16, k8s_17, k8s_clusters, k8s_crio, k8s_ns  # noqa: E402, F401

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_GUARD = HostGuard()


def pytest_configure(config):
    """The suite runs in a private mount namespace where the host's nvshim paths are
    empty directories of its own; they must still be empty at the end. SIGHUP is
    restored to its default: the engines the suite starts inherit it, and a suite run
    under nohup would otherwise start a containerd that a signal restart cannot restart."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    _GUARD.enter()


@pytest.fixture(autouse=True)
def _leaves_host_alone():
    """Each test: no host path of nvshim's written (see tests/hostguard.py)."""
    before = set(_GUARD.written())
    yield
    new = sorted(set(_GUARD.written()) - before)
    if new:
        pytest.fail(f"the test wrote host paths: {', '.join(new)}")


def pytest_collection_modifyitems(config, items):
    """A test module may narrow its own parametrization matrix (fewer cells on one engine):
    its ``wanted(item)`` says which items run; the others are deselected, not skipped."""
    kept, dropped = [], []
    for item in items:
        wanted = getattr(getattr(item, "module", None), "wanted", None)
        (kept if wanted is None or wanted(item) else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_sessionfinish(session, exitstatus):
    written = _GUARD.written()
    if written:
        print(f"\nthe suite wrote host paths: {', '.join(written)}", file=sys.stderr)
        session.exitstatus = 1
    import shutil

    shutil.rmtree(CACHE_DIR, ignore_errors=True)


VENV_BIN = os.path.dirname(sys.executable)
NVSHIM = os.path.join(VENV_BIN, "nvshim")
HOSTS = ("single", "h100x8-mig", "a100-mig-1g5gb")


@pytest.fixture(scope="session")
def sim_hosts(tmp_path_factory):
    """``get(name)`` builds (once) and returns the shipped simulated host ``name``."""
    from tests.sim.simhost import build_host

    built = {}

    def get(name: str):
        if name not in built:
            built[name] = build_host(name, str(tmp_path_factory.mktemp(f"sim-{name}")))
        return built[name]

    return get


@pytest.fixture(scope="session")
def launchers(tmp_path_factory) -> str:
    """A bin dir holding the isolated nvshim-runtime and nvshim-hook launchers."""
    from nvshim.launch import write_launchers

    bin_dir = str(tmp_path_factory.mktemp("bin"))
    write_launchers(bin_dir, cache_dir=os.environ["NVSHIM_CACHE_DIR"])
    return bin_dir


@pytest.fixture
def scratch(tmp_path):
    """A scratch host root for `nvshim node` (tests/node_util.py); installers a failed test
    left running are killed afterwards."""
    from tests.node_util import Scratch, reap_started

    yield Scratch(tmp_path)
    reap_started()


def write_config(path, host, bin_dir: str, inventory_dir, log_file, **policy) -> str:
    """An nvshim config.toml for ``host`` (a SimHost); extra [policy] keys as kwargs."""
    lines = [
        "[host]",
        f'driver-root = "{host.driver_root}"',
        f'dev-root = "{host.dev_root}"',
        "[runtime]",
        f'log-file = "{log_file}"',
        f'hook-path = "{bin_dir}/nvshim-hook"',
        f'inventory-dir = "{inventory_dir}"',
        "[policy]",
    ]
    for key, value in policy.items():
        key = key.replace("_", "-")
        if isinstance(value, bool):
            lines.append(f"{key} = {'true' if value else 'false'}")
        else:
            lines.append(f'{key} = "{value}"')
    path = str(path)
    with open(path, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    return path


def run_nvshim(*args: str, env: dict | None = None, check: bool = False, **kw):
    """Run the installed ``nvshim`` console script; text output captured."""
    full_env = {**os.environ, "NVSHIM_CONFIG": os.devnull, **(env or {})}
    return subprocess.run(
        [NVSHIM, *args], capture_output=True, text=True, env=full_env, check=check, **kw
    )


def sh_in_private_mounts(script: str, **env: str) -> subprocess.CompletedProcess:
    """``sh -c script`` in a mount namespace of its own (what it mounts goes with it),
    with ``env`` over this environment and ``NVSHIM_CONFIG=/dev/null``; text output
    captured."""
    return subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        env={**os.environ, "NVSHIM_CONFIG": os.devnull, **env},
    )
