"""nvshim's own configuration: one typed record per table, checked once at load (types,
choices with did-you-mean, checks, the old name of a renamed key), the cached load, the
effective configuration `config show` prints."""

from __future__ import annotations

import os
import re

import pytest

from nvshim import config as config_module
from nvshim.config import Config, PairingConfig, load_config, parse_config
from nvshim.errors import NvshimError
from nvshim.memo import Last
from nvshim.record import fields
from tests.conftest import REPO, run_nvshim


def test_missing_default_file_means_defaults(monkeypatch, tmp_path):
    monkeypatch.delenv("NVSHIM_CONFIG", raising=False)
    monkeypatch.setattr("nvshim.config.DEFAULT_PATH", str(tmp_path / "absent.toml"))
    config = load_config()
    assert config == Config() and config.path is None
    assert config.policy.accept_env_unprivileged is False  # safe default


def test_values_override_and_unknown_keys_warn(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(
        '[host]\ndriver-root = "/run/nvidia/driver"\nbogus = 1\n'
        "[policy]\naccept-env-unprivileged = true\n[extra]\nx = 1\n"
        '[runtime]\nlog-levle = "debug"\n[sharng]\n'
    )
    config = load_config(str(path))
    assert config.host.driver_root == "/run/nvidia/driver"
    assert config.policy.accept_env_unprivileged is True
    assert config.runtime.runtimes == ["runc", "crun"]
    assert config.warnings == [
        f"{path}: unknown key host.bogus ignored",
        f"{path}: unknown section [extra] ignored",
        f"{path}: unknown key runtime.log-levle ignored (did you mean 'log-level'?)",
        f"{path}: unknown section [sharng] ignored (did you mean 'sharing'?)",
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
        # a misspelt choice gets the closest one
        ('[runtime]\nlog-level = "warnng"\n', "got 'warnng' (did you mean 'warning'?)"),
        ("[runtime]\nlog-backups = -1\n", "runtime.log-backups must be at least 0, got -1"),
        ("[runtime]\nlog-max-size = 1.5\n", "runtime.log-max-size must be an int, got 1.5"),
        ("[runtime]\nlog-backups = true\n", "runtime.log-backups must be an int, got True"),
        # [pairing]: checked here, not when a container first asks for a NIC
        ('[pairing]\nworst-affinity = "PBX"\n', "got 'PBX' (did you mean 'PXB'?)"),
        (
            '[pairing]\nrequest-sources = ["anotation"]\n',
            "pairing.request-sources entry must be one of 'annotation', 'env', got 'anotation'"
            " (did you mean 'annotation'?)",
        ),
        (
            '[pairing]\nnics = ["mlx5_0", "mlx5_1 mlx5_2"]\n',
            "pairing.nics: 'mlx5_1 mlx5_2' is not a PCI address or an HCA/netdev name pattern",
        ),
        ('[pairing]\nmove-physical = [""]\n', "pairing.move-physical: '' is not a PCI"),
        (
            '[policy]\ncdi-vendor = "nvidia com"\n',
            "policy.cdi-vendor: 'nvidia com' is not a CDI vendor name: character \" \" is not",
        ),
        ('[policy]\ncdi-class = "1gpu"\n', "policy.cdi-class: '1gpu' is not a CDI class name"),
        # default-capabilities: checked here, not warned about at each container
        (
            '[policy]\ndefault-capabilities = "utility,comptue"\n',
            "policy.default-capabilities: 'utility,comptue' names 'comptue', not a capability"
            " (did you mean 'compute'?); known: all, compute, utility, video, graphics,",
        ),
        ('[policy]\ndefault-capabilities = " , "\n', "default-capabilities: ' , ' names no"),
        (
            '[pairing]\nnetdev-name = "a-very-long-name%d"\n',
            "pairing.netdev-name: 'a-very-long-name%d' is not a usable name pattern",
        ),
        # out of range: each rotation renames every backup; TOML integers are 64-bit
        ("[runtime]\nlog-backups = 1000000000\n", "log-backups must be at most 1000, got"),
        ("[runtime]\nlog-max-size = 99999999999999999999\n", "must be a 64-bit integer"),
        # paths: the runtime and hook run in a bundle's directory, a relative one misleads
        ('[host]\ndriver-root = "run/nvidia/driver"\n', "host.driver-root: 'run/nvidia/"),
        ('[host]\ndev-root = ""\n', "host.dev-root: '' is not an absolute path"),
        ('[runtime]\nlog-file = "nvshim.log"\n', "runtime.log-file: 'nvshim.log' is not an"),
        ('[runtime]\nhook-path = "nvshim-hook"\n', "runtime.hook-path: 'nvshim-hook' is not"),
        ('[runtime]\ninventory-dir = "."\n', "runtime.inventory-dir: '.' is not an absolute"),
        ('[policy]\ncdi-spec-dirs = ["/etc/cdi", "cdi"]\n', "cdi-spec-dirs: 'cdi' is not an"),
        ('[sharing]\nmps-root = "mps"\n', "sharing.mps-root: 'mps' is not an absolute path"),
        ('[sharing]\nconfig = "sharing.yaml"\n', "sharing.config: 'sharing.yaml' is not an"),
        ("[runtime]\nruntimes = []\n", "runtime.runtimes must list at least 1 (got [])"),
        ('[runtime]\nruntimes = ["bin/runc"]\n', "'bin/runc' is not a program name or an"),
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


@pytest.mark.parametrize(
    "make, line",
    [
        (lambda p: os.mkfifo(p), "{p}: not a regular file (a FIFO or socket)"),  # hung
        (lambda p: p.symlink_to("/dev/zero"), "{p}: larger than 1 MiB, not an nvshim config"),
    ],
    ids=["fifo", "endless"],
)
def test_a_config_that_is_no_file_is_one_line_not_a_hang(tmp_path, make, line):
    path = tmp_path / "config.toml"
    make(path)
    proc = run_nvshim("config", "show", env={"NVSHIM_CONFIG": str(path)}, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr == "nvshim: error: " + line.format(p=path) + "\n"


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
    first = load_config(str(path))
    for section in config_module.SECTIONS:
        assert getattr(again, section) == getattr(first, section)
    assert again.runtime.runtimes == ["/opt/runc"] and again.sharing.on_daemon_down == "warn"
    keys = [line.split(" = ")[0] for line in proc.stdout.splitlines() if " = " in line]
    assert "inventory-dir" in keys and "state-dir" not in keys and "log-level" in keys
    assert (
        len(keys) == len(set(keys)) == sum(len(fields(c)) for c in config_module.SECTIONS.values())
    )


def test_records_have_python_names_and_declared_types():
    config = Config()
    assert config.runtime.log_level == "info" and config.runtime.log_max_size == 10 << 20
    assert config.runtime.inventory_dir == "/run/nvshim"
    assert config.pairing.request_sources == ["annotation", "env"]
    assert config.pairing.nics is not PairingConfig().nics  # a list per record
    with pytest.raises(AttributeError):
        config.runtime.log_level = "debug"  # checked once: records are not changed after
    assert not hasattr(config, "get") and not hasattr(config, "values")
    # every default passes its own key's checks (what a file may set, a default is)
    text = config_module.render_config(config).encode()
    assert parse_config(text, "shown.toml") == Config(path="shown.toml")


def test_choices_are_case_folded_where_declared(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('[pairing]\nworst-affinity = " node "\n')
    assert load_config(str(path)).pairing.worst_affinity == "NODE"
    path.write_text('[runtime]\nlog-level = "INFO"\n')
    with pytest.raises(NvshimError, match="did you mean 'info'"):
        load_config(str(path))


def test_renamed_key_still_read_with_a_warning(tmp_path):
    """``runtime.state-dir`` is now ``runtime.inventory-dir``: old files keep working."""
    path = tmp_path / "config.toml"
    path.write_text('[runtime]\nstate-dir = "/srv/inv"\n')
    config = load_config(str(path))
    assert config.runtime.inventory_dir == "/srv/inv"
    assert config.warnings == [
        f"{path}: runtime.state-dir is deprecated: name it runtime.inventory-dir"
    ]
    proc = run_nvshim("config", "show", env={"NVSHIM_CONFIG": str(path)})
    assert proc.returncode == 0, proc.stderr
    assert 'inventory-dir = "/srv/inv"' in proc.stdout and "state-dir" not in proc.stdout
    assert "runtime.state-dir is deprecated: name it runtime.inventory-dir" in proc.stderr
    # both names: the new one wins, the old is named as ignored
    path.write_text('[runtime]\nstate-dir = "/srv/old"\ninventory-dir = "/srv/new"\n')
    config = load_config(str(path))
    assert config.runtime.inventory_dir == "/srv/new"
    assert config.warnings == [
        f"{path}: runtime.state-dir ignored: runtime.inventory-dir is set (its new name)"
    ]
    path.write_text("[runtime]\nstate-dir = 3\n")
    with pytest.raises(NvshimError, match="runtime.inventory-dir must be a str, got 3"):
        load_config(str(path))


def test_the_cached_load_rebuilds_the_same_records(tmp_path, monkeypatch):
    """The second load of the same text comes from the JSON cache (no TOML parsed), as
    the same typed records with the same warnings; an entry this code did not write is
    parsed again."""
    from nvshim import fastjson, filecache

    entry = tmp_path / "config-cache.json"
    monkeypatch.setattr(filecache, "entry_path", lambda kind, directory=None: str(entry))
    path = tmp_path / "config.toml"
    path.write_text(
        '[runtime]\nstate-dir = "/srv/inv"\nlog-max-size = 0\n'
        '[pairing]\nworst-affinity = "pix"\nnics = ["ibp*"]\n[policy]\nbogus = 1\n'
    )
    first = load_config(str(path))
    assert entry.exists()

    def no_parse(raw, where):
        raise AssertionError("parsed again")

    monkeypatch.setattr(config_module, "parse_config", no_parse)
    monkeypatch.setattr(config_module, "_last", Last())  # a new process: only the file cache
    again = load_config(str(path))
    assert again == first and again.warnings == first.warnings and len(again.warnings) == 2
    assert again.pairing.worst_affinity == "PIX" and again.pairing.nics == ["ibp*"]
    assert again.runtime.log_max_size == 0 and type(again.runtime) is type(first.runtime)
    # an entry of another layout (the dict-of-tables one before the records) is not used
    data = fastjson.loads(entry.read_bytes())
    data["value"] = {"values": {"host": {}}, "warnings": []}
    entry.write_bytes(fastjson.dumps(data).encode())
    monkeypatch.setattr(config_module, "parse_config", parse_config)
    monkeypatch.setattr(config_module, "_last", Last())
    assert load_config(str(path)) == first


def test_a_process_loads_the_configuration_again_only_when_its_text_changed(tmp_path, monkeypatch):
    """nvshim-runtimed's workers load the configuration for every call: the same text
    gives the records already built (no cache file read, nothing parsed); another text,
    of the same size and time, or another file, is loaded again."""
    from nvshim import filecache

    monkeypatch.setattr(
        filecache, "entry_path", lambda kind, directory=None: str(tmp_path / f"{kind}.json")
    )
    reads, real_read = [], filecache.read
    monkeypatch.setattr(filecache, "read", lambda p: reads.append(p) or real_read(p))
    path = tmp_path / "config.toml"
    path.write_text('[host]\ndriver-root = "/aaa"\n')
    first = load_config(str(path))
    assert load_config(str(path)) is first and len(reads) == 1
    st = os.stat(path)
    path.write_text('[host]\ndriver-root = "/bbb"\n')
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert load_config(str(path)).host.driver_root == "/bbb" and len(reads) == 2
    other = tmp_path / "other.toml"
    other.write_text('[host]\ndriver-root = "/bbb"\n')
    assert load_config(str(other)).path == str(other) and len(reads) == 3
    assert load_config(str(path)).path == str(path)


def test_the_documented_keys_are_every_key_with_its_default():
    """docs/configuration.md's TOML block lists every key, in order, at its default."""
    with open(os.path.join(REPO, "docs", "configuration.md"), encoding="utf-8") as fh:
        block = fh.read().split("```toml\n", 1)[1].split("```", 1)[0]
    names = re.compile(r"^(\[\w+\]|[a-z-]+)(?= |$)", re.M)  # tables and keys
    assert names.findall(block) == names.findall(config_module.render_config(Config()))
    assert parse_config(block.encode(), "doc") == Config(path="doc")  # no warning either


def test_default_capabilities_as_the_variable_takes_them(tmp_path):
    """Any case, blanks, ``all``: what NVIDIA_DRIVER_CAPABILITIES accepts (read at use)."""
    for value in ("ALL", " Video , compute", "compat32,ngx,display,graphics"):
        path = tmp_path / "config.toml"
        path.write_text(f'[policy]\ndefault-capabilities = "{value}"\n')
        config = load_config(str(path))
        assert config.policy.default_capabilities == value and config.warnings == []
