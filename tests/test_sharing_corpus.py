"""Device-plugin configs written from its documented format (tests/sharing_corpus/), and the
sharing nvshim derives from each on every simulated host, device by device: what the device
plugin advertises under each resource name and migStrategy, shared as it shares it. Then
containers through nvshim-runtime and real runc on a shared and an unshared device."""

from __future__ import annotations

import os

import pytest

from nvshim.errors import NvshimError
from nvshim.host.discover import discover_host
from nvshim.mps.sharing import load_sharing_config, resolve_sharing
from tests.conftest import write_config
from tests.runc_util import make_bundle, make_busybox_rootfs, read_log, runc_run

CORPUS = os.path.join(os.path.dirname(__file__), "sharing_corpus")
HOSTS = ("single", "h100x8-mig", "a100-mig-1g5gb")
H100_WHOLE = [str(i) for i in range(6)]  # GPUs 0-5; 6 and 7 are in MIG mode
H100_1G10 = ["6:2"] + [f"7:{i}" for i in range(2, 7)]  # the 1g.10gb MIG devices
H100_1C = ["7:0", "7:1"]  # the 1c.2g.20gb compute instances
A100_MIG = [f"0:{i}" for i in range(7)]  # seven 1g.5gb
GPU = "nvidia.com/gpu"


def shares(names, mode: str, replicas: int, resource: str = GPU) -> dict[str, tuple]:
    return {n: (mode, replicas, resource) for n in names}


TS, MPS = "timeSlicing", "mps"

# case -> (named config or "", {host: {device: (mode, replicas, resource)} or error text}),
# failRequestsGreaterThanOne expected for the shared devices
EXPECTED: dict[str, tuple] = {
    "flags-only": ("", {"single": {}, "h100x8-mig": {}, "a100-mig-1g5gb": {}}, None),
    "time-slicing": (
        "",
        {
            "single": shares(["0"], TS, 10),
            "h100x8-mig": shares([str(i) for i in range(8)], TS, 10),  # none: whole GPUs
            "a100-mig-1g5gb": shares(["0"], TS, 10),
        },
        False,
    ),
    "time-slicing-rename-by-default": (
        "",
        {
            "single": shares(["0"], TS, 10, "nvidia.com/gpu.shared"),
            "h100x8-mig": shares([str(i) for i in range(8)], TS, 10, "nvidia.com/gpu.shared"),
            "a100-mig-1g5gb": shares(["0"], TS, 10, "nvidia.com/gpu.shared"),
        },
        True,
    ),
    "rename": (
        "",
        {
            "single": shares(["0"], TS, 4, "nvidia.com/shared-gpu"),
            "h100x8-mig": shares([str(i) for i in range(8)], TS, 4, "nvidia.com/shared-gpu"),
            "a100-mig-1g5gb": shares(["0"], TS, 4, "nvidia.com/shared-gpu"),
        },
        False,
    ),
    "mps": (
        "",
        {
            "single": shares(["0"], MPS, 10),
            "h100x8-mig": "sharing.mps.resources[0].name: nvidia.com/gpu covers GPU in MIG mode 6",
            "a100-mig-1g5gb": "nvidia.com/gpu covers GPU in MIG mode 0",
        },
        True,
    ),
    "mixed-time-slicing": (
        "",
        {
            "single": shares(["0"], TS, 2),
            "h100x8-mig": shares(H100_WHOLE, TS, 2),  # no A100 profile exists here
            "a100-mig-1g5gb": shares(A100_MIG, TS, 2, "nvidia.com/mig-1g.5gb"),
        },
        False,
    ),
    "mixed-h100-profiles": (
        "",
        {
            "single": shares(["0"], TS, 4),
            "h100x8-mig": {
                **shares(H100_WHOLE, TS, 4),
                **shares(H100_1G10, TS, 3, "nvidia.com/mig-1g.10gb"),
                **shares(H100_1C, TS, 2, "nvidia.com/mig-1c.2g.20gb"),
            },
            "a100-mig-1g5gb": {},
        },
        False,
    ),
    "single-strategy": (
        "",
        {
            "single": shares(["0"], TS, 4),  # no GPU in MIG mode: single is none
            "h100x8-mig": "flags.migStrategy: single needs every GPU in MIG mode; "
            "GPU 0, 1, 2, 3, 4, 5 is not",
            "a100-mig-1g5gb": shares(A100_MIG, TS, 4),  # MIG devices are nvidia.com/gpu
        },
        False,
    ),
    "mps-mixed": (
        "",
        {
            "single": shares(["0"], MPS, 3),
            "h100x8-mig": shares(H100_WHOLE, MPS, 3),
            "a100-mig-1g5gb": {},  # its only GPU is MIG devices, none of them nvidia.com/gpu
        },
        True,
    ),
    "mps-on-mig": (
        "",
        {
            "single": {},
            "h100x8-mig": "nvidia.com/mig-1g.10gb covers MIG device 6:2",
            "a100-mig-1g5gb": {},
        },
        True,
    ),
    "defaults-and-warnings": (
        "",
        {
            "single": shares(["0"], MPS, 2),
            "h100x8-mig": shares(H100_WHOLE, MPS, 2),  # devices: [0] ignored
            "a100-mig-1g5gb": {},
        },
        True,  # MPS's default
    ),
    "replicas-one": (
        "",
        dict.fromkeys(HOSTS, "sharing.timeSlicing.resources[0].replicas: must be between 2"),
        None,
    ),
    "configmap-per-node[a100-40gb]": (
        "a100-40gb",
        {
            "single": shares(["0"], TS, 8),
            "h100x8-mig": shares(H100_WHOLE, TS, 8),
            "a100-mig-1g5gb": shares(A100_MIG, TS, 2, "nvidia.com/mig-1g.5gb"),
        },
        False,
    ),
    "configmap-per-node[tesla-t4]": (
        "tesla-t4",
        {
            "single": shares(["0"], TS, 4),
            "h100x8-mig": shares([str(i) for i in range(8)], TS, 4),
            "a100-mig-1g5gb": shares(["0"], TS, 4),
        },
        False,
    ),
}


