"""CDI spec validation: every rule, the corpus, file loading, the schema, and real podman."""

import copy
import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

import pytest
import yaml

from nvshim.cdi.validate import load_spec_file, validate_files, validate_spec
from nvshim.cdi.version import spec_min_version, version_key
from nvshim.edits import ContainerEdits, DeviceNode, Mount
from nvshim.errors import NvshimError
from nvshim.hookentries import hook_entry, hook_env

sys.path.insert(0, os.path.dirname(__file__))
from podman_util import make_busybox_rootfs, podman_run  # noqa: E402

CORPUS = os.path.join(os.path.dirname(__file__), "cdi_corpus")
VALID = sorted(glob.glob(os.path.join(CORPUS, "valid", "*")))
INVALID = sorted(glob.glob(os.path.join(CORPUS, "invalid", "*")))


def base_spec():
    return {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "containerEdits": {"env": ["NVIDIA_X=1"]},
        "devices": [
            {
                "name": "gpu0",
                "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]},
            }
        ],
    }


def edit(path, value):
    """A mutation of ``base_spec`` setting ``path`` (dotted, [n] for lists); DELETE removes."""

    def apply(spec):
        parts = re.findall(r"[^.\[\]]+|\[\d+\]", path)
        node = spec
        for part in parts[:-1]:
            node = node[int(part[1:-1])] if part.startswith("[") else node[part]
        last = parts[-1]
        key = int(last[1:-1]) if last.startswith("[") else last
        if value is DELETE:
            del node[key]
        else:
            node[key] = value
        return spec

    return apply


DELETE = object()
DEV = "devices[0].containerEdits"


