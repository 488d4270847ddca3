"""The per-container path stays lean: what ``nvshim-runtime`` and ``nvshim-hook`` import
when a real runc starts GPU containers through them, and the caches that let them skip
TOML parsing and NVML. (Speed itself is measured in ``bench/runtime_start.py``.)"""

from __future__ import annotations

import os
import stat
import subprocess

import pytest

from nvshim.launch import import_roots, real_interpreter
from tests.conftest import write_config
from tests.podman_util import make_busybox_rootfs
from tests.runc_util import RUNC_ENV, make_bundle, runc_run

# Each costs milliseconds at import (re and enum behind most of them).
HEAVY = (
    "re",
    "enum",
    "typing",
    "dataclasses",
    "inspect",
    "argparse",
    "json",
    "tomllib",
    "shutil",
    "tempfile",
    "contextlib",
    "subprocess",
    "pynvml",
)

_RUNTIME = """#!{python} -IS
import posix, sys
sys.path.extend({roots!r})
real_execv = posix.execv
def execv(path, args):
    with open({out!r}, "a") as fh:
        fh.write(" ".join(sorted(sys.modules)) + "\\n")
    real_execv(path, args)
posix.execv = execv
from nvshim.runtime.main import main
sys.exit(main())
"""

_HOOK = """#!{python} -IS
import sys
sys.path.extend({roots!r})
from nvshim.hook.main import main
code = main()
with open({out!r}, "a") as fh:
    fh.write(" ".join(sorted(sys.modules)) + "\\n")
sys.exit(code)
"""


def _write(path, text: str) -> str:
    path = str(path)
    with open(path, "w") as fh:
        fh.write(text)
    os.chmod(path, 0o755)
    return path


@pytest.fixture
def recording(tmp_path, sim_hosts):
    """Launchers that record the modules loaded when the runtime execs runc and when the
    hook finishes, and a config pointing at them."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    args = {"python": real_interpreter(), "roots": import_roots()}
    runtime = _write(
        bin_dir / "nvshim-runtime", _RUNTIME.format(out=str(tmp_path / "runtime.mods"), **args)
    )
    _write(bin_dir / "nvshim-hook", _HOOK.format(out=str(tmp_path / "hook.mods"), **args))
    config = write_config(
        tmp_path / "config.toml",
        sim_hosts("h100x8-mig"),
        str(bin_dir),
        tmp_path / "state",
        tmp_path / "log",
        accept_env_unprivileged=True,
    )
    return runtime, config


def _modules(path) -> list[set[str]]:
    with open(path) as fh:
        return [set(line.split()) for line in fh]


def test_gpu_create_and_its_hook_import_nothing_heavy(tmp_path, recording):
    runtime, config = recording
    for n in range(2):  # the first run fills the config and inventory caches
        rootfs = make_busybox_rootfs(tmp_path / f"rootfs{n}")
        bundle = make_bundle(
            tmp_path, rootfs, ["true"], env={"NVIDIA_VISIBLE_DEVICES": "0"}, name=f"b{n}"
        )
        run = runc_run(
            bundle, f"hot-{os.getpid()}-{n}", runtime=runtime, env={"NVSHIM_CONFIG": config}
        )
        assert run.returncode == 0, run.stderr
    runtime_mods = _modules(tmp_path / "runtime.mods")
    hook_mods = _modules(tmp_path / "hook.mods")
    assert len(runtime_mods) == 2 and len(hook_mods) == 2
    assert "nvshim.policy.select" in runtime_mods[1]  # it did decide on a GPU request
    assert "nvshim.hook.ldconfig" in hook_mods[1]  # and the hook ran its steps
    for loaded in (runtime_mods[1], hook_mods[1]):
        assert sorted(set(HEAVY) & loaded) == []


def test_passthrough_call_imports_only_the_runtime_package(tmp_path, recording):
    runtime, config = recording
    state = tmp_path / "runc-state"
    state.mkdir()
    env = {"NVSHIM_CONFIG": config}
    for _ in range(2):  # the first call resolves runc and caches it
        assert _runtime_list(runtime, str(state), env).returncode == 0
    loaded = _modules(tmp_path / "runtime.mods")[1]
    nvshim = sorted(m for m in loaded if m.startswith("nvshim"))
    assert nvshim == [
        "nvshim",
        "nvshim.runtime",
        "nvshim.runtime.args",
        "nvshim.runtime.main",
        "nvshim.runtime.passthrough",
        "nvshim.trusted",
    ]
    assert "os" not in loaded and "nvshim.config" not in loaded


def _runtime_list(runtime: str, state: str, env: dict) -> subprocess.CompletedProcess:
    """``<runtime> --root STATE list``: a call nvshim passes straight to runc."""
    return subprocess.run(
        [runtime, "--root", state, "list"],
        env={**RUNC_ENV, **env},
        capture_output=True,
        text=True,
        check=False,
    )


def test_config_cache_follows_the_file_text(tmp_path, monkeypatch):
    """Same size, same second: a rewritten file is still seen (the key is its text)."""
    from nvshim import filecache
    from nvshim.config import load_config

    monkeypatch.setattr(
        filecache, "entry_path", lambda kind, directory=None: str(tmp_path / f"{kind}.json")
    )
    path = tmp_path / "config.toml"
    path.write_text('[host]\ndriver-root = "/aaa"\n')
    assert load_config(str(path)).driver_root == "/aaa"
    assert (tmp_path / "config.json").exists()
    st = os.stat(path)
    path.write_text('[host]\ndriver-root = "/bbb"\n')
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert load_config(str(path)).driver_root == "/bbb"
    assert load_config(str(path)).driver_root == "/bbb"  # from the cache now


def test_untrusted_cache_entries_are_ignored(tmp_path, monkeypatch):
    """An entry others could write (or not ours) is never used."""
    from nvshim import fastjson, filecache

    entry = tmp_path / "entry.json"
    entry.write_text(fastjson.dumps({"key": "k", "value": "forged"}))
    os.chmod(entry, 0o644)
    assert filecache.load(str(entry), "k") == "forged"
    os.chmod(entry, 0o666)
    assert filecache.load(str(entry), "k") is None
    os.chmod(entry, 0o644)
    link = tmp_path / "link.json"
    link.symlink_to(entry)
    assert filecache.load(str(link), "k") is None
    assert filecache.load(str(entry), "other key") is None


def test_passthrough_cache_is_keyed_and_checked(tmp_path, monkeypatch):
    from nvshim.runtime import passthrough

    monkeypatch.setattr(passthrough, "CACHE_DIR", str(tmp_path / "cache"))
    config = tmp_path / "config.toml"
    config.write_text('[runtime]\nruntimes = ["runc"]\n')
    path = str(config)
    runtime, key = passthrough.cached_runtime(path)
    assert runtime is None
    fake = _write(tmp_path / "my-runc", "#!/bin/sh\n")
    passthrough.remember(key, fake)
    entry = passthrough.entry_file()
    assert stat.S_IMODE(os.stat(entry).st_mode) == 0o644
    assert passthrough.cached_runtime(path)[0] == fake
    config.write_text('[runtime]\nruntimes = ["crun"]\n')  # another text: another key
    assert passthrough.cached_runtime(path)[0] is None
    config.write_text('[runtime]\nruntimes = ["runc"]\n')
    os.chmod(fake, 0o644)  # no longer executable: resolved again
    assert passthrough.cached_runtime(path)[0] is None
    os.chmod(fake, 0o755)
    os.chmod(entry, 0o666)  # writable by others: not trusted
    assert passthrough.cached_runtime(path)[0] is None
