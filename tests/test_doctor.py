"""`nvshim doctor` on simulated hosts with a real private containerd, real MPS daemons (the
fake control binary) and real device nodes: healthy hosts are all ok, and each injected
fault fails or warns exactly the check that owns it."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.conftest import run_nvshim
from tests.cri_util import configure_containerd, cri_ready_config
from tests.engines.containerd_instance import PrivateContainerd, private_containerd
from tests.engines.corpus_cases import CORPUS
from tests.sharing_util import mixed_sharing
from tests.sim import fake_mps_control
from tests.sim.simhost import SimHost, build_host
from tests.sim.topology import HOSTS_DIR


def raw_topology(name: str) -> dict:
    """A shipped topology as written (to edit and build)."""
    with open(os.path.join(HOSTS_DIR, f"{name}.yaml")) as fh:
        return yaml.safe_load(fh)


V16 = (CORPUS / "containerd-1.6-default" / "input" / "config.toml").read_text()
RDMA_CHECKS = {"gpudirect-rdma", "gpu-nic-affinity"}  # no RDMA devices: tests/test_pairing.py
# these nodes run no nvshim-runtimed (tests/test_runtime_daemon.py has it): a warning
UNSERVED = {"runtime-daemon": "warn"}
SKIPPED_WHEN_HEALTHY = {"fabric-manager", "oci-hook"} | RDMA_CHECKS  # no NVSwitch; runtime mode
# MPS on every whole GPU; mixed leaves GPUs in MIG mode out (MPS is refused on them)
MPS_WHOLE_GPUS = mixed_sharing("mps", {"nvidia.com/gpu": 2})
# every GPU in MIG mode: its MIG devices time-sliced, no MPS daemon to supervise
TIME_SLICED_MIG = mixed_sharing("timeSlicing", {"nvidia.com/mig-1g.5gb": 2})
SHARING = {
    "single": MPS_WHOLE_GPUS,
    "h100x8-mig": MPS_WHOLE_GPUS,
    "a100-mig-1g5gb": TIME_SLICED_MIG,
}
# what the sharing checks of each healthy node say
HEALTHY_SHARING = {
    "single": {
        "sharing-config": ("ok", "1 shared device(s) (mps)"),
        "mps-daemons": ("ok", "1 daemon(s) running and answering"),
    },
    "h100x8-mig": {  # GPUs 0-5; 6 and 7 are in MIG mode
        "sharing-config": ("ok", "6 shared device(s) (mps)"),
        "mps-daemons": ("ok", "6 daemon(s) running and answering"),
    },
    "a100-mig-1g5gb": {
        "sharing-config": ("ok", "7 shared device(s) (timeSlicing)"),
        "mps-daemons": ("skip", "no MPS-shared device"),
    },
}


def _stock_config(path: Path, scratch: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(cri_ready_config(V16, scratch, "registry.k8s.io/pause:3.6"))
    return path


@pytest.fixture(scope="module")
def containerd(tmp_path_factory, launchers):
    """A private containerd configured with nvshim's runtime and restarted (loaded)."""
    base = tmp_path_factory.mktemp("doctor-ctd")
    config = _stock_config(base / "etc" / "config.toml", base / "scratch")
    configure_containerd(config, os.path.join(launchers, "nvshim-runtime"))
    with private_containerd(base, config) as ctd:
        yield ctd


