"""The sharing config read as the device plugin reads it: shape checks (one clear line per
bad config, warnings where the device plugin only warns), checks against a simulated host,
and the sharing mode `nvshim info` shows. The corpus of device-plugin configs is in
test_sharing_corpus.py."""

from __future__ import annotations

import os

import pytest

from nvshim.errors import NvshimError
from nvshim.host.discover import discover_host
from nvshim.mps.sharing import NAME_ENV, load_sharing_config, resolve_sharing
from tests.conftest import run_nvshim

H100 = "h100x8-mig"
GPU0 = "GPU-92e91e7d-ffd7-601c-459e-d7fde767a1c6"
GPU1 = "GPU-9d9231cf-dcd5-4b0e-0f9d-e8a86f92f3cc"
MIG_6_2 = "MIG-dd355a87-3a27-cc3f-2218-7ad3de192436"  # 1g.10gb, 9856 MiB
MIG_7_2 = "MIG-a2148ebd-6cb9-e02b-fc62-0d095611dedf"  # 1g.10gb

PASCAL = {
    "driver_version": "550.90.12",
    "cuda_driver_version": 12040,
    "gpus": [
        {
            "uuid": "GPU-11111111-2222-3333-4444-555555555555",
            "name": "Tesla P100-PCIE-16GB",
            "pci_bus_id": "00000000:3B:00.0",
            "memory_mib": 16280,
            "compute_capability": "6.0",
            "architecture": "pascal",
            "brand": "tesla",
            "mig_mode": "unsupported",
            "numa_node": 0,
        }
    ],
}


@pytest.fixture(scope="module")
def h100(sim_hosts):
    sim = sim_hosts(H100)
    return discover_host(sim.driver_root, sim.dev_root)


@pytest.fixture(scope="module")
def pascal(tmp_path_factory):
    from tests.sim.simhost import build_host

    sim = build_host(PASCAL, str(tmp_path_factory.mktemp("pascal")))
    return discover_host(sim.driver_root, sim.dev_root)


def _mps(resources: str, extra: str = "") -> str:
    return f"version: v1\nsharing:\n  mps:\n{extra}    resources:\n{resources}"


# (case, YAML text, texts the one-line error must contain)
SHAPE_ERRORS = [
    ("not yaml", "version: v1\nsharing: [mps\n", ["invalid YAML", "line"]),
    ("version v2", "version: v2\n", ["version", "'v2'"]),
    ("not a mapping", "- version\n", ["must be a mapping"]),
    ("bad strategy", "version: v1\nflags: {migStrategy: some}\n", ["flags.migStrategy", "'some'"]),
    (
        "both modes",
        "version: v1\nsharing:\n  mps: {resources: [{name: nvidia.com/gpu, replicas: 2}]}\n"
        "  timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2}]}\n",
        ["sharing", "only one of mps and timeSlicing"],
    ),
    (
        "flag not bool",
        _mps("    - {name: nvidia.com/gpu, replicas: 2}\n", "    failRequestsGreaterThanOne: 1\n"),
        ["sharing.mps.failRequestsGreaterThanOne", "true or false"],
    ),
    ("no resources", "version: v1\nsharing:\n  mps: {}\n", ["sharing.mps.resources", "non-empty"]),
    ("bad name", _mps("    - {name: nvidia.com/cpu, replicas: 2}\n"), ["resources[0].name"]),
    ("other vendor", _mps("    - {name: amd.com/gpu, replicas: 2}\n"), ["resources[0].name"]),
    (
        "bad rename",
        _mps("    - {name: nvidia.com/gpu, rename: amd.com/x, replicas: 2}\n"),
        ["resources[0].rename"],
    ),
    (
        "replicas missing",
        _mps("    - {name: nvidia.com/gpu}\n"),
        ["resources[0].replicas: missing"],
    ),
    (
        "replicas misspelt",
        _mps("    - {name: nvidia.com/gpu, replica: 4}\n"),
        ["replicas: missing", "'replica' is not a key: did you mean 'replicas'?"],
    ),
    (
        "replicas string",
        _mps("    - {name: nvidia.com/gpu, replicas: '4'}\n"),
        ["resources[0].replicas", "integer"],
    ),
    (
        "replicas bool",
        _mps("    - {name: nvidia.com/gpu, replicas: true}\n"),
        ["resources[0].replicas", "integer"],
    ),
    (
        "replicas one",
        _mps("    - {name: nvidia.com/gpu, replicas: 1}\n"),
        ["resources[0].replicas", "between 2 and 48, got 1"],
    ),
    (
        "replicas over 48",
        _mps("    - {name: nvidia.com/gpu, replicas: 49}\n"),
        ["resources[0].replicas", "between 2 and 48, got 49"],
    ),
    (
        "same resource twice",
        _mps("    - {name: nvidia.com/gpu, replicas: 2}\n    - {name: gpu, replicas: 3}\n"),
        ["resources[1].name", "nvidia.com/gpu already listed in sharing.mps.resources[0]"],
    ),
    (
        "second resource",
        _mps(
            "    - {name: nvidia.com/gpu, replicas: 2}\n"
            "    - {name: nvidia.com/mig-1g.10gb, replicas: -1}\n"
        ),
        ["resources[1].replicas"],
    ),
]


