"""The simulated GPU host: the real pynvml, ldconfig and kernel device nodes see it as real."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap

import pytest
import yaml

from nvshim.errors import NvshimError
from tests.sim import compile as simcompile
from tests.sim.simhost import SimHost, build_host, generate_topology
from tests.sim.topology import HOSTS_DIR

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="building a host needs root (mknod)")

PROBE = os.path.join(os.path.dirname(__file__), "sim", "nvmlprobe.py")
LIB = "/usr/lib/x86_64-linux-gnu"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 1 << 20


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_NVML", "LD_"))}
    env.update(extra)
    return env


def probe(host: SimHost, *args: str, lib: str | None = "", env: dict | None = None) -> dict:
    """Run the pynvml probe in a fresh process against the host's libnvidia-ml.so.1."""
    if lib == "":
        lib = f"{host.driver_root}{LIB}/libnvidia-ml.so.1"
    cmd = [sys.executable, PROBE, *([lib] if lib else []), *args]
    out = subprocess.run(
        cmd, capture_output=True, text=True, check=True, env=env or _clean_env(), timeout=60
    )
    return json.loads(out.stdout)


def raw_yaml(name: str) -> dict:
    with open(os.path.join(HOSTS_DIR, f"{name}.yaml"), encoding="utf-8") as fh:
        return yaml.safe_load(fh)


@pytest.fixture(scope="module")
def hosts(tmp_path_factory) -> dict[str, SimHost]:
    """Each shipped host, built once for the read-only tests of this module."""
    base = tmp_path_factory.mktemp("hosts")
    return {
        name: build_host(name, str(base / name))
        for name in ("single", "h100x8-mig", "a100-mig-1g5gb")
    }


# ---- NVML through the real pynvml ------------------------------------------------------


def test_h100x8_gpus_come_back_as_in_the_yaml(hosts):
    host = hosts["h100x8-mig"]
    seen = probe(host)
    raw = raw_yaml("h100x8-mig")
    assert seen["driver_version"] == "550.90.12" == raw["driver_version"]
    assert seen["cuda_driver_version"] == 12040
    assert seen["nvml_version"] == "12.550.90.12"
    assert seen["count"] == 8
    for want, got in zip(raw["gpus"], seen["gpus"], strict=True):
        assert got["index"] == want["index"]
        assert got["uuid"] == want["uuid"]
        assert got["minor"] == want["minor"]
        assert got["pci_bus_id"] == want["pci_bus_id"]
        assert got["pci_bus_id_legacy"] == want["pci_bus_id"][4:]
        assert got["numa_node"] == want["numa_node"]
        assert got["name"] == "NVIDIA H100 80GB HBM3"
        assert got["memory"]["total"] == 81559 * MIB == got["memory"]["v2_total"]
        assert got["compute_capability"] == [9, 0]
        assert got["architecture"] == 9  # NVML_DEVICE_ARCH_HOPPER
        assert got["brand"] == 14  # NVML_BRAND_NVIDIA
        assert got["attributes"]["error"]["code"] == 3  # whole GPUs: not supported
    # index 6 and 7 swap device minors
    assert [g["minor"] for g in seen["gpus"]] == [0, 1, 2, 3, 4, 5, 7, 6]
    assert [g["mig_mode"] for g in seen["gpus"]] == [[0, 0]] * 6 + [[1, 1]] * 2
    assert [g["max_mig_devices"] for g in seen["gpus"]] == [0] * 6 + [7, 7]


