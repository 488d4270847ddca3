"""nvshim-runtime end to end: real runc bundles (busybox rootfs) started through the
isolated launcher on simulated hosts. The container's own view is what is asserted."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.conftest import HOSTS, write_config
from tests.podman_util import make_busybox_rootfs
from tests.runc_util import RUNC_ENV, make_bundle, runc_run
from tests.sim.driverfiles import LIBRARIES

LIBDIR = "/usr/lib/x86_64-linux-gnu"
SHOW = (
    "echo DEV: $(ls /dev | grep nvidia); "
    "echo CAPS: $(ls /dev/nvidia-caps 2>/dev/null); "
    f"echo LIBS: $(ls {LIBDIR} 2>/dev/null); "
    f"echo LINK: $(readlink {LIBDIR}/libcuda.so.1); "
    "echo CVD=${CUDA_VISIBLE_DEVICES-unset}; "
    "test -x /usr/bin/nvidia-smi && echo SMI-OK; true"
)
SYS_ADMIN_CAPS = ["CAP_SYS_ADMIN", "CAP_KILL", "CAP_AUDIT_WRITE", "CAP_NET_BIND_SERVICE"]


@pytest.fixture(scope="module")
def rootfs(tmp_path_factory):
    return make_busybox_rootfs(tmp_path_factory.mktemp("rootfs") / "rootfs")


class Runtime:
    """A simulated host, an nvshim config for it, and a way to run bundles."""

    def __init__(self, sim, launchers, tmp_path, rootfs, **policy):
        self.sim = sim
        self.tmp = tmp_path
        self.rootfs = rootfs
        self.log = tmp_path / "nvshim.log"
        self.config = write_config(
            tmp_path / "config.toml", sim, launchers, tmp_path / "state", self.log, **policy
        )
        self.runtime = os.path.join(launchers, "nvshim-runtime")
        self.count = 0

    def run(self, env=None, annotations=None, mounts=None, capabilities=None, args=None):
        self.count += 1
        name = f"c{self.count}"
        # a fresh rootfs per container: runc leaves mountpoints and the hooks leave links
        rootfs = make_busybox_rootfs(self.tmp / f"rootfs-{name}")
        bundle = make_bundle(
            self.tmp,
            rootfs,
            args or ["/bin/sh", "-c", SHOW],
            env=env,
            annotations=annotations,
            mounts=mounts,
            capabilities=capabilities,
            name=name,
        )
        before = open(os.path.join(bundle, "config.json"), "rb").read()
        proc = runc_run(
            bundle,
            f"nvshim-test-{os.getpid()}-{name}",
            runtime=self.runtime,
            env={"NVSHIM_CONFIG": self.config},
        )
        after = open(os.path.join(bundle, "config.json"), "rb").read()
        return proc, before, after

    def view(self, proc) -> dict[str, list[str]]:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        out: dict[str, list[str]] = {}
        for line in proc.stdout.splitlines():
            key, _, rest = line.partition(":" if not line.startswith("CVD=") else "=")
            out[key] = rest.split()
        return out

    def log_lines(self) -> list[str]:
        """The runtime's decision lines (one per container)."""
        text = self.log.read_text() if self.log.exists() else ""
        return [x for x in text.splitlines() if " nvshim-runtime " in x]


@pytest.fixture
def h100(sim_hosts, launchers, tmp_path, rootfs):
    return Runtime(
        sim_hosts("h100x8-mig"), launchers, tmp_path, rootfs, accept_env_unprivileged=True
    )


def gpu_nodes(view) -> set[str]:
    return {d for d in view["DEV"] if d[len("nvidia") :].isdigit()}


def test_single_gpu_by_index(h100):
    proc, _, after = h100.run(env={"NVIDIA_VISIBLE_DEVICES": "2"})
    view = h100.view(proc)
    gpu = h100.sim.topology["gpus"][2]
    assert gpu_nodes(view) == {"nvidia2"}
    assert {"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"} <= set(view["DEV"])
    assert "nvidia-modeset" not in view["DEV"]  # display capability not asked
    ver = h100.sim.driver_version
    libs = set(view["LIBS"])
    assert {
        f"libcuda.so.{ver}",
        "libcuda.so.1",
        "libcuda.so",
        f"libnvidia-ml.so.{ver}",
        "libnvidia-ml.so.1",
    } <= libs
    assert not any(x.startswith(("libnvidia-encode", "libGLX_nvidia", "libnvcuvid")) for x in libs)
    assert view["LINK"] == [f"libcuda.so.{ver}"]
    assert view["CVD"] == [gpu["uuid"]]
    assert "SMI-OK" in proc.stdout
    spec = json.loads(after)
    assert spec["annotations"]["nvshim.io/injected"] == gpu["uuid"]
    line = h100.log_lines()[-1]
    assert "source=env" in line and f"devices={gpu['uuid']}" in line
    # one line per container: the hook that finished it logs nothing more on success
    assert len(h100.log.read_text().splitlines()) == 1