RULES = [
    # (case id, mutation, expected problem lines after "s.yaml: ")
    ("valid", edit("kind", "nvidia.com/gpu"), []),
    # top level, strict fields
    ("unknown top", edit("vendor", "x"), ["vendor: unknown field (known: cdiVersion, kind, "
                                           "annotations, devices, containerEdits)"]),
    ("unknown device", edit("devices[0].x", 1), ["devices[0].x: unknown field (known: name, "
                                                  "annotations, containerEdits)"]),
    ("unknown edits", edit(f"{DEV}.devices", []), [f"{DEV}.devices: unknown field (known: env, "
        "deviceNodes, netDevices, hooks, mounts, intelRdt, additionalGids)"]),
    ("unknown node", edit(f"{DEV}.deviceNodes[0].mode", 1), [
        f"{DEV}.deviceNodes[0].mode: unknown field (known: path, hostPath, type, major, minor, "
        "fileMode, permissions, uid, gid)"]),
    ("odd key quoted", edit("devices[0].a b", 1), [
        'devices[0]["a b"]: unknown field (known: name, annotations, containerEdits)']),
    # version
    ("version missing", edit("cdiVersion", DELETE), ["cdiVersion: missing (required)"]),
    ("version number", edit("cdiVersion", 0.5), ["cdiVersion: must be a string, got number "
                                                  "(quote it)"]),
    ("version garbage", edit("cdiVersion", "latest"), ['cdiVersion "latest": not a version; known: '
        "0.3.0, 0.4.0, 0.5.0, 0.6.0, 0.7.0, 0.8.0, 1.0.0, 1.1.0"]),
    ("version v prefix", edit("cdiVersion", "v0.5.0"), [
        'cdiVersion "v0.5.0": write 0.5.0 (runtimes differ on a v prefix)']),
    ("version too new", edit("cdiVersion", "1.2.0"), [
        'cdiVersion "1.2.0": newer than 1.1.0, the newest CDI version nvshim knows; runtimes '
        "reject versions they do not know"]),
    ("version too old", edit("cdiVersion", "0.2.0"), [
        'cdiVersion "0.2.0": older than 0.3.0, the oldest version runtimes still accept']),
    ("version unreleased", edit("cdiVersion", "0.9.0"), [
        'cdiVersion "0.9.0": not a released CDI version (0.3.0, 0.4.0, 0.5.0, 0.6.0, 0.7.0, '
        "0.8.0, 1.0.0, 1.1.0)"]),
    ("version below hostPath", lambda s: edit("cdiVersion", "0.4.0")(
        edit(f"{DEV}.deviceNodes[0].hostPath", "/dev/null")(s)), [
        'cdiVersion "0.4.0": the content needs at least 0.5.0 (for '
        f"{DEV}.deviceNodes[0].hostPath)"]),
    ("version below digit name", lambda s: edit("cdiVersion", "0.4.0")(
        edit("devices[0].name", "0")(s)), [
        'cdiVersion "0.4.0": the content needs at least 0.5.0 (for devices[0].name starting '
        "with a digit)"]),
    ("version below annotations", edit("annotations", {"a": "b"}), [
        'cdiVersion "0.5.0": the content needs at least 0.6.0 (for annotations)']),
    ("version below gids", edit(f"{DEV}.additionalGids", [44]), [
        f'cdiVersion "0.5.0": the content needs at least 0.7.0 (for {DEV}.additionalGids)']),
    ("version below intelRdt", edit(f"{DEV}.intelRdt", {}), [
        f'cdiVersion "0.5.0": the content needs at least 0.7.0 (for {DEV}.intelRdt)']),
    ("version below schemata", lambda s: edit("cdiVersion", "1.0.0")(
        edit(f"{DEV}.intelRdt", {"schemata": ["L3:0=f"]})(s)), [
        f'cdiVersion "1.0.0": the content needs at least 1.1.0 (for {DEV}.intelRdt.schemata)']),
    ("version below netDevices", lambda s: edit("cdiVersion", "1.0.0")(
        edit(f"{DEV}.netDevices", [{"hostInterfaceName": "a", "name": "b"}])(s)), [
        f'cdiVersion "1.0.0": the content needs at least 1.1.0 (for {DEV}.netDevices)']),
    ("version below mount type", lambda s: edit("cdiVersion", "0.3.0")(
        edit("containerEdits.mounts", [{"hostPath": "/a", "containerPath": "/a", "type": "bind"}])(
            s)), [
        'cdiVersion "0.3.0": the content needs at least 0.4.0 (for '
        "containerEdits.mounts[0].type)"]),
    # kind
    ("kind missing", edit("kind", DELETE), ["kind: missing (required)"]),
    ("kind no class", edit("kind", "nvidia.com"), [
        'kind "nvidia.com": must have the form vendor/class']),
    ("kind bad vendor", edit("kind", "_nv/gpu"), [
        'kind "_nv/gpu": vendor "_nv": must start with a letter']),
    ("kind class dot", edit("kind", "nvidia.com/gpu.mig"), [
        'cdiVersion "0.5.0": the content needs at least 0.6.0 (for a dot in the class of kind)']),
    # devices and names
    ("devices missing", edit("devices", DELETE), ["devices: missing (required)"]),
    ("devices empty", edit("devices", []), ["devices: a spec must list at least one device"]),
    ("devices null", edit("devices", None), ["devices: a spec must list at least one device"]),
    ("devices mapping", edit("devices", {"gpu0": {}}), ["devices: must be a list, got mapping"]),
    ("device not mapping", edit("devices[0]", "gpu0"), [
        "devices[0]: must be a mapping, got string"]),
    ("name missing", edit("devices[0].name", DELETE), ["devices[0].name: missing (required)"]),
    ("name bad", edit("devices[0].name", "gpu 0"), [
        'devices[0].name "gpu 0": character " " is not allowed']),
    ("name number", edit("devices[0].name", 0), [
        "devices[0].name: must be a string, got integer (quote it)"]),
    ("name duplicate", lambda s: s["devices"].append(copy.deepcopy(s["devices"][0])) or s, [
        'devices[1].name "gpu0": duplicate device name, also at devices[0]']),
    ("edits missing", edit("devices[0].containerEdits", DELETE), [
        "devices[0].containerEdits: empty; a device must make at least one edit"]),
    ("edits empty lists", edit("devices[0].containerEdits", {"env": [], "mounts": []}), [
        "devices[0].containerEdits: empty; a device must make at least one edit"]),
    ("spec edits may be empty", edit("containerEdits", {}), []),
    # env
    ("env no equals", edit("containerEdits.env", ["NVIDIA_X"]), [
        'containerEdits.env[0] "NVIDIA_X": must be KEY=value with a non-empty KEY']),
    ("env empty key", edit(f"{DEV}.env", ["=1"]), [
        f'{DEV}.env[0] "=1": must be KEY=value with a non-empty KEY']),
    ("env empty value ok", edit(f"{DEV}.env", ["A="]), []),
    ("env not list", edit(f"{DEV}.env", "A=1"), [f"{DEV}.env: must be a list, got string"]),
    # device nodes
    ("node path missing", edit(f"{DEV}.deviceNodes[0]", {"type": "c"}), [
        f"{DEV}.deviceNodes[0].path: missing (required)"]),
    ("node path relative", edit(f"{DEV}.deviceNodes[0].path", "dev/nvidia0"), [
        f'{DEV}.deviceNodes[0].path "dev/nvidia0": must be an absolute path']),
    ("node type", edit(f"{DEV}.deviceNodes[0].type", "char"), [
        f'{DEV}.deviceNodes[0].type "char": must be one of b, c, u, p']),
    ("node type empty ok", edit(f"{DEV}.deviceNodes[0].type", ""), []),
    ("node major negative", edit(f"{DEV}.deviceNodes[0].major", -1), [
        f"{DEV}.deviceNodes[0].major -1: must be a non-negative number"]),
    ("node minor bool", edit(f"{DEV}.deviceNodes[0].minor", True), [
        f"{DEV}.deviceNodes[0].minor: must be an integer, got boolean"]),
    ("node gid range", edit(f"{DEV}.deviceNodes[0].gid", 2**32), [
        f"{DEV}.deviceNodes[0].gid 4294967296: must be 0 to 4294967295"]),
    ("perm bad letter", edit(f"{DEV}.deviceNodes[0].permissions", "rwx"), [
        f'{DEV}.deviceNodes[0].permissions "rwx": must be a subset of "rwm" (bad: x)']),
    ("perm repeat", edit(f"{DEV}.deviceNodes[0].permissions", "rwr"), [
        f'{DEV}.deviceNodes[0].permissions "rwr": must be a subset of "rwm" without repeats']),
    ("perm subset ok", edit(f"{DEV}.deviceNodes[0].permissions", "mr"), []),
    # mounts
    ("mount relative", edit(f"{DEV}.mounts", [{"hostPath": "/a", "containerPath": "a"}]), [
        f'{DEV}.mounts[0].containerPath "a": must be an absolute path']),
    ("mount host empty", edit(f"{DEV}.mounts", [{"hostPath": "", "containerPath": "/a"}]), [
        f"{DEV}.mounts[0].hostPath: must not be empty"]),
    ("mount options", edit(f"{DEV}.mounts", [{"hostPath": "/a", "containerPath": "/a",
                                               "options": ["ro", 1]}]), [
        f"{DEV}.mounts[0].options[1]: must be a string, got integer (quote it)"]),
    # hooks
    ("hook name", edit(f"{DEV}.hooks", [{"hookName": "preStart", "path": "/bin/true"}]), [
        f'{DEV}.hooks[0].hookName "preStart": must be one of prestart, createRuntime, '
        "createContainer, startContainer, poststart, poststop"]),
    ("hook path relative", edit(f"{DEV}.hooks", [{"hookName": "prestart", "path": "true"}]), [
        f'{DEV}.hooks[0].path "true": must be an absolute path']),
    ("hook env", edit(f"{DEV}.hooks", [{"hookName": "poststop", "path": "/t", "env": ["X"]}]), [
        f'{DEV}.hooks[0].env[0] "X": must be KEY=value with a non-empty KEY']),
    ("hook timeout", edit(f"{DEV}.hooks", [{"hookName": "poststop", "path": "/t", "timeout": 0}]), [
        f"{DEV}.hooks[0].timeout 0: must be positive"]),
    # intelRdt, gids, netDevices
    ("rdt closID", lambda s: edit("cdiVersion", "0.7.0")(edit(f"{DEV}.intelRdt",
                                                             {"closID": "a/b"})(s)), [
        f'{DEV}.intelRdt.closID "a/b": must be a valid file name']),
    ("rdt unknown", lambda s: edit("cdiVersion", "0.7.0")(edit(f"{DEV}.intelRdt",
                                                              {"enableCMT": True})(s)), [
        f"{DEV}.intelRdt.enableCMT: unknown field (known: closID, l3CacheSchema, memBwSchema, "
        "schemata, enableMonitoring)"]),
    ("gids negative", lambda s: edit("cdiVersion", "0.7.0")(edit(f"{DEV}.additionalGids",
                                                                [-5])(s)), [
        f"{DEV}.additionalGids[0] -5: must be a group id (0 to 4294967295)"]),
    ("netdev duplicate", lambda s: edit("cdiVersion", "1.1.0")(edit(f"{DEV}.netDevices", [
        {"hostInterfaceName": "a", "name": "x"}, {"hostInterfaceName": "b", "name": "x"}])(s)), [
        f'{DEV}.netDevices[1].name "x": duplicate, also at {DEV}.netDevices[0].name']),
    # annotations
    ("annotation value", lambda s: edit("cdiVersion", "0.6.0")(edit("annotations",
                                                                   {"a": 1})(s)), [
        "annotations.a: must be a string, got integer (quote it)"]),
    ("annotation key", lambda s: edit("cdiVersion", "0.6.0")(edit("devices[0].annotations",
                                                                 {"x/": "1"})(s)), [
        'devices[0].annotations["x/"]: invalid annotation key: name "" must be 1-63 of A-Z a-z '
        "0-9 - _ . inside alphanumerics"]),
    ("annotation size", lambda s: edit("cdiVersion", "0.6.0")(edit("annotations",
                                                                   {"a": "x" * 262144})(s)), [
        "annotations: total size 262145 bytes exceeds 262144"]),
]  # fmt: skip