@dataclass
class Node:
    """A simulated GPU node: host, nvshim config, CDI dir, hooks dir, MPS daemons."""

    sim: SimHost
    base: Path
    config: Path
    ctd: PrivateContainerd
    skipped: frozenset[str]  # the checks the healthy node skips

    def assert_only(self, results: dict, expected: dict[str, str], skipped=None) -> None:
        """``expected`` checks have their status; every other check is ok (or skipped when
        healthy, or in ``skipped``)."""
        skipped = self.skipped if skipped is None else skipped
        for name, (status, reason) in results.items():
            want = expected.get(name, "skip" if name in skipped else UNSERVED.get(name, "ok"))
            assert status == want, f"{name}: {status} ({reason}), expected {want}"
        assert set(expected) <= set(results)

    @property
    def cdi_dir(self) -> Path:
        return self.base / "cdi"

    @property
    def hooks_dir(self) -> Path:
        return self.base / "hooks"

    def nvshim(self, *args: str, config: Path | None = None) -> subprocess.CompletedProcess:
        # a cache dir of its own: exec markers other tests left are not this node's
        env = {"NVSHIM_CONFIG": str(config or self.config), "NVSHIM_CACHE_DIR": self.cache}
        return run_nvshim(*args, env=env)

    @property
    def cache(self) -> str:
        return str(self.base / "cache")

    def doctor(
        self,
        *extra: str,
        engine_config: str | None = None,
        socket: str | None = None,
        cdi_dir: Path | None = None,
        config: Path | None = None,
    ):
        """(exit code, {check: (status, reason)}) of ``nvshim doctor --json``."""
        proc = self.nvshim(
            "doctor",
            "--json",
            "--engine",
            "containerd",
            "--engine-config",
            engine_config or self.ctd.config_path,
            "--socket",
            socket or self.ctd.socket,
            "--cdi-dir",
            str(cdi_dir or self.cdi_dir),
            "--hooks-dir",
            str(self.hooks_dir),
            *extra,
            config=config,
        )
        assert proc.stdout, proc.stderr
        doc = json.loads(proc.stdout)
        assert doc["healthy"] == (proc.returncode == 0)
        return proc.returncode, {c["name"]: (c["status"], c["reason"]) for c in doc["checks"]}

    def dev(self, path: str) -> str:
        return self.sim.dev_root + path


def _write_config(node_dir: Path, sim: SimHost, sharing: str) -> Path:
    (node_dir / "sharing.yaml").write_text(sharing)
    config = node_dir / "config.toml"
    config.write_text(
        f'[host]\ndriver-root = "{sim.driver_root}"\ndev-root = "{sim.dev_root}"\n'
        f'[runtime]\nlog-file = "{node_dir}/nvshim.log"\ninventory-dir = "{node_dir}/state"\n'
        f'hook-path = "{node_dir}/bin/nvshim-hook"\n'
        f'[sharing]\nconfig = "{node_dir}/sharing.yaml"\nmps-root = "{node_dir}/mps"\n'
    )
    return config


@pytest.fixture(scope="module")
def nodes(tmp_path_factory, containerd):
    """``get(name)``: a healthy node on simulated host ``name`` (built once per module):
    CDI spec written, the sharing config's MPS daemon started."""
    from tests.test_mps_daemon import MpsHost, _cleanup

    built: dict[str, Node] = {}

    def get(name: str) -> Node:
        if name in built:
            return built[name]
        base = tmp_path_factory.mktemp(f"doctor-{name}")
        topo = raw_topology(name)
        for gpu in topo["gpus"]:  # the healthy form of the VM host: NUMA node known
            if gpu.get("numa_node") == -1:
                gpu["numa_node"] = 0
        sim = build_host(topo, str(base / "host"), extra_files=fake_mps_control.extra_files())
        skipped = {c for c, (status, _) in HEALTHY_SHARING[name].items() if status == "skip"}
        node = Node(
            sim,
            base,
            _write_config(base, sim, SHARING[name]),
            containerd,
            frozenset(SKIPPED_WHEN_HEALTHY | skipped),
        )
        node.cdi_dir.mkdir()
        node.hooks_dir.mkdir()
        for args in (
            (
                "cdi",
                "generate",
                "-o",
                str(node.cdi_dir / "nvidia.yaml"),
                "--device-name-strategy",
                "index",
                "--device-name-strategy",
                "uuid",
            ),
            ("mps", "start"),
        ):
            proc = node.nvshim(*args)
            assert proc.returncode == 0, proc.stderr
        built[name] = node
        return node

    yield get
    for node in built.values():
        _cleanup(MpsHost(node.sim, None, str(node.config), str(node.base / "mps")))


