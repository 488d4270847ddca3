"""The real-GPU kit without a GPU: the CUDA probe (built with gcc, run against a fake
libcuda, the simulated host's stub and no library at all, and in a container through
nvshim-runtime), and bench/real_gpu.sh run on a simulated host, where it must skip
every check that needs a working CUDA driver, with the reason, and pass the rest."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from bench.probe_image import PROBE_PATH, build_probe, host_probe_argv, probe_image
from nvshim.host.discover import discover_host
from nvshim.mps import compute
from nvshim.mps.daemon import is_alive
from tests.conftest import REPO, write_config
from tests.runc_util import build_stub_library, make_bundle, runc_run
from tests.sim import fake_mps_control
from tests.sim.simhost import build_host

# A fake libcuda (the lowest layer: there is no GPU). Its environment sets cuInit's result
# (FAKE_CUDA_INIT, default 0), the device count (FAKE_CUDA_COUNT, default 2) and every
# allocation's result (FAKE_CUDA_ALLOC, default ALLOC_DEFAULT: 2, CUDA_ERROR_OUT_OF_MEMORY).
# Like CUDA, it enumerates only the GPU that CUDA_VISIBLE_DEVICES names by UUID, and is an
# MPS client when CUDA_MPS_PIPE_DIRECTORY is set: cuInit connects to the daemon's control
# socket there and says `new_client` (tests/sim/fake_mps_control.py logs it); without a
# daemon it goes on without MPS, as CUDA does.
FAKE_CUDA = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#ifndef ALLOC_DEFAULT
#define ALLOC_DEFAULT 2
#endif
typedef struct { unsigned char bytes[16]; } CUuuid;
static int env(const char *name, int fallback) {
    const char *e = getenv(name);
    return e ? atoi(e) : fallback;
}
static int visible_uuid(unsigned char *out) {  /* CUDA_VISIBLE_DEVICES=GPU-<uuid> */
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    int n = 0;
    if (!v || strncmp(v, "GPU-", 4)) return 0;
    for (const char *p = v + 4; *p && *p != ',' && n < 32; p++) {
        int d = *p >= '0' && *p <= '9' ? *p - '0' : *p >= 'a' && *p <= 'f' ? *p - 'a' + 10 : -1;
        if (d < 0) continue;
        out[n / 2] = n % 2 ? out[n / 2] | d : d << 4;
        n++;
    }
    return n == 32;
}
static void mps_client(void) {
    const char *dir = getenv("CUDA_MPS_PIPE_DIRECTORY");
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    char buf[64];
    int s;
    if (!dir || !*dir || (s = socket(AF_UNIX, SOCK_STREAM, 0)) < 0) return;
    snprintf(a.sun_path, sizeof a.sun_path, "%s/control", dir);
    if (connect(s, (struct sockaddr *)&a, sizeof a) == 0
        && write(s, "new_client\n", 11) == 11)
        (void)read(s, buf, sizeof buf);
    close(s);
}
int cuInit(unsigned f) { mps_client(); return env("FAKE_CUDA_INIT", 0); }
int cuDriverGetVersion(int *v) { *v = 12040; return 0; }
int cuDeviceGetCount(int *n) {
    unsigned char u[16];
    *n = visible_uuid(u) ? 1 : env("FAKE_CUDA_COUNT", 2);
    return 0;
}
int cuDeviceGet(int *d, int i) { *d = i; return 0; }
int cuDeviceGetName(char *s, int n, int d) { strncpy(s, d ? "Fake \"B\"" : "Fake A", n); return 0; }
int cuDeviceGetUuid_v2(CUuuid *u, int d) {
    if (visible_uuid(u->bytes)) return 0;
    for (int i = 0; i < 16; i++) u->bytes[i] = (unsigned char)(d * 16 + i);
    return 0;
}
int cuCtxCreate_v2(void **c, unsigned f, int d) { *c = (void *)(long)(d + 1); return 0; }
int cuCtxDestroy_v2(void *c) { return 0; }
int cuMemAlloc_v2(unsigned long long *p, size_t n) {
    *p = n;
    return env("FAKE_CUDA_ALLOC", ALLOC_DEFAULT);
}
int cuMemFree_v2(unsigned long long p) { return 0; }
int cuGetErrorName(int rc, const char **s) {
    *s = rc == 2 ? "CUDA_ERROR_OUT_OF_MEMORY" : rc == 100 ? "CUDA_ERROR_NO_DEVICE" : "OTHER";
    return 0;
}
"""


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> str:
    return build_probe(str(tmp_path_factory.mktemp("probe") / "cuda-probe"))


