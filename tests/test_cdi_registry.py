"""Listing CDI devices from spec directories the way runtimes resolve them."""

import json
import os

import yaml

from nvshim.cdi.registry import (
    DEFAULT_SPEC_DIRS,
    find_spec_devices,
    list_devices,
    scan_spec_dirs,
)


def spec(kind, *names, env="X", version="0.5.0"):
    return {
        "cdiVersion": version,
        "kind": kind,
        "devices": [{"name": n, "containerEdits": {"env": [f"{env}={n}"]}} for n in names],
    }


def write(directory, name, data):
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name)
    with open(path, "w") as fh:
        if name.endswith(".json"):
            json.dump(data, fh)
        else:
            yaml.safe_dump(data, fh)
    return path


def test_default_dirs_are_static_then_generated():
    assert DEFAULT_SPEC_DIRS == ("/etc/cdi", "/var/run/cdi")


def test_lists_every_device_of_every_spec_sorted(tmp_path):
    etc, run = str(tmp_path / "etc"), str(tmp_path / "run")
    write(etc, "b.yaml", spec("nvidia.com/gpu", "1", "0", "all"))
    write(run, "a.json", spec("example.com/net", "eth0"))
    warnings = []
    assert list_devices([etc, run], warnings) == [
        "example.com/net=eth0",
        "nvidia.com/gpu=0",
        "nvidia.com/gpu=1",
        "nvidia.com/gpu=all",
    ]
    assert warnings == []


def test_later_directory_overrides_earlier(tmp_path):
    etc, run = str(tmp_path / "etc"), str(tmp_path / "run")
    write(etc, "static.yaml", spec("nvidia.com/gpu", "0", "1", env="STATIC"))
    generated = write(run, "generated.json", spec("nvidia.com/gpu", "0", env="GENERATED"))
    devices = find_spec_devices([etc, run])
    path, device, whole = devices["nvidia.com/gpu=0"]
    assert path == generated
    assert device["containerEdits"]["env"] == ["GENERATED=0"]
    assert whole["kind"] == "nvidia.com/gpu"
    # The device only the static spec has stays, from the static spec.
    assert devices["nvidia.com/gpu=1"][0] == os.path.join(etc, "static.yaml")
    # Reversing the directory order reverses the winner.
    assert find_spec_devices([run, etc])["nvidia.com/gpu=0"][0].endswith("static.yaml")


def test_same_directory_conflict_drops_the_device(tmp_path):
    etc, run = str(tmp_path / "etc"), str(tmp_path / "run")
    write(etc, "a.yaml", spec("nvidia.com/gpu", "0", "1"))
    write(etc, "b.yaml", spec("nvidia.com/gpu", "0"))
    write(run, "c.yaml", spec("nvidia.com/gpu", "0"))  # runtimes still refuse it
    warnings = []
    assert list_devices([etc, run], warnings) == ["nvidia.com/gpu=1"]
    assert warnings == [
        f"{etc}/b.yaml: device nvidia.com/gpu=0 is also defined in {etc}/a.yaml; runtimes refuse it"
    ]


def test_invalid_spec_is_skipped_whole_and_reported(tmp_path):
    d = str(tmp_path / "cdi")
    write(d, "good.yaml", spec("nvidia.com/gpu", "0"))
    bad = spec("example.com/dev", "ok", "-bad")
    bad_path = write(d, "bad.yaml", bad)
    broken = os.path.join(d, "broken.json")
    with open(broken, "w") as fh:
        fh.write('{"cdiVersion": "0.3.0",')
    warnings = []
    assert list_devices([d], warnings) == ["nvidia.com/gpu=0"]
    assert warnings == [
        f'{bad_path}: devices[1].name "-bad": must start with a letter or digit',
        f"{broken}: line 1, column 24: invalid JSON: Expecting property name enclosed in "
        "double quotes",
    ]


def test_only_json_and_yaml_load(tmp_path):
    d = str(tmp_path / "cdi")
    write(d, "a.yaml", spec("v.com/c", "yaml"))
    write(d, "b.json", spec("v.com/c", "json"))
    yml = write(d, "c.yml", spec("v.com/c", "yml"))
    write(d, "d.yaml.bak", spec("v.com/c", "bak"))
    write(d, "e.txt", spec("v.com/c", "txt"))
    write(os.path.join(d, "sub"), "f.yaml", spec("v.com/c", "subdir"))
    warnings = []
    assert list_devices([d], warnings) == ["v.com/c=json", "v.com/c=yaml"]
    assert warnings == [f"{yml}: ignored: runtimes load only .json and .yaml spec files"]


def test_symlinked_spec_file_loads(tmp_path):
    d = str(tmp_path / "cdi")
    target = write(str(tmp_path / "elsewhere"), "real.yaml", spec("v.com/c", "linked"))
    os.makedirs(d)
    os.symlink(target, os.path.join(d, "link.yaml"))
    assert list_devices([d]) == ["v.com/c=linked"]


def test_missing_dirs_are_silent_and_bad_dirs_reported(tmp_path):
    not_dir = tmp_path / "file"
    not_dir.write_text("x")
    warnings = []
    assert list_devices([str(tmp_path / "none"), str(not_dir)], warnings) == []
    assert warnings == [f"{not_dir}: cannot read CDI spec directory: Not a directory"]


def test_scan_keeps_valid_specs_and_edits(tmp_path):
    d = str(tmp_path / "cdi")
    data = spec("nvidia.com/gpu", "0")
    data["containerEdits"] = {"deviceNodes": [{"path": "/dev/nvidiactl"}]}
    path = write(d, "gpu.yaml", data)
    scan = scan_spec_dirs([d])
    assert scan.specs == [(path, data)]
    # The runtime resolves an annotation value to spec-level plus device edits.
    spec_path, device, whole = scan.devices["nvidia.com/gpu=0"]
    assert whole["containerEdits"]["deviceNodes"] == [{"path": "/dev/nvidiactl"}]
    assert device["containerEdits"]["env"] == ["X=0"]
