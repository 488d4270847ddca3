"""`nvshim info --json` gives every GPU and MIG device its sharing mode and replicas."""

from __future__ import annotations

import json

from tests.conftest import run_nvshim


def test_info_json_carries_each_devices_sharing(sim_hosts, tmp_path):
    sim = sim_hosts("h100x8-mig")
    gpus, migs = sim.gpu_uuids(), sim.mig_uuids()
    sharing = tmp_path / "sharing.yaml"
    sharing.write_text(
        "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n"
        f'      replicas: 4\n      devices: [0, "{migs[0]}"]\n'
    )
    config = tmp_path / "config.toml"
    config.write_text(
        f'[host]\ndriver-root = "{sim.driver_root}"\ndev-root = "{sim.dev_root}"\n'
        f'[sharing]\nconfig = "{sharing}"\n'
    )
    proc = run_nvshim("info", "--json", env={"NVSHIM_CONFIG": str(config)})
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    by_uuid = {g["uuid"]: g["sharing"] for g in data["gpus"]}
    by_uuid.update({m["uuid"]: m["sharing"] for g in data["gpus"] for m in g["mig_devices"]})
    assert by_uuid.pop(gpus[0]) == {"mode": "mps", "replicas": 4}
    assert by_uuid.pop(migs[0]) == {"mode": "mps", "replicas": 4}
    assert set(by_uuid) == set(gpus[1:] + migs[1:])
    assert all(v == {"mode": "none"} for v in by_uuid.values())
