"""The DRA driver without a kubelet: a real kube-apiserver (tests/dra_api.py), a simulated
GPU host (tests/sim, fake NVML through real pynvml, the fake MPS control daemon), and the
plugin's real gRPC sockets spoken to by a real gRPC client, as the kubelet would."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import grpc
import pytest

from nvshim.cdi.validate import validate_files
from nvshim.config import load_config
from nvshim.dra import DRIVER_NAME, slices, wire
from nvshim.dra.params import ParamsError, parse_gpu_config
from nvshim.dra.prepare import Driver, spec_path
from nvshim.dra.server import DRA_SERVICES, Plugin, socket_paths
from nvshim.host.discover import discover_host
from tests.conftest import NVSHIM, run_nvshim
from tests.dra_api import ApiServer
from tests.sim import fake_mps_control
from tests.sim.simhost import build_host
from tests.test_mps_daemon import _alive

NODE = "dra-node"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    server = ApiServer(tmp_path_factory.mktemp("api"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    root = tmp_path_factory.mktemp("dra-host")
    host = build_host("h100x8-mig", str(root / "host"), extra_files=fake_mps_control.extra_files())
    config = root / "config.toml"
    config.write_text(
        f'[host]\ndriver-root = "{host.driver_root}"\ndev-root = "{host.dev_root}"\n'
        f'[runtime]\nhook-path = "/usr/local/bin/nvshim-hook"\n'
    )
    return host, str(config)


@pytest.fixture
def short_tmp():
    """A short scratch dir: socket paths must stay under 108 bytes."""
    path = tempfile.mkdtemp(prefix="dra-", dir="/tmp")
    yield Path(path)
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def node(api, sim, short_tmp, monkeypatch):
    """A Driver and Plugin for the simulated host, serving under a scratch kubelet dir."""
    simhost, config_path = sim
    monkeypatch.setenv("NVSHIM_CONFIG", config_path)
    host = discover_host(simhost.driver_root, simhost.dev_root)
    tmp_path = short_tmp
    kubelet = tmp_path / "kubelet"
    dirs = {
        "cdi": str(tmp_path / "cdi"),
        "plugin": str(kubelet / "plugins" / DRIVER_NAME),
        "mps": str(tmp_path / "mps"),
    }
    driver = Driver(api.kube, NODE, host, load_config(), dirs["cdi"], dirs["plugin"], dirs["mps"])
    plugin = Plugin(driver, str(kubelet))
    plugin.start()
    yield plugin, driver, dirs
    plugin.stop()
    for uid in list(driver.claims):
        driver.unprepare({"uid": uid})
    for item in api.kube.get(CLAIMS).get("items", []):
        api.kube.delete(f"{CLAIMS}/{item['metadata']['name']}")


def _call(path: str, service: str, method: str, request: dict, req_schema, resp_schema):
    with grpc.insecure_channel(f"unix://{path}") as channel:
        stub = channel.unary_unary(
            f"/{service}/{method}",
            request_serializer=lambda m: wire.encode(m, req_schema),
            response_deserializer=lambda b: wire.decode(b, resp_schema),
        )
        return stub(request, timeout=30)


def _prepare(plugin, claims, version="v1.DRAPlugin"):
    return _call(
        plugin.dra_path,
        DRA_SERVICES[version],
        "NodePrepareResources",
        {"claims": claims},
        wire.CLAIMS_REQUEST,
        wire.PREPARE_RESPONSE,
    )["claims"]


def _unprepare(plugin, claims):
    return _call(
        plugin.dra_path,
        DRA_SERVICES["v1.DRAPlugin"],
        "NodeUnprepareResources",
        {"claims": claims},
        wire.CLAIMS_REQUEST,
        wire.UNPREPARE_RESPONSE,
    )["claims"]


def _allocated_claim(api, name: str, devices: list[tuple[str, str]], config=None) -> dict:
    """A ResourceClaim allocated (status written as the scheduler would) to ``devices``
    ((request, device) pairs) of this node's pool; the kubelet's Claim message for it."""
    requests = sorted({r for r, _ in devices})
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {
            "devices": {
                "requests": [
                    {"name": r, "exactly": {"deviceClassName": DRIVER_NAME}} for r in requests
                ]
            }
        },
    }
    if config is not None:
        body["spec"]["devices"]["config"] = [
            {"opaque": {"driver": DRIVER_NAME, "parameters": config}}
        ]
    obj = api.kube.create(CLAIMS, body)
    allocation = {
        "devices": {
            "results": [
                {"request": r, "driver": DRIVER_NAME, "pool": NODE, "device": d} for r, d in devices
            ]
        }
    }
    if config is not None:
        allocation["devices"]["config"] = [
            {"source": "FromClaim", "opaque": {"driver": DRIVER_NAME, "parameters": config}}
        ]
    obj["status"] = {"allocation": allocation}
    obj = api.kube.replace(f"{CLAIMS}/{name}/status", obj)
    return {"namespace": "default", "name": name, "uid": obj["metadata"]["uid"]}


def _spec(dirs, uid) -> dict:
    with open(spec_path(dirs["cdi"], uid)) as fh:
        return json.load(fh)


# -- registration and sockets -----------------------------------------------------------


def test_registration_answers_as_a_dra_plugin(node):
    plugin, _, _ = node
    info = _call(
        plugin.reg_path,
        "pluginregistration.Registration",
        "GetInfo",
        {},
        wire.EMPTY,
        wire.PLUGIN_INFO,
    )
    assert info == {
        "type": "DRAPlugin",
        "name": "gpu.nvshim.io",
        "endpoint": plugin.dra_path,
        "supported_versions": ["v1.DRAPlugin", "v1beta1.DRAPlugin"],
    }
    assert plugin.reg_path.endswith("/plugins_registry/gpu.nvshim.io-reg.sock")
    _call(
        plugin.reg_path,
        "pluginregistration.Registration",
        "NotifyRegistrationStatus",
        {"plugin_registered": True},
        wire.REGISTRATION_STATUS,
        wire.EMPTY,
    )
    assert plugin.registered.is_set()


def test_removed_socket_is_served_again_and_stop_removes_both(api, sim, short_tmp, monkeypatch):
    tmp_path = short_tmp
    monkeypatch.setenv("NVSHIM_CONFIG", sim[1])
    host = discover_host(sim[0].driver_root, sim[0].dev_root)
    driver = Driver(api.kube, NODE, host, load_config(), str(tmp_path / "cdi"),
                    str(tmp_path / "k/plugins/x"), str(tmp_path / "mps"))  # fmt: skip
    plugin = Plugin(driver, str(tmp_path / "k"))
    plugin.start()
    reg, dra = socket_paths(str(tmp_path / "k"))
    try:
        os.unlink(reg)
        deadline = time.monotonic() + 10
        while not os.path.exists(reg) and time.monotonic() < deadline:
            time.sleep(0.1)
        info = _call(
            reg, "pluginregistration.Registration", "GetInfo", {}, wire.EMPTY, wire.PLUGIN_INFO
        )
        assert info["endpoint"] == dra
    finally:
        plugin.stop()
    assert not os.path.exists(reg) and not os.path.exists(dra)


# -- ResourceSlices ----------------------------------------------------------------------


def test_slices_hold_every_gpu_and_mig_device_with_attributes(sim):
    simhost, config = sim
    out = run_nvshim("dra", "slices", "--node-name", NODE, env={"NVSHIM_CONFIG": config})
    assert out.returncode == 0, out.stderr
    (only,) = json.loads(out.stdout)
    devices = {d["name"]: d for d in only["spec"]["devices"]}
    host = discover_host(simhost.driver_root, simhost.dev_root)
    whole = [g for g in host.gpus if not g.mig_enabled]
    assert sorted(devices) == sorted(
        [f"gpu-{g.index}" for g in whole]
        + [f"mig-{m.parent_index}-{m.index}" for m in host.mig_devices()]
    )
    assert any(g.mig_enabled for g in host.gpus)  # a MIG-mode GPU is offered only as MIG
    gpu = whole[0]
    attrs = devices[f"gpu-{gpu.index}"]["attributes"]
    assert attrs["uuid"] == {"string": gpu.uuid}
    assert attrs["index"] == {"int": gpu.index}
    assert attrs["productName"] == {"string": gpu.name}
    assert attrs["cudaComputeCapability"] == {"version": "9.0.0"}
    assert attrs["driverVersion"] == {"version": host.driver_version}
    assert devices[f"gpu-{gpu.index}"]["capacity"]["memory"] == {
        "value": f"{gpu.memory_total >> 20}Mi"
    }
    mig = host.mig_devices()[0]
    mattrs = devices[f"mig-{mig.parent_index}-{mig.index}"]
    assert mattrs["attributes"]["profile"] == {"string": mig.profile}
    assert mattrs["attributes"]["parentUUID"] == {"string": host.gpu(mig.parent_index).uuid}
    assert int(mattrs["capacity"]["multiprocessors"]["value"]) > 0
    # the reference driver's MIG capacities, from NVML's GPU instance profile info
    topo = {m["uuid"]: m for g in simhost.topology["gpus"] for m in g.get("mig_devices", [])}
    held: dict[int, list[int]] = {}
    for m in host.mig_devices():
        capacity = devices[f"mig-{m.parent_index}-{m.index}"]["capacity"]
        want = topo[m.uuid]
        for name, key in (("copyEngines", "copy_engines"), ("decoders", "decoders"),
                          ("encoders", "encoders"), ("jpegEngines", "jpegs"),
                          ("ofaEngines", "ofas")):  # fmt: skip
            assert capacity[name] == {"value": str(want[key])}, (name, m.profile)
        slices_ = sorted(int(k[len("memorySlice") :]) for k in capacity if k.startswith("memorySl"))
        assert slices_ and slices_ == list(range(slices_[0], slices_[-1] + 1)), slices_
        assert all(capacity[f"memorySlice{n}"] == {"value": "1"} for n in slices_)
        assert 0 <= slices_[0] and slices_[-1] <= 7
        if m.ci == min(x.ci for x in host.mig_devices() if (x.parent_index, x.gi) == (
                m.parent_index, m.gi)):  # fmt: skip
            taken = held.setdefault(m.parent_index, [])
            assert not set(taken) & set(slices_), (m.profile, taken, slices_)  # disjoint GIs
            taken += slices_


def test_slices_carry_pcie_root_and_paired_nic(tmp_path):
    simhost = build_host("hgx-h100x8-rdma", str(tmp_path / "host"))
    config = tmp_path / "config.toml"
    config.write_text(
        f'[host]\ndriver-root = "{simhost.driver_root}"\ndev-root = "{simhost.dev_root}"\n'
    )
    out = run_nvshim("dra", "slices", "--node-name", NODE, env={"NVSHIM_CONFIG": str(config)})
    assert out.returncode == 0, out.stderr
    devices = json.loads(out.stdout)[0]["spec"]["devices"]
    topo = run_nvshim("info", "--topology", "--json", env={"NVSHIM_CONFIG": str(config)})
    assert topo.returncode == 0, topo.stderr
    places = {g["index"]: g for g in json.loads(topo.stdout)["gpus"]}
    for d in devices:
        index = d["attributes"]["index"]["int"]
        assert d["attributes"]["resource.kubernetes.io/pcieRoot"] == {
            "string": places[index]["location"]["host_bridge"]
        }
        assert d["attributes"]["rdmaNic"]["string"].startswith("mlx5_")


def test_publish_is_accepted_by_the_api_server_and_kept_current(api, sim):
    simhost, config = sim
    host = discover_host(simhost.driver_root, simhost.dev_root)
    devices = slices.slice_devices(host, load_config(config), [])
    assert slices.publish(api.kube, NODE, devices, None).startswith("published")
    (first,) = slices.node_slices(api.kube, NODE)
    assert first["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
    assert len(first["spec"]["devices"]) == len(devices)
    assert slices.publish(api.kube, NODE, devices, None).endswith("current")
    assert slices.publish(api.kube, NODE, devices[:-1], None).startswith("published")
    (second,) = slices.node_slices(api.kube, NODE)
    assert second["spec"]["pool"]["generation"] == 2
    assert len(second["spec"]["devices"]) == len(devices) - 1
    api.kube.delete(f"{slices.SLICES}/{second['metadata']['name']}")  # someone deletes it
    slices.publish(api.kube, NODE, devices, None)
    assert len(slices.node_slices(api.kube, NODE)) == 1
    out = run_nvshim(
        "dra", "withdraw", "--node-name", NODE, "--kubeconfig", str(api.kubeconfig),
        env={"NVSHIM_CONFIG": config},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert slices.node_slices(api.kube, NODE) == []


# -- prepare / unprepare -----------------------------------------------------------------


def test_prepare_writes_a_claim_spec_with_exactly_the_allocated_gpu(api, node, sim):
    plugin, driver, dirs = node
    host = driver.host
    gpu = host.gpu(1)
    claim = _allocated_claim(api, "one-gpu", [("gpu", "gpu-1")])
    answer = _prepare(plugin, [claim])[claim["uid"]]
    assert answer["error"] == ""
    cdi = f"k8s.gpu.nvshim.io/claim={claim['uid']}-gpu-1"
    assert answer["devices"] == [
        {
            "request_names": ["gpu"],
            "pool_name": NODE,
            "device_name": "gpu-1",
            "cdi_device_ids": [cdi],
        }
    ]
    path = spec_path(dirs["cdi"], claim["uid"])
    assert validate_files([path]) == []
    spec = _spec(dirs, claim["uid"])
    (device,) = spec["devices"]
    assert device["containerEdits"]["env"] == [f"CUDA_VISIBLE_DEVICES={gpu.uuid}"]
    assert [n["path"] for n in device["containerEdits"]["deviceNodes"]] == [
        f"/dev/nvidia{gpu.minor}"
    ]
    common = spec["containerEdits"]
    assert "/dev/nvidiactl" in [n["path"] for n in common["deviceNodes"]]
    assert any(m["containerPath"].endswith("libcuda.so.1") or "libcuda" in m["containerPath"]
               for m in common["mounts"])  # fmt: skip
    # idempotent: the same answer, the same file
    before = os.stat(path).st_mtime_ns
    assert _prepare(plugin, [claim], "v1beta1.DRAPlugin")[claim["uid"]] == answer
    assert os.stat(path).st_mtime_ns == before
    # a second claim for the same GPU is refused, naming the owner
    other = _allocated_claim(api, "thief", [("gpu", "gpu-1")])
    refused = _prepare(plugin, [other])[other["uid"]]
    assert refused["devices"] == []
    assert "gpu-1" in refused["error"] and "default/one-gpu" in refused["error"]
    assert not os.path.exists(spec_path(dirs["cdi"], other["uid"]))
    # unprepare removes the spec and frees the GPU
    assert _unprepare(plugin, [claim]) == {claim["uid"]: {"error": ""}}
    assert not os.path.exists(path)
    assert _unprepare(plugin, [claim]) == {claim["uid"]: {"error": ""}}  # idempotent
    assert _prepare(plugin, [other])[other["uid"]]["error"] == ""


def test_multi_device_claim_and_mig_device(api, node):
    plugin, driver, dirs = node
    mig = driver.host.mig_devices()[0]
    name = f"mig-{mig.parent_index}-{mig.index}"
    claim = _allocated_claim(api, "mixed", [("a", "gpu-2"), ("a", "gpu-3"), ("m", name)])
    answer = _prepare(plugin, [claim])[claim["uid"]]
    assert answer["error"] == ""
    assert [d["device_name"] for d in answer["devices"]] == ["gpu-2", "gpu-3", name]
    spec = {d["name"]: d["containerEdits"] for d in _spec(dirs, claim["uid"])["devices"]}
    both = ",".join(driver.host.gpu(i).uuid for i in (2, 3))
    assert spec[f"{claim['uid']}-gpu-2"]["env"] == [f"CUDA_VISIBLE_DEVICES={both}"]
    assert spec[f"{claim['uid']}-{name}"]["env"] == [f"CUDA_VISIBLE_DEVICES={mig.uuid}"]
    paths = [n["path"] for n in spec[f"{claim['uid']}-{name}"]["deviceNodes"]]
    assert paths[0] == f"/dev/nvidia{driver.host.gpu(mig.parent_index).minor}"
    assert all(p.startswith("/dev/nvidia-caps/") for p in paths[1:]) and len(paths) == 3


def test_unknown_device_and_unallocated_claim_are_refused(api, node):
    plugin, _, dirs = node
    claim = _allocated_claim(api, "ghost", [("gpu", "gpu-99")])
    error = _prepare(plugin, [claim])[claim["uid"]]["error"]
    assert "gpu-99" in error and f"not on node {NODE}" in error
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "pending"},
        "spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "x"}}]}},
    }
    obj = api.kube.create(CLAIMS, body)
    pending = {"namespace": "default", "name": "pending", "uid": obj["metadata"]["uid"]}
    assert "not allocated" in _prepare(plugin, [pending])[pending["uid"]]["error"]
    wrong = {**pending, "uid": "00000000-0000-0000-0000-000000000000"}
    assert "the kubelet asked for" in _prepare(plugin, [wrong])[wrong["uid"]]["error"]
    for odd in ("../x", "\u00fc-uid"):  # a UID names a spec file: ASCII letters, digits, -
        assert (
            "is not a Kubernetes UID" in _prepare(plugin, [{**pending, "uid": odd}])[odd]["error"]
        )
    assert not os.path.isdir(dirs["cdi"]) or os.listdir(dirs["cdi"]) == []


def test_mps_claim_starts_its_daemon_with_the_claim_limits(api, node):
    plugin, driver, dirs = node
    gpu = driver.host.gpu(4)
    params = {
        "apiVersion": "gpu.nvshim.io/v1alpha1",
        "kind": "GpuConfig",
        "sharing": {
            "strategy": "MPS",
            "mps": {"activeThreadPercentage": 30, "pinnedMemoryLimit": "4Gi"},
        },
    }
    claim = _allocated_claim(api, "mps", [("gpu", "gpu-4")], params)
    answer = _prepare(plugin, [claim])[claim["uid"]]
    assert answer["error"] == ""
    edits = _spec(dirs, claim["uid"])["devices"][0]["containerEdits"]
    env = dict(e.split("=", 1) for e in edits["env"])
    assert env["CUDA_VISIBLE_DEVICES"] == gpu.uuid
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/nvidia-mps"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{gpu.uuid}=4096M"
    pipe = os.path.join(dirs["mps"], gpu.uuid, "pipe")
    assert {m["containerPath"]: m["hostPath"] for m in edits["mounts"]}["/run/nvidia-mps"] == pipe
    # the daemon runs, with the claim's defaults (the fake daemon logs what it was told)
    with open(os.path.join(pipe, "nvidia-cuda-mps-control.pid")) as fh:
        pid = int(fh.read())
    os.kill(pid, 0)
    with open(os.path.join(dirs["mps"], gpu.uuid, "log", "control.log")) as fh:
        log = fh.read()
    assert "set_default_active_thread_percentage 30" in log
    assert "set_default_device_pinned_mem_limit 0 4096M" in log
    assert _unprepare(plugin, [claim])[claim["uid"]]["error"] == ""
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid)


def test_mps_refusals_match_the_sharing_config(api, node):
    plugin, driver, dirs = node
    mig = driver.host.mig_devices()[0]
    mps = {"apiVersion": "gpu.nvshim.io/v1alpha1", "kind": "GpuConfig",
           "sharing": {"strategy": "MPS"}}  # fmt: skip
    on_mig = _allocated_claim(api, "mps-mig", [("g", f"mig-{mig.parent_index}-{mig.index}")], mps)
    error = _prepare(plugin, [on_mig])[on_mig["uid"]]["error"]
    assert "sharing with MPS is not supported for MIG devices" in error
    # request a (gpu-0) starts its daemon, request b (the MIG device) is refused: a's
    # daemon is stopped again and its directories removed
    half = _allocated_claim(
        api, "mps-half", [("a", "gpu-0"), ("b", f"mig-{mig.parent_index}-{mig.index}")], mps
    )
    error = _prepare(plugin, [half])[half["uid"]]["error"]
    assert "request b" in error and "not supported for MIG devices" in error
    assert not os.path.exists(os.path.join(dirs["mps"], driver.host.gpu(0).uuid))
    two = _allocated_claim(api, "mps-two", [("g", "gpu-0"), ("g", "gpu-5")], mps)
    assert "exactly one device" in _prepare(plugin, [two])[two["uid"]]["error"]
    typo = {**mps, "sharing": {"strategy": "MPS", "mps": {"activeThreadPercent": 20}}}
    bad = _allocated_claim(api, "mps-typo", [("g", "gpu-0")], typo)
    assert "activeThreadPercent: unknown field" in _prepare(plugin, [bad])[bad["uid"]]["error"]
    assert not os.path.isdir(dirs["cdi"]) or os.listdir(dirs["cdi"]) == []


def test_gpu_config_validation():
    base = {"apiVersion": "gpu.nvshim.io/v1alpha1", "kind": "GpuConfig"}
    assert parse_gpu_config(base).strategy is None
    got = parse_gpu_config({**base, "sharing": {"strategy": "MPS", "mps": {
        "activeThreadPercentage": 50, "pinnedMemoryLimit": "512Mi"}}})  # fmt: skip
    assert (got.strategy, got.threads, got.memory_mib) == ("MPS", 50, 512)
    for bad, words in (
        ({**base, "apiVersion": "gpu.nvshim.io/v2"}, "apiVersion/kind must be"),
        ({**base, "sharing": {"strategy": "Mps"}}, "must be TimeSlicing or MPS"),
        ({**base, "sharing": {"strategy": "TimeSlicing", "mps": {}}}, "only with strategy MPS"),
        ({**base, "sharing": {"strategy": "MPS", "mps": {"activeThreadPercentage": 0}}}, "1..100"),
        ({**base, "sharing": {"strategy": "MPS", "mps": {"pinnedMemoryLimit": "1.5G"}}}, "8Gi"),
        # digits str.isdigit takes but int refuses (or reads as another script's)
        ({**base, "sharing": {"strategy": "MPS", "mps": {"pinnedMemoryLimit": "\u00b2Gi"}}}, "8Gi"),
        ({**base, "sharing": {"strategy": "MPS", "mps": {"pinnedMemoryLimit": "\u0663Gi"}}}, "8Gi"),
        ({**base, "sharing": {"strategy": "MPS", "mps": {"pinnedMemoryLimit": "\u00b2"}}}, "8Gi"),
    ):
        with pytest.raises(ParamsError, match=words):
            parse_gpu_config(bad)


def test_restart_keeps_prepared_claims_and_drops_deleted_ones(api, node):
    plugin, driver, dirs = node
    kept = _allocated_claim(api, "kept", [("gpu", "gpu-0")])
    gone = _allocated_claim(api, "gone", [("gpu", "gpu-5")])
    for claim in (kept, gone):
        assert _prepare(plugin, [claim])[claim["uid"]]["error"] == ""
    plugin.stop()
    api.kube.delete(f"{CLAIMS}/gone")
    orphan = os.path.join(dirs["cdi"], "k8s.gpu.nvshim.io-claim_0000-orphan.json")
    with open(orphan, "w") as fh:
        fh.write("{}")
    again = Driver(api.kube, NODE, driver.host, driver.config, dirs["cdi"], dirs["plugin"],
                   dirs["mps"])  # fmt: skip
    assert sorted(again.claims) == sorted([kept["uid"], gone["uid"]])
    lines = again.reconcile()
    assert any("unprepared claim default/gone" in line for line in lines)
    assert any("orphan" in line for line in lines)
    assert sorted(os.listdir(dirs["cdi"])) == [
        os.path.basename(spec_path(dirs["cdi"], kept["uid"]))
    ]
    assert list(again.claims) == [kept["uid"]]
    # the restarted plugin still refuses gpu-0 to another claim, and answers for "kept"
    plugin2 = Plugin(again, os.path.dirname(os.path.dirname(dirs["plugin"])))
    plugin2.start()
    try:
        thief = _allocated_claim(api, "late", [("gpu", "gpu-0")])
        assert "default/kept" in _prepare(plugin2, [thief])[thief["uid"]]["error"]
        assert _prepare(plugin2, [kept])[kept["uid"]]["devices"][0]["device_name"] == "gpu-0"
    finally:
        plugin2.stop()
        again.unprepare(kept)
    driver.claims = {}


def test_run_serves_publishes_and_cleans_up_on_sigterm(api, sim, short_tmp):
    tmp_path = short_tmp
    _, config = sim
    kubelet = tmp_path / "kubelet"
    env = {**os.environ, "NVSHIM_CONFIG": config, "NODE_NAME": "run-node"}
    proc = subprocess.Popen(
        [NVSHIM, "dra", "run", "--kubeconfig", str(api.kubeconfig), "--kubelet-dir",
         str(kubelet), "--cdi-dir", str(tmp_path / "cdi"), "--mps-root", str(tmp_path / "mps"),
         "--interval", "0.5"],
        env=env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    reg, dra = socket_paths(str(kubelet))
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (
            os.path.exists(reg) and slices.node_slices(api.kube, "run-node")
        ):
            time.sleep(0.2)
        assert os.path.exists(dra)
        assert len(slices.node_slices(api.kube, "run-node")[0]["spec"]["devices"]) > 0
        # a kubelet that starts deletes the node's slices, then registers the plugin: they
        # are back within a few ticks, not at the next resync (a minute)
        assert slices.withdraw(api.kube, "run-node") == 1
        _call(reg, "pluginregistration.Registration", "NotifyRegistrationStatus",
              {"plugin_registered": True}, wire.REGISTRATION_STATUS, wire.EMPTY)  # fmt: skip
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not slices.node_slices(api.kube, "run-node"):
            time.sleep(0.2)
        assert slices.node_slices(api.kube, "run-node")
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "published" in err and "sockets removed" in err
    assert not os.path.exists(reg) and not os.path.exists(dra)
    assert not os.path.exists(os.path.join(kubelet, "plugins", DRIVER_NAME))
    slices.withdraw(api.kube, "run-node")


def test_bad_kubeconfig_is_one_line(tmp_path, sim):
    bad = tmp_path / "kc"
    bad.write_text("current-context: nowhere\n")
    out = run_nvshim("dra", "withdraw", "--node-name", "n", "--kubeconfig", str(bad))
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        f"nvshim: error: kubeconfig {bad}: no usable current context"
    ]
    # CA data that is not base64, or not a certificate: one line naming the kubeconfig
    for ca in ("!!notbase64", base64.b64encode(b"not a cert").decode()):
        bad.write_text(
            "current-context: c\n"
            "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
            f"clusters: [{{name: k, cluster: {{server: 'https://127.0.0.1:1',"
            f" certificate-authority-data: '{ca}'}}}}]\n"
        )
        out = run_nvshim("dra", "withdraw", "--node-name", "n", "--kubeconfig", str(bad))
        assert out.returncode == 1, out.stderr
        (line,) = out.stderr.strip().splitlines()
        assert line.startswith(f"nvshim: error: kubeconfig {bad}: unusable TLS settings: ")


@pytest.mark.parametrize(
    "args, line",
    [
        # a wait of 0, below 0 or nan would spin on discovery and the API server
        (("--interval", "0"), "invalid value for '--interval': 0: must be above 0"),
        (("--interval", "-5"), "invalid value for '--interval': -5: must be above 0"),
        (("--resync", "nan"), "invalid value for '--resync': nan: must be above 0"),
        # inf was "never": the slices never resent, the host never checked again
        (("--resync", "inf"), "invalid value for '--resync': inf: must be finite"),
        (("--interval", "inf"), "invalid value for '--interval': inf: must be finite"),
        # the command line's own mistake first, before the kubeconfig is read
        (("--node-name", ""), "--node-name (or NODE_NAME) is required"),
    ],
)
def test_bad_run_option_is_a_usage_error_before_anything_else(tmp_path, args, line):
    bad = tmp_path / "kc"
    bad.write_text("current-context: nowhere\n")
    argv = ("dra", "run", "--node-name", "n", "--kubeconfig", str(bad), *args)
    out = run_nvshim(*argv, env={"NODE_NAME": ""}, timeout=60)
    assert out.returncode == 2
    assert out.stderr == f"nvshim: error: {line}; try 'nvshim dra run --help'\n"
    assert os.listdir(tmp_path) == ["kc"]


def test_specs_name_the_nodes_paths_when_run_in_a_pod(api, sim, short_tmp, monkeypatch):
    """In the DaemonSet discovery runs under the node's / mounted at --host-root; the
    claim spec must name the node's own paths (what containerd on the node opens)."""
    simhost, config = sim
    monkeypatch.setenv("NVSHIM_CONFIG", config)
    host = discover_host(simhost.driver_root, simhost.dev_root)
    root = simhost.root.rstrip("/")
    driver = Driver(api.kube, NODE, host, load_config(), str(short_tmp / "cdi"),
                    str(short_tmp / "p"), str(short_tmp / "mps"), host_root=root)  # fmt: skip
    claim = _allocated_claim(api, "in-pod", [("gpu", "gpu-0")])
    try:
        assert driver.prepare(claim)["error"] == ""
        spec = json.loads(open(spec_path(str(short_tmp / "cdi"), claim["uid"])).read())
        text = json.dumps(spec)
        assert root not in text
        (device,) = spec["devices"]
        node = device["containerEdits"]["deviceNodes"][0]
        assert node["path"] == f"/dev/nvidia{host.gpu(0).minor}" and "hostPath" not in node
        hooks = spec["containerEdits"]["hooks"] + device["containerEdits"]["hooks"]
        assert hooks and all(  # the pod's config path means nothing on the node
            not any(e.startswith(("NVSHIM_CONFIG=", "NVSHIM_CACHE_DIR=")) for e in h["env"])
            for h in hooks
        )
        libs = [m["hostPath"] for m in spec["containerEdits"]["mounts"]]
        assert any(p.startswith("/usr/lib/") and "libcuda.so" in p for p in libs), libs
    finally:
        driver.unprepare(claim)
        api.kube.delete(f"{CLAIMS}/in-pod")