@pytest.mark.parametrize("name", ["single", "h100x8-mig", "a100-mig-1g5gb"])
def test_healthy_node_is_all_ok(nodes, name):
    node = nodes(name)
    code, results = node.doctor()
    node.assert_only(results, {})
    assert code == 0
    for check, want in HEALTHY_SHARING[name].items():
        assert results[check] == want
    assert (
        "fabric-manager" in results and results["fabric-manager"][1] == "no NVSwitch on this node"
    )


def test_text_output_names_each_check_and_its_fix(nodes):
    node = nodes("single")
    proc = node.nvshim("doctor", "--cdi-dir", str(node.base / "empty"), "--only", "cdi-spec")
    assert proc.returncode == 0  # a warning does not fail the node
    assert proc.stdout.splitlines()[0].startswith("WARN  cdi-spec  no spec of kind nvidia.com/gpu")
    assert "fix: nvshim cdi generate" in proc.stdout


@contextlib.contextmanager
def replaced_node(path: str, rdev: int | None):
    """The char device ``path`` replaced by one of ``rdev`` (None: removed), then put back."""
    st = os.stat(path)
    os.unlink(path)
    if rdev is not None:
        os.mknod(path, st.st_mode, rdev)
    try:
        yield
    finally:
        if os.path.lexists(path):
            os.unlink(path)
        os.mknod(path, st.st_mode, st.st_rdev)


@pytest.mark.parametrize(
    ("name", "node", "rdev", "expected"),
    [
        ("h100x8-mig", "/dev/nvidia3", None, "/dev/nvidia3 missing"),
        ("h100x8-mig", "/dev/nvidia2", os.makedev(195, 9), "/dev/nvidia2 is 195:9, expected 195:2"),
        (
            "single",
            "/dev/nvidiactl",
            os.makedev(195, 0),
            "/dev/nvidiactl is 195:0, expected 195:255",
        ),
        ("a100-mig-1g5gb", "cap", os.makedev(509, 200), "is 509:200, expected 509:"),
    ],
)
def test_device_node_faults_fail_device_nodes(nodes, name, node, rdev, expected):
    host = nodes(name)
    if node == "cap":  # the compute-instance capability of the first MIG device
        node = "/dev/nvidia-caps/" + host.sim.mig_cap_names(host.sim.mig_uuids()[0])[1]
    with replaced_node(host.dev(node), rdev):
        code, results = host.doctor()
    host.assert_only(results, {"device-nodes": "fail"})
    assert expected in results["device-nodes"][1]
    assert code == 1


def test_stale_cdi_spec_fails_cdi_spec(nodes, tmp_path):
    node = nodes("h100x8-mig")
    text = (node.cdi_dir / "nvidia.yaml").read_text()
    # the spec of the driver before an upgrade: its libraries are gone from this host
    (tmp_path / "nvidia.yaml").write_text(text.replace(node.sim.driver_version, "545.23.06"))
    code, results = node.doctor(cdi_dir=tmp_path)
    node.assert_only(results, {"cdi-spec": "fail"})
    assert "is stale" in results["cdi-spec"][1] and "545.23.06" in results["cdi-spec"][1]
    assert code == 1


def test_spec_of_another_mig_layout_fails_cdi_spec(nodes, sim_hosts, tmp_path):
    node = nodes("a100-mig-1g5gb")
    other = sim_hosts("h100x8-mig")
    proc = run_nvshim(
        "cdi",
        "generate",
        "--driver-root",
        other.driver_root,
        "--dev-root",
        other.dev_root,
        "-o",
        str(tmp_path / "nvidia.yaml"),
        env={"NVSHIM_CONFIG": str(node.config)},
    )
    assert proc.returncode == 0, proc.stderr
    code, results = node.doctor(cdi_dir=tmp_path)
    assert results["cdi-spec"][0] == "fail" and "no longer exists" in results["cdi-spec"][1]
    assert code == 1


