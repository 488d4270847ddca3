"""nvshim's own configuration: defaults, overrides, warnings, one-line errors, `config show`."""

from __future__ import annotations

import pytest

from nvshim.config import DEFAULTS, load_config
from nvshim.errors import NvshimError
from tests.conftest import run_nvshim


def test_missing_default_file_means_defaults(monkeypatch, tmp_path):
    monkeypatch.delenv("NVSHIM_CONFIG", raising=False)
    monkeypatch.setattr("nvshim.config.DEFAULT_PATH", str(tmp_path / "absent.toml"))
    config = load_config()
    assert config.values == DEFAULTS and config.path is None
    assert config.get("policy", "accept-env-unprivileged") is False  # safe default


def test_values_override_and_unknown_keys_warn(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(
        '[host]\ndriver-root = "/run/nvidia/driver"\nbogus = 1\n'
        "[policy]\naccept-env-unprivileged = true\n[extra]\nx = 1\n"
        '[runtime]\nlog-levle = "debug"\n[sharng]\n'
    )
    config = load_config(str(path))
    assert config.driver_root == "/run/nvidia/driver"
    assert config.get("policy", "accept-env-unprivileged") is True
    assert config.get("runtime", "runtimes") == ["runc", "crun"]
    assert config.warnings == [
        f"{path}: unknown key host.bogus ignored",
        f"{path}: unknown section [extra] ignored",
        f"{path}: unknown key runtime.log-levle ignored (did you mean log-level?)",
        f"{path}: unknown section [sharng] ignored (did you mean sharing?)",
    ]


@pytest.mark.parametrize(
    "text, needle",
    [
        ("[host\n", "invalid TOML"),
        (
            '[policy]\naccept-env-unprivileged = "yes"\n',
            "policy.accept-env-unprivileged must be a bool",
        ),
        ("[runtime]\nruntimes = [1]\n", "runtime.runtimes must be a list of strings"),
        ("[runtime]\nlog-file = true\n", "runtime.log-file must be a str"),
        ('host = "x"\n', "[host] must be a table"),
        (
            '[runtime]\nlog-level = "verbose"\n',
            "runtime.log-level must be one of 'debug', 'info', 'warning', 'error', got 'verbose'",
        ),
        ('[sharing]\nmig-strategy = "mixd"\n', "sharing.mig-strategy must be one of"),
        ('[runtime]\nlog-target = "syslog"\n', "runtime.log-target must be one of 'file'"),
    ],
)
def test_bad_config_one_line(tmp_path, text, needle):
    path = tmp_path / "config.toml"
    path.write_text(text)
    with pytest.raises(NvshimError, match=None) as err:
        load_config(str(path))
    assert needle in str(err.value) and str(path) in str(err.value)
    proc = run_nvshim("config", "show", env={"NVSHIM_CONFIG": str(path)})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and needle in proc.stderr


def test_explicit_missing_file_is_an_error(tmp_path):
    proc = run_nvshim("config", "show", env={"NVSHIM_CONFIG": str(tmp_path / "nope.toml")})
    assert proc.returncode == 1 and "configuration file not found" in proc.stderr


def test_config_show_round_trips(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('[runtime]\nruntimes = ["/opt/runc"]\n[sharing]\non-daemon-down = "warn"\n')
    proc = run_nvshim("config", "show", env={"NVSHIM_CONFIG": str(path)})
    assert proc.returncode == 0, proc.stderr
    shown = tmp_path / "shown.toml"
    shown.write_text(proc.stdout)
    again = load_config(str(shown))
    assert again.values == load_config(str(path)).values
    assert again.get("runtime", "runtimes") == ["/opt/runc"]