@pytest.fixture(scope="module")
def hosts(sim_hosts):
    return {
        name: discover_host(sim_hosts(name).driver_root, sim_hosts(name).dev_root) for name in HOSTS
    }


def test_every_corpus_file_has_expectations():
    files = {f.removesuffix(".yaml") for f in os.listdir(CORPUS)}
    assert files == {case.split("[")[0] for case in EXPECTED}


def _load(case: str):
    name = EXPECTED[case][0]
    path = os.path.join(CORPUS, case.split("[")[0] + ".yaml")
    return path, load_sharing_config(path, name)


@pytest.mark.parametrize("host_name", HOSTS)
@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_derived_sharing_device_by_device(hosts, case, host_name):
    _name, per_host, fail_more = EXPECTED[case]
    want = per_host[host_name]
    path = os.path.join(CORPUS, case.split("[")[0] + ".yaml")
    if isinstance(want, str) and "resources[0].replicas" in want:
        with pytest.raises(NvshimError) as info:
            _load(case)
        assert str(info.value).startswith(f"{path}: ") and want in str(info.value)
        return
    path, config = _load(case)
    host = hosts[host_name]
    if isinstance(want, str):
        with pytest.raises(NvshimError) as info:
            resolve_sharing(config, host)
        assert str(info.value).startswith(f"{config.path}: ") and want in str(info.value)
        assert "\n" not in str(info.value)
        return
    shared = resolve_sharing(config, host)
    got = {s.name: (s.mode, s.replicas, s.resource) for s in shared.values()}
    assert got == want
    names = {str(g.index): g for g in host.gpus}
    names.update({m.name_index: m for m in host.mig_devices()})
    for name, device in names.items():  # keyed by the device's own UUID, nothing else
        assert (device.uuid in shared) == (name in want)
    for s in shared.values():
        assert s.fail_requests_greater_than_one is fail_more
        assert s.is_mig == (":" in s.name)


def test_corpus_warnings():
    _path, config = _load("defaults-and-warnings")
    warnings = [w.split(": ", 1)[1] for w in config.warnings]
    assert warnings[0].startswith("nodeSelector: unknown key ignored")
    assert warnings[1] == (
        "sharing.mps.resources[0].devices: ignored, as the device plugin does: every "
        "nvidia.com/gpu device is shared"
    )
    assert _load("mixed-time-slicing")[1].warnings == ()


