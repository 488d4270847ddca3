"""What nvshim writes into the inventory directory (``[runtime] inventory-dir``): the host
inventory cache, NIC claims and the hook's params file. A real unprivileged user
(``nobody`` through ``setpriv``) who owns the directory, a directory above it, can write
into it or put a symlink on its path cannot get root's nvshim to write there: the cache
is skipped, a claim or a params file is refused with one line naming the directory. In
a directory only root can change all three are written."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import time

import pytest

from nvshim.errors import NvshimError
from nvshim.host.inventory import CACHE_NAME, load_cached, load_host, store
from nvshim.pairing import claims
from nvshim.rootfs import bind
from tests.sim.simhost import build_host
from tests.test_runtime_races import NOBODY, as_nobody, open_dir  # noqa: F401

WHY = "only in a directory no other user can change"


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """The single-GPU simulated host and its discovered inventory."""
    sim = build_host("single", str(tmp_path_factory.mktemp("sim-single")))
    scratch = str(tmp_path_factory.mktemp("scratch") / "inv")
    return sim, load_host(sim.driver_root, sim.dev_root, scratch)


def untrusted(open_dir: str, how: str) -> tuple[str, str, str]:  # noqa: F811
    """(inventory dir, the directory named in the error, why): one ``nobody`` can change."""
    if how == "nobody's directory above":
        theirs = os.path.join(open_dir, "theirs")
        as_nobody("mkdir", "-m", "0755", theirs)
        inventory = os.path.join(theirs, "inv")
        os.mkdir(inventory, 0o755)  # root's, but nobody can rename it away
        return inventory, theirs, "owned by uid 65534"
    if how == "writable by its group":
        inventory = os.path.join(open_dir, "inv")
        os.mkdir(inventory)
        os.chown(inventory, 0, 65534)  # nogroup
        os.chmod(inventory, 0o775)
        return inventory, inventory, "writable by group"
    if how == "others may write above":
        above = os.path.join(open_dir, "above")
        os.mkdir(above)
        os.chmod(above, 0o757)  # no sticky bit: nobody can rename root's names there
        inventory = os.path.join(above, "inv")
        os.mkdir(inventory, 0o755)
        return inventory, above, "writable by others"
    real = os.path.join(open_dir, "real")
    os.mkdir(real, 0o755)
    link = os.path.join(open_dir, "link")
    as_nobody("ln", "-s", real, link)
    return link, link, "a symbolic link"


def files_below(path: str) -> list[str]:
    """Every name below ``path`` (followed through a symlink at the top)."""
    return sorted(
        os.path.relpath(os.path.join(d, n), path)
        for d, dirs, files in os.walk(path)
        for n in dirs + files
    )


HOWS = ["nobody's directory above", "writable by its group", "others may write above", "symlink"]


@pytest.mark.parametrize("how", HOWS)
def test_nothing_is_written_into_an_inventory_dir_another_user_can_change(
    open_dir,  # noqa: F811
    single,
    monkeypatch,
    how,
):
    sim, host = single
    inventory, shown, why = untrusted(open_dir, how)
    before = files_below(inventory)
    line = f"{shown}: {why}: nvshim keeps NIC claims {WHY}"
    with pytest.raises(NvshimError) as err:
        claims.claim(inventory, ["mlx5_0"], "c1", os.getpid())
    assert str(err.value) == line
    monkeypatch.setattr(bind, "_clone_detached_works", False)  # the params file's fallback
    with pytest.raises(NvshimError) as err:
        with bind.private_file_tree(b"ModifyDeviceFiles: 0\n", inventory, "params"):
            pass
    assert str(err.value) == f"{shown}: {why}: nvshim keeps the hook's params file {WHY}"
    store(inventory, host)  # a cache: skipped, not an error
    assert files_below(inventory) == before == []


def test_forged_entries_in_an_inventory_dir_another_user_can_change_are_never_read(
    open_dir,  # noqa: F811
    single,
):
    """``nobody`` writes into a group-writable inventory directory a claim on a NIC (held
    by a live process: theirs) and an inventory cache copied from root's: neither is read."""
    sim, host = single
    inventory, _, _ = untrusted(open_dir, "writable by its group")
    store(inventory, host)
    safe = os.path.join(open_dir, "safe")
    store(safe, host)
    forged = pathlib.Path(safe, CACHE_NAME).read_bytes()
    claim = json.dumps({"id": "theirs", "pid": 1, "start": claims.start_time(1)})
    as_nobody("sh", "-c", f"cat > {inventory}/{CACHE_NAME} && mkdir {inventory}/rdma-claims && "
              f"echo '{claim}' > {inventory}/rdma-claims/mlx5_0", input=forged)  # fmt: skip
    assert load_cached(inventory, sim.driver_root, sim.dev_root) is None
    assert claims.live_claims(inventory) == {}
    assert load_cached(safe, sim.driver_root, sim.dev_root) == host  # the same, root's


