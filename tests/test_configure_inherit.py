"""`nvshim configure` inheriting the default runtime like the reference, without its
losses: imports, `--config-source command`, the override JSON (and the installer's env
names), CRI-O's full copy, and taking over (then giving back) a reference `nvidia` entry.
The byte-exact corpus cases (v1 types, legacy settings, new files, k3s templates) are in
tests/engines/corpus and run by test_configure_corpus.py."""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

import pytest

from tests.engines.corpus_cases import CORPUS, clear_engine_env, containerd_dump, run_cli, tree

V16 = (CORPUS / "containerd-1.6-default" / "input" / "config.toml").read_text()
RUNTIMES = ("plugins", "io.containerd.grpc.v1.cri", "containerd", "runtimes")
HAS_CONTAINERD = shutil.which("containerd") is not None


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    clear_engine_env(monkeypatch, "1.6.20")


def ctd(path: Path, *extra: str) -> list[str]:
    return [
        "--engine",
        "containerd",
        "--engine-config",
        str(path),
        "--cgroup-driver",
        "cgroupfs",
        *extra,
    ]


def runtime(path: Path, name: str = "nvshim") -> dict:
    table = tomllib.loads(path.read_text())
    for key in RUNTIMES:
        table = table[key]
    return table[name]


def default_runtime(tmp_path: Path, name: str, kind: str, options: str) -> Path:
    """A config v2 whose default runtime ``name`` has type ``kind`` and ``options``
    (TOML lines of its options table, then any further tables)."""
    config = tmp_path / "config.toml"
    cri = '[plugins."io.containerd.grpc.v1.cri".containerd'
    config.write_text(
        f'version = 2\n{cri}]\n  default_runtime_name = "{name}"\n'
        f'{cri}.runtimes.{name}]\n  runtime_type = "{kind}"\n'
        f"{cri}.runtimes.{name}.options]\n{options}"
    )
    return config


def one_error_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("nvshim: error: "), err
    return lines[0]


def test_an_import_holding_the_cri_table_is_refused_before_containerd_2_1(tmp_path, capsys):
    config = tmp_path / "config.toml"
    config.write_text(f'version = 2\nimports = ["{tmp_path}/conf.d/*.toml"]\n')
    (tmp_path / "conf.d").mkdir()
    dropin = tmp_path / "conf.d" / "99-nvidia.toml"
    dropin.write_text(V16)  # the reference's --drop-in-config: a whole copy of the CRI table
    before = tree(tmp_path)
    code, _, err = run_cli(capsys, "configure", *ctd(config))
    assert code == 1
    assert one_error_line(err) == (
        f"nvshim: error: {dropin} (imported by {config}) holds the "
        'plugins."io.containerd.grpc.v1.cri" table, which replaces the main file\'s whole '
        f"before containerd 2.1: configure that file instead (--engine-config {dropin})"
    )
    assert tree(tmp_path) == before
    # as told: the drop-in gets the runtime, with the options of its runc
    code, _, err = run_cli(capsys, "configure", *ctd(dropin))
    assert code == 0, err
    assert runtime(dropin)["options"]["BinaryName"] == "/usr/bin/nvshim-runtime"
    if HAS_CONTAINERD:
        assert "runtimes.nvshim]" in containerd_dump(config)


def test_override_json_from_option_or_installer_env(tmp_path, capsys, monkeypatch):
    config = tmp_path / "config.toml"
    config.write_text(V16)
    monkeypatch.setenv("CONTAINERD_RUNTIME_CONFIG_OVERRIDE", '{"SystemdCgroup": true}')
    code, _, err = run_cli(capsys, "configure", *ctd(config))
    assert code == 0, err
    options = runtime(config)["options"]
    assert options["SystemdCgroup"] is True  # the copied runc said false
    assert options["BinaryName"] == "/usr/bin/nvshim-runtime"
    run_cli(capsys, "unconfigure", *ctd(config))
    assert config.read_text() == V16
    monkeypatch.delenv("CONTAINERD_RUNTIME_CONFIG_OVERRIDE")
    code, _, err = run_cli(
        capsys,
        "configure",
        *ctd(config, "--runtime-config-override", '{"BinaryName": "/x", "ShimCgroup": "/s"}'),
    )
    assert code == 0, err
    options = runtime(config)["options"]
    assert (options["BinaryName"], options["ShimCgroup"]) == ("/usr/bin/nvshim-runtime", "/s")