@pytest.mark.parametrize(
    ("started_after_configure", "binary", "failing", "expected"),
    [
        # the entry names a missing binary, and containerd (started on it) loaded it so
        (True, "/nonexistent/nvshim-runtime", "engine-runtime", "does not exist"),
        # configure ran while containerd was up and nobody restarted it
        (False, None, "engine-loaded", "has no runtime 'nvshim' although"),
    ],
)
def test_engine_faults(
    nodes, tmp_path, launchers, started_after_configure, binary, failing, expected
):
    node = nodes("single")
    binary = binary or os.path.join(launchers, "nvshim-runtime")
    config = _stock_config(tmp_path / "etc" / "config.toml", tmp_path / "scratch")
    if started_after_configure:
        configure_containerd(config, binary)
    with private_containerd(tmp_path, config) as ctd:
        if not started_after_configure:
            configure_containerd(config, binary)  # no --restart
        code, results = node.doctor(engine_config=str(config), socket=ctd.socket)
    node.assert_only(results, {failing: "fail"})
    assert expected in results[failing][1]
    assert code == 1


def test_runtime_through_a_pyenv_shim_fails_engine_runtime(nodes, tmp_path):
    node = nodes("single")
    shim = tmp_path / ".pyenv" / "shims" / "python3"
    shim.parent.mkdir(parents=True)
    shim.write_text('#!/bin/sh\nexec pyenv exec python3 "$@"\n')
    shim.chmod(0o755)
    launcher = tmp_path / "nvshim-runtime"
    launcher.write_text(f"#!{shim} -IS\nimport nvshim\n")
    launcher.chmod(0o755)
    config = _stock_config(tmp_path / "etc" / "config.toml", tmp_path / "scratch")
    configure_containerd(config, str(launcher))
    code, results = node.doctor("--only", "engine-runtime", engine_config=str(config))
    assert results["engine-runtime"][0] == "fail"
    assert "version-manager shim" in results["engine-runtime"][1]
    assert code == 1


@pytest.mark.parametrize("how", ["unfilled", "shim"])
def test_a_compiled_front_unfit_to_run_fails_engine_runtime(nodes, tmp_path, how):
    """nvshim-runtime's compiled front: a build never filled in, or one that names a
    version manager's shim as its interpreter (the front runs it for every GPU create)."""
    from nvshim.runtime import frontbin
    from nvshim.runtime.front import front_fields

    node = nodes("single")
    build = open(frontbin.built(), "rb").read()
    launcher = tmp_path / "nvshim-runtime"
    if how == "unfilled":
        launcher.write_bytes(build)
    else:
        shim = tmp_path / ".pyenv" / "shims" / "python3"
        shim.parent.mkdir(parents=True)
        shim.write_text('#!/bin/sh\nexec pyenv exec python3 "$@"\n')
        shim.chmod(0o755)
        launcher.write_bytes(frontbin.fill(build, front_fields(str(shim), "pass")))
    launcher.chmod(0o755)
    config = _stock_config(tmp_path / "etc" / "config.toml", tmp_path / "scratch")
    configure_containerd(config, str(launcher))
    code, results = node.doctor("--only", "engine-runtime", engine_config=str(config))
    expected = {"unfilled": "never filled in (nvshim install writes it)",
                "shim": "version-manager shim"}[how]  # fmt: skip
    assert results["engine-runtime"][0] == "fail" and expected in results["engine-runtime"][1]
    assert code == 1


@pytest.mark.parametrize(
    "make, reason",
    [
        (lambda p: p.mkdir(), "{p}: is a directory, expected a file"),  # was Python's repr
        (lambda p: p.write_bytes(b"version = 2\n# \xff\n"), "{p}:2: not valid UTF-8"),
    ],
    ids=["directory", "not-utf8"],
)
def test_an_unreadable_engine_config_fails_engine_runtime_in_one_line(
    nodes, tmp_path, make, reason
):
    """The check reads the file as configure does, and says what configure would."""
    node = nodes("single")
    config = tmp_path / "config.toml"
    make(config)
    code, results = node.doctor("--only", "engine-runtime", engine_config=str(config))
    assert results["engine-runtime"] == ("fail", reason.format(p=config))
    assert code == 1


