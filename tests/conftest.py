"""Shared fixtures: simulated hosts (built once per session), isolated launchers, and an
nvshim config pointing at a simulated host."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
    write_launchers(bin_dir)
    return bin_dir


@pytest.fixture
def scratch(tmp_path):
    """A scratch host root for `nvshim node` (tests/node_util.py); installers a failed test
    left running are killed afterwards."""
    from tests.node_util import Scratch, reap_started

    yield Scratch(tmp_path)
    reap_started()


def write_config(path, host, bin_dir: str, state_dir, log_file, **policy) -> str:
    """An nvshim config.toml for ``host`` (a SimHost); extra [policy] keys as kwargs."""
    lines = [
        "[host]",
        f'driver-root = "{host.driver_root}"',
        f'dev-root = "{host.dev_root}"',
        "[runtime]",
        f'log-file = "{log_file}"',
        f'hook-path = "{bin_dir}/nvshim-hook"',
        f'state-dir = "{state_dir}"',
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