def _manifests() -> list[dict]:
    import yaml

    from tests.conftest import REPO
    from tests.k8s.artifacts import k8s_bin

    out = subprocess.run(
        [f"{k8s_bin()}/kubectl", "kustomize", os.path.join(REPO, "packaging/kubernetes/dra")],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return [d for d in yaml.safe_load_all(out) if d]


PATHS = {
    "Namespace": "/api/v1/namespaces",
    "ServiceAccount": "/api/v1/namespaces/nvshim-dra/serviceaccounts",
    "ConfigMap": "/api/v1/namespaces/nvshim-dra/configmaps",
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    "ValidatingAdmissionPolicy": (
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
    ),
    "ValidatingAdmissionPolicyBinding": (
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"
    ),
    "DeviceClass": "/apis/resource.k8s.io/v1/deviceclasses",
    "DaemonSet": "/apis/apps/v1/namespaces/nvshim-dra/daemonsets",
}


def test_manifests_rbac_and_policy_hold_on_a_real_api_server(api, sim):
    """The manifests are accepted (CEL type-checked), and a token of the plugin's service
    account bound to a pod on node A may write A's slices and read claims, not B's slices."""
    for doc in _manifests():
        api.kube.create(PATHS[doc["kind"]], doc)
    api.kube.create("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node",
                                      "metadata": {"name": NODE}})  # fmt: skip
    pod = api.kube.create(
        "/api/v1/namespaces/nvshim-dra/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "plugin"},
            "spec": {
                "nodeName": NODE,
                "serviceAccountName": "nvshim-dra",
                "containers": [{"name": "c", "image": "x"}],
            },
        },
    )
    token = api.kube.create(
        "/api/v1/namespaces/nvshim-dra/serviceaccounts/nvshim-dra/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": [],
                "boundObjectRef": {
                    "kind": "Pod",
                    "apiVersion": "v1",
                    "name": "plugin",
                    "uid": pod["metadata"]["uid"],
                },  # fmt: skip
            },
        },
    )["status"]["token"]
    plugin = api.as_token(token)
    simhost, config = sim
    host = discover_host(simhost.driver_root, simhost.dev_root)
    devices = slices.slice_devices(host, load_config(config), [])
    node_uid = api.kube.get(f"/api/v1/nodes/{NODE}")["metadata"]["uid"]
    deadline = time.monotonic() + 30
    while True:  # the policy takes effect once the API server has loaded it
        try:
            slices.publish(plugin, "other-node", devices, None)
        except slices.KubeError as err:
            assert err.status == 422, err  # a policy denial is Invalid
            assert "may only write ResourceSlices of its own node dra-node" in str(err)
            break
        slices.withdraw(api.kube, "other-node")
        assert time.monotonic() < deadline, "the admission policy never took effect"
        time.sleep(0.5)
    assert slices.publish(plugin, NODE, devices, node_uid).startswith("published")
    (mine,) = slices.node_slices(plugin, NODE)
    assert mine["metadata"]["ownerReferences"][0]["uid"] == node_uid
    claim = _allocated_claim(api, "readable", [("gpu", "gpu-0")])
    assert plugin.get(f"{CLAIMS}/readable")["metadata"]["uid"] == claim["uid"]
    with pytest.raises(slices.KubeError) as denied:
        plugin.get("/api/v1/namespaces/nvshim-dra/secrets")
    assert denied.value.status == 403
    assert slices.withdraw(plugin, NODE) == 1
    api.kube.delete(f"{CLAIMS}/readable")