@pytest.mark.parametrize(
    "value, words",
    [("{nope", "not JSON"), ("[1]", "must be a JSON object, got list")],
)
def test_bad_override_is_one_line_and_changes_nothing(tmp_path, capsys, monkeypatch, value, words):
    config = tmp_path / "config.toml"
    config.write_text(V16)
    code, _, err = run_cli(capsys, "configure", *ctd(config, "--runtime-config-override", value))
    assert code == 2
    line = one_error_line(err)
    assert "--runtime-config-override" in line and words in line
    monkeypatch.setenv("RUNTIME_CONFIG_OVERRIDE", value)
    code, _, err = run_cli(capsys, "configure", *ctd(config))
    assert code == 2 and "RUNTIME_CONFIG_OVERRIDE" in one_error_line(err)
    assert config.read_text() == V16
    assert tree(tmp_path) == {"config.toml": V16.encode()}


@pytest.mark.skipif(not HAS_CONTAINERD, reason="containerd not installed")
def test_config_source_command_reads_containerd_config_containerd_dump(
    tmp_path, capsys, monkeypatch
):
    config = tmp_path / "config.toml"
    # runc's options exist only in the effective config: containerd adds its defaults
    config.write_text(
        'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]\n'
        "  SystemdCgroup = true\n"
    )
    code, _, err = run_cli(capsys, "configure", *ctd(config, "--config-source", "command,file"))
    assert code == 0, err
    options = runtime(config)["options"]
    assert options["SystemdCgroup"] is True
    assert "runtime_engine" in runtime(config)  # a key only `containerd config dump` shows
    assert "runtimes.nvshim]" in containerd_dump(config)
    run_cli(capsys, "unconfigure", *ctd(config))
    # containerd not runnable: the file is read instead (the installer's default order)
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))
    monkeypatch.setenv("RUNTIME_CONFIG_SOURCES", "command,file")
    code, _, err = run_cli(capsys, "configure", *ctd(config))
    assert code == 0, err
    assert runtime(config)["options"] == {
        "BinaryName": "/usr/bin/nvshim-runtime",
        "SystemdCgroup": True,
    }


def test_bad_config_source_is_one_line(tmp_path, capsys):
    config = tmp_path / "config.toml"
    code, _, err = run_cli(capsys, "configure", *ctd(config, "--config-source", "dump"))
    assert code == 2
    assert "--config-source 'dump': expected a list of command and file" in one_error_line(err)
    assert not config.exists()


def test_a_default_runtime_of_another_type_is_copied_with_a_warning(tmp_path, capsys):
    config = default_runtime(tmp_path, "kata", "io.containerd.kata.v2",
                             '  ConfigPath = "/etc/kata/configuration.toml"\n')  # fmt: skip
    code, out, err = run_cli(capsys, "configure", *ctd(config))
    assert code == 0, err
    assert "nvshim: warning: the default runtime's type is io.containerd.kata.v2" in err
    assert "warning" not in out
    assert runtime(config)["options"]["ConfigPath"] == "/etc/kata/configuration.toml"


REFERENCE = V16.replace(
    '      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes]\n',
    '      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes]\n\n'
    '        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]\n'
    '          runtime_type = "io.containerd.runc.v2"\n'
    "          privileged_without_host_devices = false\n\n"
    '          [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]\n'
    '            BinaryName = "/usr/local/nvidia/toolkit/nvidia-container-runtime"\n'
    "            SystemdCgroup = true\n",
).replace('default_runtime_name = "runc"', 'default_runtime_name = "nvidia"')


