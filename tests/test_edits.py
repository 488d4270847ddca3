"""Container edits: merge/de-duplication, CDI round trip, minimum CDI version, and the
OCI sink that applies them to a runtime spec."""

import json

import pytest

from nvshim.cdi.version import spec_min_version
from nvshim.edits import ContainerEdits, DeviceNode, Hook, Mount, min_cdi_version
from nvshim.oci.modify import INJECTED_ANNOTATION, apply_edits, merge_env


def test_merge_dedupes_by_key_and_keeps_last_value():
    a = ContainerEdits(
        env=["A=1", "B=1"],
        device_nodes=[DeviceNode("/dev/nvidia0", major=195, minor=0)],
        mounts=[Mount("/h/lib", "/lib/x", ("ro",))],
        hooks=[Hook("createContainer", "/bin/h", ("h", "x"))],
    )
    b = ContainerEdits(
        env=["A=2", "C=3"],
        device_nodes=[DeviceNode("/dev/nvidia0", major=195, minor=0), DeviceNode("/dev/x")],
        mounts=[Mount("/h/lib2", "/lib/x", ("ro",))],
        hooks=[Hook("createContainer", "/bin/h", ("h", "x"))],
        additional_gids=[44, 44],
    )
    m = a.merge(b)
    assert m.env == ["A=2", "B=1", "C=3"]
    assert [d.path for d in m.device_nodes] == ["/dev/nvidia0", "/dev/x"]
    assert [mt.host_path for mt in m.mounts] == ["/h/lib2"]
    assert len(m.hooks) == 1
    assert m.additional_gids == [44]
    # inputs untouched
    assert a.env == ["A=1", "B=1"]


def test_cdi_round_trip():
    e = ContainerEdits(
        env=["X=1"],
        device_nodes=[DeviceNode("/dev/nvidia0", "/root/dev/nvidia0", "c", 195, 0)],
        mounts=[Mount("/h", "/c", ("ro", "bind"))],
        hooks=[Hook("createContainer", "/bin/h", ("h",), ("PATH=/bin",))],
    )
    data = e.to_cdi()
    assert data["deviceNodes"][0]["hostPath"] == "/root/dev/nvidia0"
    assert data["hooks"][0]["env"] == ["PATH=/bin"]
    back = ContainerEdits.from_cdi(json.loads(json.dumps(data)))
    assert back.to_cdi() == data


@pytest.mark.parametrize(
    "edits, version",
    [
        (ContainerEdits(env=["A=1"]), "0.3.0"),
        (ContainerEdits(mounts=[Mount("/a", "/b", type="tmpfs")]), "0.4.0"),
        (ContainerEdits(device_nodes=[DeviceNode("/dev/x", "/root/dev/x")]), "0.5.0"),
        (ContainerEdits(device_nodes=[DeviceNode("/dev/x", "/dev/x")]), "0.3.0"),
        (ContainerEdits(additional_gids=[5]), "0.7.0"),
    ],
)
def test_min_cdi_version_of_edits(edits, version):
    assert min_cdi_version(edits) == version


@pytest.mark.parametrize(
    "spec, version",
    [
        ({"kind": "nvidia.com/gpu", "devices": [{"name": "GPU-1"}]}, "0.3.0"),
        ({"kind": "nvidia.com/gpu", "devices": [{"name": "0"}]}, "0.5.0"),
        ({"kind": "nvidia.com/gpu.shared", "devices": [{"name": "a"}]}, "0.6.0"),
        ({"kind": "nvidia.com/gpu", "annotations": {"a": "b"}, "devices": []}, "0.6.0"),
        ({"kind": "v/c", "devices": [{"name": "a", "annotations": {"x": "y"}}]}, "0.6.0"),
        (
            {"kind": "v/c", "devices": [{"name": "a", "containerEdits": {"netDevices": [{}]}}]},
            "1.1.0",
        ),
    ],
)
def test_spec_min_version(spec, version):
    assert spec_min_version(spec) == version


def test_merge_env_single_entry_per_key_last_wins():
    assert merge_env(["A=1", "B=2", "A=3"], ["B=9", "C=1"]) == ["A=3", "B=9", "C=1"]
    assert merge_env(["A=1", 7, None], []) == ["A=1"]  # hostile non-strings dropped