def lib_bases(names: list[str]) -> set[str]:
    """The driver libraries (base names, as in the simulated driver's table) among ``names``."""
    known = {base for base, _, _ in LIBRARIES}
    return {n.split(".so")[0] for n in names if n.split(".so")[0] in known}


@pytest.mark.parametrize("host", HOSTS)
def test_every_host_all_and_one_device(sim_hosts, launchers, tmp_path, rootfs, host):
    """On each simulated host, ``all`` and then the first device by UUID give exactly those
    devices' nodes, the control nodes and libraries of the default capabilities
    (utility, compute) and no others, a working libcuda link and CUDA_VISIBLE_DEVICES."""
    rt = Runtime(sim_hosts(host), launchers, tmp_path, rootfs, accept_env_unprivileged=True)
    gpus = rt.sim.topology["gpus"]
    whole = [g["uuid"] for g in gpus if g["mig_mode"] != "enabled"]
    migs = rt.sim.mig_uuids()
    first = (whole or migs)[0]
    wanted_libs = {base for base, cap, _ in LIBRARIES if cap in ("utility", "compute")}
    for request, uuids in (("all", whole + migs), (first, [first])):
        proc, _, _ = rt.run(env={"NVIDIA_VISIBLE_DEVICES": request})
        view = rt.view(proc)
        owners = {
            f"nvidia{g['minor']}"
            for g in gpus
            if g["uuid"] in uuids or any(m["uuid"] in uuids for m in g["mig_devices"])
        }
        control = {"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"}
        if set(uuids) & set(migs):
            control.add("nvidia-caps")
        assert gpu_nodes(view) == owners, request
        assert set(view["DEV"]) - owners == control, request
        caps = {name for u in uuids if u in migs for name in rt.sim.mig_cap_names(u)}
        assert set(view["CAPS"]) == caps, request
        assert lib_bases(view["LIBS"]) == wanted_libs, request
        assert view["LINK"] == [f"libcuda.so.{rt.sim.driver_version}"]
        assert view["CVD"] == [",".join(uuids)], request


def test_mig_device_and_replica_ids(h100):
    gpu6 = h100.sim.topology["gpus"][6]
    mig = sorted(gpu6["mig_devices"], key=lambda m: m["slot"])[1]
    proc, _, _ = h100.run(env={"NVIDIA_VISIBLE_DEVICES": f"{mig['uuid']}::0,6:1::1"})
    view = h100.view(proc)
    assert gpu_nodes(view) == {f"nvidia{gpu6['minor']}"}
    assert set(view["CAPS"]) == set(h100.sim.mig_cap_names(mig["uuid"]))
    assert view["CVD"] == [mig["uuid"]]


def test_replica_of_whole_gpu_by_uuid(h100):
    gpu = h100.sim.topology["gpus"][4]
    proc, _, _ = h100.run(env={"NVIDIA_VISIBLE_DEVICES": f"{gpu['uuid']}::3"})
    assert gpu_nodes(h100.view(proc)) == {"nvidia4"}


def test_all_devices(h100):
    proc, _, _ = h100.run(env={"NVIDIA_VISIBLE_DEVICES": "all"})
    view = h100.view(proc)
    assert gpu_nodes(view) == {f"nvidia{i}" for i in range(8)}  # 6 whole + 2 MIG parents
    assert len(view["CAPS"]) == 2 * len(h100.sim.mig_uuids()) - 1  # 7:0 and 7:1 share a GI
    assert (
        view["CVD"][0].split(",")
        == [g["uuid"] for g in h100.sim.topology["gpus"] if g["mig_mode"] != "enabled"]
        + h100.sim.mig_uuids()
    )