def test_configmap_needs_a_name(hosts):
    path = os.path.join(CORPUS, "configmap-per-node.yaml")
    with pytest.raises(NvshimError, match=r"holds 2 named configs \(a100-40gb, tesla-t4\)"):
        load_sharing_config(path)
    assert load_sharing_config(path, "", "tesla-t4").path == f"{path} [tesla-t4]"


# ---- containers through nvshim-runtime and runc ------------------------------------------


@pytest.fixture(scope="module")
def runc_env(tmp_path_factory, sim_hosts, launchers):
    """h100x8-mig with the per-node ConfigMap; the node picks `a100-40gb` by config key."""
    root = tmp_path_factory.mktemp("sharing-runc")
    sim = sim_hosts("h100x8-mig")
    log = str(root / "nvshim.log")
    config = write_config(
        root / "config.toml", sim, launchers, root / "state", log, accept_env_unprivileged=True
    )
    with open(config, "a") as fh:
        fh.write(
            f'[sharing]\nconfig = "{os.path.join(CORPUS, "configmap-per-node.yaml")}"\n'
            'config-name = "a100-40gb"\n'
        )
    rootfs = make_busybox_rootfs(root / "rootfs")
    return {"root": root, "sim": sim, "config": config, "log": log, "rootfs": rootfs}


def _run(runc_env, tmp_path, visible: str, name: str, config: str | None = None):
    bundle = make_bundle(
        tmp_path,
        runc_env["rootfs"],
        ["sh", "-c", "echo CVD=$CUDA_VISIBLE_DEVICES"],
        env={"NVIDIA_VISIBLE_DEVICES": visible},
        name=name,
    )
    return runc_run(
        bundle,
        f"share-{os.getpid()}-{name}",
        runtime=os.path.join(launchers_dir(runc_env), "nvshim-runtime"),
        env={"NVSHIM_CONFIG": config or runc_env["config"]},
    )


def launchers_dir(runc_env) -> str:
    with open(runc_env["config"]) as fh:
        line = next(x for x in fh if x.startswith("hook-path"))
    return os.path.dirname(line.split('"')[1])


def test_container_on_a_shared_and_an_unshared_device(runc_env, tmp_path):
    sim = runc_env["sim"]
    uuids = sim.gpu_uuids()
    shared = _run(runc_env, tmp_path, f"{uuids[0]}::3", "shared")
    assert shared.returncode == 0, shared.stderr
    assert shared.stdout.strip() == f"CVD={uuids[0]}"
    record = read_log(runc_env["log"])[-1]
    assert record["sharing"] == f"0 ({uuids[0]}):time-slicing x8"

    unshared = _run(runc_env, tmp_path, "6:0", "unshared")  # 3g.40gb: not in the config
    assert unshared.returncode == 0, unshared.stderr
    record = read_log(runc_env["log"])[-1]
    assert "sharing" not in record and record["devices"].startswith("MIG-")

    mig = _run(runc_env, tmp_path, "6:2", "mig")  # 1g.10gb: not an A100 profile either
    assert mig.returncode == 0, mig.stderr
    assert "sharing" not in read_log(runc_env["log"])[-1]


def test_a_bad_sharing_file_refusal_names_the_file(runc_env, tmp_path):
    bad = tmp_path / "sharing.yaml"
    bad.write_text("version: v1\nsharing:\n  mps:\n    resources: [{name: gpu, replicas: 4}]\n")
    config = tmp_path / "config.toml"
    with open(runc_env["config"]) as fh:
        text = fh.read().split("[sharing]")[0]
    config.write_text(text + f'[sharing]\nconfig = "{bad}"\n')
    proc = _run(runc_env, tmp_path, "0", "bad", str(config))
    assert proc.returncode != 0 and "CVD=" not in proc.stdout
    assert f"{bad}: sharing.mps.resources[0].name: nvidia.com/gpu covers GPU in MIG mode 6" in (
        proc.stderr
    )