@pytest.mark.parametrize(
    "env, code",
    [
        (["NVIDIA_REQUIRE_CUDA=cuda>=12.0 brand=tesla"], 0),
        (["NVIDIA_REQUIRE_CUDA=cuda>=13.0"], 1),
        (["NVIDIA_REQUIRE_ARCH=arch>=10.0"], 1),
        (["NVIDIA_REQUIRE_CUDA=cuda>=13.0", "NVIDIA_DISABLE_REQUIRE=true"], 0),
        ([], 0),
    ],
)
def test_claim_spec_checks_the_images_requirements(api, node, launchers, tmp_path, env, code):
    """The claim spec's createRuntime hook, run as the runtime runs it (the OCI state on
    stdin, the bundle's config.json holding the image's env)."""
    plugin, driver, dirs = node
    claim = _allocated_claim(api, "req", [("gpu", "gpu-0")])
    assert _prepare(plugin, [claim])[claim["uid"]]["error"] == ""
    (device,) = _spec(dirs, claim["uid"])["devices"]
    (hook,) = [h for h in device["containerEdits"]["hooks"] if "require-check" in h["args"]]
    assert hook["hookName"] == "createRuntime"
    gpu = driver.host.gpu(0)
    assert (
        hook["args"][hook["args"].index("--device") + 1] == f"{gpu.compute_capability}:{gpu.brand}"
    )
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps({"process": {"env": ["PATH=/bin", *env]}}))
    config = tmp_path / "hook.toml"
    config.write_text(f'[runtime]\nlog-file = "{tmp_path / "log"}"\n')
    state = json.dumps({"ociVersion": "1.0.2", "id": "c1", "pid": 1, "bundle": str(bundle)})
    args = [f"{launchers}/nvshim-hook", "--config", str(config), *hook["args"][1:]]
    proc = subprocess.run(args, input=state, capture_output=True, text=True, env=dict(
        e.split("=", 1) for e in hook["env"]))  # fmt: skip
    assert proc.returncode == code, proc.stderr
    if code:
        assert proc.stderr.count("\n") == 1 and "requirement not met" in proc.stderr


