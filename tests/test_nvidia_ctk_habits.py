"""nvidia-ctk habits: its command and flag spellings (hidden aliases meaning the same),
`-d/--debug`, `--quiet`, `configure --check` for drift, and `nvshim system
create-device-nodes [--control-devices]` on a simulated host with real mknod."""

from __future__ import annotations

import os
import stat

import pytest

from tests.conftest import run_nvshim
from tests.engines.corpus_cases import CORPUS, clear_engine_env, run_cli, tree
from tests.sim.simhost import build_host

V16 = (CORPUS / "containerd-1.6-default" / "input" / "config.toml").read_text()


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    clear_engine_env(monkeypatch, "1.6.20")


def _configured(tmp_path, capsys, name: str, *argv: str) -> bytes:
    config = tmp_path / name / "config.toml"
    config.parent.mkdir()
    config.write_text(V16)
    code, _, err = run_cli(
        capsys,
        *argv,
        "--runtime",
        "containerd",
        "--config",
        str(config),
        "--cgroup-driver",
        "cgroupfs",
    )
    assert code == 0, err
    return config.read_bytes()


@pytest.mark.parametrize(
    "ours, theirs",
    [
        (
            ["configure", "--runtime-name", "gpu", "--set-as-default", "--enable-cdi"],
            [
                "runtime",
                "configure",
                "--nvidia-runtime-name",
                "gpu",
                "--nvidia-set-as-default",
                "--cdi.enabled",
            ],
        ),
        (
            ["configure", "--config-source", "file"],
            ["runtime", "configure", "--config-source", "file"],
        ),
    ],
)
def test_nvidia_ctk_spellings_write_the_same_bytes(tmp_path, capsys, ours, theirs):
    assert _configured(tmp_path, capsys, "a", *ours) == _configured(tmp_path, capsys, "b", *theirs)


def test_drop_in_config_alias(tmp_path, capsys, monkeypatch):
    clear_engine_env(monkeypatch, "2.1.0")
    config = tmp_path / "config.toml"
    dropin = tmp_path / "conf.d" / "99-nvshim.toml"

    def ctk(verb: str) -> tuple[int, str, str]:
        argv = ["--runtime", "containerd", "--config", str(config), "--drop-in-config", str(dropin)]
        return run_cli(capsys, "runtime", verb, *argv)

    code, _, err = ctk("configure")
    assert code == 0, err
    assert "runtimes.nvshim" in dropin.read_text()
    assert str(dropin) in config.read_text()  # imported by the main file
    code, _, err = ctk("unconfigure")
    assert code == 0, err
    assert tree(tmp_path) == {}


def test_aliases_are_hidden_from_help():
    top = run_nvshim("--help").stdout
    commands = [line.split()[0] for line in top.splitlines() if line.startswith("  ")]
    assert "runtime" not in commands and "system" in commands
    assert "--quiet" in top and "--debug" in top  # documented options (docs/commands.md)
    configure = run_nvshim("configure", "--help").stdout
    assert "--runtime-name" in configure and "--nvidia-runtime-name" not in configure
    assert "--cdi.enabled" not in configure and "--check" in configure


def test_check_exit_code_tells_drift(tmp_path, capsys):
    config = tmp_path / "config.toml"
    config.write_text(V16)
    argv = ["--runtime", "containerd", "--config", str(config), "--cgroup-driver", "cgroupfs"]
    code, out, _ = run_cli(capsys, "configure", "--check", *argv)
    assert code == 1 and f"+++ {config}" in out
    assert config.read_text() == V16 and tree(tmp_path) == {"config.toml": V16.encode()}
    assert run_cli(capsys, "configure", *argv)[0] == 0
    code, out, _ = run_cli(capsys, "configure", "--check", *argv)
    assert code == 0 and out.splitlines()[-1].startswith("no change:")
    # someone removed nvshim's entry behind its back: drift again
    text = config.read_text()
    config.write_text(text.replace('BinaryName = "/usr/bin/nvshim-runtime"', 'BinaryName = "/x"'))
    code, _, _ = run_cli(capsys, "--quiet", "configure", "--check", *argv)
    assert code == 1


