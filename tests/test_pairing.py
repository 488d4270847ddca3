"""GPU-NIC pairing end to end: runc containers with their own network namespace started
through nvshim-runtime on the simulated HGX host, inside the test's own network namespace
where veth links stand for the NICs' netdevs; the policy's choices; the CDI sink; bad input."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from nvshim.config import load_config
from nvshim.host.discover import discover_host
from nvshim.host.topology import discover_topology
from nvshim.policy.pairing import PairingError, nic_edits, pair
from nvshim.record import replace
from tests.conftest import run_nvshim
from tests.netns_util import add_veths, in_private_net_ns, links
from tests.podman_util import make_busybox_rootfs
from tests.runc_util import RUNC_ENV, make_bundle, read_log

NETDEVS = {"mlx5_0": "ibp21s0", "mlx5_1": "ibp53s0", "mlx5_2": "ibp149s0", "mlx5_3": "ibp163s0"}
SHOW = (
    "echo IB: $(ls /dev/infiniband); echo HCA=$NCCL_IB_HCA; echo HCAS=$NVSHIM_RDMA_HCAS; "
    "echo NET: $(ls /sys/class/net)"
)


def write_pairing_config(tmp_path, host, launchers, **pairing) -> str:
    lines = [
        "[host]",
        f'driver-root = "{host.driver_root}"',
        f'dev-root = "{host.dev_root}"',
        "[runtime]",
        f'log-file = "{tmp_path}/nvshim.log"',
        f'hook-path = "{launchers}/nvshim-hook"',
        f'inventory-dir = "{tmp_path}/state"',
        "[policy]",
        "accept-env-unprivileged = true",
        "[pairing]",
    ]
    lines += [f"{k.replace('_', '-')} = {json.dumps(v)}" for k, v in pairing.items()]
    path = tmp_path / "config.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


class Containers:
    """runc containers created through nvshim-runtime, started and reaped by hand so the
    test can look at both network namespaces while the container exists."""

    def __init__(self, tmp_path, launchers, config):
        self.tmp = tmp_path
        self.runtime = os.path.join(launchers, "nvshim-runtime")
        self.config = config
        self.root = str(tmp_path / "runc-state")
        self.count = 0

    def _runc(self, *args, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["runc", "--root", self.root, *args],
            env=RUNC_ENV,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            **kw,
        )

    def create(self, env: dict[str, str], annotations=None) -> tuple[str, int, str]:
        """(container id, exit status of create, its stderr)."""
        self.count += 1
        name = f"c{self.count}"
        rootfs = make_busybox_rootfs(self.tmp / f"rootfs-{name}")
        bundle = make_bundle(
            self.tmp, rootfs, ["/bin/sh", "-c", SHOW], env=env, annotations=annotations, name=name
        )
        cid = f"nvshim-pair-{os.getpid()}-{name}"
        out, err = self.tmp / f"{name}.out", self.tmp / f"{name}.err"
        with open(out, "w") as fo, open(err, "w") as fe:
            proc = subprocess.run(
                [self.runtime, "--root", self.root, "create", "--bundle", bundle, cid],
                env={**RUNC_ENV, "NVSHIM_CONFIG": self.config},
                stdin=subprocess.DEVNULL,
                stdout=fo,
                stderr=fe,
                timeout=60,
                check=False,
            )
        return cid, proc.returncode, err.read_text()

    def pid(self, cid: str) -> int:
        return json.loads(self._runc("state", cid).stdout)["pid"]

    def finish(self, cid: str) -> dict[str, list[str]]:
        """Start the container, wait for it to exit, delete it; its printed view."""
        assert self._runc("start", cid).returncode == 0
        for _ in range(200):
            if json.loads(self._runc("state", cid).stdout)["status"] == "stopped":
                break
            time.sleep(0.05)
        self._runc("delete", "--force", cid)
        n = cid.rsplit("-", 1)[1]
        view = {}
        for line in (self.tmp / f"{n}.out").read_text().splitlines():
            key, _, rest = line.partition("=" if line.startswith("HCA") else ":")
            view[key] = rest.split()
        return view

    def discard(self, cid: str) -> None:
        self._runc("delete", "--force", cid)


@pytest.fixture
def hgx(sim_hosts):
    return sim_hosts("hgx-h100x8-rdma")


HANDOVER = {"enabled": True, "exclusive": True, "netdev_handover": True}


def request(gpus: str, ask: str = "paired") -> dict[str, str]:
    return {"NVIDIA_VISIBLE_DEVICES": gpus, "NVSHIM_RDMA": ask}


def test_gpu2_gets_exactly_its_nic_and_the_netdev_moves_in(tmp_path, launchers, hgx):
    config = write_pairing_config(
        tmp_path, hgx, launchers, **HANDOVER, move_physical=["mlx5_1"], netdev_name="rdma%d"
    )
    box = Containers(tmp_path, launchers, config)

    def scenario():
        add_veths(list(NETDEVS.values()))
        before = links()
        cid, rc, err = box.create(request("2"))
        assert rc == 0, err
        ns = f"/proc/{box.pid(cid)}/ns/net"
        inside, outside = links(ns), links()
        view = box.finish(cid)
        return before, inside, outside, view, links()

    before, inside, outside, view, after = in_private_net_ns(scenario)
    assert view["IB"] == ["rdma_cm", "uverbs1"]
    assert view["HCA"] == ["=mlx5_1"] and view["HCAS"] == ["mlx5_1"]
    assert inside == ["lo", "rdma0"]
    assert view["NET"] == ["lo", "rdma0"]
    assert outside == sorted(set(before) - {"ibp53s0"})  # gone from here, the rest stays
    assert "ibp53s0" not in after and "ibp21s0" in after  # a veth dies with the netns
    record = [r for r in read_log(str(tmp_path / "nvshim.log")) if r["tool"] == "nvshim-runtime"]
    assert record[-1]["rdma"] == "mlx5_1"


def test_policy_off_pairs_nothing(tmp_path, launchers, hgx):
    config = write_pairing_config(tmp_path, hgx, launchers)  # enabled defaults to false
    box = Containers(tmp_path, launchers, config)

    def scenario():
        add_veths(list(NETDEVS.values()))
        cid, rc, err = box.create(request("2"))
        assert rc == 0, err
        inside = links(f"/proc/{box.pid(cid)}/ns/net")
        return inside, box.finish(cid)

    inside, view = in_private_net_ns(scenario)
    assert inside == ["lo"]
    assert view["IB"] == [] and view["HCA"] == [] and view["HCAS"] == []
    record = read_log(str(tmp_path / "nvshim.log"))[-1]
    assert record["rdma"] == "ignored: pairing.enabled is false"


def test_affinity_worse_than_allowed_is_refused_with_one_line(tmp_path, launchers, sim_hosts):
    host = sim_hosts("rdma-cross-socket")
    config = write_pairing_config(tmp_path, host, launchers, enabled=True)
    box = Containers(tmp_path, launchers, config)
    cid, rc, err = box.create(request("0"))
    box.discard(cid)
    assert rc != 0
    lines = err.strip().splitlines()
    assert lines == [
        "nvshim-runtime: error: GPU 0 (0000:17:00.0): no RDMA NIC at PXB or better "
        "(best: mlx5_0 at SYS; pairing.worst-affinity, pairing.on-no-nic)"
    ]


def test_exclusive_nic_is_not_shared_between_containers(tmp_path, launchers, hgx):
    config = write_pairing_config(tmp_path, hgx, launchers, enabled=True, exclusive=True)
    box = Containers(tmp_path, launchers, config)
    first, rc, err = box.create(request("2"))
    assert rc == 0, err
    try:
        second, rc2, err2 = box.create(request("3"))  # GPU 3 shares mlx5_1's switch
        box.discard(second)
    finally:
        box.discard(first)
    assert rc2 != 0
    assert err2.strip() == (
        "nvshim-runtime: error: GPU 3 (0000:34:00.0): no RDMA NIC at PXB or better "
        f"(best: mlx5_1 at PIX, claimed by container {first}; "
        "pairing.worst-affinity, pairing.on-no-nic)"
    )
    # the first container is gone: its claim no longer counts
    third, rc3, err3 = box.create(request("3"))
    box.discard(third)
    assert rc3 == 0, err3


def test_claims_are_refused_in_an_inventory_dir_another_user_owns(tmp_path, launchers, hgx):
    """``nobody`` owns the directory above the inventory directory: the create fails with
    one line naming it and no claim is written there (tests/test_inventory_trust.py)."""
    config = write_pairing_config(tmp_path, hgx, launchers, enabled=True, exclusive=True)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 65534, 65534)
    text = open(config).read().replace(f"{tmp_path}/state", f"{theirs}/state")
    open(config, "w").write(text)
    box = Containers(tmp_path, launchers, config)
    cid, rc, err = box.create(request("2"))
    box.discard(cid)
    assert rc != 0
    line = (
        f"nvshim-hook: error: {theirs}: owned by uid 65534: nvshim keeps NIC claims only in a "
        "directory no other user can change\\n"  # the hook's one line, as runc quotes it
    )
    assert line in err, err
    assert os.listdir(theirs) == []


def test_nic_outside_allow_list_is_refused_and_nothing_moves(tmp_path, launchers, hgx):
    config = write_pairing_config(
        tmp_path,
        hgx,
        launchers,
        enabled=True,
        nics=["ibp53*"],
        netdev_handover=True,
        move_physical=["*"],
    )
    box = Containers(tmp_path, launchers, config)

    def scenario():
        add_veths(list(NETDEVS.values()))
        before = links()
        cid, rc, err = box.create(request("2", "mlx5_0"))
        box.discard(cid)
        return before, rc, err, links()

    before, rc, err, after = in_private_net_ns(scenario)
    assert rc != 0 and after == before
    assert err.strip() == (
        "nvshim-runtime: error: RDMA device mlx5_0 (0000:15:00.0) is not in the "
        "pairing.nics allow-list"
    )


def test_vanished_netdev_fails_the_start_and_moves_nothing(tmp_path, launchers, hgx):
    config = write_pairing_config(tmp_path, hgx, launchers, **HANDOVER, move_physical=["*"])
    box = Containers(tmp_path, launchers, config)

    def scenario():
        # GPUs 0 and 2 pair with mlx5_0 and mlx5_1; mlx5_1's netdev is not there
        add_veths([NETDEVS["mlx5_0"], NETDEVS["mlx5_2"]])
        before = links()
        cid, rc, err = box.create(request("0,2"))
        box.discard(cid)
        return before, rc, err, links()

    before, rc, err, after = in_private_net_ns(scenario)
    assert rc != 0
    assert after == before  # ibp21s0 was not moved either
    assert "netdev ibp53s0: vanished since discovery" in err and "nothing moved" in err
    claims = os.listdir(tmp_path / "state" / "rdma-claims")
    assert not [c for c in claims if not c.startswith(".")]  # claims given back


# --- the policy on its own ----------------------------------------------------------


def _policy(sim_hosts, tmp_path, name="hgx-h100x8-rdma", **pairing):
    host = sim_hosts(name)
    path = tmp_path / "c.toml"
    path.write_text(
        "[pairing]\n"
        + "".join(f"{k.replace('_', '-')} = {json.dumps(v)}\n" for k, v in pairing.items())
    )
    cfg = load_config(str(path)).pairing
    h = discover_host(host.driver_root, host.dev_root)
    return discover_topology(h), cfg


def test_each_gpu_pairs_with_its_switch_nic(sim_hosts, tmp_path):
    topo, cfg = _policy(sim_hosts, tmp_path, enabled=True)
    got = {g.index: [n.name for n in pair(topo, [g], cfg, [])[0]] for g in topo.gpus}
    assert got == {
        0: ["mlx5_0"],
        1: ["mlx5_0"],
        2: ["mlx5_1"],
        3: ["mlx5_1"],
        4: ["mlx5_2"],
        5: ["mlx5_2"],
        6: ["mlx5_3"],  # PXB, still within the default
        7: ["mlx5_3"],
    }


def test_stricter_affinity_and_warn_mode(sim_hosts, tmp_path):
    topo, cfg = _policy(sim_hosts, tmp_path, worst_affinity="pix", on_no_nic="warn")
    nics, warnings = pair(topo, [topo.gpu(6), topo.gpu(4)], cfg, [])
    assert [n.name for n in nics] == ["mlx5_2"]
    assert warnings == [
        "GPU 6 (0000:a6:00.0): no RDMA NIC at PIX or better (best: mlx5_3 at PXB; "
        "pairing.worst-affinity, pairing.on-no-nic)"
    ]
    cfg = replace(cfg, on_no_nic="fail")
    with pytest.raises(PairingError, match="GPU 6"):
        pair(topo, [topo.gpu(6)], cfg, [])


def test_ties_go_to_the_lowest_pci_address(sim_hosts, tmp_path):
    topo, cfg = _policy(sim_hosts, tmp_path, "rdma-cross-socket", worst_affinity="SYS")
    for gpu in topo.gpus:  # every NIC is SYS from every GPU
        assert [n.name for n in pair(topo, [gpu], cfg, [])[0]] == ["mlx5_0"]
    cfg = replace(cfg, nics=["0000:b1:00.2", "ens177np0"])
    assert [n.name for n in pair(topo, [topo.gpu(0)], cfg, [])[0]] == ["mlx5_1"]


def test_physical_functions_move_only_when_named(sim_hosts, tmp_path):
    topo, cfg = _policy(sim_hosts, tmp_path, "rdma-cross-socket", netdev_handover=True)
    pf, vf = topo.nic("mlx5_1"), topo.nic("mlx5_2")
    edits, kept = nic_edits([pf, vf], topo, cfg, "/usr/bin/nvshim-hook")
    assert kept == ["ens177np0"]
    assert edits.hooks[0].args == ("nvshim-hook", "rdma-pair", "--netdev", "ens177v0")
    cfg = replace(cfg, move_physical=["0000:b1:00.0"])
    edits, kept = nic_edits([pf, vf], topo, cfg, "/usr/bin/nvshim-hook")
    assert kept == [] and edits.hooks[0].args[2:] == (
        "--netdev",
        "ens177np0",
        "--netdev",
        "ens177v0",
    )


def test_cdi_spec_pairs_each_gpu_device(sim_hosts, tmp_path, launchers):
    host = sim_hosts("hgx-h100x8-rdma")
    config = write_pairing_config(
        tmp_path, host, launchers, enabled=True, netdev_handover=True, move_physical=["*"]
    )
    out = tmp_path / "spec.json"
    proc = run_nvshim("cdi", "generate", "--pairing", "-o", str(out), env={"NVSHIM_CONFIG": config})
    assert proc.returncode == 0, proc.stderr
    spec = json.loads(out.read_text())
    devices = {d["name"]: d["containerEdits"] for d in spec["devices"]}
    two = devices["2"]
    assert [n["path"] for n in two["deviceNodes"]] == [
        "/dev/nvidia2",
        "/dev/infiniband/uverbs1",
        "/dev/infiniband/rdma_cm",
    ]
    assert two["env"] == ["NCCL_IB_HCA==mlx5_1", "NVSHIM_RDMA_HCAS=mlx5_1"]
    (hook,) = two["hooks"]
    assert hook["hookName"] == "createRuntime"
    assert hook["args"] == ["nvshim-hook", "rdma-pair", "--netdev", "ibp53s0"]
    assert hook["path"] == f"{launchers}/nvshim-hook"
    assert hook["env"][:2] == [
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LC_ALL=C.UTF-8",
    ]
    assert devices["all"]["env"] == [
        "NCCL_IB_HCA==mlx5_0,mlx5_1,mlx5_2,mlx5_3",
        "NVSHIM_RDMA_HCAS=mlx5_0,mlx5_1,mlx5_2,mlx5_3",
    ]
    check = run_nvshim("cdi", "validate", str(out))
    assert check.returncode == 0, check.stdout + check.stderr
    plain = run_nvshim("cdi", "generate", env={"NVSHIM_CONFIG": config})
    assert "infiniband" not in plain.stdout  # only with --pairing


def test_prestart_hook_pairs_and_hands_over_too(tmp_path, launchers, hgx):
    """The standalone hook gets the same devices and moves the netdev itself; it cannot set
    env, so NCCL_IB_HCA is logged as not applied (NCCL then opens the one HCA it can)."""
    from nvshim.hookentries import hook_entry
    from tests.runc_util import runc_run

    config = write_pairing_config(
        tmp_path, hgx, launchers, enabled=True, netdev_handover=True, move_physical=["mlx5_1"]
    )
    entry = hook_entry(f"{launchers}/nvshim-hook", "prestart", "prestart", "--config", config)
    rootfs = make_busybox_rootfs(tmp_path / "rootfs")
    bundle = make_bundle(
        tmp_path, rootfs, ["/bin/sh", "-c", SHOW], env=request("2"), hooks={"prestart": [entry]}
    )

    def scenario():
        add_veths(list(NETDEVS.values()))
        proc = runc_run(bundle, f"nvshim-pair-prestart-{os.getpid()}")
        return proc.returncode, proc.stdout + proc.stderr

    rc, out = in_private_net_ns(scenario)
    assert rc == 0, out
    view = dict(
        line.split(":", 1) if ":" in line else line.split("=", 1) for line in out.splitlines()
    )
    assert view["IB"].split() == ["rdma_cm", "uverbs1"]
    assert view["NET"].split() == ["ibp53s0", "lo"]
    record = [r for r in read_log(str(tmp_path / "nvshim.log")) if r.get("step") == "prestart"][-1]
    assert record["rdma"] == "mlx5_1" and record["netdevs"] == "ibp53s0"
    assert "NCCL_IB_HCA" in record["env_not_applied"].split(",")


def test_doctor_checks(sim_hosts, tmp_path):
    from nvshim.config import Config
    from nvshim.pairing.checks import check_gpu_nics, check_peermem

    config = Config()
    for name, want in (("hgx-h100x8-rdma", "ok"), ("rdma-cross-socket", "warn")):
        sim = sim_hosts(name)
        status, reason, fix = check_gpu_nics(discover_host(sim.driver_root, sim.dev_root), config)
        assert status == want, reason
    assert reason == "no NIC at PXB or better for GPU 0 (best SYS), GPU 1 (best SYS)"
    assert "pairing.worst-affinity" in fix
    root = tmp_path / "root"
    assert check_peermem(str(root))[0] == "skip"
    (root / "sys/class/infiniband/mlx5_0").mkdir(parents=True)
    (root / "proc").mkdir()
    (root / "proc/modules").write_text("mlx5_ib 466944 0 - Live 0x0\n")
    assert check_peermem(str(root))[:2] == (
        "warn",
        "nvidia_peermem is not loaded: NCCL falls back to staging RDMA through host memory",
    )
    (root / "proc/modules").write_text("nvidia_peermem 16384 0 - Live 0x0\n")
    assert check_peermem(str(root))[0] == "ok"


def test_podman_with_the_paired_cdi_spec(sim_hosts, tmp_path, launchers):
    """The CDI sink end to end: podman (its own network namespace, --network none) given
    GPU 2 of a spec generated with --pairing gets the paired HCA, its env and, through the
    spec's createRuntime hook, its netdev."""
    from tests.podman_util import podman_run

    host = sim_hosts("hgx-h100x8-rdma")
    config = write_pairing_config(
        tmp_path, host, launchers, **HANDOVER, move_physical=["mlx5_1"], netdev_name="rdma%d"
    )
    cdi_dir = tmp_path / "cdi"
    cdi_dir.mkdir()
    spec = cdi_dir / "nvidia.yaml"
    proc = run_nvshim(
        "cdi", "generate", "--pairing", "-o", str(spec), env={"NVSHIM_CONFIG": config}
    )
    assert proc.returncode == 0, proc.stderr
    rootfs = make_busybox_rootfs(tmp_path / "rootfs")

    def scenario():
        add_veths(list(NETDEVS.values()))
        run = podman_run(
            tmp_path,
            rootfs,
            ["--device", "nvidia.com/gpu=2", "--", "/bin/sh", "-c", SHOW],
            cdi_dir=str(cdi_dir),
        )
        return run.returncode, run.stdout, run.stderr, links()

    rc, out, err, after = in_private_net_ns(scenario)
    assert rc == 0, err
    view = dict(
        line.split(":", 1) if ":" in line else line.split("=", 1) for line in out.splitlines()
    )
    assert view["IB"].split() == ["rdma_cm", "uverbs1"]
    assert view["HCA"] == "=mlx5_1" and view["HCAS"] == "mlx5_1"
    assert view["NET"].split() == ["lo", "rdma0"]
    assert "ibp53s0" not in after and "ibp21s0" in after


def test_nvshim_doctor_runs_the_pairing_checks(sim_hosts, tmp_path, launchers):
    checks = ("--only", "gpudirect-rdma", "--only", "gpu-nic-affinity")
    for name, affinity in (("hgx-h100x8-rdma", "ok"), ("rdma-cross-socket", "warn")):
        config = write_pairing_config(tmp_path, sim_hosts(name), launchers)
        proc = run_nvshim("doctor", "--json", *checks, env={"NVSHIM_CONFIG": config})
        assert proc.returncode == 0, proc.stderr  # warnings do not fail the node
        got = {c["name"]: c["status"] for c in json.loads(proc.stdout)["checks"]}
        assert got == {"gpudirect-rdma": "warn", "gpu-nic-affinity": affinity}
