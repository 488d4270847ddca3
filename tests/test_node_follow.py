"""`nvshim node run` follows the host it installed on (issue 27): a MIG re-layout and a
driver upgrade of the simulated host under the running installer show in its CDI spec
within seconds, with a log line naming what changed; a host that cannot be discovered
for a while keeps the previous spec until it can. (On the real cluster with NVIDIA's
device plugin: tests/test_k8s_nvidia_plugin.py.)"""

from __future__ import annotations

import contextlib
import os
import signal
import time

import yaml

from tests.node_util import Scratch, start_node, wait_for
from tests.sim.simhost import rebuild_host
from tests.sim.topology import generate_topology


def spec_devices(scratch: Scratch) -> tuple[set[str], str]:
    """The UUID-named devices of the CDI spec and the libcuda it names ("" when none)."""
    try:
        text = scratch.path("/var/run/cdi/nvshim.yaml").read_text()
    except FileNotFoundError:
        return set(), ""
    spec = yaml.safe_load(text)
    names = {d["name"] for d in spec["devices"] if d["name"].startswith(("GPU-", "MIG-"))}
    libcuda = next((p for p in text.split() if "libcuda.so." in p and p[-1].isdigit()), "")
    return names, os.path.basename(libcuda)


def uuids(topology: dict) -> set[str]:
    whole = {g["uuid"] for g in topology["gpus"] if g["mig_mode"] != "enabled"}
    return whole | {m["uuid"] for g in topology["gpus"] for m in g.get("mig_devices", [])}


@contextlib.contextmanager
def installed(tmp_path, topology: dict):
    """``nvshim node run`` (CDI on) on a scratch host of ``topology``, ready; SIGTERM at
    the end. Yields (scratch, process, log)."""
    scratch = Scratch(tmp_path, topology)
    log = tmp_path / "log"
    proc = start_node(scratch.env(CDI_ENABLED="true"), log)
    try:
        wait_for(scratch.ready.exists, proc=proc, log=log)
        yield scratch, proc, log
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def test_mig_relayout_and_driver_upgrade_are_followed(tmp_path):
    whole = generate_topology(2, mig=False)
    with installed(tmp_path, whole) as (scratch, proc, log):
        assert spec_devices(scratch) == (uuids(whole), "libcuda.so.550.90.12")
        steps = [
            ("MIG", generate_topology(2, mig=True)),
            ("driver", generate_topology(2, mig=True, driver_version="550.127.05")),
        ]
        for what, topology in steps:
            started = time.monotonic()
            scratch.sim = rebuild_host(scratch.sim, topology)
            want = (uuids(topology), f"libcuda.so.{topology['driver_version']}")
            wait_for(lambda w=want: spec_devices(scratch) == w, proc=proc, log=log, timeout=15)
            print(f"{what} change followed in {time.monotonic() - started:.2f} s")
        text = log.read_text()
        assert "host changed (" in text
        assert "now driver 550.127.05, 2 GPU(s), 8 MIG device(s)" in text
    assert not scratch.path("/var/run/cdi/nvshim.yaml").exists()


def test_a_host_that_cannot_be_discovered_keeps_the_spec_until_it_can(tmp_path):
    with installed(tmp_path, generate_topology(1, mig=False)) as (scratch, proc, log):
        before = scratch.path("/var/run/cdi/nvshim.yaml").read_bytes()
        nvml = scratch.sim.nvml_path
        os.rename(nvml, nvml + ".away")  # the driver container is between versions
        os.utime(scratch.sim.dev_root + "/dev")  # a device node change: the key moves
        wait_for(
            lambda: "the previous spec stays" in log.read_text(), proc=proc, log=log, timeout=15
        )
        assert scratch.path("/var/run/cdi/nvshim.yaml").read_bytes() == before
        newer = generate_topology(1, mig=True)
        scratch.sim = rebuild_host(scratch.sim, newer)
        want = (uuids(newer), "libcuda.so.550.90.12")
        wait_for(lambda: spec_devices(scratch) == want, proc=proc, log=log, timeout=15)