def test_quiet_prints_warnings_only(tmp_path, capsys):
    config = tmp_path / "config.toml"
    code, out, err = run_cli(
        capsys,
        "--quiet",
        "configure",
        "--runtime",
        "containerd",
        "--config",
        str(config),
        "--enable-cdi",
        "--cgroup-driver",
        "cgroupfs",
    )
    assert code == 0, err
    assert out == ""  # quiet: nothing on stdout, the warnings on stderr
    lines = err.splitlines()
    assert lines and all(line.startswith("nvshim: warning: ") for line in lines), lines
    assert any(
        "containerd 1.6.20 has no CDI support" in line
        and "still passes the cdi.k8s.io/* annotations through to nvshim-runtime" in line
        for line in lines
    )
    assert "enable_cdi" in config.read_text()


def test_debug_flag_is_accepted_and_bad_input_stays_one_line(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text("version = 2\n[plugins\n")
    for flag in ("-d", "--debug"):
        proc = run_nvshim(flag, "configure", "--runtime", "containerd", "--config", str(config))
        assert proc.returncode == 1
        assert proc.stderr.count("\n") == 1 and "invalid TOML" in proc.stderr
    assert config.read_text() == "version = 2\n[plugins\n"


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--config-source", "dump"], "expected a list of command and file"),
        (["--runtime-config-override", "{"], "not JSON"),
        (["--nvidia-runtime-name", "runc"], "that name is the engine's own runtime"),
        (["--drop-in-config", ""], "empty path"),
    ],
)
def test_alias_bad_input_is_one_line_and_changes_nothing(tmp_path, capsys, argv, words):
    config = tmp_path / "config.toml"
    config.write_text(V16)
    code, _, err = run_cli(
        capsys, "runtime", "configure", "--runtime", "containerd", "--config", str(config), *argv
    )
    assert code == 2
    assert err.count("\n") == 1 and words in err
    assert tree(tmp_path) == {"config.toml": V16.encode()}


# ---- system create-device-nodes ---------------------------------------------------------


@pytest.fixture
def bare_host(tmp_path):
    sim = build_host("h100x8-mig", str(tmp_path / "host"))
    return sim


def _node(sim, path: str):
    st = os.lstat(sim.host_path(path))
    return stat.S_ISCHR(st.st_mode), os.major(st.st_rdev), os.minor(st.st_rdev), st.st_mode & 0o777


def _nvshim(sim, *args):
    return run_nvshim(
        "system",
        "create-device-nodes",
        "--driver-root",
        sim.driver_root,
        "--dev-root",
        sim.dev_root,
        *args,
    )


def test_create_device_nodes_recreates_missing_gpu_and_control_nodes(bare_host):
    sim = bare_host
    want = {n.path: (True, n.major, n.minor, 0o666) for n in sim.expected_nodes()}
    removed = ["/dev/nvidia1", "/dev/nvidia7", "/dev/nvidiactl", "/dev/nvidia-uvm-tools"]
    for path in removed:
        os.unlink(sim.host_path(path))
    dry = _nvshim(sim, "--control-devices", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert sum("would create" in line for line in dry.stdout.splitlines()) == 4
    assert not os.path.exists(sim.host_path("/dev/nvidia1"))

    gpus_only = _nvshim(sim)
    assert gpus_only.returncode == 0, gpus_only.stderr
    created = [line.split(":")[0] for line in gpus_only.stdout.splitlines() if "created" in line]
    assert created == [sim.host_path("/dev/nvidia1"), sim.host_path("/dev/nvidia7")]
    assert not os.path.exists(sim.host_path("/dev/nvidiactl"))  # not without --control-devices

    proc = _nvshim(sim, "--control-devices")
    assert proc.returncode == 0, proc.stderr
    for path in removed:
        assert _node(sim, path) == want[path], path
    again = _nvshim(sim, "--control-devices")
    assert "created" not in again.stdout and again.returncode == 0


def test_create_device_nodes_never_replaces_a_wrong_file(bare_host):
    sim = bare_host
    os.unlink(sim.host_path("/dev/nvidia0"))
    os.unlink(sim.host_path("/dev/nvidia2"))
    with open(sim.host_path("/dev/nvidia2"), "w") as fh:
        fh.write("not a device")
    proc = _nvshim(sim)
    assert proc.returncode == 1
    assert proc.stderr == (
        f"nvshim: error: {sim.host_path('/dev/nvidia2')}: not a character device; not touched\n"
    )
    assert not os.path.exists(sim.host_path("/dev/nvidia0"))  # nothing made before the check
