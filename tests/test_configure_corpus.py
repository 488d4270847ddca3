"""`nvshim configure`/`unconfigure` over the corpus of real-world engine configs.

For every case: the exact expected output, a second run that changes nothing, an
``unconfigure`` that gives the original bytes back, comments kept, and ``--dry-run`` that
writes nothing. Configured containerd files are checked by containerd itself.
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
from pathlib import Path

import pytest

from nvshim.cli import main
from nvshim.engines.settings import ENV
from tests.engines.corpus_cases import Case, containerd_dump, dirs, load_cases, tree

CASES = load_cases()
REGEN = os.environ.get("NVSHIM_REGEN_CORPUS") == "1"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for table in ENV.values():
        for names in table.values():
            for name in names:
                monkeypatch.delenv(name, raising=False)


def run(capsys, *argv: str) -> str:
    main(list(argv))
    return capsys.readouterr().out


def configure(case: Case, root: Path, capsys, monkeypatch, *extra: str) -> str:
    if case.containerd_version:
        monkeypatch.setenv("NVSHIM_CONTAINERD_VERSION", case.containerd_version)
    return run(capsys, "configure", *case.cli_args(root), *extra)


def unconfigure(case: Case, root: Path, capsys, *extra: str) -> str:
    return run(capsys, "unconfigure", *unconfigure_args(case.cli_args(root)), *extra)


def unconfigure_args(args: list[str]) -> list[str]:
    """``args`` without configure's own options (unconfigure refuses them)."""
    from nvshim.cli.configure import unconfigure as command

    takes_value = {o: not p.is_flag for p in command.params for o in p.opts + p.secondary_opts}
    kept, rest = [], list(args)
    while rest:
        arg = rest.pop(0)
        name = arg.split("=", 1)[0]
        value = [] if "=" in arg or name not in takes_value or not takes_value[name] else [rest[0]]
        if name not in takes_value:  # configure's: drop its value too, when it has one
            if "=" not in arg and rest and not rest[0].startswith("--"):
                rest.pop(0)
            continue
        kept.append(arg)
        kept += value
        del rest[: len(value)]
    return kept


def written(case: Case, root: Path) -> dict[str, bytes]:
    """The files configure is expected to write, as they are under ``root`` now (the
    scratch path written as ``{root}``)."""
    return {
        rel: (root / rel).read_bytes().replace(str(root).encode(), b"{root}")
        for rel in case.expected()
        if (root / rel).exists()
    }