def test_claim_config_overrides_the_class_config_per_request():
    from nvshim.dra.params import configs_for_requests

    def opaque(strategy: str, threads: int | None = None) -> dict:
        mps = {"mps": {"activeThreadPercentage": threads}} if threads else {}
        return {"driver": DRIVER_NAME, "parameters": {
            "apiVersion": "gpu.nvshim.io/v1alpha1", "kind": "GpuConfig",
            "sharing": {"strategy": strategy, **mps}}}  # fmt: skip

    allocation = {
        "devices": {
            "config": [
                # the claim's entries come first here: the class's must still apply first
                {"source": "FromClaim", "requests": ["a"], "opaque": opaque("MPS", 25)},
                {"source": "FromClass", "requests": [], "opaque": opaque("MPS", 60)},
                {"source": "FromClaim", "requests": ["b"], "opaque": opaque("TimeSlicing")},
                {
                    "source": "FromClaim",
                    "opaque": {"driver": "other.example.com", "parameters": {"x": 1}},
                },  # fmt: skip
            ]
        }
    }
    got = configs_for_requests(allocation, ["a", "b", "c/sub"])
    assert (got["a"].strategy, got["a"].threads) == ("MPS", 25)
    assert got["b"].strategy == "TimeSlicing"
    assert (got["c/sub"].strategy, got["c/sub"].threads) == ("MPS", 60)