def test_the_writes_work_in_a_directory_only_root_can_change(open_dir, single, monkeypatch):  # noqa: F811
    """Below a sticky world-writable directory (like ``/tmp``), root's 0755 directory, made
    by nvshim when missing: the cache, a claim and the params file are all written."""
    sim, host = single
    inventory = os.path.join(open_dir, "inv")
    store(inventory, host)
    assert load_cached(inventory, sim.driver_root, sim.dev_root) == host
    assert claims.claim(inventory, ["mlx5_0"], "c1", os.getpid()) == ["mlx5_0"]
    assert claims.live_claims(inventory) == {"mlx5_0": "c1"}
    with pytest.raises(NvshimError, match="mlx5_0 is claimed by container c1"):
        claims.claim(inventory, ["mlx5_0"], "c2", os.getpid())
    claims.release(inventory, ["mlx5_0"], "c1")
    assert claims.live_claims(inventory) == {}
    monkeypatch.setattr(bind, "_clone_detached_works", False)
    with bind.private_file_tree(b"ModifyDeviceFiles: 0\n", inventory, "params") as tree:
        params = f".params.{os.getpid()}"
        assert sorted(os.listdir(inventory)) == [params, CACHE_NAME, "rdma-claims"]
        assert os.fstat(tree).st_size == len("ModifyDeviceFiles: 0\n")
    assert sorted(os.listdir(inventory)) == [CACHE_NAME, "rdma-claims"]


def _uninstall_cleans(host_root: str, inventory_dir: str) -> list[str]:
    """The lines of the node uninstall's cleaning of the run directories, for a host at
    ``host_root`` whose config names ``inventory_dir``."""
    from nvshim.node.env import NodeSettings
    from nvshim.node.steps import clean_run_dirs

    config = os.path.join(host_root, "config.toml")
    with open(config, "w") as fh:
        fh.write(f'[runtime]\ninventory-dir = "{inventory_dir}"\n')
    s = NodeSettings(engine=None, engine_name="none", host_root=host_root, prefix="/opt/nvshim",
                     driver_root="/", driver_root_ctr=host_root, dev_root="/",
                     dev_root_ctr=host_root, node_config=config)  # fmt: skip
    lines: list[str] = []
    clean_run_dirs(s, lines.append)
    return lines


def test_the_node_uninstall_empties_only_an_inventory_dir_no_other_user_can_change(open_dir):  # noqa: F811
    """The uninstall removes what is in the inventory directory, as root: in one
    ``nobody`` owns a directory above (where they could swap a directory for a symlink
    while it walks), it removes nothing and says so in one line."""
    host = os.path.join(open_dir, "host")
    os.makedirs(os.path.join(host, "srv/safe/rdma-claims"))
    os.mkdir(os.path.join(host, "srv/theirs"))
    os.chown(os.path.join(host, "srv/theirs"), 65534, 65534)  # nobody's
    theirs = os.path.join(host, "srv/theirs/inv")
    os.makedirs(os.path.join(theirs, "rdma-claims"))
    assert _uninstall_cleans(host, "/srv/theirs/inv") == [
        f"warning: left {theirs} as it is: {host}/srv/theirs: owned by uid 65534: another user "
        "could change it"
    ]
    assert os.listdir(theirs) == ["rdma-claims"]
    safe = os.path.join(host, "srv/safe")
    assert _uninstall_cleans(host, "/srv/safe") == [f"removed 1 cache entry in {safe}"]
    assert os.listdir(safe) == []


