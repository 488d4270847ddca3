"""CUDA forward compatibility on real runc: images carrying an older or a newer
``/usr/local/cuda/compat/libcuda.so.X.Y.Z`` (real ELF stubs, with NVIDIA's note) on the
simulated host's 550.90.12 driver (CUDA 12.4). The compat library is used exactly when
NVIDIA's rule says so (tests/test_hook_nvidia_diff.py holds the rule to NVIDIA's own
hook), through nvshim-runtime's create (steps in its own process) and run (the hook);
``NVIDIA_REQUIRE_CUDA`` is judged against the driver the container really uses."""

from __future__ import annotations

import os

import pytest

from nvshim.hook.cudacompat import CONF_FILE
from nvshim.ldcache import parse_ld_cache
from tests import test_hook_standalone as standalone
from tests.compat_util import build_compat_library
from tests.podman_util import make_busybox_rootfs, podman_run
from tests.runc_util import make_bundle, read_log, run_hook_direct, runc_run, write_hook_config
from tests.test_runtime_finish import Creates

gpu_host = standalone.gpu_host  # the fixture: the single-GPU host, inventory cached
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runc needs root")

COMPAT = "/usr/local/cuda/compat"
NEWER = ("570.86.10", "12.8", [535, 550])  # a 12.8 compat library that runs on 535 and 550
NEWER_ELSEWHERE = ("570.86.10", "12.8", [535, 560])  # ... but not on a 550 driver
OLDER = ("535.104.05", "12.2", [535, 550])


@pytest.fixture
def creates(sim_hosts, tmp_path):
    c = Creates(sim_hosts("single"), tmp_path)
    yield c
    c.cleanup()


def image(tmp_path, name: str, compat) -> str:
    rootfs = make_busybox_rootfs(tmp_path / name)
    if compat is not None:
        build_compat_library(rootfs, *compat)
    return rootfs


def libcuda(rootfs: str) -> str:
    """The file ld.so finds for ``libcuda.so.1`` through the container's cache."""
    with open(os.path.join(rootfs, "etc/ld.so.cache"), "rb") as fh:
        entries = parse_ld_cache(fh.read())
    return next(e.path for e in entries if e.name == "libcuda.so.1")


def create(creates: Creates, rootfs: str, cid: str, require: str | None):
    env = {"NVIDIA_VISIBLE_DEVICES": "0"}
    if require:
        env["NVIDIA_REQUIRE_CUDA"] = require
    bundle = make_bundle(creates.tmp, rootfs, ["/bin/true"], env=env, name=cid)
    creates.ids.append(cid)
    out = creates.tmp / f"{cid}.out"
    with open(out, "w") as fh:  # a file: the created process keeps it open until start
        proc = creates.call("create", "--bundle", bundle, cid, stdout=fh, stderr=fh)
    return proc.returncode, out.read_text()


@pytest.mark.parametrize(
    "compat, used",
    [(NEWER, True), (NEWER_ELSEWHERE, False), (OLDER, False), (None, False)],
    ids=["newer", "newer-other-majors", "older", "none"],
)
def test_create_uses_the_compat_library_exactly_when_newer(creates, tmp_path, compat, used):
    rootfs = image(tmp_path, "rootfs", compat)
    cid = f"compat-{os.getpid()}-{compat and compat[0]}-{used}"
    code, output = create(creates, rootfs, cid, None)
    assert code == 0, output
    creates.start_and_wait(cid)
    conf = os.path.join(rootfs, CONF_FILE.lstrip("/"))
    if used:
        assert libcuda(rootfs) == f"{COMPAT}/libcuda.so.1"
        with open(conf) as fh:
            assert fh.read() == f"{COMPAT}\n"
    else:
        assert libcuda(rootfs) == "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
        assert not os.path.exists(conf)


@pytest.mark.parametrize(
    "compat, require, ok",
    [
        (NEWER, "cuda>=12.8", True),  # the 12.8 compat library meets it on a 12.4 driver
        (NEWER, "cuda>=12.9", False),
        (NEWER_ELSEWHERE, "cuda>=12.8", False),  # not used on 550: the host's 12.4 is judged
        (OLDER, "cuda>=12.4", True),  # not used: the host's 12.4 is judged
        (OLDER, "cuda>=12.8", False),
        (None, "cuda>=12.8", False),
    ],
)
def test_require_cuda_is_judged_against_the_driver_in_use(creates, tmp_path, compat, require, ok):
    rootfs = image(tmp_path, "rootfs", compat)
    cid = f"require-{os.getpid()}-{len(creates.ids)}"
    code, output = create(creates, rootfs, cid, require)
    records = read_log(str(creates.log))
    if ok:
        assert code == 0, output
        used = compat is NEWER
        assert records[-1].get("cuda_compat") == (NEWER[0] if used else None)
        return
    assert code != 0
    assert "NVIDIA_REQUIRE_CUDA: requirement not met" in output
    assert "requirement not met" in records[-1]["error"]
    assert not os.path.exists(os.path.join(rootfs, "etc/ld.so.cache"))  # nothing was done