def sidecar(name: str) -> bool:
    return ".nvshim." in name


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_configure_writes_expected_bytes(case, tmp_path, capsys, monkeypatch):
    root = tmp_path / "root"
    case.materialize(root)
    out = configure(case, root, capsys, monkeypatch)
    if REGEN:
        shutil.rmtree(case.dir / "expected", ignore_errors=True)
        for rel, data in tree(root).items():
            if not sidecar(rel) and case.input().get(rel) != data:
                (case.dir / "expected" / rel).parent.mkdir(parents=True, exist_ok=True)
                (case.dir / "expected" / rel).write_bytes(
                    data.replace(str(root).encode(), b"{root}")
                )
    expected = case.expected()
    assert expected, "case has no expected output"
    assert written(case, root) == expected
    # Nothing else changed: other input files are untouched, only sidecars were added.
    after = {k: v for k, v in tree(root).items() if not sidecar(k)}
    assert after.keys() == {**case.input(), **expected}.keys()
    assert all(after[k] == v for k, v in case.input().items() if k not in expected)
    assert "runtime 'nvshim' -> /usr/bin/nvshim-runtime" in out
    # The original is kept beside an existing file, byte for byte.
    for rel, original in case.input().items():
        if rel in expected:
            backups = [k for k in tree(root) if k.endswith(".nvshim.bak")]
            assert any(tree(root)[b] == original for b in backups), backups


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_second_identical_run_changes_nothing(case, tmp_path, capsys, monkeypatch):
    root = tmp_path / "root"
    case.materialize(root)
    configure(case, root, capsys, monkeypatch)
    before = tree(root)
    out = configure(case, root, capsys, monkeypatch)
    assert tree(root) == before
    assert out.splitlines()[-1].startswith("no change:")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_unconfigure_gives_back_the_original_bytes(case, tmp_path, capsys, monkeypatch):
    root = tmp_path / "root"
    case.materialize(root)
    dirs_before = dirs(root)
    configure(case, root, capsys, monkeypatch)
    out = unconfigure(case, root, capsys)
    assert tree(root) == case.input()  # no sidecar left either
    assert dirs(root) == dirs_before  # directories nvshim made are gone again
    assert "restored the original" in out or "removed (nvshim made it)" in out


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_dry_run_prints_a_diff_and_writes_nothing(case, tmp_path, capsys, monkeypatch):
    root = tmp_path / "root"
    case.materialize(root)
    out = configure(case, root, capsys, monkeypatch, "--dry-run")
    assert tree(root) == case.input()
    assert dirs(root) == dirs(case.dir / "input")
    target = str(root / case.target)
    assert f"+++ {target}" in out
    assert "dry run: nothing written" in out
    assert not [ln for ln in out.splitlines() if "warning:" in ln]  # stderr's, never the diff's
    # The diff adds exactly the lines of the expected output that the input lacks.
    added = [ln[1:] for ln in out.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    expected_lines = {
        line
        for data in case.expected().values()
        for line in data.decode().replace("{root}", str(root)).splitlines()
    }
    assert added and all(line in expected_lines for line in added)


def _comments(text: str) -> list[str]:
    return re.findall(r"#.*", text)


@pytest.mark.parametrize(
    "case", [c for c in CASES if c.input()], ids=[c.name for c in CASES if c.input()]
)
def test_comments_and_other_lines_are_kept_in_order(case, tmp_path, capsys, monkeypatch):
    root = tmp_path / "root"
    case.materialize(root)
    configure(case, root, capsys, monkeypatch)
    for rel, original in case.input().items():
        if case.engine == "docker":
            continue  # JSON has no comments; key order is checked by the expected bytes
        before = original.decode().splitlines()
        after = (root / rel).read_text().splitlines()
        # Lines are only added, except values nvshim sets in place.
        matcher = difflib.SequenceMatcher(None, before, after, autojunk=False)
        for tag, i1, i2, _, _ in matcher.get_opcodes():
            assert tag != "delete", before[i1:i2]
            if tag == "replace":
                assert all(
                    re.match(r"\s*(default_runtime_name|enable_cdi|imports)\s*=", ln)
                    for ln in before[i1:i2]
                ), before[i1:i2]
        assert _comments(original.decode()) == [
            c for c in _comments((root / rel).read_text()) if c in _comments(original.decode())
        ]


CONTAINERD_V2 = [c for c in CASES if c.engine == "containerd" and c.containerd_version < "2"]


@pytest.mark.skipif(shutil.which("containerd") is None, reason="containerd not installed")
@pytest.mark.parametrize("case", CONTAINERD_V2, ids=[c.name for c in CONTAINERD_V2])
def test_containerd_accepts_configured_file(case, tmp_path, capsys, monkeypatch):
    root = tmp_path / "root"
    case.materialize(root)
    configure(case, root, capsys, monkeypatch)
    target = root / case.target
    if case.target.endswith(".tmpl"):  # what k3s renders: the base, then the template's rest
        base = (root / case.target.removesuffix(".tmpl")).read_text()
        target = root / "rendered.toml"
        target.write_text((root / case.target).read_text().replace('{{ template "base" . }}', base))
    dump = containerd_dump(target)
    section = re.search(
        r'\[plugins\."io\.containerd\.grpc\.v1\.cri"\.containerd\.runtimes\.nvshim\]'
        r"(.*?)\[plugins\.\"io\.containerd\.grpc\.v1\.cri\"\.containerd\.runtimes\.nvshim\.options\]"
        r"(.*?)\n\n",
        dump,
        re.S,
    )
    assert section, dump
    assert 'runtime_type = "io.containerd.runc.v2"' in section.group(1)
    assert 'BinaryName = "/usr/bin/nvshim-runtime"' in section.group(2)
    if "--set-as-default" in case.args:
        assert 'default_runtime_name = "nvshim"' in dump