def test_none_gives_driver_but_no_gpu(h100):
    proc, _, _ = h100.run(env={"NVIDIA_VISIBLE_DEVICES": "none"})
    view = h100.view(proc)
    assert gpu_nodes(view) == set()
    assert "nvidiactl" in view["DEV"]
    assert "libcuda.so.1" in view["LIBS"]
    assert view["CVD"] == []  # empty: hides every GPU


@pytest.mark.parametrize("value", [None, "void", ""])
def test_non_gpu_container_untouched(h100, value):
    env = {"CUDA_VISIBLE_DEVICES": "5"} if value is None else {"NVIDIA_VISIBLE_DEVICES": value}
    proc, before, after = h100.run(env=env)
    view = h100.view(proc)
    assert before == after  # byte-identical config.json
    assert view["DEV"] == [] and view["LIBS"] == []


def test_capabilities_select_files(h100):
    proc, _, _ = h100.run(
        env={"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_DRIVER_CAPABILITIES": "video,display"}
    )
    view = h100.view(proc)
    libs = set(view["LIBS"])
    assert any(x.startswith("libnvidia-encode.so") for x in libs)
    assert not any(x.startswith(("libcuda", "libnvidia-ml")) for x in libs)
    assert "nvidia-modeset" in view["DEV"]
    assert "nvidia-uvm" not in view["DEV"]
    assert "SMI-OK" not in proc.stdout  # utility not asked


def test_user_cuda_visible_devices_kept_or_replaced(h100):
    gpus = h100.sim.topology["gpus"]
    proc, _, _ = h100.run(env={"NVIDIA_VISIBLE_DEVICES": "1,3", "CUDA_VISIBLE_DEVICES": "1"})
    assert h100.view(proc)["CVD"] == ["1"]  # container index 1 names an injected GPU
    proc, _, _ = h100.run(env={"NVIDIA_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": "5"})
    assert h100.view(proc)["CVD"] == [gpus[1]["uuid"]]
    assert "cuda_visible_devices_replaced" in h100.log_lines()[-1]


def test_failed_requirement_stops_create(h100):
    proc, _, _ = h100.run(env={"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_REQUIRE_CUDA": "cuda>=13.0"})
    assert proc.returncode != 0
    lines = [x for x in proc.stderr.splitlines() if x.startswith("nvshim-runtime")]
    assert len(lines) == 1
    assert "cuda>=13.0" in lines[0] and "550.90.12" in lines[0] and "12.4" in lines[0]
    assert "error=" in h100.log_lines()[-1]
    # an older CUDA image's alternative (space = OR) is met
    proc, _, _ = h100.run(
        env={
            "NVIDIA_VISIBLE_DEVICES": "0",
            "NVIDIA_REQUIRE_CUDA": "cuda>=12.4 brand=tesla,driver>=470",
        }
    )
    assert proc.returncode == 0, proc.stderr


def test_arch_requirement_checks_each_gpu(h100):
    proc, _, _ = h100.run(env={"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_REQUIRE_ARCH": "arch>=10.0"})
    assert proc.returncode != 0 and "arch>=10.0" in proc.stderr


def test_cdi_annotation_honoured_for_unprivileged(sim_hosts, launchers, tmp_path, rootfs):
    rt = Runtime(sim_hosts("a100-mig-1g5gb"), launchers, tmp_path, rootfs)  # default policy
    uuid = rt.sim.mig_uuids()[3]
    proc, _, _ = rt.run(annotations={"cdi.k8s.io/gpu": f"nvidia.com/gpu={uuid}"})
    view = rt.view(proc)
    assert gpu_nodes(view) == {"nvidia0"}
    assert len(view["CAPS"]) == 2
    assert view["CVD"] == [uuid]
    assert "source=cdi" in rt.log_lines()[-1]


def test_device_plugin_volume_mounts(sim_hosts, launchers, tmp_path, rootfs):
    rt = Runtime(sim_hosts("h100x8-mig"), launchers, tmp_path, rootfs)
    mount = {
        "destination": "/var/run/nvidia-container-devices/3",
        "type": "bind",
        "source": "/dev/null",
        "options": ["bind", "ro"],
    }
    proc, _, _ = rt.run(mounts=[mount])
    assert gpu_nodes(rt.view(proc)) == {"nvidia3"}