@pytest.mark.parametrize("mutate, expected", [r[1:] for r in RULES], ids=[r[0] for r in RULES])
def test_rule(mutate, expected):
    spec = mutate(base_spec())
    assert validate_spec(spec, "s.yaml") == [f"s.yaml: {line}" for line in expected]


def test_not_a_mapping():
    assert validate_spec(["x"], "s.yaml") == ["s.yaml: a CDI spec must be a mapping, got list"]


def test_many_problems_are_all_reported_in_order():
    spec = base_spec()
    spec["kind"] = "nvidia.com"
    spec["devices"][0]["name"] = "-0"
    spec["devices"][0]["containerEdits"]["env"] = ["X"]
    assert validate_spec(spec, "f.json") == [
        'f.json: kind "nvidia.com": must have the form vendor/class',
        'f.json: devices[0].name "-0": must start with a letter or digit',
        'f.json: devices[0].containerEdits.env[0] "X": must be KEY=value with a non-empty KEY',
    ]


# -- the JSON schema -----------------------------------------------------------------------


def test_schema_failure_is_one_line():
    import nvshim.cdi.validate as validate

    spec = base_spec()
    spec["devices"][0]["containerEdits"]["deviceNodes"][0]["major"] = "195"
    problems = validate._schema_problems(spec, "s.json")
    assert problems == [
        (
            f"{DEV}.deviceNodes[0].major",
            f"s.json: {DEV}.deviceNodes[0].major: schema: '195' is not of type 'integer'",
        )
    ]
    # validate_spec reports the place once (the rule's line), not twice.
    assert validate_spec(spec, "s.json") == [
        f"s.json: {DEV}.deviceNodes[0].major: must be an integer, got string"
    ]


