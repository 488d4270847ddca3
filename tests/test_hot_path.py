"""The per-container path stays lean: what ``nvshim-runtime`` and ``nvshim-hook`` import
when a real runc starts GPU containers through them, and the caches that let them skip
TOML parsing and NVML. (Speed itself is measured in ``bench/runtime_start.py``.)"""

from __future__ import annotations

import os

import pytest

from nvshim.launch import import_roots, real_interpreter
from tests.conftest import write_config
from tests.podman_util import make_busybox_rootfs
from tests.runc_util import make_bundle, runc_run

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


def test_config_cache_follows_the_file_text(tmp_path, monkeypatch):
    """Same size, same second: a rewritten file is still seen (the key is its text)."""
    from nvshim import filecache
    from nvshim.config import load_config

    monkeypatch.setattr(
        filecache, "entry_path", lambda kind, directory=None: str(tmp_path / f"{kind}.json")
    )
    path = tmp_path / "config.toml"
    path.write_text('[host]\ndriver-root = "/aaa"\n')
    assert load_config(str(path)).host.driver_root == "/aaa"
    assert (tmp_path / "config.json").exists()
    st = os.stat(path)
    path.write_text('[host]\ndriver-root = "/bbb"\n')
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert load_config(str(path)).host.driver_root == "/bbb"
    assert load_config(str(path)).host.driver_root == "/bbb"  # from the cache now


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