@pytest.mark.parametrize("case,text,expect", SHAPE_ERRORS, ids=[c[0] for c in SHAPE_ERRORS])
def test_bad_config_shape_is_one_clear_line(tmp_path, case, text, expect):
    path = tmp_path / "sharing.yaml"
    path.write_text(text)
    with pytest.raises(NvshimError) as info:
        load_sharing_config(str(path))
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: ")
    for part in expect:
        assert part in message
    assert path.read_text() == text


# (case, YAML text, the warnings, in order): accepted as the device plugin accepts them
WARNED = [
    ("top-level typo", "version: v1\nshareing: {}\n", ["shareing: unknown key ignored"]),
    ("mode typo", "version: v1\nsharing:\n  mpss: {}\n", ["sharing.mpss: unknown key ignored"]),
    (
        "flag typo",
        _mps("    - {name: nvidia.com/gpu, replicas: 2}\n", "    failRequestGreaterThanOne: no\n"),
        ["sharing.mps.failRequestGreaterThanOne: unknown key ignored"],
    ),
    (
        "devices list",
        _mps("    - {name: nvidia.com/gpu, replicas: 2, devices: [0, 'GPU-x'], replica: 3}\n"),
        [
            "sharing.mps.resources[0].replica: unknown key ignored",
            "sharing.mps.resources[0].devices: ignored, as the device plugin does: every "
            "nvidia.com/gpu device is shared",
        ],
    ),
    ("empty file", "", ["empty config: nothing shared"]),
]


@pytest.mark.parametrize("case,text,expect", WARNED, ids=[c[0] for c in WARNED])
def test_what_the_device_plugin_ignores_is_a_warning(tmp_path, case, text, expect):
    path = tmp_path / "sharing.yaml"
    path.write_text(text)
    config = load_sharing_config(str(path))
    assert [w.removeprefix(f"{path}: ").split(" (known: ")[0] for w in config.warnings] == expect


def test_defaults_version_and_fail_requests_greater_than_one(tmp_path):
    path = tmp_path / "sharing.yaml"
    path.write_text("sharing:\n  mps:\n    resources: [{name: nvidia.com/gpu, replicas: 2}]\n")
    mps = load_sharing_config(str(path))
    assert (mps.mode, mps.fail_requests_greater_than_one, mps.mig_strategy) == ("mps", True, "none")
    path.write_text("sharing:\n  timeSlicing:\n    resources: [{name: gpu, replicas: 2}]\n")
    ts = load_sharing_config(str(path))
    assert (ts.mode, ts.fail_requests_greater_than_one) == ("timeSlicing", False)
    assert ts.resources[0].name == ts.resources[0].advertised == "nvidia.com/gpu"
    path.write_text(
        "sharing:\n  mps:\n    failRequestsGreaterThanOne: false\n"
        "    resources: [{name: nvidia.com/gpu, replicas: 2}]\n"
    )
    assert load_sharing_config(str(path)).fail_requests_greater_than_one is False


