"""`nvshim info --json` gives every GPU and MIG device its sharing mode and replicas, as the
device plugin's config covers them on the mixed-MIG host (GPUs 0-5 whole, 6 and 7 in MIG
mode)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_nvshim
from tests.sharing_util import mixed_sharing

MPS = mixed_sharing("mps", {"nvidia.com/gpu": 4})
TIME_SLICING = mixed_sharing("timeSlicing", {"nvidia.com/gpu": 4, "nvidia.com/mig-1g.10gb": 3})


@pytest.mark.parametrize(
    ("text", "mode", "mig_replicas"),
    [(MPS, "mps", None), (TIME_SLICING, "timeSlicing", 3)],
    ids=["mps", "time-slicing"],
)
def test_info_json_carries_each_devices_sharing(sim_hosts, tmp_path, text, mode, mig_replicas):
    sim = sim_hosts("h100x8-mig")
    sharing = tmp_path / "sharing.yaml"
    sharing.write_text(text)
    config = tmp_path / "config.toml"
    config.write_text(
        f'[host]\ndriver-root = "{sim.driver_root}"\ndev-root = "{sim.dev_root}"\n'
        f'[sharing]\nconfig = "{sharing}"\n'
    )
    proc = run_nvshim("info", "--json", env={"NVSHIM_CONFIG": str(config)})
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in proc.stderr
    data = json.loads(proc.stdout)
    by_uuid = {g["uuid"]: g["sharing"] for g in data["gpus"]}
    by_uuid.update({m["uuid"]: m["sharing"] for g in data["gpus"] for m in g["mig_devices"]})

    want = {}
    for gpu in sim.topology["gpus"]:
        in_mig_mode = gpu["mig_mode"] == "enabled"
        want[gpu["uuid"]] = {"mode": "none"} if in_mig_mode else {"mode": mode, "replicas": 4}
        for mig in gpu["mig_devices"]:
            shared = mig_replicas and mig["profile"] == "1g.10gb"
            want[mig["uuid"]] = (
                {"mode": mode, "replicas": mig_replicas} if shared else {"mode": "none"}
            )
    assert by_uuid == want
    # the host has both kinds of device, so each branch above was taken
    assert {"mode": "none"} in want.values() and {"mode": mode, "replicas": 4} in want.values()
    if mig_replicas:
        assert sum(v == {"mode": mode, "replicas": 3} for v in want.values()) == 6
