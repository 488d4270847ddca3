"""Checks of GPU sharing: the sharing config parses and resolves on this host, and every
MPS-shared device has a healthy control daemon."""

from __future__ import annotations

import os

from nvshim.doctor import Skip, check, fail, ok
from nvshim.doctor.context import Context
from nvshim.errors import NvshimError


@check("sharing-config", "the sharing config is valid for this host")
def sharing_config(ctx: Context):
    from nvshim.mps.sharing import sharing_for

    path = ctx.config.sharing.config
    if not os.path.exists(path):
        raise Skip(f"no sharing config at {path}: GPUs are not shared")
    try:
        shared = sharing_for(ctx.config, ctx.host())
    except NvshimError as err:
        return fail(
            "sharing-config",
            str(err),
            f"fix {path}: until then every GPU container on this node is refused",
        )
    modes = sorted({s.mode for s in shared.values()})
    return ok("sharing-config", f"{len(shared)} shared device(s) ({', '.join(modes) or 'none'})")


@check("mps-daemons", "every MPS-shared device has a healthy control daemon")
def mps_daemons(ctx: Context):
    from nvshim.mps.daemon import daemon_statuses
    from nvshim.mps.service import mps_devices

    try:
        shared = mps_devices(ctx.config, ctx.host())
    except NvshimError:
        raise Skip("needs a valid sharing config (see check sharing-config)") from None
    if not shared:
        raise Skip("no MPS-shared device")
    root = ctx.config.sharing.mps_root
    bad = []
    statuses = daemon_statuses(ctx.host(), list(shared.items()), root)
    for status, share in zip(statuses, shared.values(), strict=True):
        if not status.healthy:
            why = status.problem or ("not running" if not status.running else "not answering")
            bad.append(f"device {share.name}: {why}")
    if bad:
        return fail(
            "mps-daemons",
            "; ".join(bad[:3]),
            "nvshim mps start (or systemctl restart nvshim-mps); containers on these devices"
            " are refused meanwhile",
        )
    return ok("mps-daemons", f"{len(shared)} daemon(s) running and answering")