def test_broken_sharing_file_fails_sharing_config(nodes, tmp_path):
    node = nodes("single")
    text = node.config.read_text().replace(
        str(node.base / "sharing.yaml"), str(tmp_path / "s.yaml")
    )
    (tmp_path / "s.yaml").write_text(
        "version: v1\nsharing:\n  mps:\n    resources: [{replicas: x}]\n"
    )
    config = tmp_path / "config.toml"
    config.write_text(text)
    code, results = node.doctor(config=config)
    node.assert_only(results, {"sharing-config": "fail"}, node.skipped | {"mps-daemons"})
    assert str(tmp_path / "s.yaml") in results["sharing-config"][1]
    assert results["mps-daemons"] == (
        "skip",
        "needs a valid sharing config (see check sharing-config)",
    )
    assert code == 1


def test_killed_mps_daemon_fails_mps_daemons(nodes):
    node = nodes("h100x8-mig")
    uuid = node.sim.gpu_uuids()[1]
    pid_file = node.base / "mps" / uuid / "pipe" / "nvidia-cuda-mps-control.pid"
    os.kill(int(pid_file.read_text()), signal.SIGKILL)
    try:
        code, results = node.doctor()
    finally:
        proc = node.nvshim("mps", "start")
        assert proc.returncode == 0, proc.stdout + proc.stderr
    node.assert_only(results, {"mps-daemons": "fail"})
    assert "device 1: stale pid file" in results["mps-daemons"][1]
    assert code == 1
    assert node.doctor()[0] == 0  # started again: healthy


def test_numa_node_minus_one_warns(nodes):
    node = nodes("a100-mig-1g5gb")
    bdf = node.sim.gpu(0)["pci_bdf"]
    path = Path(node.dev(f"/sys/bus/pci/devices/{bdf}/numa_node"))
    path.write_text("-1\n")
    try:
        code, results = node.doctor()
    finally:
        path.write_text("0\n")
    node.assert_only(results, {"numa-node": "warn"})
    assert "numa_node -1" in results["numa-node"][1]
    assert code == 0  # a warning: pods still run


def test_persistence_off_and_mig_pending_warn(tmp_path):
    topo = raw_topology("h100x8-mig")
    topo["gpus"][2]["persistence_mode"] = 0
    topo["gpus"][3]["mig_mode"] = "disabled"
    topo["gpus"][3]["mig_pending"] = 1
    sim = build_host(topo, str(tmp_path / "host"))
    config = _write_config(tmp_path, sim, "")
    os.unlink(tmp_path / "sharing.yaml")
    proc = run_nvshim(
        "doctor",
        "--json",
        "--check",
        "persistence-mode",
        "--check",
        "mig-pending",
        env={"NVSHIM_CONFIG": str(config)},
    )
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    assert checks["persistence-mode"]["status"] == "warn"
    assert "GPU 2" in checks["persistence-mode"]["reason"]
    assert checks["mig-pending"]["status"] == "warn"
    assert "GPU 3: MIG off now, on after reset" in checks["mig-pending"]["reason"]
    assert proc.returncode == 0