def _publisher(api, profile: str, node: str, tmp_path, short_tmp):
    """A simulated host of ``profile``, its Driver and a Publisher that has ticked once."""
    from nvshim.dra.run import Publisher

    simhost = build_host(profile, str(tmp_path / "host"))
    host = discover_host(simhost.driver_root, simhost.dev_root)
    config = tmp_path / "config.toml"
    config.write_text(f'[host]\ndriver-root = "{simhost.driver_root}"\n')
    scratch = [str(short_tmp / d) for d in ("cdi", "p", "mps")]
    driver = Driver(api.kube, node, host, load_config(str(config)), *scratch)
    publisher = Publisher(api.kube, node, driver, simhost.driver_root, simhost.dev_root)
    publisher.tick(resync=3600)
    return simhost, host, driver, publisher


def test_publisher_rewrites_the_slices_when_the_host_changes(api, tmp_path, short_tmp):
    """The refresh key (device nodes here) changes: rediscovery, a new pool generation
    without the GPU whose node went away; unchanged: nothing sent until the resync."""
    simhost, host, driver, publisher = _publisher(api, "single", "change-node", tmp_path,
                                                  short_tmp)  # fmt: skip
    (first,) = slices.node_slices(api.kube, "change-node")
    assert [d["name"] for d in first["spec"]["devices"]] == ["gpu-0"]
    publisher.tick(resync=3600)  # nothing changed: the slice is not rewritten
    (same,) = slices.node_slices(api.kube, "change-node")
    assert same["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    node = os.path.join(simhost.dev_root, "dev", f"nvidia{host.gpu(0).minor}")
    os.rename(node, node + ".away")
    try:
        publisher.tick(resync=3600)
    finally:
        os.rename(node + ".away", node)
    (changed,) = slices.node_slices(api.kube, "change-node")
    assert changed["spec"].get("devices", []) == []  # the API leaves an empty list out
    assert changed["spec"]["pool"]["generation"] == 2
    assert driver.host.gpus == []  # prepare sees the new host too
    publisher.tick(resync=3600)
    (back,) = slices.node_slices(api.kube, "change-node")
    assert [d["name"] for d in back["spec"]["devices"]] == ["gpu-0"]
    assert back["spec"]["pool"]["generation"] == 3
    slices.withdraw(api.kube, "change-node")


# -- claim forms, restarts, reboots, damaged checkpoints (issue 29) ------------------------


def _claim_with(api, name: str, requests: list[dict], results: list[dict]) -> dict:
    """A ResourceClaim with these spec ``requests``, allocated to ``results`` (request,
    device, extra fields) of this node's pool; the kubelet's Claim message for it."""
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": requests}},
    }
    obj = api.kube.create(CLAIMS, body)
    obj["status"] = {"allocation": {"devices": {"results": [
        {"driver": DRIVER_NAME, "pool": NODE, **r} for r in results]}}}  # fmt: skip
    obj = api.kube.replace(f"{CLAIMS}/{name}/status", obj)
    return {"namespace": "default", "name": name, "uid": obj["metadata"]["uid"]}


def test_first_available_answers_the_request_not_the_subrequest(api, node):
    """The kubelet matches a container's ``request: gpu`` against the names prepare
    answers: a ``firstAvailable`` allocation's ``gpu/whole`` must come back as ``gpu``."""
    plugin, driver, dirs = node
    exactly = {"deviceClassName": DRIVER_NAME}
    requests = [{"name": "gpu", "firstAvailable": [
        {"name": "two", "deviceClassName": DRIVER_NAME, "allocationMode": "ExactCount",
         "count": 2},
        {"name": "whole", **exactly}]}]  # fmt: skip
    claim = _claim_with(api, "first", requests, [{"request": "gpu/whole", "device": "gpu-2"}])
    answer = _prepare(plugin, [claim])[claim["uid"]]
    assert answer["error"] == ""
    assert [d["request_names"] for d in answer["devices"]] == [["gpu"]]
    (device,) = _spec(dirs, claim["uid"])["devices"]
    assert device["containerEdits"]["env"] == [f"CUDA_VISIBLE_DEVICES={driver.host.gpu(2).uuid}"]
    assert _unprepare(plugin, [claim])[claim["uid"]]["error"] == ""