def test_the_node_uninstall_never_follows_a_directory_swapped_for_a_symlink(open_dir):  # noqa: F811
    """A container writes in its MPS pipe directory (bind-mounted from the cache
    directory): ``nobody`` there swaps a directory of theirs with a symlink to a host
    directory (``renameat2(RENAME_EXCHANGE)``) while the uninstall empties the cache
    directory. The walk listed the directory, then unlinked by path through the symlink:
    root removed the host's file. Now it works through directory fds and the host's file
    stays, whatever the timing."""
    from tests.test_runtime_races import SWAP, SYSTEM_PYTHON

    host = os.path.join(open_dir, "host")
    canary = os.path.join(host, "etc")
    os.makedirs(canary)
    pipe = os.path.join(host, "run/nvshim/mps/GPU-0/pipe")
    for attempt in range(30):
        with open(os.path.join(canary, "victim"), "w") as fh:
            fh.write("host file\n")
        shutil.rmtree(os.path.join(host, "run"), ignore_errors=True)  # what a try left
        os.makedirs(pipe)
        os.chown(pipe, 65534, 65534)  # the container's process may write here
        as_nobody("sh", "-c", f"cd {pipe} && mkdir x && : > x/victim && "
                  "ln -s ../../../../../etc y")  # fmt: skip
        swapper = subprocess.Popen(
            [*NOBODY, SYSTEM_PYTHON, "-c", SWAP, "x", "y", "5"], cwd=pipe,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            time.sleep(0.05)
            _uninstall_cleans(host, "/srv/none")
        finally:
            swapper.kill()
            swapper.wait()
        assert os.path.exists(os.path.join(canary, "victim")), f"attempt {attempt}"
        assert os.listdir(canary) == ["victim"]


def test_the_node_uninstall_keeps_what_running_containers_and_the_dra_driver_use(open_dir):  # noqa: F811
    """With containers still running through nvshim (a containerd shim started with its
    runtime: a real process, named as one, in a bundle naming the runtime), their exec
    markers and NIC claims stay for the next install; the DRA driver's MPS root (its
    daemons' pipes and logs, in the same cache directory on its DaemonSet) always stays;
    the installer's own caches go."""
    host = os.path.join(open_dir, "host")
    run = os.path.join(host, "run/nvshim")
    for path in ("exec/ctr-1", "rdma-claims/mlx5_0", "dra-mps/GPU-1/pipe/control",
                 "mps/GPU-2/pipe/control", "runtime-front"):  # fmt: skip
        os.makedirs(os.path.dirname(os.path.join(run, path)), exist_ok=True)
        open(os.path.join(run, path), "w").close()
    bundle = os.path.join(open_dir, "bundle")
    os.mkdir(bundle)
    with open(os.path.join(bundle, "runtime"), "w") as fh:
        fh.write("/opt/nvshim/bin/nvshim-runtime")
    shim = os.path.join(open_dir, "containerd-shim-runc-v2")
    shutil.copy(shutil.which("sleep"), shim)
    running = subprocess.Popen([shim, "60"], cwd=bundle)
    try:
        time.sleep(0.2)
        assert _uninstall_cleans(host, "/run/nvshim") == [f"removed 2 cache entries in {run}"]
        assert sorted(os.listdir(run)) == ["dra-mps", "exec", "rdma-claims"]
    finally:
        running.kill()
        running.wait()
    assert _uninstall_cleans(host, "/run/nvshim") == [f"removed 2 cache entries in {run}"]
    assert os.listdir(run) == ["dra-mps"]
    assert os.path.exists(os.path.join(run, "dra-mps/GPU-1/pipe/control"))