def test_take_over_a_reference_entry_and_give_it_back_byte_exact(tmp_path, capsys):
    assert REFERENCE != V16 and 'default_runtime_name = "nvidia"' in REFERENCE
    config = tmp_path / "config.toml"
    config.write_text(REFERENCE)
    code, _, err = run_cli(capsys, "configure", *ctd(config, "--runtime-name", "nvidia"))
    assert code == 1
    assert one_error_line(err) == (
        f'nvshim: error: {config}: plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia'
        " runs the NVIDIA Container Toolkit's /usr/local/nvidia/toolkit/nvidia-container-runtime:"
        " add --take-over to point it at nvshim-runtime (keeping its options; unconfigure gives"
        " it back), or choose another --runtime-name"
    )
    assert config.read_text() == REFERENCE

    code, out, err = run_cli(
        capsys, "configure", *ctd(config, "--nvidia-runtime-name", "nvidia", "--take-over")
    )
    assert code == 0, err
    entry = runtime(config, "nvidia")
    assert entry["options"] == {
        "BinaryName": "/usr/bin/nvshim-runtime",
        "SystemdCgroup": True,
    }  # the reference entry's own options kept
    assert entry["privileged_without_host_devices"] is False
    assert 'default_runtime_name = "nvidia"' in config.read_text()  # pods keep their class
    if HAS_CONTAINERD:
        assert 'BinaryName = "/usr/bin/nvshim-runtime"' in containerd_dump(config)
    again = run_cli(capsys, "configure", *ctd(config, "--runtime-name", "nvidia", "--take-over"))
    assert again[1].splitlines()[-1].startswith("no change:")

    code, out, err = run_cli(capsys, "unconfigure", *ctd(config, "--runtime-name", "nvidia"))
    assert code == 0, err
    assert config.read_bytes() == REFERENCE.encode()
    assert tree(tmp_path) == {"config.toml": REFERENCE.encode()}


def test_take_over_give_back_when_the_file_changed_since(tmp_path, capsys):
    config = tmp_path / "config.toml"
    config.write_text(REFERENCE)
    run_cli(capsys, "configure", *ctd(config, "--runtime-name", "nvidia", "--take-over"))
    config.write_text(config.read_text() + "\n# edited by someone\n")
    code, _, err = run_cli(capsys, "unconfigure", *ctd(config, "--runtime-name", "nvidia"))
    assert code == 0, err
    assert tomllib.loads(config.read_text()) == tomllib.loads(REFERENCE)
    assert config.read_text().endswith("\n# edited by someone\n")


def test_crio_copies_every_key_and_takes_the_override(tmp_path, capsys, monkeypatch):
    (tmp_path / "crio.conf.d").mkdir()
    (tmp_path / "crio.conf").write_text(
        '[crio.runtime]\ndefault_runtime = "runc"\n[crio.runtime.runtimes.runc]\n'
        'runtime_path = "/usr/sbin/runc"\nruntime_root = "/run/runc"\nmonitor_cgroup = "pod"\n'
        'runtime_config_path = "/etc/runc.json"\n'
    )
    dropin = tmp_path / "crio.conf.d" / "99-nvshim.toml"
    code, _, err = run_cli(
        capsys,
        "configure",
        "--engine",
        "crio",
        "--engine-config",
        str(dropin),
        "--runtime-config-override",
        '{"privileged_without_host_devices": true}',
    )
    assert code == 0, err
    table = tomllib.loads(dropin.read_text())["crio"]["runtime"]["runtimes"]["nvshim"]
    assert table == {
        "runtime_path": "/usr/bin/nvshim-runtime",
        "runtime_type": "oci",
        "runtime_root": "/run/runc",
        "monitor_cgroup": "pod",
        "runtime_config_path": "/etc/runc.json",
        "privileged_without_host_devices": True,
    }