def test_apply_edits_keeps_unknown_fields_and_order():
    spec = {
        "ociVersion": "1.0.2",
        "x-unknown": {"keep": [1, 2]},
        "process": {"env": ["PATH=/bin", "CUDA_VISIBLE_DEVICES=7"], "args": ["sh"]},
        "root": {"path": "rootfs"},
        "linux": {"resources": {"devices": [{"allow": False, "access": "rwm"}]}},
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
    }
    edits = ContainerEdits(
        env=["CUDA_VISIBLE_DEVICES=GPU-a"],
        device_nodes=[DeviceNode("/dev/nvidia0", "/r/dev/nvidia0", "c", 195, 0, file_mode=0o666)],
        mounts=[Mount("/r/usr/lib/libcuda.so.1", "/usr/lib/libcuda.so.1", ("ro", "nosuid"))],
        hooks=[Hook("createContainer", "/usr/bin/nvshim-hook", ("nvshim-hook", "x"), ("PATH=/b",))],
    )
    out = apply_edits(spec, edits, ["GPU-a"])
    assert list(out)[:5] == ["ociVersion", "x-unknown", "process", "root", "linux"]
    assert out["x-unknown"] == {"keep": [1, 2]}
    assert out["process"]["env"] == ["PATH=/bin", "CUDA_VISIBLE_DEVICES=GPU-a"]
    assert out["linux"]["devices"] == [
        {
            "path": "/dev/nvidia0",
            "type": "c",
            "major": 195,
            "minor": 0,
            "fileMode": 0o666,
            "uid": 0,
            "gid": 0,
        }
    ]
    rules = out["linux"]["resources"]["devices"]
    assert rules[0] == {"allow": False, "access": "rwm"}  # deny-all stays first
    assert rules[1] == {"allow": True, "type": "c", "major": 195, "minor": 0, "access": "rwm"}
    assert out["mounts"][1] == {
        "destination": "/usr/lib/libcuda.so.1",
        "type": "bind",
        "source": "/r/usr/lib/libcuda.so.1",
        "options": ["ro", "nosuid", "bind"],
    }
    assert out["hooks"]["createContainer"][0]["env"] == ["PATH=/b"]
    assert out["annotations"][INJECTED_ANNOTATION] == "GPU-a"


def test_apply_edits_tolerates_hostile_types():
    spec = {"process": {"env": "not-a-list"}, "linux": "nope", "mounts": {}, "hooks": []}
    out = apply_edits(spec, ContainerEdits(env=["A=1"], mounts=[Mount("/a", "/b")]), [])
    assert out["process"]["env"] == ["A=1"]
    assert out["mounts"][0]["destination"] == "/b"
    assert out["annotations"][INJECTED_ANNOTATION] == "none"


def test_apply_edits_is_idempotent():
    edits = ContainerEdits(
        env=["A=1"],
        device_nodes=[DeviceNode("/dev/nvidia0", None, "c", 195, 0)],
        mounts=[Mount("/h/lib", "/lib/x", ("ro", "bind"))],
        hooks=[Hook("createContainer", "/bin/h", ("h",), ("PATH=/b",))],
    )
    once = apply_edits({"process": {"env": []}}, edits, ["GPU-a"])
    snapshot = json.dumps(once, sort_keys=True)
    twice = apply_edits(json.loads(snapshot), edits, ["GPU-a"])
    assert json.dumps(twice, sort_keys=True) == snapshot


def test_runtime_sink_folds_finishing_steps_into_one_hook():
    env = ("PATH=/bin",)
    edits = ContainerEdits(
        hooks=[
            Hook(
                "createContainer",
                "/b/nvshim-hook",
                ("nvshim-hook", "create-symlinks", "--link", "a::/x"),
                env,
            ),
            Hook("createContainer", "/other", ("other",), env),
            Hook(
                "createContainer",
                "/b/nvshim-hook",
                ("nvshim-hook", "update-ldcache", "--folder", "/lib"),
                env,
            ),
            Hook(
                "createContainer",
                "/b/nvshim-hook",
                ("nvshim-hook", "disable-device-node-modification"),
                env,
            ),
        ]
    )
    hooks = apply_edits({}, edits, [])["hooks"]["createContainer"]
    assert [h["args"] for h in hooks] == [
        [
            "nvshim-hook",
            "finish",
            "create-symlinks",
            "--link",
            "a::/x",
            "+",
            "update-ldcache",
            "--folder",
            "/lib",
            "+",
            "disable-device-node-modification",
        ],
        ["other"],
    ]
    assert all(h["env"] == ["PATH=/bin"] for h in hooks)
    from nvshim.hook.main import parse_finish

    steps = parse_finish(hooks[0]["args"][2:])
    assert [s.command for s in steps] == [
        "create-symlinks",
        "update-ldcache",
        "disable-device-node-modification",
    ]
    assert steps[0].link == ["a::/x"] and steps[1].folder == ["/lib"]