def test_bad_values_from_the_kubelet_or_a_claim_are_one_line(api, node):
    plugin, _, dirs = node
    digits = "9" * 5000
    for i, limit in enumerate((digits + "Gi", digits)):
        params = {"apiVersion": "gpu.nvshim.io/v1alpha1", "kind": "GpuConfig",
                  "sharing": {"strategy": "MPS", "mps": {"pinnedMemoryLimit": limit}}}  # fmt: skip
        claim = _allocated_claim(api, f"huge-{i}", [("gpu", "gpu-0")], params)
        error = _prepare(plugin, [claim])[claim["uid"]]["error"]
        assert "pinnedMemoryLimit: must be a quantity" in error and "at most 18 digits" in error
        assert "\n" not in error and len(error) < 400 and "internal error" not in error
    with pytest.raises(ParamsError, match="at most 18 digits"):  # a JSON integer too
        parse_gpu_config({"apiVersion": "gpu.nvshim.io/v1alpha1", "kind": "GpuConfig",
                          "sharing": {"strategy": "MPS",
                                      "mps": {"pinnedMemoryLimit": 10**40}}})  # fmt: skip
    good = _allocated_claim(api, "good", [("gpu", "gpu-0")])
    for key, value, words in (
        ("uid", "a/../b", "claim UID 'a/../b' is not a Kubernetes UID"),
        ("uid", "..", "is not a Kubernetes UID"),
        ("namespace", "Default", "namespace 'Default' is not a DNS label"),
        ("name", "x" * 300, "is not a DNS subdomain"),
    ):
        error = _prepare(plugin, [{**good, key: value}])[value]["error"] if key == "uid" else (
            _prepare(plugin, [{**good, key: value}])[good["uid"]]["error"])  # fmt: skip
        assert words in error and "\n" not in error, error
    assert not os.path.isdir(dirs["cdi"]) or os.listdir(dirs["cdi"]) == []


def _entry(claim: dict, device: str, uuid: str) -> dict:
    return {"uid": claim["uid"], "namespace": claim["namespace"], "name": claim["name"],
            "devices": [{"request": "gpu", "pool": NODE, "device": device, "uuid": uuid,
                         "admin": False}], "mps": []}  # fmt: skip


def _run_plugin(api, config: str, kubelet, cdi: str, mps: str, node_name=NODE, env=None):
    """``nvshim dra run`` (the plugin process) until its DRA socket serves."""
    argv = [NVSHIM, "dra", "run", "--kubeconfig", str(api.kubeconfig), "--kubelet-dir",
            str(kubelet), "--cdi-dir", cdi, "--mps-root", mps, "--interval", "0.5"]  # fmt: skip
    env = {**os.environ, "NVSHIM_CONFIG": config, "NODE_NAME": node_name, **(env or {})}
    dra = socket_paths(str(kubelet))[1]

    def serving() -> bool:  # a killed plugin's socket file stays: connect to tell
        import socket

        with socket.socket(socket.AF_UNIX) as sock:
            try:
                sock.connect(dra)
            except OSError:
                return False
        return True

    proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not serving():
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "the plugin never served"
        time.sleep(0.1)
    return proc


def _stop_plugin(proc, sig=signal.SIGTERM) -> str:
    if proc.poll() is not None:  # stopped already (an assertion failed after a kill)
        return proc.communicate()[1]
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == (0 if sig == signal.SIGTERM else -sig), err
    return err


def test_damaged_checkpoint_recovers_what_it_can_and_starts(api, sim, short_tmp):
    """Wrong shapes, missing keys, a UID with ``../``, a truncated file: the plugin process
    drops what does not check out (one line each), keeps the rest, and serves."""
    _, config = sim
    kubelet = short_tmp / "kubelet"
    plugin_dir = kubelet / "plugins" / DRIVER_NAME
    plugin_dir.mkdir(parents=True)
    cdi, mps = str(short_tmp / "cdi"), str(short_tmp / "mps")
    host = discover_host(sim[0].driver_root, sim[0].dev_root)
    kept = _allocated_claim(api, "kept-1", [("gpu", "gpu-0")])
    also = _allocated_claim(api, "kept-2", [("gpu", "gpu-1")])
    good = _entry(kept, "gpu-0", host.gpu(0).uuid)
    victim = short_tmp / "victim.json"
    victim.write_text("{}")
    bad = {
        "listed": [good],
        "missing": {k: v for k, v in {**good, "uid": "missing"}.items() if k != "devices"},
        "../../victim": {**good, "uid": "../../victim"},
        "typed": {**good, "uid": "typed", "devices": [{**good["devices"][0], "admin": "yes"}]},
        "huge": {
            **good,
            "uid": "huge",
            "mps": [{"uuid": host.gpu(3).uuid, "threads": 10**50, "memory_mib": None}],
        },  # fmt: skip
    }
    checkpoint = plugin_dir / "checkpoint.json"
    checkpoint.write_text(json.dumps({"version": 1, "claims": {kept["uid"]: good, **bad}}))
    proc = _run_plugin(api, config, kubelet, cdi, mps)
    err = _stop_plugin(proc)
    dropped = [line for line in err.splitlines() if "dropped claim" in line]
    assert len(dropped) == len(bad), err
    for words in ("a list where a mapping belongs", "missing devices",
                  "claim UID '../../victim' is not a Kubernetes UID",
                  "admin 'yes' is not a boolean", "threads"):  # fmt: skip
        assert any(words in line for line in dropped), (words, dropped)
    assert victim.exists()
    assert list(json.loads(checkpoint.read_text())["claims"]) == [kept["uid"]]
    # truncated in the middle of the second claim: the first is recovered
    text = json.dumps(
        {
            "version": 1,
            "claims": {kept["uid"]: good, also["uid"]: _entry(also, "gpu-1", host.gpu(1).uuid)},
        },
        indent=1,
    )
    cut = text[: text.index(also["uid"] + '",') + 10]
    checkpoint.write_text(cut)
    proc = _run_plugin(api, config, kubelet, cdi, mps)
    err = _stop_plugin(proc)
    assert "not JSON" in err and "recovered 1 claim(s)" in err, err
    assert (plugin_dir / "checkpoint.json.bad").read_text() == cut  # the original, kept
    assert list(json.loads(checkpoint.read_text())["claims"]) == [kept["uid"]]
    for name in ("kept-1", "kept-2"):
        api.kube.delete(f"{CLAIMS}/{name}")
    proc = _run_plugin(api, config, kubelet, cdi, mps)  # the claims gone: unprepared
    assert "unprepared claim default/kept-1" in _stop_plugin(proc)
    assert not checkpoint.exists()


def _mps_params(threads: int) -> dict:
    return {"apiVersion": "gpu.nvshim.io/v1alpha1", "kind": "GpuConfig",
            "sharing": {"strategy": "MPS", "mps": {"activeThreadPercentage": threads}}}  # fmt: skip


def _daemon_pid(mps: str, uuid: str) -> int:
    with open(os.path.join(mps, uuid, "pipe", "nvidia-cuda-mps-control.pid")) as fh:
        return int(fh.read())


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rpartition(")")[2].split()[1])


def test_mps_daemons_outlive_the_plugin_process_and_are_adopted(api, sim, short_tmp):
    """SIGKILL and SIGTERM of the plugin: the claim's daemon runs on (its own session, not
    the plugin's child); the restarted plugin adopts that very process; only unprepare
    stops it. A recorded identity that no longer matches (a reused pid) is not adopted."""
    _, config = sim
    kubelet, cdi, mps = short_tmp / "kubelet", str(short_tmp / "cdi"), str(short_tmp / "mps")
    host = discover_host(sim[0].driver_root, sim[0].dev_root)
    uuid = host.gpu(6).uuid if not host.gpu(6).mig_enabled else host.gpu(4).uuid
    device = next(f"gpu-{g.index}" for g in host.gpus if g.uuid == uuid)
    claim = _allocated_claim(api, "mps-live", [("gpu", device)], _mps_params(25))
    proc = _run_plugin(api, config, kubelet, cdi, mps)
    plugin = type("P", (), {"dra_path": socket_paths(str(kubelet))[1]})
    try:
        assert _prepare(plugin, [claim])[claim["uid"]]["error"] == ""
        pid = _daemon_pid(mps, uuid)
        assert _ppid(pid) != proc.pid and os.getsid(pid) != os.getsid(proc.pid)
        _stop_plugin(proc, signal.SIGKILL)
        assert _alive(pid)
        proc = _run_plugin(api, config, kubelet, cdi, mps)
        _stop_plugin(proc)  # a graceful stop leaves it running too
        assert _alive(pid)
        proc = _run_plugin(api, config, kubelet, cdi, mps)
        time.sleep(0.5)
    finally:
        err = _stop_plugin(proc)
    assert f"adopted its MPS daemon (pid {pid})" in err, err
    assert _daemon_pid(mps, uuid) == pid
    # the checkpoint names another start time: that process is not the claim's daemon
    path = kubelet / "plugins" / DRIVER_NAME / "checkpoint.json"
    data = json.loads(path.read_text())
    data["claims"][claim["uid"]]["mps"][0]["start_time"] += 1
    path.write_text(json.dumps(data))
    proc = _run_plugin(api, config, kubelet, cdi, mps)
    try:
        assert _unprepare(plugin, [claim])[claim["uid"]]["error"] == ""
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(pid)  # unprepare stops it
        assert not os.path.exists(os.path.join(mps, uuid))
    finally:
        err = _stop_plugin(proc)
    # not the recorded process: the daemon serving the pipe directory, said so
    assert f"serving its pipe directory (pid {pid}; pid {pid} recorded)" in err, err