def test_rename_and_rename_by_default(tmp_path):
    path = tmp_path / "sharing.yaml"
    path.write_text(
        "version: v1\nflags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n"
        "    renameByDefault: true\n    resources:\n"
        "    - {name: nvidia.com/gpu, replicas: 2}\n"
        "    - {name: mig-1g.10gb, rename: small, replicas: 3}\n"
    )
    config = load_sharing_config(str(path))
    assert [(r.name, r.advertised) for r in config.resources] == [
        ("nvidia.com/gpu", "nvidia.com/gpu.shared"),
        ("nvidia.com/mig-1g.10gb", "nvidia.com/small"),
    ]


# (case, YAML text, host fixture, texts the error must contain)
HOST_ERRORS = [
    (
        "MPS on a MIG-mode GPU (none)",
        _mps("    - {name: nvidia.com/gpu, replicas: 4}\n"),
        "h100",
        ["resources[0].name", "GPU in MIG mode 6", "not supported for MIG devices"],
    ),
    (
        "MPS on a MIG profile (mixed)",
        "version: v1\nflags: {migStrategy: mixed}\n"
        + _mps("    - {name: nvidia.com/mig-1g.10gb, replicas: 2}\n").removeprefix("version: v1\n"),
        "h100",
        ["resources[0].name", f"MIG device 6:2 ({MIG_6_2})", "migStrategy mixed"],
    ),
    (
        "single on a partly MIG host",
        "version: v1\nflags: {migStrategy: single}\n",
        "h100",
        ["flags.migStrategy", "single needs every GPU in MIG mode; GPU 0, 1, 2, 3, 4, 5 is not"],
    ),
    (
        "pre-Volta 17 clients",
        _mps("    - {name: nvidia.com/gpu, replicas: 17}\n"),
        "pascal",
        ["resources[0].replicas", "17 exceeds the 16 MPS clients", "6.0"],
    ),
]


@pytest.mark.parametrize("case,text,host,expect", HOST_ERRORS, ids=[c[0] for c in HOST_ERRORS])
def test_config_not_matching_host_is_one_clear_line(request, tmp_path, case, text, host, expect):
    path = tmp_path / "sharing.yaml"
    path.write_text(text)
    config = load_sharing_config(str(path))
    with pytest.raises(NvshimError) as info:
        resolve_sharing(config, request.getfixturevalue(host))
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: ")
    for part in expect:
        assert part in message