def test_h100x8_mig_devices_and_attributes(hosts):
    host = hosts["h100x8-mig"]
    gpu6, gpu7 = probe(host)["gpus"][6:]
    # GPU 6: three MIG devices, then empty slots (NVML_ERROR_NOT_FOUND)
    assert [m and m["name"] for m in gpu6["mig_devices"]] == [
        "NVIDIA H100 80GB HBM3 MIG 3g.40gb",
        "NVIDIA H100 80GB HBM3 MIG 2g.20gb",
        "NVIDIA H100 80GB HBM3 MIG 1g.10gb",
        None,
        None,
        None,
        None,
    ]
    big = gpu6["mig_devices"][0]
    assert big["uuid"] == "MIG-64c009e4-bf61-2bc3-2b79-b1f33acc77f0"
    assert big["is_mig"] is True
    assert big["parent_uuid"] == gpu6["uuid"]
    assert (big["gi"], big["ci"]) == (2, 0)
    assert big["memory"]["total"] == 40192 * MIB
    assert big["pci_bus_id"] == gpu6["pci_bus_id"]
    assert big["attributes"]["gpuInstanceSliceCount"] == 3
    assert big["attributes"]["computeInstanceSliceCount"] == 3
    assert big["attributes"]["memorySizeMB"] == 40192
    assert big["attributes"]["multiprocessorCount"] == 60
    # GPU 7: a 2g.20gb GPU instance split into two compute instances, then five 1g.10gb
    migs = gpu7["mig_devices"]
    assert all(m is not None for m in migs)
    assert [(m["gi"], m["ci"]) for m in migs] == [
        (3, 0),
        (3, 1),
        (9, 0),
        (10, 0),
        (11, 0),
        (12, 0),
        (13, 0),
    ]
    assert migs[0]["name"] == "NVIDIA H100 80GB HBM3 MIG 1c.2g.20gb"
    assert migs[1]["attributes"]["gpuInstanceSliceCount"] == 2
    assert migs[1]["attributes"]["computeInstanceSliceCount"] == 1
    assert migs[1]["memory"]["total"] == 19968 * MIB
    assert {m["memory"]["total"] for m in migs[2:]} == {9856 * MIB}
    assert [m["uuid"] for m in gpu6["mig_devices"] + migs if m] == host.mig_uuids()


def test_a100_all_1g5gb_in_a_vm(hosts):
    host = hosts["a100-mig-1g5gb"]
    (gpu,) = probe(host)["gpus"]
    assert gpu["name"] == "NVIDIA A100-SXM4-40GB"
    assert gpu["compute_capability"] == [8, 0]
    assert gpu["architecture"] == 7  # NVML_DEVICE_ARCH_AMPERE
    assert gpu["memory"]["total"] == 40960 * MIB
    assert gpu["numa_node"]["error"]["code"] == 3  # numa -1: NVML says not supported
    migs = gpu["mig_devices"]
    assert [m["gi"] for m in migs] == [7, 8, 9, 11, 12, 13, 14]
    for m in migs:
        assert m["name"] == "NVIDIA A100-SXM4-40GB MIG 1g.5gb"
        assert m["memory"]["total"] == 4864 * MIB
        assert m["attributes"]["memorySizeMB"] == 4864
        assert m["attributes"]["gpuInstanceSliceCount"] == 1
        assert m["attributes"]["multiprocessorCount"] == 14
        assert m["compute_capability"] == [8, 0]  # a MIG device reports its parent's
    assert [m["uuid"] for m in migs] == [
        d["uuid"] for d in raw_yaml("a100-mig-1g5gb")["gpus"][0]["mig_devices"]
    ]


def test_pynvml_own_loading_finds_the_topology_beside_the_library(hosts):
    host = hosts["single"]
    seen = probe(host, lib=None, env=_clean_env(**host.nvml_env()))
    (gpu,) = seen["gpus"]
    assert gpu["uuid"] == "GPU-c73ed862-58bf-4b3e-e1b3-c36f503e5d02" == host.gpu_uuids()[0]
    assert gpu["name"] == "NVIDIA A10"
    assert gpu["compute_capability"] == [8, 6]
    assert gpu["mig_mode"]["error"]["code"] == 3  # an A10 has no MIG
    assert gpu["max_mig_devices"] == 0 and gpu["mig_devices"] == []


def test_topology_env_override_and_malformed_topology(hosts, tmp_path):
    single, a100 = hosts["single"], hosts["a100-mig-1g5gb"]
    env = _clean_env(FAKE_NVML_TOPOLOGY=a100.topology_path)
    assert [g["uuid"] for g in probe(single, env=env)["gpus"]] == a100.gpu_uuids()
    bad = tmp_path / "bad.topology"
    bad.write_text("driver 550.90.12\ngpu minor=zero name=X\n")
    cmd = [sys.executable, PROBE, f"{single.driver_root}{LIB}/libnvidia-ml.so.1"]
    out = subprocess.run(
        cmd, capture_output=True, text=True, env=_clean_env(FAKE_NVML_TOPOLOGY=str(bad))
    )
    assert json.loads(out.stdout)["error"]["code"] == 999  # NVML_ERROR_UNKNOWN
    assert f"fake-nvml: {bad}: line 2: malformed record" in out.stderr


