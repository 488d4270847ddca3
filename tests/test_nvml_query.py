"""nvshim's own NVML binding for discovery (nvshim.host.nvml.query) against the real
pynvml on every shipped simulated host: the same snapshot, call for call, and the same
failures."""

from __future__ import annotations

import pytest

from nvshim.errors import NvshimError
from nvshim.host import nvml
from tests.sim.simhost import build_host, shipped_hosts
from tests.test_discovery import load_topology


def pynvml_snapshot(library: str) -> dict:
    """What the real pynvml reports for the devices discovery reads."""
    pynvml = nvml.load_library(library)
    pynvml.nvmlInit()
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total
            try:
                mig_on = pynvml.nvmlDeviceGetMigMode(handle)[0] == 1
            except pynvml.NVMLError_NotSupported:
                mig_on = False
            try:
                arch = nvml.ARCHITECTURES[pynvml.nvmlDeviceGetArchitecture(handle)]
            except pynvml.NVMLError_NotSupported:
                arch = "unknown"
            migs = []
            for slot in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle) if mig_on else 0):
                try:
                    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
                except pynvml.NVMLError_NotFound:
                    continue
                attrs = pynvml.nvmlDeviceGetAttributes(mig)
                migs.append(
                    {
                        "index": slot,
                        "gi": pynvml.nvmlDeviceGetGpuInstanceId(mig),
                        "ci": pynvml.nvmlDeviceGetComputeInstanceId(mig),
                        "uuid": pynvml.nvmlDeviceGetUUID(mig),
                        "profile": nvml.mig_profile(
                            attrs.gpuInstanceSliceCount,
                            attrs.computeInstanceSliceCount,
                            attrs.memorySizeMB,
                            memory,
                        ),
                        "memory_total": pynvml.nvmlDeviceGetMemoryInfo(mig).total,
                    }
                )
            gpus.append(
                {
                    "index": index,
                    "minor": pynvml.nvmlDeviceGetMinorNumber(handle),
                    "uuid": pynvml.nvmlDeviceGetUUID(handle),
                    "name": pynvml.nvmlDeviceGetName(handle),
                    "pci_bus_id": pynvml.nvmlDeviceGetPciInfo(handle).busId,
                    "memory_total": memory,
                    "compute_capability": f"{major}.{minor}",
                    "architecture": arch,
                    "brand": nvml.BRANDS[pynvml.nvmlDeviceGetBrand(handle)],
                    "mig_enabled": mig_on,
                    "migs": migs,
                }
            )
        return {
            "driver_version": pynvml.nvmlSystemGetDriverVersion(),
            "cuda_version": nvml.cuda_version_text(pynvml.nvmlSystemGetCudaDriverVersion()),
            "gpus": gpus,
        }
    finally:
        pynvml.nvmlShutdown()


def ours(library: str) -> dict:
    snap = nvml.query(library)
    assert snap.warnings == []
    return {
        "driver_version": snap.driver_version,
        "cuda_version": snap.cuda_version,
        "gpus": [_gpu(g) for g in snap.gpus],
    }


def _gpu(gpu: nvml.NvmlGpu) -> dict:
    fields = (
        "index minor uuid name pci_bus_id memory_total compute_capability architecture"
        " brand mig_enabled"
    ).split()
    row = {name: getattr(gpu, name) for name in fields}
    row["migs"] = [
        {name: getattr(m, name) for name in "index gi ci uuid profile memory_total".split()}
        for m in gpu.migs
    ]
    return row


@pytest.mark.parametrize("name", shipped_hosts())
def test_query_reports_what_pynvml_reports(sim_hosts, name, monkeypatch):
    sim = sim_hosts(name)
    want = pynvml_snapshot(sim.nvml_path)
    assert want["gpus"]
    assert ours(sim.nvml_path) == want
    import ctypes  # the binding's types on ctypes itself (its fallback): the same answers

    monkeypatch.setattr(nvml, "c_types", lambda: ctypes)
    assert ours(sim.nvml_path) == want


def test_lost_gpu_and_init_failure_carry_nvml_text(tmp_path):
    topo = load_topology("h100x8-mig")
    topo["gpus"][2]["fail"] = {"code": 15}  # NVML_ERROR_GPU_IS_LOST
    sim = build_host(topo, str(tmp_path / "lost"))
    snap = nvml.query(sim.nvml_path)
    assert [g.index for g in snap.gpus] == [0, 1, 3, 4, 5, 6, 7]
    pynvml = nvml.load_library(sim.nvml_path)
    assert snap.warnings == [
        f"GPU 2: NVML error ({pynvml.NVMLError(15)}); GPU skipped"  # pynvml's text for 15
    ]
    topo = load_topology("single")
    topo["init_error"] = 9
    sim = build_host(topo, str(tmp_path / "init"))
    with pytest.raises(NvshimError, match=r"NVML initialisation failed \(.*\): Driver Not Loaded"):
        nvml.query(sim.nvml_path)
    with pytest.raises(NvshimError, match="cannot load NVML library"):
        nvml.query(str(tmp_path / "missing.so"))