def test_unprivileged_env_request_denied_by_default(sim_hosts, launchers, tmp_path, rootfs):
    rt = Runtime(sim_hosts("single"), launchers, tmp_path, rootfs)
    proc, before, after = rt.run(env={"NVIDIA_VISIBLE_DEVICES": "all"})
    view = rt.view(proc)
    assert view["DEV"] == [] and view["LIBS"] == []
    assert before == after
    assert "denied=" in rt.log_lines()[-1]
    # a privileged container (CAP_SYS_ADMIN in its bounding set) is honoured
    proc, _, _ = rt.run(env={"NVIDIA_VISIBLE_DEVICES": "all"}, capabilities=SYS_ADMIN_CAPS)
    assert gpu_nodes(rt.view(proc)) == {"nvidia0"}


def test_unprivileged_env_request_naming_a_gpu_fails_the_create(
    sim_hosts, launchers, tmp_path, rootfs
):
    """The device plugin's envvar strategy (NVIDIA_VISIBLE_DEVICES=<id>) from an
    unprivileged container: the create fails with the reason on stderr (what the engine
    puts in the pod's events), never a container silently without its GPU."""
    rt = Runtime(sim_hosts("single"), launchers, tmp_path, rootfs)
    proc, _, _ = rt.run(env={"NVIDIA_VISIBLE_DEVICES": "0"})
    assert proc.returncode != 0
    assert "NVIDIA_VISIBLE_DEVICES='0' not honoured: unprivileged container" in proc.stderr
    assert "Traceback" not in proc.stderr
    (tmp_path / "relaxed").mkdir()
    relaxed = Runtime(
        sim_hosts("single"), launchers, tmp_path / "relaxed", rootfs, fail_refused_env=False
    )
    proc, _, _ = relaxed.run(env={"NVIDIA_VISIBLE_DEVICES": "0"})
    assert relaxed.view(proc)["DEV"] == []
    assert "denied=" in relaxed.log_lines()[-1]


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"env": {"NVIDIA_VISIBLE_DEVICES": "../../etc"}}, "../../etc"),
        ({"env": {"NVIDIA_VISIBLE_DEVICES": "9"}}, "9"),
        (
            {
                "mounts": [
                    {
                        "destination": "/var/run/nvidia-container-devices/../../x",
                        "type": "bind",
                        "source": "/dev/null",
                        "options": ["bind"],
                    }
                ]
            },
            "..",
        ),
    ],
)
def test_bad_requests_fail_with_one_line(h100, kwargs, needle):
    proc, before, after = h100.run(**kwargs)
    assert proc.returncode != 0
    lines = [x for x in proc.stderr.splitlines() if x.startswith("nvshim-runtime")]
    assert len(lines) == 1 and needle in lines[0]
    assert before == after


# nested 5,000 deep: runc's Go decoder takes it (its limit is 10,000); Python's scanner
# stops at its recursion limit, an error that named no input
DEEP = '{"process":{"env":["NVIDIA_VISIBLE_DEVICES=0"]},"x":' + "[" * 5000 + "]" * 5000 + "}"


def create_alone(h100, bundle, text: str) -> subprocess.CompletedProcess:
    """``nvshim-runtime create`` of ``bundle`` holding only a config.json of ``text``
    (state under the bundle's parent, ``st``)."""
    bundle.mkdir()
    (bundle / "config.json").write_text(text)
    return subprocess.run(
        [h100.runtime, "--root", str(bundle.parent / "st"), "create", "--bundle", str(bundle), "x"],
        capture_output=True,
        text=True,
        env={**RUNC_ENV, "NVSHIM_CONFIG": h100.config, "PATH": os.environ["PATH"]},
    )


@pytest.mark.parametrize("text", ["{not json", DEEP], ids=["not-json", "deep"])
def test_invalid_config_json_one_line(h100, tmp_path, text):
    bundle = tmp_path / "broken"
    proc = create_alone(h100, bundle, text)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "config.json: invalid JSON" in proc.stderr
    assert (bundle / "config.json").read_text() == text


GPU_ENV = '"env":["NVIDIA_VISIBLE_DEVICES=0"]'