def test_nvswitch_without_fabric_manager_fails(nodes):
    node = nodes("h100x8-mig")
    control = node.dev("/dev/nvidia-nvswitchctl")
    switch = node.dev("/dev/nvidia-nvswitch0")
    comm = Path(node.dev("/proc/4242/comm"))
    os.mknod(control, 0o20666, os.makedev(511, 255))
    try:
        # the control node alone is no switch: a one-GPU H100 VM has it (real hardware)
        code, results = node.doctor("--only", "fabric-manager")
        assert results["fabric-manager"] == ("skip", "no NVSwitch on this node")
        os.mknod(switch, 0o20666, os.makedev(511, 0))
        code, results = node.doctor("--only", "fabric-manager")
        assert results["fabric-manager"][0] == "fail" and code == 1
        comm.parent.mkdir()
        comm.write_text("nv-fabricmanager\n")
        code, results = node.doctor("--only", "fabric-manager")
        assert results["fabric-manager"] == ("ok", "nv-fabricmanager running (pid 4242)")
    finally:
        for node_path in (control, switch):
            if os.path.lexists(node_path):
                os.unlink(node_path)
        shutil.rmtree(comm.parent, ignore_errors=True)


def test_prestart_hook_file_is_checked_and_cgroup_v2_fails_it(nodes, launchers):
    node = nodes("single")
    bin_dir = node.base / "bin"
    proc = node.nvshim("install", "--bin-dir", str(bin_dir), "--hooks-dir", str(node.hooks_dir))
    assert proc.returncode == 0, proc.stderr
    cgroup = Path(node.dev("/sys/fs/cgroup"))
    try:
        code, results = node.doctor()
        node.assert_only(results, {"fabric-manager": "skip"}, RDMA_CHECKS)
        assert results["oci-hook"][1].endswith(f"-> {bin_dir}/nvshim-hook")
        cgroup.mkdir(parents=True)
        (cgroup / "cgroup.controllers").write_text("cpu memory pids\n")
        code, results = node.doctor()
        node.assert_only(results, {"fabric-manager": "skip", "cgroup": "fail"}, RDMA_CHECKS)
        assert "cannot add device rules" in results["cgroup"][1]
        assert code == 1
    finally:
        shutil.rmtree(node.hooks_dir)
        node.hooks_dir.mkdir()
        shutil.rmtree(cgroup, ignore_errors=True)


def test_missing_ld_cache_warns_driver(nodes):
    node = nodes("single")
    cache = Path(node.sim.driver_root) / "etc" / "ld.so.cache"
    cache.rename(cache.with_suffix(".away"))
    try:
        code, results = node.doctor("--only", "driver")
    finally:
        cache.with_suffix(".away").rename(cache)
    assert results["driver"] == (
        "warn",
        f"{cache}: not found; searching the standard library directories",
    )
    assert code == 0


def test_a_runtime_other_than_runc_or_crun_warns_exec_enforcement(nodes, tmp_path):
    """nvshim reads a GPU container's exec-env annotation from runc's or crun's state: a
    node whose low-level runtime is another one gets a warning (its execs go unchecked);
    crun is named with where its state is read."""
    from tests.crun_util import CRUN

    node = nodes("single")
    other = tmp_path / "runsc"
    other.write_text('#!/bin/sh\nexec runc "$@"\n')
    other.chmod(0o755)
    results = {}
    for runtime in (str(other), CRUN):
        config = tmp_path / f"{os.path.basename(runtime)}.toml"
        text = node.config.read_text().replace(
            "[runtime]\n", f"[runtime]\nruntimes = [{runtime!r}]\n"
        )
        config.write_text(text)
        code, results[runtime] = node.doctor(config=config)
        assert code == 0  # a warning does not fail the node
    node.assert_only(results[str(other)], {"exec-enforcement": "warn"})
    assert results[str(other)]["exec-enforcement"][1].startswith(
        f"{other} is neither runc nor crun"
    )
    node.assert_only(results[CRUN], {})
    assert results[CRUN]["exec-enforcement"] == (
        "ok",
        f"{CRUN}: read from crun's /run/crun/ID/config.json",
    )


def test_every_check_is_in_the_node_health_table():
    """docs/node-health.md's table names each registered check, in report order."""
    import re

    from nvshim.doctor import load_checks
    from tests.conftest import REPO

    with open(f"{REPO}/docs/node-health.md") as fh:
        documented = re.findall(r"^\| `([a-z-]+)` \|", fh.read(), re.M)
    assert documented == list(load_checks())