def test_reboot_with_and_without_claims_deleted(api, sim, short_tmp):
    """A reboot: daemons, their directories and the CDI specs (tmpfs) are gone, the
    checkpoint is not. A claim deleted meanwhile is unprepared (no error for its missing
    MPS directory), one still allocated gets its daemon again; the plugin serves."""
    from nvshim.mps.daemon import unmount_shm

    _, config = sim
    kubelet, cdi, mps = short_tmp / "kubelet", str(short_tmp / "cdi"), str(short_tmp / "mps")
    host = discover_host(sim[0].driver_root, sim[0].dev_root)
    whole = [g for g in host.gpus if not g.mig_enabled]
    gone = _allocated_claim(api, "mps-gone", [("gpu", f"gpu-{whole[0].index}")], _mps_params(30))
    kept = _allocated_claim(api, "mps-kept", [("gpu", f"gpu-{whole[1].index}")], _mps_params(40))
    proc = _run_plugin(api, config, kubelet, cdi, mps)
    plugin = type("P", (), {"dra_path": socket_paths(str(kubelet))[1]})
    try:
        for claim in (gone, kept):
            assert _prepare(plugin, [claim])[claim["uid"]]["error"] == ""
        old = _daemon_pid(mps, whole[1].uuid)
    finally:
        _stop_plugin(proc, signal.SIGKILL)
    for gpu in whole[:2]:  # the reboot
        os.kill(_daemon_pid(mps, gpu.uuid), signal.SIGKILL)
        unmount_shm(os.path.join(mps, gpu.uuid, "shm"))
    shutil.rmtree(mps)
    shutil.rmtree(cdi)
    api.kube.delete(f"{CLAIMS}/mps-gone")
    proc = _run_plugin(api, config, kubelet, cdi, mps)
    try:
        assert _prepare(plugin, [kept])[kept["uid"]]["error"] == ""  # the kubelet again
        new = _daemon_pid(mps, whole[1].uuid)
        assert _unprepare(plugin, [kept])[kept["uid"]]["error"] == ""
    finally:
        err = _stop_plugin(proc)
    assert "unprepared claim default/mps-gone" in err, err
    assert "claim default/mps-kept" in err and "started its MPS daemon again" in err, err
    assert new != old and not _alive(new)
    assert not os.path.exists(os.path.join(mps, whole[0].uuid))
    api.kube.delete(f"{CLAIMS}/mps-kept")


@pytest.fixture
def tiny_fs(short_tmp):
    """A 256 KiB tmpfs under the scratch dir (a disk to fill)."""
    path = short_tmp / "small"
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "nvshim-test", str(path)],
                   check=True)  # fmt: skip
    yield path
    subprocess.run(["umount", "-l", str(path)], check=False)


def test_full_disk_keeps_the_old_checkpoint_and_undoes_the_prepare(api, sim, short_tmp, tiny_fs):
    _, config = sim
    host = discover_host(sim[0].driver_root, sim[0].dev_root)
    plugin_dir, cdi = str(tiny_fs / "plugin"), str(short_tmp / "cdi")
    driver = Driver(api.kube, NODE, host, load_config(config), cdi, plugin_dir,
                    str(short_tmp / "mps"))  # fmt: skip
    first = _allocated_claim(api, "disk-1", [("gpu", "gpu-0")])
    second = _allocated_claim(api, "disk-2", [("gpu", "gpu-1")], _mps_params(50))
    assert driver.prepare(first)["error"] == ""
    checkpoint = os.path.join(plugin_dir, "checkpoint.json")
    before = open(checkpoint, "rb").read()
    filler = tiny_fs / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass  # full
    finally:
        os.close(fd)
    answer = driver.prepare(second)
    assert answer["devices"] == [] and "cannot write" in answer["error"], answer
    assert "No space left on device" in answer["error"] and "\n" not in answer["error"]
    assert open(checkpoint, "rb").read() == before  # the old checkpoint, whole
    assert not os.path.exists(spec_path(cdi, second["uid"]))  # nothing of it left behind
    assert not os.path.exists(os.path.join(short_tmp, "mps", host.gpu(1).uuid))
    assert "No space left" in driver.unprepare(first)["error"]
    filler.unlink()
    assert driver.unprepare(first)["error"] == ""  # the retry writes what is owed
    assert driver.prepare(second)["error"] == ""
    assert sorted(json.loads(open(checkpoint).read())["claims"]) == [second["uid"]]
    assert driver.unprepare(second)["error"] == ""
    for name in ("disk-1", "disk-2"):
        api.kube.delete(f"{CLAIMS}/{name}")


def test_unprepare_keeps_a_mount_below_the_daemon_directory(api, sim, short_tmp):
    """A file system still mounted below an MPS daemon's directory (its shm tmpfs that
    failed to unmount) is kept with the directories above it: the removal never crosses
    a mount point (shutil.rmtree emptied it, then failed on it)."""
    host = discover_host(sim[0].driver_root, sim[0].dev_root)
    mps = str(short_tmp / "mps")
    driver = Driver(api.kube, NODE, host, load_config(sim[1]), str(short_tmp / "cdi"),
                    str(short_tmp / "plugin"), mps)  # fmt: skip
    claim = _allocated_claim(api, "mps-mounted", [("gpu", "gpu-3")], _mps_params(40))
    assert driver.prepare(claim)["error"] == ""
    base = os.path.join(mps, host.gpu(3).uuid)
    held = os.path.join(base, "held")
    os.mkdir(held)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "nvshim-test", held], check=True)
    try:
        with open(os.path.join(held, "segment"), "w") as fh:
            fh.write("in use")
        assert driver.unprepare(claim)["error"] == ""
        assert os.path.ismount(held)
        assert open(os.path.join(held, "segment")).read() == "in use"
        assert os.listdir(base) == ["held"]  # the rest of the daemon's directory: gone
    finally:
        subprocess.run(["umount", "-l", held], check=False)
    api.kube.delete(f"{CLAIMS}/mps-mounted")