@pytest.mark.parametrize(
    "text, key, field",
    [
        ('{"process":{' + GPU_ENV + ',"Env":["PATH=/bin"]}}', "Env", "process.env"),
        ('{"process":{' + GPU_ENV + '},"Process":{"env":[]}}', "Process", "process"),
        ('{"process":{' + GPU_ENV + '},"linux":{"DEVICES":[]}}', "DEVICES", "linux.devices"),
        ('{"process":{' + GPU_ENV + '},"hooks":{"preStart":[]}}', "preStart", "hooks.prestart"),
        ('{"process":{' + GPU_ENV + '},"Mounts":[]}', "Mounts", "mounts"),
        # Go folds the long s as s: "proce\u017f\u017f" is "process" to runc
        ('{"process":{' + GPU_ENV + '},"proce\u017f\u017f":{}}', "proce\u017f\u017f", "process"),
    ],
    ids=["process.Env", "Process", "linux.DEVICES", "hooks.preStart", "Mounts", "long-s"],
)
def test_a_field_nvshim_edits_spelt_in_another_case_is_refused(h100, tmp_path, text, key, field):
    """runc's Go decoder matches field names case-insensitively, the last one winning:
    it would read ``Env`` (``Process`` ...) and drop what nvshim put in ``env``. Refused
    at load, one line naming the file and the key, the file as it was."""
    bundle = tmp_path / "cased"
    proc = create_alone(h100, bundle, text)
    assert proc.returncode == 1
    assert proc.stderr == (
        f"nvshim-runtime: error: {bundle}/config.json: {key!r} is the {field} field spelt "
        "in another case\n"
    )
    assert (bundle / "config.json").read_text() == text
    assert not (tmp_path / "st").exists()


def test_pass_through_is_runc(h100, tmp_path):
    env = {**RUNC_ENV, "NVSHIM_CONFIG": h100.config, "PATH": os.environ["PATH"]}
    ours = subprocess.run([h100.runtime, "--version"], capture_output=True, text=True, env=env)
    theirs = subprocess.run(["runc", "--version"], capture_output=True, text=True)
    assert ours.returncode == theirs.returncode == 0
    assert ours.stdout.split("\n", 1)[1] == theirs.stdout  # after nvshim's own version
    args = ["--root", str(tmp_path / "st"), "state", "no-such-container"]
    ours = subprocess.run([h100.runtime, *args], capture_output=True, text=True, env=env)
    theirs = subprocess.run(["runc", *args], capture_output=True, text=True)
    assert ours.returncode == theirs.returncode != 0
    assert ours.stderr == theirs.stderr


def test_json_log_error_reaches_engine(h100, tmp_path):
    """containerd reads runc's --log file for the failure message: ours is there too."""
    bundle = make_bundle(
        tmp_path, h100.rootfs, ["true"], env={"NVIDIA_VISIBLE_DEVICES": "42"}, name="logged"
    )
    log = tmp_path / "runc-log.json"
    proc = subprocess.run(
        [
            h100.runtime,
            "--root",
            str(tmp_path / "st"),
            "--log",
            str(log),
            "--log-format",
            "json",
            "create",
            "--bundle",
            bundle,
            "logged",
        ],
        capture_output=True,
        text=True,
        env={**RUNC_ENV, "NVSHIM_CONFIG": h100.config, "PATH": os.environ["PATH"]},
    )
    assert proc.returncode == 1
    record = json.loads(log.read_text().splitlines()[-1])
    assert record["level"] == "error" and "42" in record["msg"]


def test_pass_through_follows_config_changes(launchers, tmp_path):
    """The resolved low-level runtime is cached per config file; editing the file (or
    PATH) takes effect on the next call."""
    fake = tmp_path / "fake-runc"
    fake.write_text('#!/bin/sh\necho FAKE "$@"\n')
    fake.chmod(0o755)
    config = tmp_path / "config.toml"
    runtime = os.path.join(launchers, "nvshim-runtime")
    env = {**RUNC_ENV, "NVSHIM_CONFIG": str(config), "PATH": os.environ["PATH"]}
    for expected in ("FAKE", "runc version", "FAKE"):
        target = str(fake) if expected == "FAKE" else "runc"
        config.write_text(f'# {expected}\n[runtime]\nruntimes = ["{target}"]\n')
        proc = subprocess.run([runtime, "--version"], capture_output=True, text=True, env=env)
        runc_part = proc.stdout.split("\n", 1)[-1]  # after nvshim's own version line
        assert runc_part.startswith(expected), proc.stdout + proc.stderr
    config.write_text('[runtime]\nruntimes = ["/nonexistent/runc"]\n')
    proc = subprocess.run([runtime, "--version"], capture_output=True, text=True, env=env)
    assert proc.returncode == 1
    assert (
        proc.stderr.strip()
        == "nvshim-runtime: error: no low-level runtime found (tried /nonexistent/runc)"
    )
