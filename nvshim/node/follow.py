"""The installer follows the host it installed on: a MIG re-layout (NVIDIA's mig-manager),
a driver upgrade (a driver container) or GPUs appearing change the driver's ld cache, its
kernel module or the device and MIG capability nodes, which is the runtime inventory
cache's key (``nvshim.host.inventory.cache_key``). When it changes, the host is
discovered again and what the install made from it is made again with the install's own
steps: the CDI specs (``steps.write_cdi``) and the MPS daemons (stopped for the devices
that went, started for the new ones). nvshim-runtime needs nothing: its inventory cache
has the same key.
"""

from __future__ import annotations

from collections.abc import Callable

from nvshim.errors import NvshimError
from nvshim.node import steps
from nvshim.node.env import NodeSettings

INTERVAL = 1.0  # seconds between looks at the host (a few stat calls)
RETRY = 30.0  # seconds before a failed discovery of an unchanged host is tried again


def host_key(s: NodeSettings) -> dict:
    """The host's key as the installer sees it."""
    from nvshim.host.inventory import cache_key

    return cache_key(s.driver_root_ctr, s.dev_root_ctr)


def _changes(old: dict, new: dict) -> str:
    from nvshim.cdi.refresh import FIELD_NAMES

    return ", ".join(FIELD_NAMES.get(k, k) for k in new if old.get(k) != new[k]) or "nothing"


class HostWatch:
    """Re-does the host-derived install steps when the host's key changes.

    ``restart_mps(host)`` is called with the new host when MPS is supervised. The key is
    taken before discovery, so a change during discovery is seen on the next look; a
    discovery that fails keeps the old spec and is tried again when the host changes
    again, or after ``RETRY`` seconds."""

    def __init__(
        self, s: NodeSettings, say: Callable[[str], None], key: dict | None = None
    ) -> None:
        self.s = s
        self.say = say
        self.key = key if key is not None else host_key(s)
        self.failed: tuple[dict, float] | None = None  # (key, when) of a failed attempt

    def look(self, restart_mps: Callable[[object], None] | None = None) -> object | None:
        """Follow a change if there was one; the new host, or None."""
        import time

        key = host_key(self.s)
        if key == self.key:
            return None
        if self.failed and self.failed[0] == key and time.monotonic() - self.failed[1] < RETRY:
            return None
        self.say(f"host changed ({_changes(self.key, key)}): discovering it again")
        try:
            host = steps.discover(self.s)
            for warning in host.warnings:
                self.say(f"warning: {warning}")
            if self.s.cdi_enabled:
                steps.write_cdi(self.s, self.say, host)
            if restart_mps is not None:
                restart_mps(host)
        except (NvshimError, OSError) as err:
            self.say(f"error: following the host change: {err}; the previous spec stays, "
                     "trying again when the host changes again")  # fmt: skip
            self.failed = (key, time.monotonic())
            return None
        self.key, self.failed = key, None
        gpus = len(host.gpus)
        migs = len(host.mig_devices())
        self.say(f"now driver {host.driver_version}, {gpus} GPU(s), {migs} MIG device(s)")
        return host