def test_run_with_the_hook_uses_the_compat_library(creates, tmp_path):
    """``run`` keeps the finishing steps as a createContainer hook: the hook sink."""
    rootfs = image(tmp_path, "rootfs", NEWER)
    env = {"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_REQUIRE_CUDA": "cuda>=12.8"}
    bundle = make_bundle(tmp_path, rootfs, ["/bin/true"], env=env, name="run")
    run = runc_run(bundle, f"compat-run-{os.getpid()}", runtime=creates.runtime, env=creates.env())
    assert run.returncode == 0, run.stderr
    assert libcuda(rootfs) == f"{COMPAT}/libcuda.so.1"


@pytest.mark.parametrize("compat, ok", [(NEWER, True), (OLDER, False)], ids=["newer", "older"])
def test_claim_require_check_judges_the_compat_driver(tmp_path, launchers, compat, ok):
    """A DRA claim spec's createRuntime ``require-check`` (host facts in its flags)."""
    config, log = write_hook_config(tmp_path / "cfg")
    rootfs = image(tmp_path, "rootfs", compat)
    env = {"NVIDIA_VISIBLE_DEVICES": "void", "NVIDIA_REQUIRE_CUDA": "cuda>=12.8"}
    bundle = make_bundle(tmp_path, rootfs, ["/bin/true"], env=env)
    argv = [f"{launchers}/nvshim-hook", "require-check", "--config", config]
    argv += ["--cuda", "12.4", "--driver", "550.90.12", "--device", "9.0:nvidia"]
    got = run_hook_direct(argv, bundle, private_ns=False)
    assert (got.returncode == 0) == ok, got.stderr
    (record,) = read_log(log)
    if ok:
        assert record["cuda_compat"] == NEWER[0]
    else:
        assert "requirement not met" in got.stderr and "cuda_compat" not in record


@pytest.mark.parametrize("compat, used", [(NEWER, True), (OLDER, False)], ids=["newer", "older"])
def test_the_cdi_spec_applies_it_in_podman(sim_hosts, launchers, tmp_path, compat, used):
    """The CDI sink: ``nvshim cdi generate``'s spec, run by podman's own CDI support."""
    from tests.test_cdi_generate import generate_for_podman

    cdi_dir = tmp_path / "cdi"
    cdi_dir.mkdir()
    generate_for_podman(sim_hosts("h100x8-mig"), cdi_dir / "nvidia.yaml", launchers, tmp_path)
    rootfs = image(tmp_path, "rootfs", compat)
    proc = podman_run(
        tmp_path, rootfs, ["--device", "nvidia.com/gpu=0", "--", "/bin/true"], cdi_dir=str(cdi_dir)
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    want = f"{COMPAT}/libcuda.so.1" if used else "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
    assert libcuda(rootfs) == want


@pytest.mark.parametrize("compat, ok", [(NEWER, True), (OLDER, False)], ids=["newer", "older"])
def test_the_prestart_hook_judges_and_applies_it(tmp_path, launchers, gpu_host, compat, ok):
    """The standalone sink: ``nvshim-hook prestart`` from a runc prestart entry."""
    from nvshim.hookentries import hook_entry

    rootfs = image(tmp_path, "rootfs", compat)
    config, log = standalone._config(tmp_path, gpu_host)
    entry = hook_entry(f"{launchers}/nvshim-hook", "prestart", "prestart", "--config", config)
    env = {"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_REQUIRE_CUDA": "cuda>=12.8"}
    admin = ["CAP_SYS_ADMIN", "CAP_KILL", "CAP_AUDIT_WRITE"]  # privileged: env honoured
    bundle = make_bundle(
        tmp_path, rootfs, ["/bin/true"], env=env, hooks=[entry], capabilities=admin
    )
    run = runc_run(bundle, f"compat-prestart-{os.getpid()}-{ok}")
    (record,) = read_log(log)
    if ok:
        assert run.returncode == 0, run.stderr
        assert record["cuda_compat"] == NEWER[0] and libcuda(rootfs) == f"{COMPAT}/libcuda.so.1"
    else:
        assert run.returncode != 0 and "requirement not met" in record["error"]


def test_create_names_the_resolved_folder_as_nvidia_does(creates, tmp_path):
    """CUDA images link /usr/local/cuda to cuda-12.x: the drop-in names the folder as
    resolved inside the root, also from inside the pivoted container (the runtime's
    steps run after runc create)."""
    rootfs = make_busybox_rootfs(tmp_path / "rootfs")
    build_compat_library(rootfs, *NEWER, folder="usr/local/cuda-12.8/compat")
    os.symlink("cuda-12.8", os.path.join(rootfs, "usr/local/cuda"))
    cid = f"compat-link-{os.getpid()}"
    code, output = create(creates, rootfs, cid, "cuda>=12.8")
    assert code == 0, output
    creates.start_and_wait(cid)
    with open(os.path.join(rootfs, CONF_FILE.lstrip("/"))) as fh:
        assert fh.read() == "/usr/local/cuda-12.8/compat\n"
    assert libcuda(rootfs) == "/usr/local/cuda-12.8/compat/libcuda.so.1"