def test_compute_mode_persists_across_processes(tmp_path):
    host = build_host("single", str(tmp_path / "h"))
    assert probe(host)["gpus"][0]["compute_mode"] == 0
    # the first process sets EXCLUSIVE_PROCESS (3); a later one sees it
    assert probe(host, "--set-compute-mode", "0", "3")["gpus"][0]["compute_mode"] == 3
    assert probe(host)["gpus"][0]["compute_mode"] == 3
    with open(host.state_path, encoding="ascii") as fh:
        assert fh.read() == f"compute_mode {host.gpu_uuids()[0]} 3\n"
    assert probe(host, "--set-compute-mode", "0", "0")["gpus"][0]["compute_mode"] == 0
    # EXCLUSIVE_THREAD was removed from NVML: not supported; out of range: invalid argument
    assert probe(host, "--set-compute-mode", "0", "1")["error"]["code"] == 3
    assert probe(host, "--set-compute-mode", "0", "7")["error"]["code"] == 2
    assert probe(host)["gpus"][0]["compute_mode"] == 0


def _single_with(**changes) -> dict:
    topo = raw_yaml("single")
    gpu_changes = changes.pop("gpu", {})
    topo.update(changes)
    topo["gpus"][0].update(gpu_changes)
    return topo


def test_init_failure_injection(tmp_path):
    host = build_host(_single_with(init_error=9), str(tmp_path / "h"))
    assert probe(host) == {"error": {"code": 9, "message": "Driver Not Loaded"}}


def test_gpu_failure_injection(tmp_path):
    topo = raw_yaml("h100x8-mig")
    topo["gpus"][1]["fail"] = {"code": 15}
    topo["gpus"][6]["fail"] = {"code": 15, "only": ["nvmlDeviceGetMemoryInfo"]}
    topo["gpus"][2]["fail"] = {"code": 15, "on_handle": True}
    host = build_host(topo, str(tmp_path / "h"))
    gpus = probe(host)["gpus"]
    assert gpus[1] == {"error": {"code": 15, "message": "GPU is lost"}}
    assert gpus[2] == {"error": {"code": 15, "message": "GPU is lost"}}
    assert gpus[6] == {"error": {"code": 15, "message": "GPU is lost"}}
    assert gpus[0]["uuid"] == host.gpu_uuids()[0]
    assert gpus[7]["mig_devices"][0]["uuid"] == host.gpu(7)["mig_devices"][0]["uuid"]


def test_uninitialized_and_invalid_handles(hosts):
    """Calls before init, unknown handles and MIG-only calls answer as real NVML."""
    lib = f"{hosts['h100x8-mig'].driver_root}{LIB}/libnvidia-ml.so.1"
    script = textwrap.dedent(
        f"""
        import ctypes, json
        nvml = ctypes.CDLL({lib!r})
        c = ctypes.c_uint()
        h = ctypes.c_void_p()
        mig = ctypes.c_void_p()
        out = {{"count_before_init": nvml.nvmlDeviceGetCount_v2(ctypes.byref(c))}}
        out["shutdown_before_init"] = nvml.nvmlShutdown()
        out["init"] = nvml.nvmlInit_v2()
        out["bogus_handle"] = nvml.nvmlDeviceGetIndex(ctypes.c_void_p(16), ctypes.byref(c))
        out["index_out_of_range"] = nvml.nvmlDeviceGetHandleByIndex_v2(8, ctypes.byref(h))
        nvml.nvmlDeviceGetHandleByIndex_v2(6, ctypes.byref(h))
        out["gi_of_whole_gpu"] = nvml.nvmlDeviceGetGpuInstanceId(h, ctypes.byref(c))
        out["mig_slot_7"] = nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 7, ctypes.byref(mig))
        out["mig_slot_0"] = nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 0, ctypes.byref(mig))
        out["distinct_mig_handle"] = mig.value != h.value
        out["set_mode_on_mig"] = nvml.nvmlDeviceSetComputeMode(mig, 3)
        buf = ctypes.create_string_buffer(8)
        out["short_buffer"] = nvml.nvmlDeviceGetUUID(h, buf, 8)
        out["by_uuid"] = nvml.nvmlDeviceGetHandleByUUID(
            b"MIG-64c009e4-bf61-2bc3-2b79-b1f33acc77f0", ctypes.byref(h))
        out["by_uuid_is_mig_handle"] = h.value == mig.value
        out["shutdown"] = nvml.nvmlShutdown()
        out["after_shutdown"] = nvml.nvmlDeviceGetCount_v2(ctypes.byref(c))
        print(json.dumps(out))
        """
    )
    res = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, env=_clean_env()
    )
    assert json.loads(res.stdout) == {
        "count_before_init": 1,  # NVML_ERROR_UNINITIALIZED
        "shutdown_before_init": 1,
        "init": 0,
        "bogus_handle": 2,  # NVML_ERROR_INVALID_ARGUMENT
        "index_out_of_range": 2,
        "gi_of_whole_gpu": 3,  # NVML_ERROR_NOT_SUPPORTED
        "mig_slot_7": 2,
        "mig_slot_0": 0,
        "distinct_mig_handle": True,
        "set_mode_on_mig": 3,
        "short_buffer": 7,  # NVML_ERROR_INSUFFICIENT_SIZE
        "by_uuid": 0,
        "by_uuid_is_mig_handle": True,
        "shutdown": 0,
        "after_shutdown": 1,
    }