def test_schema_check_without_jsonschema_says_so(monkeypatch):
    import nvshim.cdi.validate as validate

    validate._schema_validator.cache_clear()
    monkeypatch.setitem(sys.modules, "jsonschema", None)
    try:
        assert validate_spec(base_spec(), "s.json") == [
            "s.json: JSON schema not checked: Python package jsonschema is missing"
        ]
        assert validate_spec(base_spec(), "s.json", schema=False) == []
    finally:
        validate._schema_validator.cache_clear()


def test_reference_schema_copy_matches_packaged():
    ref = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "reference", "cdi-schema")
    if not os.path.isdir(ref):
        pytest.skip("shared reference schema not present")
    here = os.path.join(os.path.dirname(__file__), "..", "nvshim", "cdi", "schema")
    for name in ("schema.json", "defs.json"):
        with open(os.path.join(ref, name)) as a, open(os.path.join(here, name)) as b:
            assert json.load(a) == json.load(b)


# -- the corpus ------------------------------------------------------------------------------

INVALID_EXPECTED = {
    "bad-annotations.yaml": [
        'annotations["bad key!"]: invalid annotation key: name "bad key!" must be 1-63 of A-Z '
        "a-z 0-9 - _ . inside alphanumerics",
        'annotations["a/b/c"]: invalid annotation key: "a/b/c" has more than one /',
        "annotations.count: must be a string, got integer (quote it)",
        'devices[0].annotations["-x"]: invalid annotation key: name "-x" must be 1-63 of A-Z '
        "a-z 0-9 - _ . inside alphanumerics",
    ],
    "bad-device-nodes.yaml": [
        f'{DEV}.deviceNodes[0].permissions "rwx": must be a subset of "rwm" (bad: x)',
        f'{DEV}.deviceNodes[1].permissions "rrw": must be a subset of "rwm" without repeats',
        f'{DEV}.deviceNodes[2].type "x": must be one of b, c, u, p',
        f'{DEV}.deviceNodes[3].path "dev/d": must be an absolute path',
        f"{DEV}.deviceNodes[4].major -1: must be a non-negative number",
        f"{DEV}.deviceNodes[5].uid 4294967296: must be 0 to 4294967295",
        f"{DEV}.deviceNodes[6].path: missing (required)",
    ],
    "bad-env.json": [
        'containerEdits.env[0] "=value": must be KEY=value with a non-empty KEY',
        f'{DEV}.env[0] "NOEQUALS": must be KEY=value with a non-empty KEY',
        f'{DEV}.env[1] "": must be KEY=value with a non-empty KEY',
        f"{DEV}.env[2]: must be a string, got integer (quote it)",
    ],
    "bad-hooks.yaml": [
        f'{DEV}.hooks[0].hookName "preStart": must be one of prestart, createRuntime, '
        "createContainer, startContainer, poststart, poststop",
        f'{DEV}.hooks[1].path "bin/true": must be an absolute path',
        f'{DEV}.hooks[2].env[0] "NOVALUE": must be KEY=value with a non-empty KEY',
        f"{DEV}.hooks[2].timeout 0: must be positive",
        f"{DEV}.hooks[3].hookName: missing (required)",
    ],
    "bad-kind-class.yaml": [
        'kind "1vendor/gpu_": vendor "1vendor": must start with a letter',
        'kind "1vendor/gpu_": class "gpu_": must end with a letter or digit',
    ],
    "bad-kind.json": ['kind "nvidia.com": must have the form vendor/class'],
    "bad-names.yaml": [
        'devices[0].name "-leading-dash": must start with a letter or digit',
        'devices[1].name "trailing.": must end with a letter or digit',
        'devices[2].name "gpu/0": character "/" is not allowed',
        "devices[3].name: must be a string, got integer (quote it)",
    ],
    "bad-net-devices.yaml": [
        f'{DEV}.intelRdt.closID "..": must be a valid file name',
        f"{DEV}.additionalGids[0] -1: must be a group id (0 to 4294967295)",
        f'{DEV}.netDevices[1].hostInterfaceName "eth0": duplicate, also at '
        f"{DEV}.netDevices[0].hostInterfaceName",
        f"{DEV}.netDevices[2].hostInterfaceName: must not be empty",
    ],
    "class-dot-old-version.yaml": [
        'cdiVersion "0.5.0": the content needs at least 0.6.0 (for a dot in the class of kind)'
    ],
    "duplicate-device.json": ['devices[2].name "gpu": duplicate device name, also at devices[0]'],
    "duplicate-key.yaml": ['line 7, column 7: invalid YAML: duplicate key "env"'],
    "empty-device-edits.yaml": [
        f"devices[{i}].containerEdits: empty; a device must make at least one edit"
        for i in range(3)
    ],
    "missing-required.json": [
        "kind: missing (required)",
        "devices: missing (required)",
        "cdiVersion: missing (required)",
    ],
    "no-devices.yaml": ["devices: a spec must list at least one device"],
    "not-a-mapping.yaml": ["a CDI spec must be a mapping, got list"],
    "relative-mount.yaml": [
        f'{DEV}.mounts[0].containerPath "usr/lib/x": must be an absolute path',
        f"{DEV}.mounts[1].hostPath: must not be empty",
        f"{DEV}.mounts[2].hostPath: missing (required)",
    ],
    "syntax-error.json": ["line 4, column 3: invalid JSON: Expecting ',' delimiter"],
    "syntax-error.yaml": [
        "line 7, column 1: invalid YAML: did not find expected ',' or ']' "
        "(while parsing a flow sequence at line 6, column 12)"
    ],
    "unknown-fields-new.json": [
        "vendor: unknown field (known: cdiVersion, kind, annotations, devices, containerEdits)",
        f"{DEV}.intelRdt.enableCMT: unknown field (known: closID, l3CacheSchema, memBwSchema, "
        "schemata, enableMonitoring)",
        f"{DEV}.netDevices[0].mac: unknown field (known: hostInterfaceName, name)",
    ],
    "unknown-fields.yaml": [
        "containerEdits.environment: unknown field (known: env, deviceNodes, netDevices, hooks, "
        "mounts, intelRdt, additionalGids)",
        "devices[0].labels: unknown field (known: name, annotations, containerEdits)",
        f"{DEV}.deviceNodes[0].hostpath: unknown field (known: path, hostPath, type, major, "
        "minor, fileMode, permissions, uid, gid)",
        f"{DEV}.mounts[0].readOnly: unknown field (known: hostPath, containerPath, options, type)",
        f"{DEV}.hooks[0].when: unknown field (known: hookName, path, args, env, timeout)",
    ],
    "version-missing-patch.yaml": [
        'cdiVersion "0.5": not a version; known: 0.3.0, 0.4.0, 0.5.0, 0.6.0, 0.7.0, 0.8.0, '
        "1.0.0, 1.1.0"
    ],
    "version-mount-type.json": [
        f'cdiVersion "0.3.0": the content needs at least 0.4.0 (for {DEV}.mounts[0].type)'
    ],
    "version-too-low.yaml": [
        f'cdiVersion "0.3.0": the content needs at least 0.5.0 (for {DEV}.deviceNodes[0].hostPath)'
    ],
    "version-too-new.json": [
        'cdiVersion "2.0.0": newer than 1.1.0, the newest CDI version nvshim knows; runtimes '
        "reject versions they do not know"
    ],
    "version-unquoted.yaml": ["cdiVersion: must be a string, got number (quote it)"],
}