def run_probe(probe: str, *args: str, env: dict | None = None) -> tuple[int, dict]:
    proc = subprocess.run([probe, *args], capture_output=True, text=True, env=env or {})
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout + proc.stderr
    return proc.returncode, json.loads(lines[0])


def test_probe_without_libcuda_is_a_clean_error(probe, tmp_path):
    rc, out = run_probe(probe, str(tmp_path / "libcuda.so.1"))
    assert rc == 1
    assert out["ok"] is False and out["error"] == "driver not loaded"
    assert out["stage"] == "dlopen" and "libcuda.so.1" in out["detail"]
    assert out["cuda_visible_devices"] is None


def test_probe_against_the_simulated_hosts_libcuda(probe, sim_hosts):
    """The simulated driver's libcuda is an ELF stub without the driver API."""
    sim = sim_hosts("single")
    rc, out = run_probe(probe, sim.host_path(f"{sim.lib_dir}/libcuda.so.1"))
    assert rc == 1
    assert (out["error"], out["stage"]) == ("driver not loaded", "dlsym")
    assert "has no cuInit" in out["detail"]


def test_probe_reports_devices_of_a_fake_libcuda(probe, tmp_path):
    lib = build_stub_library(tmp_path / "libcuda.so.1", "libcuda.so.1", FAKE_CUDA)
    rc, out = run_probe(probe, lib, env={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert rc == 1 and out["error"] == "device failed"
    assert out["driver_cuda"] == "12.4" and out["count"] == 2
    assert out["cuda_visible_devices"] == "0,1"
    first, second = out["devices"]
    assert first["uuid"] == "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"
    assert second["uuid"] == "GPU-10111213-1415-1617-1819-1a1b1c1d1e1f"
    assert (first["name"], second["name"]) == ("Fake A", 'Fake "B"')  # JSON-escaped
    assert first["ctx"] == 0 and first["alloc_name"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert first["ok"] is False
    rc, out = run_probe(probe, lib, env={"FAKE_CUDA_INIT": "100"})
    assert (out["error"], out["init_name"]) == ("no CUDA device", "CUDA_ERROR_NO_DEVICE")
    rc, out = run_probe(probe, lib, env={"FAKE_CUDA_INIT": "999"})
    assert (out["error"], out["stage"], out["init"]) == ("driver not loaded", "cuInit", 999)


def test_kit_judges_what_cuda_sees(probe, tmp_path):
    """The kit's CUDA verdicts, on the probe's own output (fake libcuda)."""
    from bench.real_gpu_host import Unit
    from bench.real_gpu_verdict import Failed
    from bench.real_gpu_verdict import cuda_match as _cuda_match

    lib = build_stub_library(tmp_path / "libcuda.so.1", "libcuda.so.1", FAKE_CUDA)
    uuids = ("00010203-0405-0607-0809-0a0b0c0d0e0f", "10111213-1415-1617-1819-1a1b1c1d1e1f")
    a, b = (Unit(str(i), f"GPU-{u}") for i, u in enumerate(uuids))
    _, two = run_probe(probe, lib, env={"FAKE_CUDA_ALLOC": "0"})
    assert _cuda_match(two, [a, b]).startswith("2 device(s), context + 1 MiB each: Fake A")
    with pytest.raises(Failed, match="expected"):
        _cuda_match(two, [a])  # CUDA sees a device that was not granted
    with pytest.raises(Failed, match="expected none"):
        _cuda_match(two, [])
    _, failing = run_probe(probe, lib)
    with pytest.raises(Failed, match="CUDA_ERROR_OUT_OF_MEMORY"):
        _cuda_match(failing, [a, b])
    # two MIG devices granted, CUDA enumerates one of them: right; another device: wrong
    _, one = run_probe(probe, lib, env={"FAKE_CUDA_ALLOC": "0", "FAKE_CUDA_COUNT": "1"})
    migs = [Unit("0:0", f"MIG-{uuids[0]}"), Unit("0:1", "MIG-" + "f" * 32)]
    assert _cuda_match(one, migs).startswith("1 device(s)")
    with pytest.raises(Failed):
        _cuda_match(one, [Unit("0:1", "MIG-" + "f" * 32)])
    _, none = run_probe(probe, lib, env={"FAKE_CUDA_INIT": "100"})
    assert _cuda_match(none, []) == "no device (no CUDA device (CUDA_ERROR_NO_DEVICE))"
    with pytest.raises(Failed, match="CUDA sees nothing: no CUDA device"):
        _cuda_match(none, [a])


def test_host_probe_runs_with_the_images_own_glibc(sim_hosts):
    sim = sim_hosts("single")
    argv = host_probe_argv(probe_image(), sim.host_path(f"{sim.lib_dir}/libcuda.so.1"))
    proc = subprocess.run(argv, capture_output=True, text=True, env={})
    assert json.loads(proc.stdout)["stage"] == "dlsym", proc.stderr


def test_probe_in_a_container_on_a_simulated_host(sim_hosts, launchers, tmp_path):
    """Through nvshim-runtime: the GPU and libcuda are injected, CUDA is not there."""
    sim = sim_hosts("single")
    config = write_config(
        tmp_path / "config.toml", sim, launchers, tmp_path / "state", tmp_path / "log",
        accept_env_unprivileged=True,
    )  # fmt: skip
    rootfs = str(tmp_path / "rootfs")
    shutil.copytree(probe_image(), rootfs, symlinks=True)
    env = {"NVIDIA_VISIBLE_DEVICES": "0"}
    bundle = make_bundle(tmp_path, rootfs, [PROBE_PATH], env=env)
    proc = runc_run(
        bundle,
        f"nvshim-kit-test-{os.getpid()}",
        runtime=os.path.join(launchers, "nvshim-runtime"),
        env={"NVSHIM_CONFIG": config},
    )
    assert proc.returncode == 1, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (out["ok"], out["error"], out["stage"]) == (False, "driver not loaded", "dlsym")
    assert out["library"] == "libcuda.so.1"  # found through the image's own ld.so.cache
    assert "nvidia0" in out["dev"] and "nvidiactl" in out["dev"]
    assert out["cuda_visible_devices"] == sim.gpu_uuids()[0]


def fake_nvidia_smi(sim, path) -> str:
    """An nvidia-smi answering the kit's queries from the simulated host's topology."""
    gpus = sim.topology["gpus"]
    query = "".join(
        f"{g['index']}, {g['uuid']}, {g['name']}, {g['memory_mib']}, {g['pci_bus_id']}, "
        f"{'Enabled' if g['mig_mode'] == 'enabled' else 'Disabled'}, {sim.driver_version}\n"
        for g in gpus
    )
    modes = "".join(f"{g['uuid']}, Default, Disabled, Disabled\n" for g in gpus)
    listing = ""
    for g in gpus:
        listing += f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})\n"
        for n, m in enumerate(sorted(g["mig_devices"], key=lambda m: m["slot"])):
            listing += f"  MIG {m['profile']:<11} Device {n:2}: (UUID: {m['uuid']})\n"
    script = (
        "#!/bin/sh\n"
        'case "$1" in\n'
        f"  -L) printf '%s' '{listing}';;\n"
        f"  --query-gpu=index,*) printf '%s' '{query}';;\n"
        f"  --query-gpu=uuid,*) printf '%s' '{modes}';;\n"
        '  *) echo "fake nvidia-smi: $*" >&2; exit 2;;\n'
        "esac\n"
    )
    with open(path, "w") as fh:
        fh.write(script)
    os.chmod(path, 0o755)
    return str(path)


def parse_report(text: str) -> dict[str, dict[str, str]]:
    """The report's check table: check -> {status, needs, detail}."""
    rows = {}
    section = text.split("## Checks", 1)[1].split("\n## ", 1)[0]
    for line in section.splitlines()[4:]:
        if line.startswith("| "):
            status, check, needs, detail = (c.strip() for c in line.strip("|").split(" | ", 3))
            rows[check] = {"status": status, "needs": needs, "detail": detail}
    return rows


def run_kit(tmp_path, *args: str, env: dict | None = None) -> tuple[int, dict, str]:
    out = tmp_path / "report.md"
    proc = subprocess.run(
        ["/bin/bash", os.path.join(REPO, "bench", "real_gpu.sh"), "--out", str(out), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=1500,
    )
    assert out.exists(), proc.stdout + proc.stderr
    text = out.read_text()
    return proc.returncode, parse_report(text), text


MPS_CHECKS = (
    "MPS: daemons start",
    "MPS: probe x2: device nodes, MPS env, pipe dir, shm",
    "MPS: probe x2: CUDA through the MPS daemon",
    "MPS: stop restores compute mode",
)


def mps_host(name: str, tmp_path):
    """The simulated host ``name`` whose nvidia-cuda-mps-control is the fake one."""
    return build_host(name, str(tmp_path / "host"), extra_files=fake_mps_control.extra_files())


def compute_modes(sim) -> dict[str, int]:
    """Each GPU's compute mode, through the fake NVML (which keeps it in a state file)."""
    with compute.nvml_session(discover_host(sim.driver_root, sim.dev_root)) as nvml:
        return {u: compute.get_compute_mode(nvml, u) for u in sim.gpu_uuids()}


def assert_mps_rows(sim, rows: dict[str, dict[str, str]]) -> None:
    """--mps on a simulated host: a (fake) control daemon per GPU outside MIG mode, its GPU
    in EXCLUSIVE_PROCESS meanwhile; two probe containers on GPU 0 with its MPS env, pipe
    dir and shm; CUDA is not there; then every daemon stopped and every mode as found."""
    import re

    whole = {g["uuid"] for g in sim.topology["gpus"] if g["mig_mode"] != "enabled"}
    start = rows[MPS_CHECKS[0]]
    assert start["needs"] == "root, info, gpu, mps, mps-control, mps-gpu"
    started = re.findall(
        r"GPU \d (GPU-\S+): started, pid (\d+), 50% threads, 40779M pinned, "
        r"compute mode Default -> Exclusive_Process, healthy",
        start["detail"],
    )
    assert {uuid for uuid, _ in started} == whole and len(whole) == 6, start["detail"]
    gpu0 = sim.gpu_uuids()[0]
    clients = rows[MPS_CHECKS[1]]
    assert clients["needs"].endswith("mps-gpu, runc, image, mps-daemons")
    assert clients["detail"].startswith(
        f"NVIDIA_VISIBLE_DEVICES=0: nvidia0; CUDA_VISIBLE_DEVICES={gpu0}; "
        f"NVIDIA_VISIBLE_DEVICES={gpu0}::1: nvidia0; CUDA_VISIBLE_DEVICES={gpu0}; each with "
        "CUDA_MPS_PIPE_DIRECTORY=/run/nvidia-mps, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50, "
        f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={gpu0}=40779M, /run/nvidia-mps bound from "
    ), clients["detail"]
    assert clients["detail"].endswith(
        f"/mps/{gpu0}/pipe (holding nvidia-cuda-mps-control.pid), /dev/shm the daemon's tmpfs"
    )
    assert rows[MPS_CHECKS[2]]["status"] == "skip"  # what CUDA sees: no driver here
    stop = rows[MPS_CHECKS[3]]["detail"]
    assert all(f"{uuid} stopped" in stop for uuid in whole), stop
    assert stop.count("compute mode Default, persistence mode 1") == len(sim.gpu_uuids())
    assert set(compute_modes(sim).values()) == {compute.DEFAULT}
    assert not [pid for _, pid in started if is_alive(int(pid))]


def test_kit_on_a_simulated_host(tmp_path):
    """Every check, --mps included: the host's nvidia-cuda-mps-control is the fake one."""
    sim = build_host(
        "h100x8-mig", str(tmp_path / "host"), extra_files=fake_mps_control.extra_files()
    )
    smi = fake_nvidia_smi(sim, tmp_path / "nvidia-smi")
    rc, rows, text = run_kit(
        tmp_path,
        *("--driver-root", sim.driver_root, "--dev-root", sim.dev_root),
        *("--nvidia-smi", smi, "--runs", "1", "--engine-rounds", "1", "--work", str(tmp_path)),
        "--mps",
    )
    failed = {k: v for k, v in rows.items() if v["status"] == "fail"}
    assert rc == 0 and not failed, failed
    for check, row in rows.items():
        if "driver" in row["needs"].split(", "):  # every CUDA check: skipped, with the reason
            assert row["status"] == "skip", check
            assert "driver not loaded" in row["detail"] and "has no cuInit" in row["detail"]
    passed = {k for k, v in rows.items() if v["status"] == "pass"}
    cases = ("all", "one index", "one UUID", "CUDA_VISIBLE_DEVICES widened",
             "env request, unprivileged, default policy")  # fmt: skip
    wanted = {f"{engine}: {case}: device nodes" for engine in ("runc", "podman") for case in cases}
    wanted |= {"runc: none: device nodes", "nvshim info --json", "info vs nvidia-smi --query-gpu",
               "MIG devices vs nvidia-smi -L", "cdi generate + validate", "CDI host paths exist",
               "NVIDIA_REQUIRE_CUDA above the driver refused", "host left unchanged",
               "1-GPU create overhead vs bare runc", "nvshim-runtimed serves 1-GPU creates",
               "engine benchmark (bench/engine_start.py)", *MPS_CHECKS[:2],
               MPS_CHECKS[3]}  # fmt: skip
    assert wanted <= passed, wanted - passed
    assert_mps_rows(sim, rows)
    assert (
        "supports up to CUDA 12.4" in rows["NVIDIA_REQUIRE_CUDA above the driver refused"]["detail"]
    )
    # the MIG device asked for by index: its parent node and its two capability nodes
    for engine, request in (
        ("runc", "NVIDIA_VISIBLE_DEVICES="),
        ("podman", "--device nvidia.com/gpu="),
    ):
        detail = rows[f"{engine}: one index: device nodes"]["detail"]
        assert detail.startswith(f"{request}7:6") and "nvidia6 and 2 MIG cap node(s)" in detail
    assert rows["runc: all: device nodes"]["detail"].startswith(
        "NVIDIA_VISIBLE_DEVICES=all: nvidia0, nvidia1, nvidia2, nvidia3, nvidia4, nvidia5, "
        "nvidia6, nvidia7 and 19 MIG cap node(s)"
    )
    assert "driver 550.90.12" in text and "| 7 | NVIDIA H100 80GB HBM3 |" in text
    assert "## Findings (failed checks)\n\nnone\n" in text
    assert (
        "8 x NVIDIA H100 80GB HBM3, driver 550.90.12 (CUDA ?): "
        "24 checks passed, 0 failed, 13 skipped" in text
    )
    # nvshim-runtimed served all of the kit's creates, the later ones through a slot (the
    # first by its socket, or by a slot too when the front's cache was already warm)
    served = rows["nvshim-runtimed serves 1-GPU creates"]["detail"]
    assert served.startswith("3 1-GPU runs of 0 served ("), served
    ways = served.split("(", 1)[1].rstrip(")").split(", ")
    assert len(ways) == 3 and (ways[0] == "socket" or ways[0].startswith("slot ")), ways
    assert all(w.startswith("slot ") for w in ways[1:]), ways
    # the engine benchmark ran on the kit's host and its table is in the report
    bench = rows["engine benchmark (bench/engine_start.py)"]["detail"]
    assert bench.startswith("1 rounds; create, 1 GPU (runc: no GPU)"), bench
    section = text.split("## Engine benchmark (bench/engine_start.py)\n\n```\n", 1)[1]
    for case in ("pass-through call (list)", "podman run --rm true, 1 GPU",
                 "CRI pod + container, 1 GPU", "yardstick: python3 -IS -c pass"):  # fmt: skip
        assert case in section.split("```", 1)[0], section
    assert not [p for p in os.listdir(tmp_path) if p.startswith("nvshim-kit-")]  # cleaned up


def test_kit_skips_what_this_host_lacks(sim_hosts, tmp_path):
    """No runc, podman or nvidia-smi on PATH: those checks are skipped, naming the tool;
    a mismatching nvidia-smi is a failure naming the difference."""
    sim = sim_hosts("single")
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, GPU-00000000-0000-0000-0000-000000000000, X, 1, "
                   "00000000:00:1E.0, [N/A], 550.90.12'\n")  # fmt: skip
    smi.chmod(0o755)
    rc, rows, _ = run_kit(
        tmp_path,
        *("--driver-root", sim.driver_root, "--dev-root", sim.dev_root),
        *("--image", probe_image(), "--nvidia-smi", str(smi), "--runs", "1"),
        env={"PATH": str(tmp_path / "empty")},
    )
    assert rc == 1
    row = rows["info vs nvidia-smi --query-gpu"]
    assert row["status"] == "fail" and "uuid: nvshim GPU-c73ed862" in row["detail"]
    assert rows["runc: all: device nodes"] == {
        "status": "skip",
        "needs": "root, runc, image, info, gpu",
        "detail": "runc: runc not found on PATH",
    }
    assert rows["podman: all: device nodes"]["detail"] == "podman: podman not found on PATH"
    assert rows["1-GPU create overhead vs bare runc"]["status"] == "skip"
    assert rows["nvshim-runtimed serves 1-GPU creates"]["detail"] == "runc: runc not found on PATH"
    assert rows["engine benchmark (bench/engine_start.py)"]["status"] == "skip"
    assert rows["cdi generate + validate"]["status"] == "pass"
    assert rows["host left unchanged"]["status"] == "pass"
    for check in MPS_CHECKS:  # not asked for: the option is named
        assert rows[check]["status"] == "skip", check
        assert (
            rows[check]["detail"].startswith("mps: not asked for: ")
            and "--mps" in (rows[check]["detail"])
        )


@pytest.fixture(scope="module")
def mps_libcuda(tmp_path_factory) -> str:
    """The fake libcuda whose allocations succeed: a working driver, and an MPS client."""
    lib = tmp_path_factory.mktemp("mps-libcuda") / "libcuda.so.1"
    return build_stub_library(lib, "libcuda.so.1", "#define ALLOC_DEFAULT 0\n" + FAKE_CUDA)


@pytest.fixture
def mps_kit(tmp_path, mps_libcuda):
    """The kit set up with --mps on a one-GPU simulated host whose MPS control and libcuda
    are the fakes."""
    from bench.real_gpu import Kit, options
    from bench.real_gpu_mps import MpsChecks

    sim = mps_host("single", tmp_path)
    driver_lib = os.path.realpath(sim.host_path(f"{sim.lib_dir}/libcuda.so.1"))
    os.unlink(driver_lib)  # replaced, never written through (it may be a shared file)
    shutil.copyfile(mps_libcuda, driver_lib)
    roots = ["--driver-root", sim.driver_root, "--dev-root", sim.dev_root]
    kit = Kit(options(["--mps", *roots, "--work", str(tmp_path)]))
    kit.setup()
    mps = MpsChecks(kit)
    mps.note_missing()
    yield sim, kit, mps
    shutil.rmtree(kit.work, ignore_errors=True)


def test_mps_checks_stop_the_daemons_when_the_kit_is_interrupted(mps_kit):
    """Ctrl-C after the daemons started: the stop check still runs (a finally), stops the
    daemon and leaves the compute mode as found."""
    sim, kit, mps = mps_kit

    def interrupted() -> str:
        raise KeyboardInterrupt

    mps.check_clients = interrupted
    with pytest.raises(KeyboardInterrupt):
        mps.run()
    assert [(r.check, r.status) for r in kit.results] == [
        (MPS_CHECKS[0], "pass"),
        (MPS_CHECKS[3], "pass"),
    ], kit.results
    (daemon,) = mps.daemons.values()
    assert daemon["compute_mode"] == "Exclusive_Process" and not is_alive(daemon["pid"])
    assert compute_modes(sim) == {sim.gpu_uuids()[0]: compute.DEFAULT}


def test_mps_checks_see_cuda_go_through_the_daemon(mps_kit):
    """With a libcuda that initialises and is an MPS client (the fake above), the whole
    --mps path passes: CUDA in both containers sees the granted GPU and reaches the daemon
    through the pipe dir nvshim mounted (the daemon logs each client). A client line from
    before the containers ran is no proof."""
    sim, kit, mps = mps_kit
    gpu = sim.gpu_uuids()[0]
    assert "driver" not in kit.missing, kit.missing
    mps.run()
    assert [(r.check, r.status) for r in kit.results] == [(c, "pass") for c in MPS_CHECKS], (
        kit.results
    )
    cuda = kit.results[2].detail
    one = f"1 device(s), context + 1 MiB each: Fake A {gpu}"
    assert cuda.startswith(f"{one} / {one}; control.log: 2 client line(s) since the "
                           "containers started (NEW CLIENT "), cuda  # fmt: skip
    assert cuda.count("from user 0: Server already exists") == 2
    control = os.path.join(mps.root, gpu, "log", "control.log")
    with open(control) as fh:
        mps.log_mark = len(fh.read().splitlines())
    kit.check("again, the clients' lines before the mark", (), mps.check_cuda)
    assert kit.results[-1].status == "fail"
    assert kit.results[-1].detail.startswith(
        "CUDA ran, but not through the daemon: control.log: 0 client line(s)"
    )


def test_mps_stop_check_sets_back_a_compute_mode_nvshim_left(mps_kit):
    """The record of the mode found gone (state.json, wiped behind nvshim's back), `nvshim
    mps stop` leaves EXCLUSIVE_PROCESS: the check fails, naming it, and the kit sets the
    mode it found back itself."""
    sim, kit, mps = mps_kit
    gpu = sim.gpu_uuids()[0]
    kit.check(MPS_CHECKS[0], (), mps.check_start)
    assert compute_modes(sim) == {gpu: compute.EXCLUSIVE_PROCESS}
    os.unlink(os.path.join(mps.root, gpu, "state.json"))
    kit.check(MPS_CHECKS[3], (), mps.check_stop)
    start, stop = kit.results
    assert start.status == "pass" and stop.status == "fail"
    assert stop.detail == (
        f"{gpu}: compute mode Exclusive_Process, persistence mode 1, found compute mode "
        "Default, persistence mode 1; the kit set the compute mode back itself: done"
    )
    assert compute_modes(sim) == {gpu: compute.DEFAULT}


def test_mps_stop_check_ends_what_a_failed_stop_left(mps_kit):
    """`nvshim mps stop` failing (its config gone): the check fails, naming it; the kit
    ends its own daemon (SIGTERM through a pidfd), detaches its shm and sets the compute
    mode back."""
    sim, kit, mps = mps_kit
    gpu = sim.gpu_uuids()[0]
    kit.check(MPS_CHECKS[0], (), mps.check_start)
    (daemon,) = mps.daemons.values()
    os.unlink(mps.config)
    kit.check(MPS_CHECKS[3], (), mps.check_stop)
    start, stop = kit.results
    assert start.status == "pass" and stop.status == "fail"
    shm = os.path.join(mps.root, gpu, "shm")
    for part in (
        f"nvshim mps stop: exit 1: nvshim: error: {mps.config}: configuration file not found",
        f"{gpu}: daemon {daemon['pid']} still ran: the kit sent {daemon['pid']} SIGTERM",
        f"{shm}: still mounted (the kit detached it)",
        f"{gpu}: compute mode Exclusive_Process, persistence mode 1, found compute mode Default",
        "the kit set the compute mode back itself: done",
    ):
        assert part in stop.detail, stop.detail
    for _ in range(200):  # SIGTERM is asynchronous
        if not is_alive(daemon["pid"]):
            break
        time.sleep(0.01)
    assert not is_alive(daemon["pid"]) and not os.path.ismount(shm)
    assert compute_modes(sim) == {gpu: compute.DEFAULT}


def test_snapshot_sees_a_compute_mode_change(tmp_path):
    """The "host left unchanged" check would notice: a compute mode changed between two
    snapshots (through the fake NVML, which keeps it in a state file) is a difference."""
    from bench.real_gpu_host import differences, snapshot
    from nvshim.host.discover import discover_host
    from nvshim.mps.compute import EXCLUSIVE_PROCESS, nvml_session, set_compute_mode
    from tests.sim.simhost import build_host

    sim = build_host("single", str(tmp_path / "host"))
    before = snapshot(sim.driver_root, sim.dev_root, None)
    assert differences(before, snapshot(sim.driver_root, sim.dev_root, None)) == []
    with nvml_session(discover_host(sim.driver_root, sim.dev_root)) as pynvml:
        set_compute_mode(pynvml, sim.gpu_uuids()[0], EXCLUSIVE_PROCESS)
    diff = differences(before, snapshot(sim.driver_root, sim.dev_root, None))
    assert len(diff) == 1 and diff[0].startswith("gpus:") and "'compute_mode': 3" in diff[0]


def test_kit_runs_from_a_checkout_without_venv(sim_hosts, tmp_path):
    """A GPU host that reaches no registry: a copy of the checkout without .venv, plus
    what bench/real_gpu_carry.py collected (site, probe image, runc, busybox, the simulated
    host's compiled libraries; docs/real-gpu.md's line, run as written in the copy while
    its .venv is there), run by python3 with no runc on PATH but the carried one."""
    import shlex

    from tests.docs_commands import documented

    sim = sim_hosts("single")
    checkout = tmp_path / "checkout"
    skip = shutil.ignore_patterns(".venv", ".git", "build", "__pycache__", ".*_cache")
    shutil.copytree(REPO, checkout, ignore=skip)
    carry = checkout / "build" / "real-gpu-kit"
    os.symlink(os.path.dirname(os.path.dirname(sys.executable)), checkout / ".venv")
    line = documented("docs/real-gpu.md", ".venv/bin/python3 bench/real_gpu_carry.py")
    subprocess.run(shlex.split(line), cwd=checkout, check=True, capture_output=True)
    os.unlink(checkout / ".venv")  # the GPU host has none
    assert {"probe-image.tar.gz", "site", "bin", "lib", "sim-cache"} <= set(os.listdir(carry))
    assert {"runc", "busybox"} <= set(os.listdir(carry / "bin"))
    out = tmp_path / "report.md"
    proc = subprocess.run(
        ["/bin/sh", str(checkout / "bench" / "real_gpu.sh"), "--out", str(out), "--runs", "1"]
        + ["--driver-root", sim.driver_root, "--dev-root", sim.dev_root],
        env={"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C.UTF-8"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    rows = parse_report(out.read_text())
    failed = {k: v for k, v in rows.items() if v["status"] == "fail"}
    assert proc.returncode == 0 and not failed, (failed, proc.stderr[-2000:])
    assert rows["runc: one UUID: device nodes"]["status"] == "pass"
    assert rows["podman: one UUID: device nodes"]["status"] == "pass"
    assert rows["cdi generate + validate"]["status"] == "pass"