def test_generated_topology_64_gpus_with_mig(tmp_path):
    host = build_host(generate_topology(64, mig=True), str(tmp_path / "h"))
    seen = probe(host)
    assert seen["count"] == 64
    assert len(set(host.gpu_uuids())) == 64 and len(set(host.mig_uuids())) == 64 * 4
    assert [g["uuid"] for g in seen["gpus"]] == host.gpu_uuids()
    assert all(sum(m is not None for m in g["mig_devices"]) == 4 for g in seen["gpus"])
    assert len({g["pci_bus_id"] for g in seen["gpus"]}) == 64
    assert os.path.exists(f"{host.dev_root}/dev/nvidia63")
    plain = generate_topology(8, mig=False)
    assert all("mig_devices" not in g for g in plain["gpus"])
    assert plain["gpus"][0]["uuid"] == generate_topology(8, mig=False)["gpus"][0]["uuid"]


# ---- ld.so.cache and the driver files ---------------------------------------------------


def _ldconfig_p(host: SimHost) -> dict[tuple[str, str], str]:
    out = subprocess.run(
        ["ldconfig", "-C", f"{host.driver_root}/etc/ld.so.cache", "-p"],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/sbin:/sbin:/usr/bin:/bin"},
    ).stdout
    entries = {}
    for line in out.splitlines()[1:]:
        if " => " not in line:  # the trailing "Cache generated by: ..." line
            continue
        name, rest = line.strip().split(" ", 1)
        flags, path = rest.split(" => ")
        entries[(name, flags.strip("()"))] = path
    return entries


def test_ld_so_cache_lists_every_library(hosts):
    host = hosts["h100x8-mig"]
    cache = _ldconfig_p(host)
    assert cache[("libcuda.so.1", "libc6,x86-64")] == f"{LIB}/libcuda.so.1"
    assert cache[("libnvidia-ml.so.1", "libc6,x86-64")] == f"{LIB}/libnvidia-ml.so.1"
    assert cache[("libGLX_nvidia.so.0", "libc6,x86-64")] == f"{LIB}/libGLX_nvidia.so.0"
    assert cache[("libGLESv2_nvidia.so.2", "libc6,x86-64")] == f"{LIB}/libGLESv2_nvidia.so.2"
    glcore = "libnvidia-glcore.so.550.90.12"  # versioned SONAME: cached under its own name
    assert cache[(glcore, "libc6,x86-64")] == f"{LIB}/{glcore}"
    assert cache[("libcuda.so.1", "libc6")] == "/usr/lib/i386-linux-gnu/libcuda.so.1"
    for lib in host.libraries:
        flags = "libc6,x86-64" if lib.bits == 64 else "libc6"
        assert cache[(lib.soname, flags)] == os.path.join(os.path.dirname(lib.path), lib.soname)
        assert os.path.isfile(host.host_path(lib.path))
    names = {lib.name for lib in host.libraries if lib.bits == 64}
    assert {"libcuda", "libnvidia-ml", "libnvcuvid", "libnvidia-ngx", "libEGL_nvidia"} <= names


