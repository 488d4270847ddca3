"""The sharing config: shape checks (one clear line per bad config), checks against a
simulated host, and the sharing mode `nvshim info` shows."""

from __future__ import annotations

import os

import pytest

from nvshim.errors import NvshimError
from nvshim.host.discover import discover_host
from nvshim.mps.sharing import load_sharing_config, resolve_sharing
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
    ("empty", "", ["empty file"]),
    ("no version", "sharing: {}\n", ["version", "must be 'v1'"]),
    ("version v2", "version: v2\n", ["version", "'v2'"]),
    ("top-level typo", "version: v1\nshareing: {}\n", ["unknown key 'shareing'"]),
    ("not a mapping", "- version\n", ["must be a mapping"]),
    ("mode typo", "version: v1\nsharing:\n  mpss: {}\n", ["sharing", "unknown key 'mpss'"]),
    (
        "both modes",
        "version: v1\nsharing:\n  mps: {resources: [{name: nvidia.com/gpu, replicas: 2}]}\n"
        "  timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2}]}\n",
        ["sharing", "only one of mps and timeSlicing"],
    ),
    (
        "flag typo",
        _mps(
            "    - {name: nvidia.com/gpu, replicas: 2}\n", "    failRequestGreaterThanOne: true\n"
        ),
        ["sharing.mps", "unknown key 'failRequestGreaterThanOne'"],
    ),
    (
        "flag not bool",
        _mps("    - {name: nvidia.com/gpu, replicas: 2}\n", "    failRequestsGreaterThanOne: 1\n"),
        ["sharing.mps.failRequestsGreaterThanOne", "true or false"],
    ),
    ("no resources", "version: v1\nsharing:\n  mps: {}\n", ["sharing.mps.resources", "non-empty"]),
    (
        "resource typo",
        _mps("    - {name: nvidia.com/gpu, replica: 2}\n"),
        ["resources[0]", "unknown key 'replica'"],
    ),
    ("bad name", _mps("    - {name: nvidia.com/cpu, replicas: 2}\n"), ["resources[0].name"]),
    ("replicas missing", _mps("    - {name: nvidia.com/gpu}\n"), ["resources[0].replicas"]),
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
        "replicas zero",
        _mps("    - {name: nvidia.com/gpu, replicas: 0}\n"),
        ["resources[0].replicas", "between 1 and 48"],
    ),
    (
        "replicas over 48",
        _mps("    - {name: nvidia.com/gpu, replicas: 49}\n"),
        ["resources[0].replicas", "between 1 and 48, got 49"],
    ),
    (
        "devices word",
        _mps("    - {name: nvidia.com/gpu, replicas: 2, devices: some}\n"),
        ["resources[0].devices", "'some'"],
    ),
    (
        "devices zero",
        _mps("    - {name: nvidia.com/gpu, replicas: 2, devices: 0}\n"),
        ["resources[0].devices", "at least 1"],
    ),
    (
        "devices empty",
        _mps("    - {name: nvidia.com/gpu, replicas: 2, devices: []}\n"),
        ["resources[0].devices"],
    ),
    (
        "device float",
        _mps("    - {name: nvidia.com/gpu, replicas: 2, devices: [1.5]}\n"),
        ["resources[0].devices[0]", "1.5"],
    ),
    (
        "second resource",
        _mps(
            "    - {name: nvidia.com/gpu, replicas: 2}\n"
            "    - {name: nvidia.com/gpu, replicas: -1}\n"
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


# (case, YAML text, host fixture, texts the error must contain)
HOST_ERRORS = [
    (
        "unknown GPU",
        _mps("    - {name: nvidia.com/gpu, replicas: 4, devices: [9]}\n"),
        "h100",
        ["resources[0].devices[0]", "unknown GPU device '9'"],
    ),
    (
        "MIG-mode GPU",
        _mps("    - {name: nvidia.com/gpu, replicas: 4, devices: [6]}\n"),
        "h100",
        ["resources[0].devices[0]", "MIG mode", "6:0, 6:1, 6:2"],
    ),
    (
        "MIG-mode GPU by UUID",
        _mps(
            "    - {name: nvidia.com/gpu, replicas: 4, devices: "
            "[GPU-f73b3dbf-c113-9b90-fdd9-8529c42fd596]}\n"
        ),
        "h100",
        ["MIG mode"],
    ),
    (
        "listed twice",
        _mps(f"    - {{name: nvidia.com/gpu, replicas: 4, devices: [0, {GPU0}]}}\n"),
        "h100",
        ["resources[0].devices[1]", "more than once"],
    ),
    (
        "in two resources",
        _mps(
            "    - {name: nvidia.com/gpu, replicas: 4, devices: ['6:2']}\n"
            "    - {name: nvidia.com/mig-1g.10gb, replicas: 2}\n"
        ),
        "h100",
        ["resources[1].devices", "more than once"],
    ),
    (
        "count too big",
        _mps("    - {name: nvidia.com/mig-1g.10gb, replicas: 2, devices: 7}\n"),
        "h100",
        ["resources[0].devices", "count 7", "6 nvidia.com/mig-1g.10gb"],
    ),
    (
        "wrong profile",
        _mps("    - {name: nvidia.com/mig-1g.10gb, replicas: 2, devices: ['6:0']}\n"),
        "h100",
        ["resources[0].devices[0]", "not a nvidia.com/mig-1g.10gb device"],
    ),
    (
        "bad id",
        _mps("    - {name: nvidia.com/gpu, replicas: 2, devices: ['../x']}\n"),
        "h100",
        ["resources[0].devices[0]", "invalid device id"],
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
    path.write_text(_mps("    - {name: nvidia.com/gpu, replicas: 48, devices: [0]}\n"))
    shared = resolve_sharing(load_sharing_config(str(path)), h100)
    assert shared[GPU0].thread_percentage == 2  # 100 // 48


def test_all_devices_shares_whole_gpus_and_mig_devices(tmp_path, h100):
    path = tmp_path / "sharing.yaml"
    path.write_text(
        _mps(
            "    - {name: nvidia.com/gpu, replicas: 4}\n", "    failRequestsGreaterThanOne: true\n"
        )
    )
    shared = resolve_sharing(load_sharing_config(str(path)), h100)
    # six whole GPUs (6 and 7 are in MIG mode) and their ten MIG devices
    assert sorted(s.name for s in shared.values()) == sorted(
        [str(i) for i in range(6)] + [f"6:{i}" for i in range(3)] + [f"7:{i}" for i in range(7)]
    )
    gpu0, mig = shared[GPU0], shared[MIG_6_2]
    assert (gpu0.mode, gpu0.replicas, gpu0.fail_requests_greater_than_one) == ("mps", 4, True)
    assert (gpu0.thread_percentage, gpu0.memory_limit_mib) == (25, 81559 // 4)
    assert (mig.is_mig, mig.memory_limit_mib) == (True, 9856 // 4)


def test_mig_profile_resource_and_count(tmp_path, h100):
    path = tmp_path / "sharing.yaml"
    path.write_text(
        "version: v1\nflags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n"
        "    renameByDefault: false\n    resources:\n"
        "    - {name: nvidia.com/mig-1g.10gb, rename: nvidia.com/small, replicas: 3, devices: 2}\n"
        "    - {name: nvidia.com/gpu, replicas: 2, devices: ['1', '7:0']}\n"
    )
    shared = resolve_sharing(load_sharing_config(str(path)), h100)
    assert {s.name: (s.mode, s.replicas) for s in shared.values()} == {
        "6:2": ("timeSlicing", 3),
        "7:2": ("timeSlicing", 3),
        "1": ("timeSlicing", 2),
        "7:0": ("timeSlicing", 2),
    }
    assert shared[MIG_7_2].label == "time-slicing x3"


def test_missing_file_or_empty_sharing_shares_nothing(tmp_path, h100):
    assert load_sharing_config(str(tmp_path / "absent.yaml")) is None
    path = tmp_path / "sharing.yaml"
    path.write_text("version: v1\nsharing: {}\n")
    assert resolve_sharing(load_sharing_config(str(path)), h100) == {}


def test_info_shows_sharing_mode_per_device(tmp_path, sim_hosts):
    sim = sim_hosts(H100)
    sharing = tmp_path / "sharing.yaml"
    sharing.write_text(
        _mps(f"    - {{name: nvidia.com/gpu, replicas: 4, devices: [{GPU1}, '6:2']}}\n")
    )
    config = tmp_path / "config.toml"
    config.write_text(f'[sharing]\nconfig = "{sharing}"\n')
    proc = run_nvshim(
        "info",
        "--driver-root",
        sim.driver_root,
        "--dev-root",
        sim.dev_root,
        env={"NVSHIM_CONFIG": str(config)},
    )
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line for line in proc.stdout.splitlines() if line.strip()}
    assert rows["1"].rstrip().endswith("mps x4")
    assert rows["6:2"].rstrip().endswith("mps x4")
    assert rows["0"].rstrip().endswith("none")
    assert rows["6:1"].rstrip().endswith("none")


def test_info_warns_of_a_bad_sharing_config_in_one_line(tmp_path, sim_hosts):
    sim = sim_hosts(H100)
    sharing = tmp_path / "sharing.yaml"
    sharing.write_text(_mps("    - {name: nvidia.com/gpu, replicas: 4, devices: [6]}\n"))
    config = tmp_path / "config.toml"
    config.write_text(f'[sharing]\nconfig = "{sharing}"\n')
    proc = run_nvshim(
        "info",
        "--driver-root",
        sim.driver_root,
        "--dev-root",
        sim.dev_root,
        env={"NVSHIM_CONFIG": str(config)},
    )
    assert proc.returncode == 0  # the host is still shown; containers are refused elsewhere
    warnings = [x for x in proc.stderr.splitlines() if "sharing config" in x]
    assert len(warnings) == 1 and "Traceback" not in proc.stderr
    assert f"{sharing}: sharing.mps.resources[0].devices[0]: GPU 6 is in MIG mode" in warnings[0]
    assert sim.gpu_uuids()[6] in proc.stdout
    assert os.path.exists(sharing)
