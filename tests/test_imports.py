"""The import contract (``.ci/imports.py``, issue 30): nvshim's modules import only within
their layer or below, lazy imports included, and form no circle; a breach is named."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.conftest import REPO

SCRIPT = os.path.join(REPO, ".ci", "imports.py")


def _check(root=None) -> subprocess.CompletedProcess:
    args = [sys.executable, "-I", SCRIPT, *([str(root)] if root else [])]
    return subprocess.run(args, capture_output=True, text=True, cwd=REPO, timeout=60)


def _package(root, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / "nvshim" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_nvshim_keeps_its_import_contract():
    run = _check()
    assert run.returncode == 0, run.stderr
    assert run.stderr == ""
    assert " 0 circles, 0 problems, 1 named exception(s)" in run.stdout


def test_the_check_names_each_breach(tmp_path):
    _package(
        tmp_path,
        {
            "__init__.py": "",
            "cli/__init__.py": "",
            "cli/main.py": "from nvshim import errors\n",  # down: fine
            # up a layer, lazily: base -> commands
            "errors.py": "def f():\n    from nvshim.cli import __name__\n",
            "record.py": "from nvshim import log\n",  # a circle within one layer
            "log.py": "import nvshim.record\n",
            "newthing.py": "",  # placed nowhere
        },
    )
    run = _check(tmp_path / "nvshim")
    assert run.returncode == 1
    lines = run.stderr.splitlines()
    assert "nvshim.newthing: in no layer (add it to LAYERS in .ci/imports.py)" in lines
    assert any(
        line.endswith(
            "errors.py:2: nvshim.errors (base) imports nvshim.cli (commands), a layer above"
        )
        for line in lines
    ), lines
    assert "import circle: nvshim.log -> nvshim.record -> nvshim.log" in lines
    # the named exception no longer occurs here: the list stays honest
    assert (
        "exception nvshim.runtime.daemon -> nvshim.runtimed.main: no longer occurs, remove it"
        in lines
    )
    assert len(lines) == 4, lines


def test_relative_imports_count(tmp_path):
    _package(
        tmp_path,
        {
            "__init__.py": "",
            "runtime/__init__.py": "",
            "runtime/daemon.py": "from ..runtimed.main import main\n",  # the exception
            "runtimed/__init__.py": "",
            "runtimed/main.py": "def main():\n    pass\n",
            "hook/__init__.py": "",
            "hook/steps.py": "from .. import runtime\n",  # up: hook steps -> runtime
        },
    )
    run = _check(tmp_path / "nvshim")
    assert run.returncode == 1
    assert run.stderr.splitlines() == [
        "nvshim/hook/steps.py:1: nvshim.hook.steps (nvshim-hook's steps) imports"
        " nvshim.runtime (nvshim-runtime), a layer above"
    ], run.stderr


def test_the_documented_command_runs_as_written():
    """docs/development.md runs the check as ``python3 .ci/imports.py`` and shows its
    summary line: the same command prints that line (the counts as they are today)."""
    with open(os.path.join(REPO, "docs", "development.md"), encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    at = lines.index("python3 .ci/imports.py")
    shown = lines[at + 1].removeprefix("# ")
    run = subprocess.run(lines[at].split(), capture_output=True, text=True, cwd=REPO, timeout=60)
    assert run.returncode == 0, run.stderr

    def shape(text: str) -> str:
        return re.sub(r"\d+", "N", text.strip())

    assert shape(run.stdout) == shape(shown)
    assert " 0 circles, 0 problems" in run.stdout


def test_a_launcher_written_before_the_move_still_starts_nvshim_runtimed(tmp_path):
    """The contract's one exception earns its place: a launcher an older ``nvshim
    install`` wrote (naming ``nvshim.runtime.daemon``) runs today's nvshim-runtimed."""
    from nvshim.launch import LAUNCHERS, launcher_text

    assert LAUNCHERS["nvshim-runtimed"] == "nvshim.runtimed.main"
    outputs = []
    for module in ("nvshim.runtime.daemon", LAUNCHERS["nvshim-runtimed"]):
        path = tmp_path / module
        path.write_text(launcher_text(module))
        path.chmod(0o755)
        run = subprocess.run(
            [str(path), "--version"], capture_output=True, text=True, env={}, timeout=60
        )
        assert run.returncode == 0, run.stderr
        outputs.append(run.stdout)
    assert outputs[0] == outputs[1] and outputs[0].startswith("nvshim-runtimed version ")