def test_soname_links_and_elf_sonames(hosts):
    host = hosts["h100x8-mig"]
    lib_dir = host.driver_root + LIB
    assert os.readlink(f"{lib_dir}/libcuda.so.1") == "libcuda.so.550.90.12"
    assert os.readlink(f"{lib_dir}/libcuda.so") == "libcuda.so.1"
    assert os.readlink(f"{lib_dir}/libnvidia-ml.so.1") == "libnvidia-ml.so.550.90.12"
    assert not os.path.lexists(f"{lib_dir}/libnvidia-glcore.so.1")
    dyn = subprocess.run(
        ["readelf", "-d", f"{lib_dir}/libEGL_nvidia.so.550.90.12"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "Library soname: [libEGL_nvidia.so.0]" in dyn
    assert host.nvml_path == f"{lib_dir}/libnvidia-ml.so.550.90.12"
    # the stubs are loadable shared objects
    ctypes.CDLL(f"{lib_dir}/libcuda.so.550.90.12")


def test_binaries_firmware_configs_sockets_and_extra_files(tmp_path):
    mps = "#!/bin/sh\necho fake mps control\n"
    host = build_host(
        "single",
        str(tmp_path / "h"),
        extra_files={"usr/bin/nvidia-cuda-mps-control": mps, "etc/nvidia/x.conf": b"k=v\n"},
    )
    root = host.driver_root
    for name in ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-server"):
        st = os.stat(f"{root}/usr/bin/{name}")
        assert stat.S_IMODE(st.st_mode) == 0o755
    out = subprocess.run(
        [f"{root}/usr/bin/nvidia-cuda-mps-control"], capture_output=True, text=True
    )
    assert out.stdout == "fake mps control\n"
    assert stat.S_IMODE(os.stat(f"{root}/etc/nvidia/x.conf").st_mode) == 0o644
    for blob in ("gsp_ga10x.bin", "gsp_tu10x.bin"):
        assert os.path.getsize(f"{root}/lib/firmware/nvidia/550.90.12/{blob}") > 0
    with open(f"{root}/usr/share/vulkan/icd.d/nvidia_icd.json") as fh:
        assert json.load(fh)["ICD"]["library_path"] == "libGLX_nvidia.so.0"
    with open(f"{root}/usr/share/glvnd/egl_vendor.d/10_nvidia.json") as fh:
        assert json.load(fh)["ICD"]["library_path"] == "libEGL_nvidia.so.0"
    assert os.path.isfile(f"{root}/etc/vulkan/implicit_layer.d/nvidia_layers.json")
    for sock in ("run/nvidia-persistenced/socket", "run/nvidia-fabricmanager/socket"):
        assert stat.S_ISSOCK(os.lstat(f"{root}/{sock}").st_mode)
    with pytest.raises(NvshimError, match=r"\.\./x"):
        build_host("single", str(tmp_path / "h2"), extra_files={"../x": "no"})


def test_build_is_cached(tmp_path):
    first = build_host("single", str(tmp_path / "a"))
    cached = simcompile.fake_nvml()
    before = os.stat(cached).st_mtime_ns
    second = build_host("single", str(tmp_path / "b"))
    assert os.stat(cached).st_mtime_ns == before
    with (
        open(first.nvml_path, "rb") as a,
        open(second.nvml_path, "rb") as b,
        open(cached, "rb") as c,
    ):
        assert a.read() == b.read() == c.read()


def test_build_without_gcc_from_a_prebuilt_cache(tmp_path):
    """A machine without gcc (a GPU host the real-GPU kit is carried to) builds a host from
    a cache ``prebuild`` filled; an entry missing there, or no cache, is a one-line error."""
    cache = tmp_path / "cache"
    shutil.copytree(simcompile.cache_root(), cache)  # entries made here already: no compiles
    env = {**os.environ, "NVSHIM_SIM_CACHE": str(cache)}
    code = "from tests.sim.simhost import prebuild; print(prebuild('single'))"
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, check=True,
                         capture_output=True, text=True)  # fmt: skip
    assert out.stdout == f"{cache}\n" and (cache / simcompile.COMPILER_FILE).is_file()
    build = [sys.executable, "-m", "tests.sim.simhost", "build", "single"]
    env["PATH"] = str(tmp_path / "no-tools")  # no gcc; ldconfig by its absolute path
    out = subprocess.run([*build, str(tmp_path / "h")], env=env, cwd=REPO,
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 0, out.stderr
    nvml = tmp_path / f"h{LIB}/libnvidia-ml.so.1"
    assert nvml.read_bytes() == open(simcompile.fake_nvml(), "rb").read()
    seen = subprocess.run([sys.executable, PROBE, str(nvml)], env=_clean_env(), check=True,
                          capture_output=True, text=True)  # fmt: skip
    assert json.loads(seen.stdout)["count"] == 1  # the topology beside the library
    missing = cache / os.path.relpath(simcompile.fake_nvml(), simcompile.cache_root())
    missing.unlink()
    out = subprocess.run([*build, str(tmp_path / "x")], env=env, cwd=REPO,
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 1 and out.stderr.count("\n") == 1, out.stderr
    assert f"gcc not found on PATH and {missing} not prebuilt" in out.stderr
    env["NVSHIM_SIM_CACHE"] = str(tmp_path / "empty")
    out = subprocess.run([*build, str(tmp_path / "y")], env=env, cwd=REPO,
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 1 and "gcc not found on PATH" in out.stderr, out.stderr


# ---- device nodes, /proc and /sys ----------------------------------------------------------


def _chr(path: str) -> tuple[int, int, int]:
    st = os.lstat(path)
    assert stat.S_ISCHR(st.st_mode), path
    return os.major(st.st_rdev), os.minor(st.st_rdev), stat.S_IMODE(st.st_mode)


def test_device_nodes_are_real_char_devices(hosts):
    host = hosts["h100x8-mig"]
    dev = f"{host.dev_root}/dev"
    with open(f"{host.dev_root}/proc/devices") as fh:
        majors = {
            line.split()[1]: int(line.split()[0]) for line in fh if line[:3].strip().isdigit()
        }
    assert majors["nvidia-frontend"] == 195
    uvm, caps = majors["nvidia-uvm"], majors["nvidia-caps"]
    assert _chr(f"{dev}/nvidia0") == (195, 0, 0o666)
    assert _chr(f"{dev}/nvidia7") == (195, 7, 0o666)
    assert _chr(f"{dev}/nvidiactl") == (195, 255, 0o666)
    assert _chr(f"{dev}/nvidia-modeset") == (195, 254, 0o666)
    assert _chr(f"{dev}/nvidia-uvm") == (uvm, 0, 0o666)
    assert _chr(f"{dev}/nvidia-uvm-tools") == (uvm, 1, 0o666)
    assert _chr(f"{dev}/nvidia-caps/nvidia-cap1") == (caps, 1, 0o400)
    assert _chr(f"{dev}/nvidia-caps/nvidia-cap2") == (caps, 2, 0o444)
    # GPU index 6 is minor 7: gpu7/gi2/access = 3 + 7*135 + 2*9 = 966, its ci0 967
    assert _chr(f"{dev}/nvidia-caps/nvidia-cap966") == (caps, 966, 0o444)
    assert _chr(f"{dev}/nvidia-caps/nvidia-cap967") == (caps, 967, 0o444)
    # GPU index 7 is minor 6: the shared gi3 is 3 + 6*135 + 3*9 = 840, its ci0 841, ci1 842
    assert [_chr(f"{dev}/nvidia-caps/nvidia-cap{m}")[1] for m in (840, 841, 842)] == [840, 841, 842]
    caps_nodes = sorted(os.listdir(f"{dev}/nvidia-caps"))
    assert len(caps_nodes) == 2 + 3 * 2 + (1 + 2) + 5 * 2
    assert {n.path for n in host.expected_nodes()} == {
        "/dev/" + p for p in os.listdir(dev) if p != "nvidia-caps"
    } | {f"/dev/nvidia-caps/{n}" for n in caps_nodes}


def test_mig_minors_and_capability_files(hosts):
    host = hosts["a100-mig-1g5gb"]
    with open(f"{host.dev_root}/proc/driver/nvidia-caps/mig-minors") as fh:
        lines = fh.read().splitlines()
    assert lines[:4] == ["config 1", "monitor 2", "gpu0/gi0/access 3", "gpu0/gi0/ci0/access 4"]
    assert "gpu1/gi2/access 156" in lines and "gpu1/gi2/ci0/access 157" in lines
    assert "gpu3/gi3/ci3/access 439" in lines
    assert lines[-1] == "gpu31/gi14/ci7/access 4322"
    assert len(lines) == 2 + 32 * 15 * 9
    # gpu0/gi7: 3 + 7*9 = 66, ci0 67; the capability file and the node agree
    with open(f"{host.dev_root}/proc/driver/nvidia/capabilities/gpu0/mig/gi7/access") as fh:
        assert fh.read().startswith("DeviceFileMinor: 66\n")
    with open(f"{host.dev_root}/proc/driver/nvidia/capabilities/gpu0/mig/gi7/ci0/access") as fh:
        assert fh.read().startswith("DeviceFileMinor: 67\n")
    assert _chr(f"{host.dev_root}/dev/nvidia-caps/nvidia-cap67")[1] == 67
    assert host.mig_minor(0, 7, 0) == 67


def test_proc_params_version_and_sys_numa(hosts, tmp_path):
    a100, single = hosts["a100-mig-1g5gb"], hosts["single"]
    with open(f"{single.dev_root}/proc/driver/nvidia/params") as fh:
        assert "ModifyDeviceFiles: 1\n" in fh.read()
    with open(f"{single.dev_root}/proc/driver/nvidia/version") as fh:
        assert " 550.90.12 " in fh.readline()
    with open(f"{a100.dev_root}/sys/bus/pci/devices/0000:00:05.0/numa_node") as fh:
        assert fh.read() == "-1\n"
    with open(f"{single.dev_root}/sys/bus/pci/devices/0000:00:1e.0/numa_node") as fh:
        assert fh.read() == "0\n"
    with open(f"{single.dev_root}/proc/driver/nvidia/gpus/0000:00:1e.0/information") as fh:
        assert "GPU UUID: \t GPU-c73ed862-58bf-4b3e-e1b3-c36f503e5d02\n" in fh.read()
    topo = _single_with(gpu={"numa_node": None})
    del topo["gpus"][0]["numa_node"]
    host = build_host(topo, str(tmp_path / "h"))
    assert not os.path.exists(f"{host.dev_root}/sys/bus/pci/devices/0000:00:1e.0/numa_node")


def test_separate_dev_root(tmp_path):
    host = build_host("single", str(tmp_path / "driver"), dev_root=str(tmp_path / "devroot"))
    assert host.driver_root == str(tmp_path / "driver")
    assert _chr(str(tmp_path / "devroot/dev/nvidia0"))[:2] == (195, 0)
    assert os.path.isfile(tmp_path / "devroot/proc/devices")
    assert not os.path.exists(tmp_path / "driver/dev")
    assert not os.path.exists(tmp_path / "driver/proc")
    assert {n.host_path for n in host.expected_nodes()} >= {str(tmp_path / "devroot/dev/nvidiactl")}


# ---- topology errors and the CLI ----------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"gpu": {"colour": "red"}}, r"gpus\[0\]\.colour: unknown key"),
        ({"gpu": {"uuid": "GPU-1234"}}, r"gpus\[0\]\.uuid: malformed value 'GPU-1234'"),
        ({"gpu": {"architecture": "fermi"}}, r"gpus\[0\]\.architecture: unknown value 'fermi'"),
        ({"gpu": {"minor": 255}}, r"gpus\[0\]\.minor: 255 out of range"),
        ({"gpu": {"mig_devices": [{"gi": 1}]}}, r"mig_devices: given but mig_mode"),
        ({"driver_version": 550}, r"driver_version: has the wrong type"),
    ],
)
def test_topology_errors_name_the_key(tmp_path, change, message):
    with pytest.raises(NvshimError, match=message):
        build_host(_single_with(**change), str(tmp_path / "h"))
    assert not os.path.exists(tmp_path / "h")


def test_topology_duplicate_uuid_and_unknown_name(tmp_path):
    topo = raw_yaml("h100x8-mig")
    topo["gpus"][3]["uuid"] = topo["gpus"][0]["uuid"]
    with pytest.raises(NvshimError, match=r"gpus\[3\]\.uuid: .* already used by gpus\[0\]"):
        build_host(topo, str(tmp_path / "h"))
    with pytest.raises(NvshimError, match=r"no such topology \(shipped: a100-mig-1g5gb, h100x8"):
        build_host("h200x8", str(tmp_path / "h"))


def test_cli_build(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "tests.sim.simhost",
        "build",
        "a100-mig-1g5gb",
        str(tmp_path / "h"),
    ]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=root, check=True)
    assert out.stdout == f"{tmp_path / 'h'}\n"
    assert os.path.islink(tmp_path / f"h{LIB}/libnvidia-ml.so.1")
    bad = subprocess.run(
        [*cmd[:4], "nope", str(tmp_path / "x")], capture_output=True, text=True, cwd=root
    )
    assert bad.returncode == 1
    assert bad.stderr.count("\n") == 1 and "nope" in bad.stderr and "Traceback" not in bad.stderr
