"""The configure corpus: realistic engine configs under ``corpus/<case>/`` and helpers.

Each case has ``case.json`` (engine, command-line ``args``, containerd version to assume,
``target`` file), an ``input/`` tree (no ``input/`` or no target in it: the file is missing)
and an ``expected/`` tree holding every file ``configure`` writes, byte for byte.
``{root}`` in args is the case's scratch directory. Set ``NVSHIM_REGEN_CORPUS=1`` to
rewrite the expected trees from the current code (then review the diff).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

CORPUS = Path(__file__).parent / "corpus"
DEFAULT_TARGET = {"containerd": "config.toml", "docker": "daemon.json", "crio": "99-nvshim.toml"}


@dataclass(frozen=True)
class Case:
    name: str
    engine: str
    target: str
    args: tuple[str, ...]
    containerd_version: str | None
    about: str

    @property
    def dir(self) -> Path:
        return CORPUS / self.name

    def materialize(self, root: Path) -> Path:
        """Copy the input tree into ``root``; return the target's path there."""
        root.mkdir(parents=True, exist_ok=True)
        if (self.dir / "input").is_dir():
            shutil.copytree(self.dir / "input", root, dirs_exist_ok=True)
        return root / self.target

    def cli_args(self, root: Path) -> list[str]:
        args = [a.replace("{root}", str(root)) for a in self.args]
        if not any(a.startswith("--cgroup-driver") for a in args):
            args += ["--cgroup-driver", "cgroupfs"]  # not the test machine's own
        return ["--engine", self.engine, "--engine-config", str(root / self.target), *args]

    def expected(self) -> dict[str, bytes]:
        return tree(self.dir / "expected")

    def input(self) -> dict[str, bytes]:
        return tree(self.dir / "input")


def load_cases() -> list[Case]:
    cases = []
    for case_dir in sorted(p for p in CORPUS.iterdir() if (p / "case.json").is_file()):
        meta = json.loads((case_dir / "case.json").read_text())
        cases.append(
            Case(
                name=case_dir.name,
                engine=meta["engine"],
                target=meta.get("target", DEFAULT_TARGET[meta["engine"]]),
                args=tuple(meta.get("args", ())),
                containerd_version=meta.get("containerd_version"),
                about=meta.get("about", ""),
            )
        )
    return cases


def tree(root: Path) -> dict[str, bytes]:
    """Every regular file under ``root`` (relative path -> bytes)."""
    if not root.is_dir():
        return {}
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            out[str(path.relative_to(root))] = path.read_bytes()
    return out


def dirs(root: Path) -> set[str]:
    return {str(Path(d).relative_to(root)) for d, _, _ in os.walk(root) if Path(d) != root}


def clear_engine_env(monkeypatch, containerd_version: str) -> None:
    """Drop every variable `nvshim configure` reads and pin the containerd version."""
    from nvshim.engines.settings import ENV

    for table in ENV.values():
        for names in table.values():
            for name in names:
                monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NVSHIM_CONTAINERD_VERSION", containerd_version)


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """Run the nvshim CLI in-process: (exit code, stdout, stderr)."""
    from nvshim.cli import main

    try:
        main(list(argv))
        code = 0
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def containerd_dump(config) -> str:
    """``containerd --config CONFIG config dump``: the effective config containerd loads."""
    import subprocess

    return subprocess.run(
        ["containerd", "--config", str(config), "config", "dump"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