def test_pre_volta_accepts_16_mps_clients_and_volta_48(tmp_path, pascal, h100):
    path = tmp_path / "sharing.yaml"
    path.write_text(_mps("    - {name: nvidia.com/gpu, replicas: 16}\n"))
    shared = resolve_sharing(load_sharing_config(str(path)), pascal)
    assert [s.replicas for s in shared.values()] == [16]
    path.write_text(
        "flags: {migStrategy: mixed}\n" + _mps("    - {name: nvidia.com/gpu, replicas: 48}\n")
    )
    shared = resolve_sharing(load_sharing_config(str(path)), h100)
    assert shared[GPU0].thread_percentage == 2  # 100 // 48
    assert (shared[GPU0].memory_limit_mib, shared[GPU0].is_mig) == (81559 // 48, False)


def test_missing_file_or_empty_sharing_shares_nothing(tmp_path, h100):
    assert load_sharing_config(str(tmp_path / "absent.yaml")) is None
    path = tmp_path / "sharing.yaml"
    path.write_text("version: v1\nsharing: {}\n")
    assert resolve_sharing(load_sharing_config(str(path)), h100) == {}


NAMED = """a100-40gb: |
  version: v1
  flags: {migStrategy: mixed}
  sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 8}]}}
tesla-t4:
  version: v1
  sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 4}]}}
"""


def test_named_configs_select_by_name_then_default_then_the_only_one(tmp_path):
    path = tmp_path / "sharing.yaml"
    path.write_text(NAMED)
    a100 = load_sharing_config(str(path), "a100-40gb", "tesla-t4")
    assert (a100.path, a100.mig_strategy, a100.resources[0].replicas) == (
        f"{path} [a100-40gb]",
        "mixed",
        8,
    )
    t4 = load_sharing_config(str(path), "", "tesla-t4")
    assert (t4.path, t4.resources[0].replicas) == (f"{path} [tesla-t4]", 4)
    with pytest.raises(NvshimError) as info:
        load_sharing_config(str(path))
    assert str(info.value) == (
        f"{path}: holds 2 named configs (a100-40gb, tesla-t4): set [sharing] config-name "
        "or config-default to pick one"
    )
    with pytest.raises(NvshimError) as info:
        load_sharing_config(str(path), "h100", "tesla-t4")
    assert str(info.value) == (
        f"{path}: no config named 'h100' (sharing.config-name; the file has: a100-40gb, tesla-t4)"
    )
    path.write_text("only:\n  version: v1\n  sharing: {}\n")
    assert load_sharing_config(str(path)).path == f"{path} [only]"


def test_an_error_in_a_named_config_names_the_file_and_the_config(tmp_path):
    path = tmp_path / "sharing.yaml"
    path.write_text(NAMED.replace("replicas: 8", "replicas: 1"))
    with pytest.raises(NvshimError) as info:
        load_sharing_config(str(path), "a100-40gb")
    assert str(info.value) == (
        f"{path} [a100-40gb]: sharing.timeSlicing.resources[0].replicas: must be between 2 "
        "and 1024, got 1"
    )
    path.write_text(NAMED.replace("replicas: 8}]}}", "replicas: 8}]}"))
    with pytest.raises(NvshimError, match=r"\[a100-40gb\]: invalid YAML"):
        load_sharing_config(str(path), "a100-40gb")


def _info(sim, tmp_path, sharing_text: str, extra: str = "", env=None):
    sharing = tmp_path / "sharing.yaml"
    sharing.write_text(sharing_text)
    config = tmp_path / "config.toml"
    config.write_text(f'[sharing]\nconfig = "{sharing}"\n{extra}')
    proc = run_nvshim(
        "info",
        "--driver-root",
        sim.driver_root,
        "--dev-root",
        sim.dev_root,
        env={"NVSHIM_CONFIG": str(config), **(env or {})},
    )
    return sharing, proc


def test_info_shows_sharing_mode_per_device(tmp_path, sim_hosts):
    sim = sim_hosts(H100)
    text = "flags: {migStrategy: mixed}\n" + _mps(
        "    - {name: nvidia.com/gpu, replicas: 4, devices: [1]}\n"
    )
    sharing, proc = _info(sim, tmp_path, text)
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line for line in proc.stdout.splitlines() if line.strip()}
    for gpu in "012345":
        assert rows[gpu].rstrip().endswith("mps x4")
    assert rows["6:2"].rstrip().endswith("none")
    assert proc.stderr == (
        f"nvshim: warning: sharing config: {sharing}: sharing.mps.resources[0].devices: "
        "ignored, as the device plugin does: every nvidia.com/gpu device is shared\n"
    )


