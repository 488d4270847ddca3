"""Safety of `nvshim configure`: bad input, ownership, third-party edits, locking, env."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from nvshim.engines.common import load_state
from tests.engines.corpus_cases import CORPUS, clear_engine_env, run_cli, tree

REPO = Path(__file__).resolve().parents[1]
COMMENTS = (CORPUS / "containerd-comments" / "input" / "config.toml").read_text()
V16 = (CORPUS / "containerd-1.6-default" / "input" / "config.toml").read_text()


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    clear_engine_env(monkeypatch, "1.7.13")


nvshim = run_cli


def ctd(path: Path, *extra: str) -> list[str]:
    return ["--engine", "containerd", "--engine-config", str(path), *extra]


def one_error_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("nvshim: error: "), err
    return lines[0]


@pytest.mark.parametrize(
    "text, where, words",
    [
        ("version = 2\n[plugins\nx = 1\n", ":2:", "invalid TOML"),
        ('version = 2\nroot = "a"\nroot = "b"\n', "", "invalid TOML"),
        (
            'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\n'
            '  snapshotter = "overlayfs"\n  runtimes = "oops"\n',
            ":4:",
            'plugins."io.containerd.grpc.v1.cri".containerd.runtimes must be a table,'
            " found a string",
        ),
        ("version = 4\n", ":1:", "config version 4 is not supported"),
        # the keys read to copy the default runtime: containerd would refuse these too
        (
            'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\n'
            "  default_runtime_name = 5\n",
            ":3:",
            "containerd.default_runtime_name must be a string, found an integer",
        ),
        (
            'version = 3\n[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]\n'
            '  runtime_type = "io.containerd.runc.v2"\n  options = "SystemdCgroup"\n',
            ":4:",
            "containerd.runtimes.runc.options must be a table, found a string",
        ),
        (
            'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes]\n'
            '  runc = "io.containerd.runc.v2"\n',
            ":3:",
            "containerd.runtimes.runc must be a table, found a string",
        ),
        ('version = 2\nimports = "/etc/containerd/conf.d/*.toml"\n', ":2:", "imports must be an"),
        (
            'version = 2\nimports = ["/etc/containerd/conf.d/*.toml", 3]\n',
            ":2:",
            "imports must be an array of strings, found an entry that is an integer",
        ),
        ('version = "2"\n', ":1:", "version must be an integer"),
    ],
)
def test_bad_toml_is_one_line_naming_file_and_line_and_changes_nothing(
    tmp_path, capsys, text, where, words
):
    config = tmp_path / "config.toml"
    config.write_text(text)
    code, out, err = nvshim(capsys, "configure", *ctd(config, "--set-as-default"))
    line = one_error_line(err)
    assert code == 1
    assert f"{config}{where}" in line and words in line
    assert tree(tmp_path) == {"config.toml": text.encode()}  # no backup, state or lock left


@pytest.mark.parametrize(
    "text, where, words",
    [
        ('{\n  "log-driver": "json-file",\n  "runtimes": {\n', ":4:", "invalid JSON"),
        ('{\n  "debug": true,\n  "runtimes": ["nvidia"]\n}\n', ":3:", "runtimes must be an object"),
        (
            '{\n  "features": {\n    "buildkit": true\n  },\n  "features": "yes"\n}\n',
            ":2:",
            "features must be an object, found a string",
        ),
        ("[1, 2]\n", ":1:", "must be a JSON object"),
        # the keys nvshim sets: dockerd refuses these, an edit would have hidden it
        ('{\n  "default-runtime": 5\n}\n', ":2:", "default-runtime must be a string"),
        (
            '{\n  "features": {\n    "cdi": "yes"\n  }\n}\n',
            ":3:",
            "features.cdi must be a boolean, found a string",
        ),
    ],
)
def test_bad_daemon_json_is_one_line_and_changes_nothing(tmp_path, capsys, text, where, words):
    config = tmp_path / "daemon.json"
    config.write_text(text)
    code, _, err = nvshim(
        capsys, "configure", "--engine", "docker", "--engine-config", str(config), "--enable-cdi"
    )
    line = one_error_line(err)
    assert code == 1 and f"{config}{where}" in line and words in line, line
    assert tree(tmp_path) == {"daemon.json": text.encode()}


@pytest.mark.parametrize(
    "text, where, words",
    [
        ("[crio.runtime]\ndefault_runtime = 5\n", ":2:", "default_runtime must be a string"),
        (
            '[crio.runtime.runtimes]\ncrun = "/usr/bin/crun"\n',
            ":2:",
            "crio.runtime.runtimes.crun must be a table, found a string",
        ),
    ],
)
def test_bad_crio_config_is_one_line_and_changes_nothing(tmp_path, capsys, text, where, words):
    """The keys read to copy CRI-O's default runtime, in crio.conf beside the drop-in."""
    (tmp_path / "crio.conf").write_text(text)
    drop_in = tmp_path / "crio.conf.d" / "99-nvshim.toml"
    code, _, err = nvshim(capsys, "configure", "--engine", "crio", "--engine-config", str(drop_in))
    line = one_error_line(err)
    assert code == 1 and f"{tmp_path / 'crio.conf'}{where}" in line and words in line, line
    assert tree(tmp_path) == {"crio.conf": text.encode()}
    assert os.listdir(tmp_path) == ["crio.conf"]