def test_gpu_operator_installer_names_first_wins_go_booleans(tmp_path, capsys, monkeypatch):
    config = tmp_path / "config.toml"
    config.write_text(V16)
    monkeypatch.setenv("RUNTIME_CONFIG", str(config))
    monkeypatch.setenv("CONTAINERD_CONFIG", str(tmp_path / "not-this.toml"))
    monkeypatch.setenv("NVIDIA_RUNTIME_NAME", "gpu")
    monkeypatch.setenv("CONTAINERD_RUNTIME_CLASS", "not-this")
    monkeypatch.setenv("NVIDIA_RUNTIME_SET_AS_DEFAULT", "T")  # Go's ParseBool
    monkeypatch.setenv("RUNTIME_ENABLE_CDI", "F")
    code, _, err = run_cli(capsys, "configure", "--engine", "containerd")
    assert code == 0, err
    cri = tomllib.loads(config.read_text())["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["containerd"]["default_runtime_name"] == "gpu"
    assert set(cri["containerd"]["runtimes"]) == {"runc", "gpu"}
    assert cri.get("enable_cdi") is not True
    assert not (tmp_path / "not-this.toml").exists()


FAKE_CRIO = """#!/bin/sh
[ "$1 $2" = "status config" ] || exit 3
cat <<'END'
[crio.runtime]
default_runtime = "runc"
[crio.runtime.runtimes.runc]
runtime_path = "/usr/sbin/runc"
runtime_root = "/run/effective-root"
END
"""


def test_crio_config_source_command_reads_crio_status_config(tmp_path, capsys, monkeypatch):
    """`crio status config` asks the running daemon (none here): a stand-in prints it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "crio").write_text(FAKE_CRIO)
    (bin_dir / "crio").chmod(0o755)
    (tmp_path / "crio.conf").write_text('[crio.runtime.runtimes.runc]\nruntime_root = "/file"\n')
    dropin = tmp_path / "crio.conf.d" / "99-nvshim.toml"
    argv = ["configure", "--engine", "crio", "--engine-config", str(dropin)]
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    code, _, err = run_cli(capsys, *argv, "--config-source", "command,file")
    assert code == 0, err
    table = tomllib.loads(dropin.read_text())["crio"]["runtime"]["runtimes"]["nvshim"]
    assert table["runtime_root"] == "/run/effective-root"
    run_cli(capsys, "unconfigure", "--engine", "crio", "--engine-config", str(dropin))
    (bin_dir / "crio").write_text("#!/bin/sh\nexit 1\n")  # daemon not running: the files
    code, _, err = run_cli(capsys, *argv, "--config-source", "command,file")
    assert code == 0, err
    table = tomllib.loads(dropin.read_text())["crio"]["runtime"]["runtimes"]["nvshim"]
    assert table["runtime_root"] == "/file"


def test_what_a_v1_default_runtime_cannot_carry_over_is_named(tmp_path, capsys):
    """A v1.linux default runtime's runc binary, options without a runc v2 equivalent and
    the v1 plugin's shim settings are each named in a warning; what has an equivalent is
    carried over (the corpus cases hold the exact bytes)."""
    config = default_runtime(
        tmp_path, "runc", "io.containerd.runtime.v1.linux",
        '  Runtime = "/opt/bin/runc-custom"\n  RuntimeRoot = "/run/v1-root"\n'
        '  Root = "/run/ignored-by-v1"\n  NoPivotRoot = true\n  Terminal = true\n'
        '[plugins."io.containerd.runtime.v1.linux"]\n  shim_debug = true\n',
    )  # fmt: skip
    code, _, err = run_cli(capsys, "configure", *ctd(config))
    assert code == 0, err
    assert "runs /opt/bin/runc-custom: nvshim-runtime runs the low-level runtime" in err
    assert "io.containerd.runtime.v1.linux options Terminal have no io.containerd.runc.v2" in err
    assert "shim_debug of the io.containerd.runtime.v1.linux plugin have no" in err
    options = runtime(config)["options"]
    assert options == {"BinaryName": "/usr/bin/nvshim-runtime", "Root": "/run/v1-root",
                       "NoPivotRoot": True}  # fmt: skip