def test_info_selects_the_named_config_by_key_or_env(tmp_path, sim_hosts):
    sim = sim_hosts(H100)
    _, proc = _info(sim, tmp_path, NAMED, 'config-name = "tesla-t4"\n')
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line for line in proc.stdout.splitlines() if line.strip()}
    assert rows["6"].rstrip().endswith("time-slicing x4")  # none: MIG-mode GPUs are whole
    _, proc = _info(sim, tmp_path, NAMED, 'config-name = "tesla-t4"\n', {NAME_ENV: "a100-40gb"})
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line for line in proc.stdout.splitlines() if line.strip()}
    assert rows["0"].rstrip().endswith("time-slicing x8")
    assert rows["6"].rstrip().endswith("none")  # mixed: GPU 6 is its MIG devices


def test_info_fails_on_a_bad_sharing_config_in_one_line(tmp_path, sim_hosts):
    sim = sim_hosts(H100)
    sharing, proc = _info(sim, tmp_path, _mps("    - {name: nvidia.com/gpu, replicas: 4}\n"))
    assert proc.returncode == 1  # the host is still shown, then the file is refused
    assert sim.gpu_uuids()[6] in proc.stdout
    assert "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1
    assert proc.stderr.startswith(
        f"nvshim: error: {sharing}: sharing.mps.resources[0].name: "
        "nvidia.com/gpu covers GPU in MIG mode 6"
    )
    assert os.path.exists(sharing)


def test_config_show_fails_naming_file_and_key(tmp_path):
    sharing = tmp_path / "sharing.yaml"
    sharing.write_text("version: v1\nsharing:\n  timeSlicing:\n    resources: [{name: gpu}]\n")
    config = tmp_path / "config.toml"
    config.write_text(f'[sharing]\nconfig = "{sharing}"\nconfig-default = "x"\n')
    proc = run_nvshim("config", "show", env={"NVSHIM_CONFIG": str(config)})
    assert proc.returncode == 1
    assert 'config-default = "x"' in proc.stdout
    assert proc.stderr == (
        f"nvshim: error: {sharing}: sharing.timeSlicing.resources[0].replicas: "
        "missing: the number of replicas\n"
    )
    sharing.write_text("version: v1\nextra: 1\n")
    proc = run_nvshim("config", "show", env={"NVSHIM_CONFIG": str(config)})
    assert proc.returncode == 0
    assert proc.stderr == (
        f"nvshim: warning: sharing config: {sharing}: extra: unknown key ignored "
        "(known: version, flags, resources, sharing, imex)\n"
    )


def test_check_sharing_for_the_installer(tmp_path, h100):
    from nvshim.config import parse_config
    from nvshim.mps.sharing import check_sharing

    sharing = tmp_path / "sharing.yaml"
    config = parse_config(f'[sharing]\nconfig = "{sharing}"\n'.encode(), "config.toml")
    assert check_sharing(config, h100) == []  # no file: nothing shared, nothing wrong
    sharing.write_text(_mps("    - {name: nvidia.com/gpu, replicas: 4}\n"))
    assert check_sharing(config) == []  # the shape is fine
    with pytest.raises(NvshimError, match="GPU in MIG mode 6"):
        check_sharing(config, h100)  # the host is not


def test_mig_strategy_key_wins_over_the_file_as_the_plugin_flag_does(tmp_path, sim_hosts):
    """The GPU Operator passes MIG_STRATEGY to the device plugin, which beats the file."""
    sim = sim_hosts(H100)
    text = "version: v1\nsharing: {timeSlicing: {resources: [{name: gpu, replicas: 2}]}}\n"
    _, proc = _info(sim, tmp_path, text, 'mig-strategy = "mixed"\n')
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line for line in proc.stdout.splitlines() if line.strip()}
    assert rows["6"].rstrip().endswith("none")  # mixed: GPU 6 is its MIG devices
    assert rows["5"].rstrip().endswith("time-slicing x2")
    _, proc = _info(sim, tmp_path, text, 'mig-strategy = "mixd"\n')
    assert proc.returncode == 1
    assert proc.stderr == (
        f"nvshim: error: {tmp_path / 'config.toml'}: sharing.mig-strategy must be one of "
        "'', 'none', 'single', 'mixed', got 'mixd' (did you mean 'mixed'?)\n"
    )
