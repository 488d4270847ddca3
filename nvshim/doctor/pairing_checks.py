"""Checks of GPUDirect RDMA readiness (``nvshim.pairing.checks``): ``nvidia_peermem``, and
a NIC at the accepted affinity for every GPU."""

from __future__ import annotations

from nvshim.doctor import Result, Skip, check
from nvshim.doctor.context import Context


def _result(name: str, outcome) -> Result:
    status, reason, fix = outcome
    if status == "skip":
        raise Skip(reason)
    return Result(name, status, reason, fix)


@check("gpudirect-rdma", "nvidia_peermem is loaded where the host has RDMA devices")
def gpudirect_rdma(ctx: Context):
    from nvshim.pairing.checks import check_peermem

    return _result("gpudirect-rdma", check_peermem(ctx.dev_root))


@check("gpu-nic-affinity", "every GPU has an allowed NIC at pairing.worst-affinity or better")
def gpu_nic_affinity(ctx: Context):
    from nvshim.pairing.checks import check_gpu_nics

    return _result("gpu-nic-affinity", check_gpu_nics(ctx.host(), ctx.config))
