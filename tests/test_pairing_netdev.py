"""The netdev hand-over and NIC claims on their own: real veth links in the test's network
namespace, a real process in a namespace of its own standing for the container."""

from __future__ import annotations

import subprocess

import pytest

from nvshim.errors import NvshimError
from nvshim.pairing import claims
from nvshim.pairing.netdev import move_netdevs, parse_move
from tests.netns_util import add_veths, in_private_net_ns, links


def _container():
    """A process in a network namespace of its own (killed by the caller)."""
    proc = subprocess.Popen(["unshare", "--net", "sleep", "60"])
    for _ in range(100):  # until unshare has exec'd sleep in the new namespace
        with open(f"/proc/{proc.pid}/cmdline", "rb") as fh:
            if fh.read().startswith(b"sleep"):
                break
        subprocess.run(["sleep", "0.02"], check=True)
    return proc


def test_move_rename_is_idempotent_and_leaves_the_rest():
    def scenario():
        add_veths(["ens1f0v0", "ens1f0v1"])
        box = _container()
        try:
            ns = f"/proc/{box.pid}/ns/net"
            first = move_netdevs(box.pid, ["ens1f0v0=net0"])
            again = move_netdevs(box.pid, ["ens1f0v0=net0"])
            return first, again, links(ns), links()
        finally:
            box.kill()
            box.wait()

    first, again, inside, here = in_private_net_ns(scenario)
    assert first == {"netdevs": "ens1f0v0->net0"}
    assert again == {"netdevs": "already in place"}
    assert inside == ["lo", "net0"]
    assert here == ["ens1f0v0p", "ens1f0v1", "ens1f0v1p", "lo"]


def test_vanished_netdev_moves_nothing():
    def scenario():
        add_veths(["ens1f0v0"])
        box = _container()
        try:
            try:
                move_netdevs(box.pid, ["ens1f0v0", "ens9f9v9"])
            except NvshimError as err:
                return str(err), links(f"/proc/{box.pid}/ns/net"), links()
            return None
        finally:
            box.kill()
            box.wait()

    error, inside, here = in_private_net_ns(scenario)
    assert error == (
        "netdev ens9f9v9: vanished since discovery (not in this network namespace nor the "
        "container's); nothing moved"
    )
    assert inside == ["lo"] and "ens1f0v0" in here


def test_name_taken_in_the_container_moves_nothing():
    def scenario():
        add_veths(["ens1f0v0", "ens1f0v1"])
        box = _container()
        try:
            move_netdevs(box.pid, ["ens1f0v1=net0"])
            try:
                move_netdevs(box.pid, ["ens1f0v0=net0"])
            except NvshimError as err:
                return str(err), links()
            return None
        finally:
            box.kill()
            box.wait()

    error, here = in_private_net_ns(scenario)
    assert error == "netdev ens1f0v0: the container already has a net0"
    assert "ens1f0v0" in here


def test_gone_namespace_and_shared_namespace():
    box = _container()
    box.kill()
    box.wait()
    assert move_netdevs(box.pid, ["ens1f0v0"]) == {
        "netdevs": "none moved: the container's network namespace is gone"
    }

    def shared():
        add_veths(["ens1f0v0"])
        peer = subprocess.Popen(["sleep", "60"])  # same namespace as the "runtime"
        try:
            move_netdevs(peer.pid, ["ens1f0v0"])
        except NvshimError as err:
            return str(err), links()
        finally:
            peer.kill()
            peer.wait()
        return None

    error, here = in_private_net_ns(shared)
    assert "shares this network namespace" in error and "ens1f0v0" in here


@pytest.mark.parametrize("spec", ["", "a/b", "x=y:z", "averyveryverylongname", "a b"])
def test_bad_names_are_refused(spec):
    with pytest.raises(NvshimError, match="not a valid interface name"):
        parse_move(spec)


def test_claims_are_exclusive_while_the_holder_lives(tmp_path):
    holder = subprocess.Popen(["sleep", "60"])
    other = subprocess.Popen(["sleep", "60"])
    try:
        assert claims.claim(str(tmp_path), ["mlx5_1"], "a", holder.pid) == ["mlx5_1"]
        assert claims.claim(str(tmp_path), ["mlx5_1"], "a", holder.pid) == ["mlx5_1"]
        with pytest.raises(NvshimError, match="claimed by container a"):
            claims.claim(str(tmp_path), ["mlx5_0", "mlx5_1"], "b", other.pid)
        assert claims.live_claims(str(tmp_path)) == {"mlx5_1": "a"}  # mlx5_0 not taken
        holder.kill()
        holder.wait()
        assert claims.live_claims(str(tmp_path)) == {}
        assert claims.claim(str(tmp_path), ["mlx5_1"], "b", other.pid) == ["mlx5_1"]
        claims.release(str(tmp_path), ["mlx5_1"], "a")  # not a's any more: kept
        assert claims.live_claims(str(tmp_path)) == {"mlx5_1": "b"}
    finally:
        for p in (holder, other):
            p.kill()
            p.wait()


def _hook_config(tmp_path, host, **pairing) -> str:
    import json

    lines = [
        "[host]",
        f'dev-root = "{host.dev_root}"',
        "[runtime]",
        f'log-file = "{tmp_path}/nvshim.log"',
        f'inventory-dir = "{tmp_path}/state"',
        "[pairing]",
        *(f"{k.replace('_', '-')} = {json.dumps(v)}" for k, v in pairing.items()),
    ]
    path = tmp_path / "config.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.mark.parametrize(
    ("args", "policy", "message"),
    [
        (["--claim", "../../etc/x"], {}, "--claim '../../etc/x': no such RDMA device"),
        (["--netdev", "eth0"], {"netdev_handover": True}, "'eth0': not a netdev of an RDMA"),
        (["--netdev", "ibp53s0"], {}, "pairing.netdev-handover is false"),
        (
            ["--netdev", "ibp53s0"],
            {"netdev_handover": True, "move_physical": ["mlx5_0"]},
            "ibp53s0 is a physical function's netdev (mlx5_1) not named",
        ),
    ],
)
def test_hook_step_from_a_hostile_spec_is_refused(
    tmp_path, launchers, sim_hosts, args, policy, message
):
    """A spec can carry an rdma-pair entry of its own: the step moves or claims only what
    the host has and the policy allows, and leaves no file behind."""
    from tests.runc_util import read_log, run_hook_direct

    host = sim_hosts("hgx-h100x8-rdma")
    config = _hook_config(tmp_path, host, **policy)
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text('{"root": {"path": "rootfs"}}')
    proc = run_hook_direct(
        [f"{launchers}/nvshim-hook", "rdma-pair", "--config", config, *args], str(bundle)
    )
    assert proc.returncode != 0
    assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "state").exists()
    assert message in read_log(str(tmp_path / "nvshim.log"))[-1]["error"]