@pytest.mark.parametrize("ctr_path", [False, True], ids=["under-host-root", "ctr-path"])
def test_driver_container_layout_from_the_installers_variables(api, tmp_path, short_tmp, ctr_path):
    """The GPU Operator's layout: the driver at /run/nvidia/driver on the node, the node's
    / at --host-root in the pod, NVIDIA_DRIVER_ROOT (as the node installer reads it), and
    with DRIVER_ROOT_CTR_PATH/DEV_ROOT_CTR_PATH the driver mounted elsewhere in the pod:
    discovery finds the GPUs where the pod sees them, the claim spec names the node's own
    paths."""
    node_root = tmp_path / "node"
    node_root.mkdir()
    argv_env = {"NVIDIA_DRIVER_ROOT": "/run/nvidia/driver"}
    if ctr_path:  # as the GPU Operator mounts it: nothing at /run/nvidia/driver under /host
        seen = str(tmp_path / "driver-root")
        argv_env |= {"DRIVER_ROOT_CTR_PATH": seen, "DEV_ROOT_CTR_PATH": seen}
    else:
        seen = str(node_root / "run/nvidia/driver")
    simhost = build_host("single", seen)
    config = tmp_path / "config.toml"
    config.write_text('[runtime]\nhook-path = "/usr/local/nvshim/bin/nvshim-hook"\n')
    kubelet, cdi = short_tmp / "kubelet", str(short_tmp / "cdi")
    proc = subprocess.Popen(
        [NVSHIM, "dra", "run", "--kubeconfig", str(api.kubeconfig), "--kubelet-dir",
         str(kubelet), "--cdi-dir", cdi, "--mps-root", str(short_tmp / "mps"),
         "--host-root", str(node_root), "--interval", "0.5"],
        env={**os.environ, "NVSHIM_CONFIG": str(config), "NODE_NAME": "ctr-node", **argv_env},
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    plugin = type("P", (), {"dra_path": socket_paths(str(kubelet))[1]})
    try:
        deadline = time.monotonic() + 60
        while not slices.node_slices(api.kube, "ctr-node"):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        (one,) = slices.node_slices(api.kube, "ctr-node")
        assert [d["name"] for d in one["spec"]["devices"]] == ["gpu-0"]
        claim = _claim_with(
            api,
            "ctr",
            [{"name": "gpu", "exactly": {"deviceClassName": "x"}}],
            [{"request": "gpu", "device": "gpu-0", "pool": "ctr-node"}],
        )
        assert _prepare(plugin, [claim])[claim["uid"]]["error"] == ""
        spec = json.loads(open(spec_path(cdi, claim["uid"])).read())
        libs = [m["hostPath"] for m in spec["containerEdits"]["mounts"]]
        assert any(p.startswith("/run/nvidia/driver/usr/lib/") and "libcuda.so" in p
                   for p in libs), libs  # fmt: skip
        (device,) = spec["devices"]
        nodes = [n.get("hostPath", n["path"]) for n in device["containerEdits"]["deviceNodes"]]
        assert nodes == ["/run/nvidia/driver/dev/nvidia0"], nodes
        assert str(tmp_path) not in json.dumps(spec)
        assert _unprepare(plugin, [claim])[claim["uid"]]["error"] == ""
    finally:
        _stop_plugin(proc)
        slices.withdraw(api.kube, "ctr-node")
    api.kube.delete(f"{CLAIMS}/ctr")
    assert simhost.driver_root == seen


def test_driver_roots_are_the_installers(tmp_path):
    """`nvshim dra run` and the node installer resolve the roots through one function:
    the NVSHIM_ name first, the container path where discovery runs, the node path the
    CDI specs name; the dev root follows the driver root's node path, under the host root."""
    from nvshim.node.env import driver_roots, resolve_node

    ctr, other = tmp_path / "driver-root", tmp_path / "other"
    ctr.mkdir()
    env = {
        "NVIDIA_DRIVER_ROOT": "/run/nvidia/driver",
        "NVSHIM_DRIVER_ROOT_CTR_PATH": str(ctr),
        "DRIVER_ROOT_CTR_PATH": str(other),  # the NVSHIM_ form wins
        "HOST_ROOT_MOUNT": str(tmp_path / "host"),
    }
    roots = driver_roots(str(tmp_path / "host"), env, need=True)
    assert roots.pairs == (
        (str(ctr), "/run/nvidia/driver"),
        (str(tmp_path / "host/run/nvidia/driver"), "/run/nvidia/driver"),
    )
    node = resolve_node({}, {**env, "NO_RUNTIME_CONFIG": "true"})
    assert (node.driver_root, node.driver_root_ctr, node.dev_root, node.dev_root_ctr) == (
        roots.driver_root, roots.driver_root_ctr, roots.dev_root, roots.dev_root_ctr
    )  # fmt: skip


@pytest.mark.parametrize(
    ("env", "line"),
    [
        ({"DRIVER_ROOT_CTR_PATH": "driver-root"},
         "DRIVER_ROOT_CTR_PATH='driver-root': expected an absolute path"),
        ({"DRIVER_ROOT_CTR_PATH": "/nonexistent/driver-root"},
         "DRIVER_ROOT_CTR_PATH='/nonexistent/driver-root': not a directory"),
        ({"NVSHIM_DEV_ROOT_CTR_PATH": "/nonexistent/dev", "DEV_ROOT_CTR_PATH": "/"},
         "NVSHIM_DEV_ROOT_CTR_PATH='/nonexistent/dev': not a directory"),
        ({"NVIDIA_DRIVER_ROOT": "/run/nvidia/driver"},
         "NVIDIA_DRIVER_ROOT='/run/nvidia/driver': {host}/run/nvidia/driver is not a directory"),
    ],
    ids=["relative", "missing", "nvshim-name-first", "missing-under-host-root"],
)  # fmt: skip
def test_bad_driver_root_variable_is_one_line_naming_it(tmp_path, env, line):
    out = run_nvshim("dra", "run", "--host-root", str(tmp_path), "--node-name", "n", env=env)
    assert out.returncode != 0
    (got,) = out.stderr.strip().splitlines()
    assert got.startswith("nvshim: error: " + line.format(host=tmp_path)), got


def test_publisher_follows_a_mig_layout_change_within_a_tick(api, tmp_path, short_tmp):
    """A MIG reconfiguration need not touch a file the host key reads (the capability
    nodes exist for every instance): NVML's layout is compared at every tick, so the
    slices follow on the next one."""
    simhost, host, driver, publisher = _publisher(api, "h100x8-mig", "mig-node", tmp_path,
                                                  short_tmp)  # fmt: skip
    (first,) = slices.node_slices(api.kube, "mig-node")
    gone = host.mig_devices()[-1]
    name = f"mig-{gone.parent_index}-{gone.index}"
    assert name in [d["name"] for d in first["spec"]["devices"]]
    with open(simhost.topology_path) as fh:
        lines = fh.read().splitlines(keepends=True)
    with open(simhost.topology_path, "w") as fh:  # the instance destroyed
        fh.writelines(line for line in lines if f"uuid={gone.uuid} " not in line)
    started = time.monotonic()
    publisher.tick(resync=3600)
    (after,) = slices.node_slices(api.kube, "mig-node")
    assert name not in [d["name"] for d in after["spec"]["devices"]]
    assert after["spec"]["pool"]["generation"] == first["spec"]["pool"]["generation"] + 1
    assert gone.uuid not in [m.uuid for m in driver.host.mig_devices()]
    assert time.monotonic() - started < 10
    publisher.tick(resync=3600)  # nothing more changed: nothing rewritten
    (same,) = slices.node_slices(api.kube, "mig-node")
    assert same["metadata"]["resourceVersion"] == after["metadata"]["resourceVersion"]
    slices.withdraw(api.kube, "mig-node")


def test_the_documented_upgrade_from_the_nvshim_namespace(api, tmp_path):
    """docs/dra.md's upgrade command, run as written against a real API server holding an
    old install (the driver in `nvshim`) beside the node installer: the old driver goes,
    the node installer stays."""
    import re

    from tests.conftest import REPO
    from tests.k8s.artifacts import k8s_bin

    with open(os.path.join(REPO, "docs", "dra.md")) as fh:
        (command,) = re.findall(r"^kubectl -n nvshim delete .*$", fh.read(), re.M)
    api.kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                          "metadata": {"name": "nvshim"}})  # fmt: skip
    pod = {
        "metadata": {"labels": {"a": "b"}},
        "spec": {"containers": [{"name": "c", "image": "x"}]},
    }
    for name in ("nvshim-dra", "nvshim-node"):
        api.kube.create("/apis/apps/v1/namespaces/nvshim/daemonsets", {
            "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": pod}})  # fmt: skip
        api.kube.create("/api/v1/namespaces/nvshim/serviceaccounts", {
            "apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}})  # fmt: skip
    argv = [f"{k8s_bin()}/kubectl", f"--kubeconfig={api.kubeconfig}", *command.split()[1:]]
    proc = subprocess.run(argv, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    left = [d["metadata"]["name"] for d in
            api.kube.get("/apis/apps/v1/namespaces/nvshim/daemonsets")["items"]]  # fmt: skip
    accounts = [a["metadata"]["name"] for a in
                api.kube.get("/api/v1/namespaces/nvshim/serviceaccounts")["items"]]  # fmt: skip
    assert left == ["nvshim-node"] and "nvshim-dra" not in accounts and "nvshim-node" in accounts
    assert subprocess.run(argv, capture_output=True).returncode == 0  # again: nothing to do
    api.kube.delete("/api/v1/namespaces/nvshim")