def test_cli_prints_one_line_without_traceback(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text("[plugins\n")
    done = subprocess.run(
        [sys.executable, "-m", "nvshim", "configure", *ctd(config)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "NVSHIM_CONTAINERD_VERSION": "1.7.13"},
    )
    assert done.returncode == 1
    assert done.stderr.startswith(f"nvshim: error: {config}:1: invalid TOML")
    assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr


def test_mode_and_owner_kept_and_backup_matches(tmp_path, capsys):
    config = tmp_path / "config.toml"
    config.write_text(V16)
    os.chmod(config, 0o640)
    os.chown(config, 1234, 5678)
    assert nvshim(capsys, "configure", *ctd(config))[0] == 0
    st = config.stat()
    assert (st.st_mode & 0o7777, st.st_uid, st.st_gid) == (0o640, 1234, 5678)
    backup = tmp_path / "config.toml.nvshim.bak"
    bst = backup.stat()
    assert backup.read_text() == V16
    assert (bst.st_mode & 0o7777, bst.st_uid, bst.st_gid) == (0o640, 1234, 5678)
    assert nvshim(capsys, "unconfigure", *ctd(config))[0] == 0
    st = config.stat()
    assert config.read_text() == V16
    assert (st.st_mode & 0o7777, st.st_uid, st.st_gid) == (0o640, 1234, 5678)


def test_unconfigure_after_third_party_edits_keeps_them(tmp_path, capsys):
    config = tmp_path / "config.toml"
    config.write_text(COMMENTS)
    nvshim(capsys, "configure", *ctd(config, "--set-as-default", "--enable-cdi"))
    # Someone else edits the file: a comment on top and a metrics setting.
    text = config.read_text()
    edited = "# audited 2024-05-01\n" + text.replace(
        'address = "127.0.0.1:1338"', 'address = "127.0.0.1:1338"\n  grpc_histogram = true'
    )
    config.write_text(edited)
    code, out, _ = nvshim(capsys, "unconfigure", *ctd(config))
    assert code == 0
    expected = "# audited 2024-05-01\n" + COMMENTS.replace(
        'address = "127.0.0.1:1338"', 'address = "127.0.0.1:1338"\n  grpc_histogram = true'
    )
    assert config.read_text() == expected
    assert "restored" in out and "removed" in out
    # The pre-nvshim original stays available; no record is left.
    assert (tmp_path / "config.toml.nvshim.bak").read_text() == COMMENTS
    assert not (tmp_path / "config.toml.nvshim.state").exists()


def test_a_value_changed_since_configure_is_kept(tmp_path, capsys):
    config = tmp_path / "config.toml"
    config.write_text(COMMENTS)
    nvshim(capsys, "configure", *ctd(config, "--set-as-default"))
    config.write_text(
        config.read_text().replace(
            'default_runtime_name = "nvshim"', 'default_runtime_name = "kata"'
        )
    )
    code, out, _ = nvshim(capsys, "unconfigure", *ctd(config))
    data = tomllib.loads(config.read_text())
    containerd = data["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]
    assert containerd["default_runtime_name"] == "kata"
    assert "nvshim" not in containerd["runtimes"]
    assert set(containerd["runtimes"]) == {"crun", "runc", "kata"}
    assert "kept" in out and "default_runtime_name = 'kata'" in out


def test_reconfigure_with_other_options_still_round_trips(tmp_path, capsys):
    config = tmp_path / "config.toml"
    config.write_text(COMMENTS)
    nvshim(capsys, "configure", *ctd(config))
    nvshim(capsys, "configure", *ctd(config, "--set-as-default", "--enable-cdi"))
    nvshim(capsys, "configure", *ctd(config, "--runtime-path", "/opt/nvshim/bin/nvshim-runtime"))
    data = tomllib.loads(config.read_text())
    runtime = data["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["nvshim"]
    assert runtime["options"]["BinaryName"] == "/opt/nvshim/bin/nvshim-runtime"
    # The copy still comes from crun, the default before nvshim took over.
    assert runtime["pod_annotations"] == ["io.kubernetes.cri-o.userns-mode"]
    nvshim(capsys, "unconfigure", *ctd(config))
    assert config.read_text() == COMMENTS
    assert tree(tmp_path) == {"config.toml": COMMENTS.encode()}


def test_two_runtime_names_are_removed_independently(tmp_path, capsys):
    config = tmp_path / "config.toml"
    config.write_text(V16)
    nvshim(capsys, "configure", *ctd(config, "--runtime-name", "gpu-a"))
    nvshim(capsys, "configure", *ctd(config, "--runtime-name", "gpu-b", "--set-as-default"))
    nvshim(capsys, "unconfigure", *ctd(config, "--runtime-name", "gpu-b"))
    cri = tomllib.loads(config.read_text())["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["containerd"]["default_runtime_name"] == "runc"
    assert set(cri["containerd"]["runtimes"]) == {"runc", "gpu-a"}
    nvshim(capsys, "unconfigure", *ctd(config, "--runtime-name", "gpu-a"))
    assert config.read_text() == V16
    assert tree(tmp_path) == {"config.toml": V16.encode()}


def test_refuses_to_take_over_a_runtime_it_did_not_add(tmp_path, capsys):
    text = COMMENTS
    config = tmp_path / "config.toml"
    config.write_text(text)
    code, _, err = nvshim(capsys, "configure", *ctd(config, "--runtime-name", "kata"))
    assert code == 1 and "runtimes.kata exists and was not added by nvshim" in err
    assert config.read_text() == text
    # ... nor to remove one.
    code, out, _ = nvshim(capsys, "unconfigure", *ctd(config, "--runtime-name", "kata"))
    assert code == 0 and config.read_text() == text and "not nvshim's" in out


@pytest.mark.parametrize("name", ["runc", "crun", "bad name", "-x", ""])
def test_runtime_name_is_checked(tmp_path, capsys, name):
    config = tmp_path / "config.toml"
    code, _, err = nvshim(capsys, "configure", *ctd(config, "--runtime-name", name))
    assert code == 2 and "--runtime-name" in one_error_line(err)
    assert not config.exists()


def test_unconfigure_without_a_record_removes_only_its_runtime(tmp_path, capsys):
    config = tmp_path / "config.toml"
    config.write_text(COMMENTS)
    nvshim(capsys, "configure", *ctd(config, "--set-as-default"))
    (tmp_path / "config.toml.nvshim.state").unlink()
    nvshim(capsys, "unconfigure", *ctd(config))
    data = tomllib.loads(config.read_text())
    containerd = data["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]
    assert "nvshim" not in containerd["runtimes"]
    assert "default_runtime_name" not in containerd  # containerd's default, runc, again
    assert set(containerd["runtimes"]) == {"crun", "runc", "kata"}


@pytest.mark.parametrize("record", ["garbage\n", '{"format": 99}\n', ""])
def test_an_unreadable_record_never_costs_the_backup(tmp_path, capsys, record):
    """A state record configure cannot read was taken for a first configure: the backup
    of the true original was replaced by the configured file. Refused, one line naming
    the record, every file as it was."""
    config = tmp_path / "config.toml"
    config.write_text(V16)
    assert nvshim(capsys, "configure", *ctd(config))[0] == 0
    state = tmp_path / "config.toml.nvshim.state"
    state.write_text(record)
    before = tree(tmp_path)
    code, _, err = nvshim(capsys, "configure", *ctd(config, "--runtime-name", "other"))
    assert code == 1
    line = one_error_line(err)
    assert line.startswith(f"nvshim: error: {state}: not a state record nvshim can read"), line
    assert tree(tmp_path) == before
    assert (tmp_path / "config.toml.nvshim.bak").read_text() == V16


def test_unconfigure_with_nothing_configured_changes_nothing(tmp_path, capsys):
    config = tmp_path / "config.toml"
    config.write_text(V16)
    code, out, _ = nvshim(capsys, "unconfigure", *ctd(config))
    assert code == 0 and "nothing to remove" in out
    assert tree(tmp_path) == {"config.toml": V16.encode()}


def test_unconfigure_dry_run_writes_nothing(tmp_path, capsys):
    config = tmp_path / "config.toml"
    config.write_text(V16)
    nvshim(capsys, "configure", *ctd(config))
    before = tree(tmp_path)
    code, out, _ = nvshim(capsys, "unconfigure", *ctd(config, "--dry-run"))
    assert code == 0 and tree(tmp_path) == before
    assert '-        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvshim]' in out
    assert "dry run: nothing written" in out


def test_symlinked_config_stays_a_symlink(tmp_path, capsys):
    real = tmp_path / "real"
    real.mkdir()
    (real / "config.toml").write_text(V16)
    link = tmp_path / "config.toml"
    link.symlink_to(real / "config.toml")
    nvshim(capsys, "configure", *ctd(link))
    assert link.is_symlink()
    assert "runtimes.nvshim]" in (real / "config.toml").read_text()
    assert (real / "config.toml.nvshim.bak").read_text() == V16


def test_drop_in_refused_before_containerd_2_1(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("NVSHIM_CONTAINERD_VERSION", "2.0.5")
    config = tmp_path / "config.toml"
    config.write_text(V16)
    code, _, err = nvshim(
        capsys, "configure", *ctd(config, "--drop-in", str(tmp_path / "conf.d" / "n.toml"))
    )
    line = one_error_line(err)
    assert code == 2 and "containerd 2.1 or later (containerd 2.0.5 here)" in line
    assert "hide the main file's CRI settings" in line
    assert tree(tmp_path) == {"config.toml": V16.encode()}


def test_empty_drop_in_is_refused(tmp_path, capsys):
    config = tmp_path / "config.toml"
    code, _, err = nvshim(capsys, "configure", *ctd(config, "--drop-in", ""))
    assert code == 2 and "empty path" in one_error_line(err)


def test_drop_in_already_matched_by_an_imports_glob(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("NVSHIM_CONTAINERD_VERSION", "2.1.1")
    config = tmp_path / "config.toml"
    main_text = "version = 3\nimports = ['conf.d/*.toml']\n"
    config.write_text(main_text)
    drop_in = tmp_path / "conf.d" / "50-nvshim.toml"
    code, out, _ = nvshim(capsys, "configure", *ctd(config, "--drop-in", str(drop_in)))
    assert code == 0
    assert config.read_text() == main_text  # the glob already imports it
    data = tomllib.loads(drop_in.read_text())
    runtime = data["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]
    assert runtime["nvshim"]["options"]["BinaryName"] == "/usr/bin/nvshim-runtime"
    nvshim(capsys, "unconfigure", *ctd(config, "--drop-in", str(drop_in)))
    assert tree(tmp_path) == {"config.toml": main_text.encode()}
    assert not (tmp_path / "conf.d").exists()


def test_installer_environment_variables(tmp_path, capsys, monkeypatch):
    config = tmp_path / "config.toml"
    config.write_text(V16)
    monkeypatch.setenv("CONTAINERD_CONFIG", str(config))
    monkeypatch.setenv("CONTAINERD_RUNTIME_CLASS", "gpu")
    monkeypatch.setenv("CONTAINERD_SET_AS_DEFAULT", "true")
    assert nvshim(capsys, "configure", "--engine", "containerd")[0] == 0
    cri = tomllib.loads(config.read_text())["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["containerd"]["default_runtime_name"] == "gpu"
    assert "gpu" in cri["containerd"]["runtimes"]
    # NVSHIM_* wins over the installer form; the option wins over both.
    monkeypatch.setenv("NVSHIM_RUNTIME_NAME", "gpu2")
    nvshim(capsys, "configure", "--engine", "containerd", "--no-set-as-default")
    cri = tomllib.loads(config.read_text())["plugins"]["io.containerd.grpc.v1.cri"]
    assert "gpu2" in cri["containerd"]["runtimes"]
    assert cri["containerd"]["default_runtime_name"] == "gpu"  # not asked to change it


def test_bad_boolean_in_environment(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CONTAINERD_SET_AS_DEFAULT", "maybe")
    code, _, err = nvshim(capsys, "configure", *ctd(tmp_path / "c.toml"))
    assert code == 2 and "CONTAINERD_SET_AS_DEFAULT='maybe'" in one_error_line(err)


@pytest.mark.parametrize(
    "extra, env, line",
    [
        # TOML has no null: this was an internal error (exit 70) while rendering the edit
        (
            ("--runtime-config-override", '{"SystemdCgroup": true, "Root": null}'),
            {},
            "--runtime-config-override: Root is null, which TOML cannot hold",
        ),
        (
            ("--runtime-config-override", '{"a": {"b": [1, null]}}'),
            {},
            "--runtime-config-override: a.b.1 is null, which TOML cannot hold",
        ),
        # the variable is named (it read "containerd version 'garbage'")
        (
            (),
            {"NVSHIM_CONTAINERD_VERSION": "garbage"},
            "NVSHIM_CONTAINERD_VERSION='garbage': expected like 1.7.2",
        ),
    ],
)
def test_bad_setting_is_a_usage_error_naming_it(tmp_path, capsys, monkeypatch, extra, env, line):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    config = tmp_path / "config.toml"
    config.write_text(V16)
    code, _, err = nvshim(capsys, "configure", *ctd(config, *extra))
    assert code == 2
    assert one_error_line(err) == f"nvshim: error: {line}; try 'nvshim configure --help'"
    assert tree(tmp_path) == {"config.toml": V16.encode()}


def test_docker_features_map_is_merged_not_replaced(tmp_path, capsys):
    config = tmp_path / "daemon.json"
    config.write_text('{\n\t"features": {\n\t\t"buildkit": true\n\t}\n}\n')
    nvshim(
        capsys, "configure", "--engine", "docker", "--engine-config", str(config), "--enable-cdi"
    )
    assert json.loads(config.read_text())["features"] == {"buildkit": True, "cdi": True}
    assert config.read_text().startswith('{\n\t"features": {\n\t\t"buildkit": true,\n')


def test_warnings_for_k3s_and_cdi_on_containerd_1_6(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("NVSHIM_CONTAINERD_VERSION", "1.6.20")
    config = tmp_path / "config.toml"
    config.write_text((CORPUS / "containerd-k3s" / "input" / "config.toml").read_text())
    _, _, err = nvshim(capsys, "configure", *ctd(config, "--enable-cdi"))
    assert "generated by k3s" in err and "config.toml.tmpl" in err
    assert "containerd 1.6.20 has no CDI support" in err


_STORM = """
import sys
from nvshim.cli import main
main(sys.argv[1:])
"""


def test_twenty_concurrent_runs_leave_a_valid_file(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(V16)
    env = {**os.environ, "NVSHIM_CONTAINERD_VERSION": "1.6.20"}
    names = [f"gpu{i}" for i in range(5)]
    procs = []
    for i in range(20):
        action = "configure" if i % 3 != 2 else "unconfigure"
        argv = [action, *ctd(config, "--runtime-name", names[i % 5])]
        if i % 4 == 0 and action == "configure":
            argv.append("--set-as-default")
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", _STORM, *argv],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    data = tomllib.loads(config.read_text())  # a valid file
    runtimes = data["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]
    state = load_state(str(config))
    owners = {r["owner"] for r in state.records} if state else set()
    assert {n for n in names if n in runtimes} == owners  # the record matches the file
    if shutil.which("containerd"):
        subprocess.run(
            ["containerd", "--config", str(config), "config", "dump"],
            check=True,
            capture_output=True,
        )
    assert not list(tmp_path.glob("*.lock"))
    for name in names:
        subprocess.run(
            [sys.executable, "-c", _STORM, "unconfigure", *ctd(config, "--runtime-name", name)],
            cwd=REPO,
            env=env,
            check=True,
            capture_output=True,
        )
    assert tree(tmp_path) == {"config.toml": V16.encode()}


def test_crio_drop_in_directory_holds_only_the_drop_in(tmp_path, capsys):
    """CRI-O parses every file in crio.conf.d: backup, state and lock must live elsewhere."""
    dropins = tmp_path / "crio.conf.d"
    dropins.mkdir()
    (dropins / "99-nvshim.toml").write_text("# placeholder kept by ops\n")
    config = dropins / "99-nvshim.toml"
    code, out, _ = nvshim(capsys, "configure", "--engine", "crio", "--engine-config", str(config))
    assert code == 0
    assert sorted(p.name for p in dropins.iterdir()) == ["99-nvshim.toml"]
    assert (tmp_path / "crio.conf.d.99-nvshim.toml.nvshim.bak").is_file()
    assert (tmp_path / "crio.conf.d.99-nvshim.toml.nvshim.state").is_file()
    assert tomllib.loads(config.read_text())["crio"]["runtime"]["runtimes"]["nvshim"] == {
        "runtime_path": "/usr/bin/nvshim-runtime",
        "runtime_type": "oci",
    }


def test_engine_is_required(capsys):
    code, _, err = nvshim(capsys, "configure")
    assert code == 2 and "--engine is required" in one_error_line(err)


def test_make_dirs_tolerates_a_directory_created_meanwhile(tmp_path, monkeypatch):
    """Two installers creating the same directories at once: the one that loses the race
    neither fails nor counts the other's directory as its own (it would remove it)."""
    from nvshim.engines import common

    target = tmp_path / "run" / "nvshim"
    real_mkdir = os.mkdir

    def racing_mkdir(path, mode=0o777):
        if str(path) == str(tmp_path / "run"):
            real_mkdir(path, mode)  # the other installer got there first
        real_mkdir(path, mode)

    monkeypatch.setattr(common.os, "mkdir", racing_mkdir)
    assert common.make_dirs(str(target)) == [str(target)]
    assert target.is_dir()


# In a private mount namespace: a 64 KiB tmpfs holding a 40 KiB config and a 4 KiB backup
# of an older original (its record gone); keeping the config's original then runs out of
# room part way through the new backup.
FULL_BACKUP = r"""
set -e
mount -t tmpfs -o size=64k tmpfs "$DIR"
head -c 40960 /dev/urandom > "$DIR/f"
head -c 4096 /dev/zero | tr '\0' o > "$DIR/f$SUFFIX"
sha256sum "$DIR/f" "$DIR/f$SUFFIX" > "$SUMS"
set +e
"$PY" -c '
import sys
from nvshim.engines.common import write_backup
try:
    write_backup(sys.argv[1], open(sys.argv[1], "rb").read())
except OSError as err:
    print("error", err.strerror, err.filename)
' "$DIR/f"
sha256sum -c --quiet "$SUMS" && echo intact
echo $(ls -A "$DIR")
"""


def test_a_backup_that_fails_part_way_keeps_the_old_backup_whole(tmp_path):
    """The backup was copied over the old one in place: ENOSPC part way left it
    truncated. Now written beside it and renamed: the old backup stays whole, the file
    as it was, no temporary left, the error naming the backup."""
    from nvshim.engines.common import BACKUP_SUFFIX
    from tests.conftest import sh_in_private_mounts

    mnt = tmp_path / "mnt"
    mnt.mkdir()
    done = sh_in_private_mounts(
        FULL_BACKUP, DIR=str(mnt), SUMS=str(tmp_path / "sums"), PY=sys.executable,
        PYTHONPATH=str(REPO), SUFFIX=BACKUP_SUFFIX,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    error, intact, listing = done.stdout.splitlines()
    assert error == f"error No space left on device {mnt}/f{BACKUP_SUFFIX}", done.stdout
    assert intact == "intact" and listing == f"f f{BACKUP_SUFFIX}", done.stdout


# In a private mount namespace: a 64 KiB tmpfs holding the config, filled up to FREE KiB
# free, then the installed `nvshim configure`; prints its status and what the tmpfs holds.
FULL_FS = r"""
set -e
mount -t tmpfs -o size=64k tmpfs "$DIR"
cp "$SRC" "$DIR/config.toml"
chmod 640 "$DIR/config.toml"
chown 1234:5678 "$DIR/config.toml"
used=$(df -k --output=used "$DIR" | tail -1)
dd if=/dev/zero of="$DIR/fill" bs=1k count=$((64 - used - FREE)) 2>/dev/null
set +e
"$NVSHIM" configure --engine containerd --engine-config "$DIR/config.toml"
echo "rc=$?"
echo $(ls -A "$DIR")
stat -c '%a %u %g' "$DIR/config.toml"
sha256sum < "$DIR/config.toml"
"""


@pytest.mark.parametrize(
    "free_kib, failed",
    [
        (4, "config.toml.nvshim.bak"),  # V16 is two pages: no room for the backup
        (8, "config.toml.nvshim.state"),  # room for the backup, not for the record
        (12, "config.toml"),  # room for the backup and record, not for the new file
    ],
)
def test_a_full_file_system_leaves_the_config_and_no_backup_or_record(tmp_path, free_kib, failed):
    """ENOSPC part way: one line naming the file that could not be written, exit 1, and
    the config's bytes, mode and owner as they were, with no backup, record, lock or
    temporary file left beside it."""
    from tests.conftest import NVSHIM, sh_in_private_mounts

    src = tmp_path / "src.toml"
    src.write_text(V16)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    done = sh_in_private_mounts(
        FULL_FS, DIR=str(mnt), SRC=str(src), FREE=str(free_kib), NVSHIM=NVSHIM
    )
    assert done.stderr == f"nvshim: error: {mnt}/{failed}: No space left on device\n"
    rc, listing, owner, digest = done.stdout.splitlines()
    assert rc == "rc=1"
    assert listing.split() == ["config.toml", "fill"]
    assert owner == "640 1234 5678"
    assert digest.split()[0] == hashlib.sha256(V16.encode()).hexdigest()


@pytest.mark.parametrize(
    "command, extra, code",
    [
        # fails after the lock: the restart asked for cannot happen
        ("configure", ("--restart", "signal", "--socket", "/nonexistent.sock"), 1),
        ("unconfigure", (), 0),  # nothing there to remove
    ],
)
def test_a_run_that_writes_nothing_makes_no_directory(tmp_path, capsys, command, extra, code):
    config = tmp_path / "etc" / "docker" / "daemon.json"
    argv = ["--engine", "docker", "--engine-config", str(config), *extra]
    assert nvshim(capsys, command, *argv)[0] == code
    assert os.listdir(tmp_path) == []


def test_unconfigure_removes_the_directories_configure_made(tmp_path, capsys):
    config = tmp_path / "etc" / "docker" / "daemon.json"
    argv = ["--engine", "docker", "--engine-config", str(config)]
    assert nvshim(capsys, "configure", *argv)[0] == 0
    assert load_state(str(config)).created_dirs == [str(tmp_path / "etc"), str(config.parent)]
    code, out, _ = nvshim(capsys, "unconfigure", *argv)
    assert code == 0 and "removed (nvshim made it)" in out
    assert os.listdir(tmp_path) == []


def test_a_read_only_file_system_names_the_config(tmp_path):
    """A config on a read-only mount: the line starts with the config's path (it named
    only the lock file nvshim makes beside it) and the file stays as it was."""
    from tests.conftest import NVSHIM, sh_in_private_mounts

    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    mnt.mkdir()
    (src / "config.toml").write_text(V16)
    config = mnt / "config.toml"
    script = (
        f"mount --bind -o ro {src} {mnt} && {NVSHIM} configure --engine containerd"
        f" --engine-config {config}"
    )
    done = sh_in_private_mounts(script)
    assert done.returncode == 1
    assert done.stderr == (
        f"nvshim: error: {config}: cannot create its lock {config}.nvshim.lock:"
        " Read-only file system\n"
    )
    assert tree(src) == {"config.toml": V16.encode()}