def test_every_invalid_corpus_file_has_expectations():
    assert sorted(os.path.basename(p) for p in INVALID) == sorted(INVALID_EXPECTED)


@pytest.mark.parametrize("path", INVALID, ids=os.path.basename)
def test_invalid_corpus(path):
    expected = INVALID_EXPECTED[os.path.basename(path)]
    assert validate_files([path]) == [f"{path}: {line}" for line in expected]


@pytest.mark.parametrize("path", VALID, ids=os.path.basename)
def test_valid_corpus(path):
    assert validate_files([path]) == []
    spec = load_spec_file(path)
    # Each valid spec declares exactly the minimum version its content needs.
    assert spec["cdiVersion"] == spec_min_version(spec)


def test_validate_files_collects_across_files():
    paths = [VALID[0], os.path.join(CORPUS, "invalid", "no-devices.yaml"), "/nonexistent.json"]
    assert validate_files(paths) == [
        f"{paths[1]}: devices: a spec must list at least one device",
        "/nonexistent.json: cannot read: No such file or directory",
    ]


# -- loading files ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("a.txt", b"{}", "not a CDI spec file name (expected .json, .yaml or .yml)"),
        ("a.yaml", b"", "empty, not a CDI spec"),
        ("a.yaml", b"\xff\xfe", "not UTF-8 text (bad byte at offset 0)"),
        ("a.json", b"", "line 1, column 1: invalid JSON: Expecting value"),
        ("a.json", b'{"a": 1, "a": 2}', 'invalid JSON: duplicate key "a"'),
        ("a.json", b'{"a": NaN}', "invalid JSON: NaN is not valid JSON"),
        ("a.json", b"[1]", "a CDI spec must be a mapping, got list"),
        ("a.yml", b"a: b: c\n", "line 1, column 5: invalid YAML: mapping values are not "
                                "allowed in this context"),
        ("a.yaml", b"x: !!python/object:os.system {}\n",
         "line 1, column 4: invalid YAML: could not determine a constructor for the tag "
         "'tag:yaml.org,2002:python/object:os.system'"),
    ],
)  # fmt: skip
def test_load_errors_are_one_line(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(NvshimError) as err:
        load_spec_file(str(path))
    assert str(err.value) == f"{path}: {message}"


def test_load_directory_and_missing(tmp_path):
    (tmp_path / "d.yaml").mkdir()
    with pytest.raises(NvshimError, match=r"d\.yaml: cannot read: Is a directory$"):
        load_spec_file(str(tmp_path / "d.yaml"))


def test_load_yml_and_bom(tmp_path):
    (tmp_path / "a.yml").write_bytes(b"\xef\xbb\xbfcdiVersion: 0.3.0\nkind: a/b\n")
    assert load_spec_file(str(tmp_path / "a.yml")) == {"cdiVersion": "0.3.0", "kind": "a/b"}


def test_yaml_merge_keys_are_not_duplicates(tmp_path):
    text = "base: &b {env: [A=1]}\nedits:\n  <<: *b\n  mounts: []\n"
    (tmp_path / "m.yaml").write_text(text)
    assert load_spec_file(str(tmp_path / "m.yaml"))["edits"] == {"env": ["A=1"], "mounts": []}


def test_spec_from_edits_round_trips_through_yaml_and_json(tmp_path):
    common = ContainerEdits(
        env=["NVIDIA_VISIBLE_DEVICES=void"],
        device_nodes=[DeviceNode("/dev/nvidiactl", major=195, minor=255)],
        mounts=[
            Mount("/run/nvidia/driver/usr/lib/libcuda.so.550.90.12",
                  "/usr/lib/libcuda.so.550.90.12", ("ro", "nosuid", "nodev", "bind")),
        ],
        hooks=[hook_entry("/usr/local/bin/nvshim-hook", "createContainer", "update-ldcache")],
    )  # fmt: skip
    devices = [
        ("0", ContainerEdits(device_nodes=[DeviceNode("/dev/nvidia0", "/run/d/dev/nvidia0")])),
        ("1:0", ContainerEdits(device_nodes=[DeviceNode("/dev/nvidia-caps/nvidia-cap21")])),
    ]
    spec = {
        "kind": "nvidia.com/gpu",
        "containerEdits": common.to_cdi(),
        "devices": [{"name": n, "containerEdits": e.to_cdi()} for n, e in devices],
    }
    spec = {"cdiVersion": spec_min_version(spec), **spec}
    assert spec["cdiVersion"] == "0.5.0"
    assert spec["containerEdits"]["hooks"][0]["env"] == list(hook_env())
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    (tmp_path / "s.json").write_text(json.dumps(spec, indent=2))
    loaded = [load_spec_file(str(tmp_path / n)) for n in ("s.yaml", "s.json")]
    assert loaded == [spec, spec]
    assert validate_files([str(tmp_path / "s.yaml"), str(tmp_path / "s.json")]) == []
    # And back into the edits type unchanged.
    assert ContainerEdits.from_cdi(loaded[0]["containerEdits"]) == common


# -- a real consumer: podman ------------------------------------------------------------------

needs_podman = pytest.mark.skipif(
    shutil.which("podman") is None or os.geteuid() != 0, reason="needs podman and root"
)


def _podman_cdi_ceiling() -> str:
    """The newest cdiVersion the installed podman loads (4.3 embeds CDI 0.5.x: 0.5.0)."""
    out = subprocess.run(["podman", "--version"], capture_output=True, text=True).stdout
    major, minor = (int(x) for x in re.search(r"(\d+)\.(\d+)", out).groups())
    return "0.5.0" if (major, minor) <= (4, 3) else KNOWN_NEWEST


KNOWN_NEWEST = "1.1.0"


@pytest.fixture(scope="module")
def rootfs(tmp_path_factory):
    return make_busybox_rootfs(tmp_path_factory.mktemp("rootfs"))


def _expected_in_container(spec):
    """env lines, device nodes (path -> (major, minor)) and mount targets all devices give."""
    edits = [spec.get("containerEdits") or {}] + [d["containerEdits"] for d in spec["devices"]]
    env, nodes, mounts = set(), {}, set()
    for e in edits:
        env.update(e.get("env") or ())
        for node in e.get("deviceNodes") or ():
            if "major" in node:
                nodes[node["path"]] = (node["major"], node["minor"])
            else:
                st = os.stat(node.get("hostPath") or node["path"])
                nodes[node["path"]] = (os.major(st.st_rdev), os.minor(st.st_rdev))
        mounts.update(m["containerPath"] for m in e.get("mounts") or ())
    return env, nodes, mounts


@needs_podman
@pytest.mark.parametrize("path", VALID, ids=os.path.basename)
def test_podman_accepts_valid_corpus(tmp_path, rootfs, path):
    spec = load_spec_file(path)
    cdi_dir = tmp_path / "cdi"
    cdi_dir.mkdir()
    shutil.copy(path, cdi_dir)
    env, nodes, mounts = _expected_in_container(spec)
    script = "echo START; env; echo ---; "
    script += "".join(f'stat -c "%n|%F|%t|%T" {shlex.quote(p)}; ' for p in sorted(nodes))
    script += "echo ---; "
    script += "".join(f"test -e {shlex.quote(m)} && echo {shlex.quote(m)}; " for m in mounts)
    device_args = []
    for device in spec["devices"]:
        device_args += ["--device", f"{spec['kind']}={device['name']}"]
    result = podman_run(
        tmp_path, rootfs, [*device_args, "--", "/bin/sh", "-c", script], str(cdi_dir)
    )
    if version_key(spec["cdiVersion"]) > version_key(_podman_cdi_ceiling()):
        # podman 4.3.1 skips such a spec silently: the device is then unknown to it.
        assert result.returncode != 0
        assert "START" not in result.stdout
        assert re.search(r"unresolvable CDI devices|no such file or directory", result.stderr)
        return
    assert result.returncode == 0, result.stderr
    env_out, nodes_out, mounts_out = result.stdout.split("START\n", 1)[1].split("---\n")
    assert env <= set(env_out.splitlines())
    seen = {}
    for line in nodes_out.splitlines():
        name, kind, major, minor = line.split("|")
        assert kind == "character special file"
        seen[name] = (int(major, 16), int(minor, 16))
    assert seen == nodes
    assert set(mounts_out.splitlines()) == mounts


@needs_podman
def test_podman_run_sees_host_run_only_where_kept(tmp_path, rootfs):
    host_dir = tempfile.mkdtemp(prefix="nvshim-test-", dir="/run")
    try:
        for name in ("kept", "hidden"):
            os.makedirs(os.path.join(host_dir, name))
            with open(os.path.join(host_dir, name, "file"), "w") as fh:
                fh.write(f"{name} content\n")
        cdi_dir = tmp_path / "cdi"
        cdi_dir.mkdir()
        results = {}
        for name in ("kept", "hidden"):
            mount = {
                "hostPath": f"{host_dir}/{name}/file",
                "containerPath": "/opt/file",
                "options": ["ro", "bind"],
            }
            spec = {
                "cdiVersion": "0.3.0",
                "kind": "example.com/run",
                "devices": [{"name": name, "containerEdits": {"mounts": [mount]}}],
            }
            (cdi_dir / f"{name}.json").write_text(json.dumps(spec))
            assert validate_files([str(cdi_dir / f"{name}.json")]) == []
            args = ["--device", f"example.com/run={name}", "--", "/bin/cat", "/opt/file"]
            results[name] = podman_run(
                tmp_path, rootfs, args, str(cdi_dir), keep_run=[f"{host_dir}/kept"]
            )
        assert results["kept"].returncode == 0, results["kept"].stderr
        assert results["kept"].stdout == "kept content\n"
        assert results["hidden"].returncode != 0
        assert "hidden/file" in results["hidden"].stderr
    finally:
        shutil.rmtree(host_dir)


def test_the_inlined_schema_judges_as_jsonschema_resolving_its_references():
    """nvshim inlines the schema's ``$ref``s once (jsonschema resolving each at every use
    took most of a large spec's validation): on every corpus file the errors are those of
    jsonschema's own validator resolving the two schema files' references."""
    from bench.cdi_validate import resolving_validator
    from nvshim.cdi import validate

    resolving = resolving_validator()
    inlined = validate._schema_validator()

    def errors(validator, data):
        found = validator.iter_errors(data)
        return sorted((list(map(str, e.absolute_path)), e.message) for e in found)

    judged = 0
    for path in VALID + INVALID:
        try:
            data = load_spec_file(path)
        except NvshimError:
            continue  # a syntax error: no schema to apply
        assert errors(inlined, data) == errors(resolving, data), path
        judged += bool(errors(resolving, data))
    assert judged >= 5  # the corpus holds schema violations, not only valid specs
