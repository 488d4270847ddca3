"""Request parsing: NVIDIA_VISIBLE_DEVICES grammar, CDI annotations, /dev/null mounts,
the env policy, and hostile config.json shapes."""

import json
import subprocess
import sys

import pytest

from nvshim.config import PolicyConfig
from nvshim.errors import NvshimError
from nvshim.policy.request import (
    DeviceList,
    RequestError,
    is_privileged,
    parse_visible_devices,
    request_from_spec,
)

U0 = "GPU-8f6a2c1e-0b3d-4e5f-9a7b-1c2d3e4f5a60"
M0 = "MIG-4b1e9d2a-7c3f-5e6a-8b9c-0d1e2f3a4b5c"
POLICY = PolicyConfig()


# --- NVIDIA_VISIBLE_DEVICES grammar -------------------------------------------------------


@pytest.mark.parametrize(
    "value, kind, ids",
    [
        (None, "unset", ()),
        ("", "void", ()),
        ("   ", "void", ()),
        (" , ,", "void", ()),
        ("void", "void", ()),
        ("none", "none", ()),
        (" none ", "none", ()),
        ("all", "all", ()),
        ("0,all", "all", ()),
        ("0", "list", ("0",)),
        ("0,1,2", "list", ("0", "1", "2")),
        (" 2 , 0 ", "list", ("2", "0")),
        ("007", "list", ("7",)),
        ("1,1,0,1", "list", ("1", "0")),
        ("0,,1,", "list", ("0", "1")),
        (U0, "list", (U0,)),
        ("0:1", "list", ("0:1",)),
        ("00:01", "list", ("0:1",)),
        (M0, "list", (M0,)),
        (f"MIG-{U0}/3/0", "list", (f"MIG-{U0}/3/0",)),
        (f"MIG-{U0}/03/00", "list", (f"MIG-{U0}/3/0",)),
        # replica ids from time-slicing: suffix stripped, duplicates folded in order
        ("0::0,0::1,1::0,0::2", "list", ("0", "1")),
        (f"{U0}::3,{U0}::4", "list", (U0,)),
        ("0:1::2", "list", ("0:1",)),
        (f"{M0}::1,1", "list", (M0, "1")),
    ],
)
def test_visible_devices_grammar(value, kind, ids):
    parsed = parse_visible_devices(value)
    assert (parsed.kind, parsed.ids) == (kind, ids)


@pytest.mark.parametrize(
    "value, shown",
    [
        ("../../etc", "../../etc"),
        ("/", "/"),
        ("0,/dev/sda", "/dev/sda"),
        ("GPU-../../x", "GPU-../../x"),
        ("GPU-", "GPU-"),
        ("MIG-", "MIG-"),
        ("0\x00", "\\x00"),
        ("0\n1", "\\n"),
        ("-1", "-1"),
        ("1.5", "1.5"),
        ("ALL", "ALL"),
        ("gpu0", "gpu0"),
        ("0:", "0:"),
        (":1", ":1"),
        ("0:1:2", "0:1:2"),
        ("0::", "0::"),
        ("0::x", "0::x"),
        ("::1", "::1"),
        (f"MIG-{U0}/1", f"MIG-{U0}/1"),
        (f"MIG-{U0}/1/2/3", f"MIG-{U0}/1/2/3"),
        (f"MIG-{U0}/../2", "/../2"),
        ("MIG-abc/1/2", "MIG-abc/1/2"),
        ("1234567890", "1234567890"),  # index with more than 9 digits
        ("GPU-" + "a" * 200, "longer than 128"),
        ("0,none", "none"),
        ("void,1", "void"),
    ],
)
def test_visible_devices_rejects_bad_ids(value, shown):
    with pytest.raises(RequestError) as err:
        parse_visible_devices(value)
    message = str(err.value)
    assert message.startswith("NVIDIA_VISIBLE_DEVICES")
    assert shown in message
    assert "\n" not in message and "\x00" not in message
    assert isinstance(err.value, NvshimError)


def test_visible_devices_value_size_is_capped():
    with pytest.raises(RequestError, match="longer than 65536 bytes"):
        parse_visible_devices("0," * 40000)
    # just under the cap still parses (and de-duplicates)
    assert parse_visible_devices(",".join(["1"] * 30000)).ids == ("1",)


def test_error_message_bounds_hostile_ids():
    with pytest.raises(RequestError) as err:
        parse_visible_devices("x" * 100 + "/")
    assert len(str(err.value)) < 200


# --- privilege ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec, expected",
    [
        ({"process": {"capabilities": {"bounding": ["CAP_CHOWN", "CAP_SYS_ADMIN"]}}}, True),
        ({"process": {"capabilities": {"bounding": ["CAP_CHOWN"]}}}, False),
        # effective/permitted do not count: the reference looks at the bounding set
        ({"process": {"capabilities": {"effective": ["CAP_SYS_ADMIN"]}}}, False),
        ({"process": {"capabilities": {"bounding": "CAP_SYS_ADMIN"}}}, False),
        ({"process": {"capabilities": ["CAP_SYS_ADMIN"]}}, False),
        ({"process": None}, False),
        ({}, False),
    ],
)
def test_is_privileged(spec, expected):
    assert is_privileged(spec) is expected


# --- request_from_spec ----------------------------------------------------------------------

UNPRIV = ["CAP_CHOWN", "CAP_KILL"]
PRIV = ["CAP_CHOWN", "CAP_SYS_ADMIN"]


def spec_with(env=(), bounding=UNPRIV, annotations=None, mounts=None):
    spec = {
        "ociVersion": "1.0.2",
        "process": {"env": list(env), "capabilities": {"bounding": list(bounding)}},
        "root": {"path": "rootfs"},
    }
    if annotations is not None:
        spec["annotations"] = annotations
    if mounts is not None:
        spec["mounts"] = mounts
    return spec


def policy(**changes):
    return PolicyConfig(**changes)


def null_mount(destination, source="/dev/null"):
    return {"destination": destination, "type": "bind", "source": source, "options": ["ro"]}


@pytest.mark.parametrize(
    "env, bounding, pol, expected",
    [
        # not GPU containers
        ([], UNPRIV, {}, None),
        (["PATH=/bin"], PRIV, {}, None),
        (["NVIDIA_VISIBLE_DEVICES="], PRIV, {}, None),
        (["NVIDIA_VISIBLE_DEVICES=void"], PRIV, {}, None),
        (["NVIDIA_VISIBLE_DEVICES=void"], UNPRIV, {}, None),
        # legacy only when NVIDIA_VISIBLE_DEVICES is unset and NVIDIA_REQUIRE_CUDA empty
        (["CUDA_VERSION=12.4.1", "NVIDIA_VISIBLE_DEVICES=void"], PRIV, {}, None),
        (["CUDA_VERSION="], PRIV, {}, None),
        (["CUDA_VERSION=12.4.1", "NVIDIA_REQUIRE_CUDA=cuda>=12.4"], PRIV, {}, None),
        # privileged: env honoured
        (["NVIDIA_VISIBLE_DEVICES=all"], PRIV, {}, ("env", "all", (), None)),
        (["NVIDIA_VISIBLE_DEVICES=none"], PRIV, {}, ("env", "none", (), None)),
        (["NVIDIA_VISIBLE_DEVICES=1,0::1"], PRIV, {}, ("env", "list", ("1", "0"), None)),
        (["CUDA_VERSION=11.0"], PRIV, {}, ("legacy", "all", (), None)),
        (["CUDA_VERSION=11.0", "NVIDIA_REQUIRE_CUDA="], PRIV, {}, ("legacy", "all", (), None)),
        # unprivileged under the default policy: denied, nothing given
        (["NVIDIA_VISIBLE_DEVICES=all"], UNPRIV, {}, ("env", "void", (), "all")),
        (["NVIDIA_VISIBLE_DEVICES=none"], UNPRIV, {}, ("env", "void", (), "none")),
        (
            ["NVIDIA_VISIBLE_DEVICES=0:1"],
            UNPRIV,
            {"fail_refused_env": False},
            ("env", "void", (), "0:1"),
        ),
        (["CUDA_VERSION=11.0"], UNPRIV, {}, ("legacy", "void", (), "legacy CUDA image")),
        # a malformed env request that would be denied anyway does not fail the container
        (["NVIDIA_VISIBLE_DEVICES=../../etc"], UNPRIV, {}, ("env", "void", (), "../../etc")),
        # unprivileged with accept-env-unprivileged
        (
            ["NVIDIA_VISIBLE_DEVICES=0"],
            UNPRIV,
            {"accept_env_unprivileged": True},
            ("env", "list", ("0",), None),
        ),
        (
            ["CUDA_VERSION=11.0"],
            UNPRIV,
            {"accept_env_unprivileged": True},
            ("legacy", "all", (), None),
        ),
        # later entries win, like execve
        (
            ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=void"],
            PRIV,
            {},
            None,
        ),
        (
            ["NVIDIA_VISIBLE_DEVICES=void", "NVIDIA_VISIBLE_DEVICES=2"],
            PRIV,
            {},
            ("env", "list", ("2",), None),
        ),
    ],
)
def test_env_requests_and_policy(env, bounding, pol, expected):
    request = request_from_spec(spec_with(env, bounding), policy(**pol))
    if expected is None:
        assert request is None
        return
    source, kind, ids, denied = expected
    assert (request.source, request.devices.kind, request.devices.ids) == (source, kind, ids)
    assert request.privileged is (bounding is PRIV)
    if denied is None:
        assert request.denied is None
    else:
        assert denied in request.denied
        assert "accept-env-unprivileged" in request.denied


@pytest.mark.parametrize("value", ["1", "GPU-0e2c1a84-5b8e-4c7e-9f0a-3d1b2c4e5f60", "0:1,2"])
def test_refused_env_request_naming_devices_fails_the_container(value):
    """The device plugin's envvar strategy names devices: refusing it silently would give
    a pod without its GPU and no error at the pod, so the create fails with the reason."""
    spec = spec_with([f"NVIDIA_VISIBLE_DEVICES={value}"], UNPRIV)
    with pytest.raises(RequestError) as err:
        request_from_spec(spec, POLICY)
    assert f"NVIDIA_VISIBLE_DEVICES={value!r} not honoured" in str(err.value)
    assert "volume-mounts" in str(err.value) and "accept-env-unprivileged" in str(err.value)
    assert "\n" not in str(err.value)
    # honoured where the policy lets it through: privileged, or accept-env-unprivileged
    assert request_from_spec(spec_with([f"NVIDIA_VISIBLE_DEVICES={value}"], PRIV), POLICY)
    allowed = request_from_spec(spec, policy(accept_env_unprivileged=True))
    assert allowed.denied is None


@pytest.mark.parametrize(
    "annotations",
    [
        {"io.kubernetes.cri.container-type": "sandbox"},
        {"io.kubernetes.cri-o.ContainerType": "sandbox"},
    ],
)
def test_a_pod_sandbox_never_asks(annotations):
    """Pod annotations an engine passes through (containerd's pod_annotations) reach the
    pause container too: it gets nothing, whatever it carries."""
    annotations = {**annotations, "cdi.k8s.io/gpu": "nvidia.com/gpu=0"}
    spec = spec_with(["NVIDIA_VISIBLE_DEVICES=all"], PRIV)
    spec["annotations"] = annotations
    assert request_from_spec(spec, POLICY) is None
    # the same annotation on a container (type "container") is a request
    spec["annotations"] = {**annotations, "io.kubernetes.cri.container-type": "container"}
    spec["annotations"].pop("io.kubernetes.cri-o.ContainerType", None)
    assert request_from_spec(spec, POLICY).source == "cdi"


def test_malformed_env_request_fails_when_it_would_be_honoured():
    with pytest.raises(RequestError, match=r"\.\./\.\./etc"):
        request_from_spec(spec_with(["NVIDIA_VISIBLE_DEVICES=../../etc"], PRIV), POLICY)


def test_request_fields_from_env():
    env = [
        "NVIDIA_VISIBLE_DEVICES=0",
        "NVIDIA_DRIVER_CAPABILITIES=video,compute,bogus",
        "NVIDIA_REQUIRE_CUDA=cuda>=12.0",
        "NVIDIA_REQUIRE_ARCH=arch>=8.0",
        "NVIDIA_DISABLE_REQUIRE=Yes",
        "NOEQUALS",
        "=novar",
        "A=1=2",
    ]
    request = request_from_spec(spec_with(env, PRIV), POLICY)
    assert request.capabilities == ("compute", "video")
    assert any("bogus" in w for w in request.warnings)
    assert request.requirements == {
        "NVIDIA_REQUIRE_CUDA": "cuda>=12.0",
        "NVIDIA_REQUIRE_ARCH": "arch>=8.0",
    }
    assert request.disable_require is True
    assert request.env["A"] == "1=2"
    assert "NOEQUALS" not in request.env and "" not in request.env


@pytest.mark.parametrize(
    "value, disabled",
    [
        ("true", True),
        ("1", True),
        ("YES", True),
        (" yes ", True),
        ("false", False),
        ("0", False),
        ("", False),
        ("on", False),
    ],
)
def test_disable_require_words(value, disabled):
    env = ["NVIDIA_VISIBLE_DEVICES=0", f"NVIDIA_DISABLE_REQUIRE={value}"]
    assert request_from_spec(spec_with(env, PRIV), POLICY).disable_require is disabled


def test_capabilities_default_from_policy():
    env = ["NVIDIA_VISIBLE_DEVICES=0"]
    request = request_from_spec(spec_with(env, PRIV), policy(default_capabilities="utility"))
    assert request.capabilities == ("utility",)
    request = request_from_spec(spec_with(env, PRIV), POLICY)
    assert request.capabilities == ("compute", "utility")


# --- CDI annotations ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "annotations, kind, ids",
    [
        ({"cdi.k8s.io/plugin_dev": "nvidia.com/gpu=0"}, "list", ("0",)),
        ({"cdi.k8s.io/a": "nvidia.com/gpu=0, nvidia.com/gpu=GPU-ab12"}, "list", ("0", "GPU-ab12")),
        (
            {"cdi.k8s.io/a": "nvidia.com/gpu=1", "cdi.k8s.io/b": "nvidia.com/gpu=1:0"},
            "list",
            ("1", "1:0"),
        ),
        ({"cdi.k8s.io/a": "nvidia.com/gpu=all"}, "all", ()),
        ({"cdi.k8s.io/a": "nvidia.com/gpu=0::3"}, "list", ("0",)),
        # another vendor's devices are ignored; ours beside them are taken
        ({"cdi.k8s.io/a": "amd.com/gpu=0,nvidia.com/gpu=2"}, "list", ("2",)),
    ],
)
def test_cdi_annotations(annotations, kind, ids):
    # env asks for something else: CDI wins, even for an unprivileged container
    spec = spec_with(["NVIDIA_VISIBLE_DEVICES=all"], UNPRIV, annotations=annotations)
    request = request_from_spec(spec, POLICY)
    assert (request.source, request.devices.kind, request.devices.ids) == ("cdi", kind, ids)
    assert request.denied is None


@pytest.mark.parametrize(
    "value,names",
    [
        ("amd.com/gpu=0", ("amd.com/gpu=0",)),
        ("nvidia.com/nic=0", ("nvidia.com/nic=0",)),  # another class
        (
            "k8s.device-plugin.nvidia.com/gpu=GPU-1, k8s.device-plugin.nvidia.com/gpu=GPU-1",
            ("k8s.device-plugin.nvidia.com/gpu=GPU-1",),
        ),
    ],
)
def test_cdi_names_of_other_vendors_are_requests(value, names):
    """Issue 27: a CDI name of any vendor is a request (resolved later from the spec
    directories, nvshim.policy.cdinames), never dropped."""
    spec = spec_with([], UNPRIV)
    spec["annotations"] = {"cdi.k8s.io/nvidia-device-plugin_GPU-1": value}
    request = request_from_spec(spec, POLICY)
    assert (request.source, request.devices.kind, request.devices.ids) == ("cdi", "list", ())
    assert request.cdi_names == names


@pytest.mark.parametrize(
    "value",
    ["nvidia.com/gpu", "nvidia.com/gpu=", "acme/x=../../etc", "=0", "a/b=c d", "x/y=0,"],
)
def test_annotation_that_is_not_a_cdi_name_is_refused(value):
    spec = spec_with([], UNPRIV)
    spec["annotations"] = {"cdi.k8s.io/a": value}
    with pytest.raises(RequestError, match="CDI device"):
        request_from_spec(spec, POLICY)


def test_engine_injected_gpu_nodes_are_a_request_unless_privileged():
    """GPU and MIG capability nodes the engine put in linux.devices (its own CDI, device
    specs) are what the container asks for; a privileged container's list holds every
    node of the host, so it says nothing."""
    spec = spec_with(["NVIDIA_VISIBLE_DEVICES=void"], UNPRIV)
    spec["linux"] = {"devices": [
        {"path": "/dev/nvidia3", "type": "c", "major": 195, "minor": 3},
        {"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255},
        {"path": "/dev/nvidia-caps/nvidia-cap21", "type": "c", "major": 240, "minor": 21},
        {"path": "/dev/nvidia3x", "type": "c"},
        "junk",
    ]}  # fmt: skip
    request = request_from_spec(spec, POLICY)
    assert request.source == "engine"
    assert request.device_nodes == ("/dev/nvidia3", "/dev/nvidia-caps/nvidia-cap21")
    spec["process"]["capabilities"] = {"bounding": ["CAP_SYS_ADMIN"]}
    assert request_from_spec(spec, POLICY) is None


@pytest.mark.parametrize(
    "annotations",
    [
        {"other.io/a": "nvidia.com/gpu=0"},  # not a CDI prefix
        {"cdi.k8s.io/a": 5},  # wrong value type
        {"cdi.k8s.io/a": ["nvidia.com/gpu=0"]},
        "nvidia.com/gpu=0",  # annotations not an object
        None,
    ],
)
def test_annotations_that_are_not_ours_fall_through(annotations):
    spec = spec_with([], PRIV)
    spec["annotations"] = annotations
    assert request_from_spec(spec, POLICY) is None
    spec["process"]["env"] = ["NVIDIA_VISIBLE_DEVICES=3"]
    assert request_from_spec(spec, POLICY).source == "env"


@pytest.mark.parametrize(
    "value, shown",
    [
        ("nvidia.com/gpu=../../etc", "../../etc"),
        ("nvidia.com/gpu=", "must have the form vendor/class=name"),
        ("nvidia.com/gpu=0,nvidia.com/gpu=/x", "/x"),
        ("nvidia.com/gpu=void", "'void' is not a device name"),
        ("nvidia.com/gpu=none", "'none' is not a device name"),
        ("nvidia.com/gpu=" + "1," * 40000, "longer than 65536"),
    ],
)
def test_bad_cdi_names_raise(value, shown):
    spec = spec_with([], UNPRIV, annotations={"cdi.k8s.io/x": value})
    with pytest.raises(RequestError) as err:
        request_from_spec(spec, POLICY)
    assert shown in str(err.value) and "annotation" in str(err.value)


def test_annotation_prefixes_vendor_and_class_come_from_policy():
    spec = spec_with([], UNPRIV, annotations={"example.org/devs": "acme.io/accel=3"})
    assert request_from_spec(spec, POLICY) is None
    pol = policy(cdi_annotation_prefixes=["example.org/"], cdi_vendor="acme.io", cdi_class="accel")
    assert request_from_spec(spec, pol).devices.ids == ("3",)


# --- /dev/null volume mounts ----------------------------------------------------------------


@pytest.mark.parametrize(
    "mounts, ids",
    [
        ([null_mount("/var/run/nvidia-container-devices/0")], ("0",)),
        (
            [
                null_mount("/var/run/nvidia-container-devices/GPU-ab12"),
                null_mount("/var/run/nvidia-container-devices/1::2"),
                null_mount("/var/run/nvidia-container-devices/1::3"),
            ],
            ("GPU-ab12", "1"),
        ),
        ([null_mount("//var/run/./nvidia-container-devices//0/")], ("0",)),
        ([null_mount("/var/run/nvidia-container-devices/0", source="//dev/./null")], ("0",)),
        # mounts that are not device mounts are ignored
        (
            [
                null_mount("/etc/x"),
                null_mount("/var/run/nvidia-container-devices/0", source="/tmp/null"),
                "garbage",
                {"destination": 5, "source": "/dev/null"},
                null_mount("/var/run/nvidia-container-devices/2"),
            ],
            ("2",),
        ),
    ],
)
def test_volume_mount_requests(mounts, ids):
    spec = spec_with(["NVIDIA_VISIBLE_DEVICES=all"], UNPRIV, mounts=mounts)
    request = request_from_spec(spec, POLICY)
    assert (request.source, request.devices.ids, request.denied) == ("mounts", ids, None)


def test_volume_mount_all():
    spec = spec_with([], UNPRIV, mounts=[null_mount("/var/run/nvidia-container-devices/all")])
    assert request_from_spec(spec, POLICY).devices.kind == "all"


@pytest.mark.parametrize(
    "destination, shown",
    [
        ("/var/run/nvidia-container-devices/../../x", "'..'"),
        ("/var/run/nvidia-container-devices/0/..", "'..'"),
        ("/tmp/../var/run/nvidia-container-devices/0", "'..'"),
        ("/var/run/nvidia-container-devices/0/1", "must be"),
        ("/var/run/nvidia-container-devices", "must be"),
        ("/run/nvidia-container-devices/0", "must be"),
        ("/var/run/nvidia-container-devicesX/0", "must be"),
        ("/var/run/nvidia-container-devices/..x", "invalid device id"),
        ("/var/run/nvidia-container-devices/void", "not a device name"),
    ],
)
def test_hostile_volume_mounts_raise(destination, shown):
    spec = spec_with([], UNPRIV, mounts=[null_mount(destination)])
    with pytest.raises(RequestError) as err:
        request_from_spec(spec, POLICY)
    assert shown in str(err.value)


def test_volume_mounts_ignored_when_policy_says_so():
    mounts = [null_mount("/var/run/nvidia-container-devices/../../x")]
    spec = spec_with([], UNPRIV, mounts=mounts)
    assert request_from_spec(spec, policy(accept_volume_mounts=False)) is None


# --- hostile spec shapes --------------------------------------------------------------------


@pytest.mark.parametrize(
    "mutate",
    [
        lambda s: s.update(process="x"),
        lambda s: s["process"].update(env="NVIDIA_VISIBLE_DEVICES=all"),
        lambda s: s["process"].update(env=[1, None, ["NVIDIA_VISIBLE_DEVICES=all"]]),
        lambda s: s["process"].update(env={"NVIDIA_VISIBLE_DEVICES": "all"}),
        lambda s: s.update(annotations=[1, 2]),
        lambda s: s.update(annotations={1: "nvidia.com/gpu=0"}),
        lambda s: s.update(mounts={"destination": "/var/run/nvidia-container-devices/0"}),
        lambda s: s.update(mounts=[None, 3, []]),
    ],
)
def test_wrong_types_are_treated_as_absent(mutate):
    spec = spec_with([], PRIV)
    mutate(spec)
    assert request_from_spec(spec, POLICY) is None


def test_spec_not_an_object_raises():
    with pytest.raises(RequestError):
        request_from_spec(["not", "a", "spec"], POLICY)


def test_device_list_str():
    assert str(DeviceList("list", ("0", "1:0"))) == "0,1:0"
    assert str(DeviceList("all")) == "all"


def test_policy_modules_import_only_stdlib_and_nvshim():
    """Under ``python -I -S`` the policy modules load without site-packages."""
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "import nvshim.policy.request, nvshim.policy.capabilities, nvshim.policy.require\n"
        "import nvshim.policy.cuda_table, nvshim.policy.visible, nvshim.policy.resolve\n"
        "new = sorted(m.split('.')[0] for m in set(sys.modules) - before)\n"
        "std = sys.stdlib_module_names\n"
        "print(sorted({m for m in new if m not in std and m != 'nvshim'}))\n"
    )
    import os

    import nvshim

    root = os.path.dirname(os.path.dirname(nvshim.__file__))
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", f"import sys; sys.path.insert(0, {root!r})\n" + code],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "[]"


def test_raw_ids_keep_replica_suffixes_for_every_source():
    from nvshim.policy.request import request_from_spec

    policy = PolicyConfig(accept_env_unprivileged=True)
    spec = {"annotations": {"cdi.k8s.io/x": "nvidia.com/gpu=GPU-a::0,nvidia.com/gpu=GPU-a::1"}}
    req = request_from_spec(spec, policy)
    assert req.devices.ids == ("GPU-a",)
    assert req.raw_ids == ("GPU-a::0", "GPU-a::1")
    spec = {"process": {"env": ["NVIDIA_VISIBLE_DEVICES=0::1, 0::2"]}}
    assert request_from_spec(spec, policy).raw_ids == ("0::1", "0::2")
    spec = {"process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]}}
    assert request_from_spec(spec, policy).raw_ids is None


# --- the sh front's trigger words (nvshim.runtime.front greps config.json for them) ------

KINDS = {
    "default": {},
    "other kind": {"cdi_vendor": "acme.io", "cdi_class": "accel"},
    "kind Go escapes": {"cdi_vendor": "a&b<c>.io", "cdi_class": "dév"},
    "kind with a quote": {"cdi_vendor": 'we"ird', "cdi_class": "x\\y"},
}
DEV_MOUNT = "/var/run/nvidia-container-devices/"


def _asking_specs(pol: PolicyConfig):
    """Specs that ask for something under ``pol``: every source, with the variants that
    make request_from_spec return a request or raise."""
    kind = f"{pol.cdi_vendor}/{pol.cdi_class}"
    for bounding in (PRIV, UNPRIV):
        for value in ("all", "0", "none", "0,1", "bad id", "GPU-x::1"):
            yield spec_with([f"NVIDIA_VISIBLE_DEVICES={value}"], bounding)
        yield spec_with(["CUDA_VERSION=12.2"], bounding)
        yield spec_with(["PATH=/bin", "CUDA_VERSION=11.0", "A=b"], bounding)
    for value in (
        f"{kind}=0",
        f" {kind}=all ",
        f"amd.com/gpu=0,{kind}=1",
        f"{kind}=",
        f"{kind}=/x",
    ):
        for key in ("cdi.k8s.io/x", "cdi.k8s.io/"):
            yield spec_with([], UNPRIV, annotations={key: value})
    for dest in (
        DEV_MOUNT + "0",
        "//var/./run/nvidia-container-devices//GPU-a",
        DEV_MOUNT + "../x",
    ):
        for source in ("/dev/null", "//dev/./null"):
            yield spec_with([], UNPRIV, mounts=[null_mount(dest, source)])
    rdma = {"nvshim.io/rdma": "true"}
    yield spec_with(["NVIDIA_VISIBLE_DEVICES=0", "NVSHIM_RDMA=1"], PRIV, annotations=rdma)


def _json_string(text: str, rng, rate: float) -> str:
    """``text`` as a JSON string, characters escaped at random in each way JSON allows
    (``\\uXXXX`` at ``rate``, ``\\/``, the short forms), as any encoder might write it."""
    out = ['"']
    for ch in text:
        short = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(ch)
        if short or ord(ch) < 0x20:
            out.append(short if short and rng.random() < 0.5 else f"\\u{ord(ch):04x}")
        elif ch == "/" and rng.random() < 0.3:
            out.append("\\/")
        elif rng.random() < rate:
            out.append(f"\\u{ord(ch):04X}" if ord(ch) < 0x10000 else ch)
        else:
            out.append(ch)
    return "".join(out) + '"'


def _random_json(value, rng, rate: float) -> str:
    if isinstance(value, str):
        return _json_string(value, rng, rate)
    if isinstance(value, dict):
        items = (
            f"{_json_string(k, rng, rate)}:{_random_json(v, rng, rate)}" for k, v in value.items()
        )
        return "{" + ",".join(items) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_random_json(v, rng, rate) for v in value) + "]"
    return json.dumps(value)


def _encodings(spec, rng):
    yield json.dumps(spec)
    yield json.dumps(spec, ensure_ascii=False, indent=1)
    yield json.dumps(spec, separators=(",", ":")).replace("&", "\\u0026").replace("<", "\\u003c")
    yield json.dumps(spec, ensure_ascii=False).replace("/", "\\/")
    for _ in range(20):
        yield _random_json(spec, rng, rng.choice((0, 0.02, 0.1)))


@pytest.mark.parametrize("changes", KINDS.values(), ids=KINDS.keys())
@pytest.mark.parametrize("env_unprivileged", (False, True))
def test_every_request_has_a_trigger_word(changes, env_unprivileged):
    """The front may skip Python only when none of the words is in config.json: every
    spec request_from_spec turns into a request (or refuses), however it is encoded,
    holds one of them in its text."""
    import random

    from nvshim import fastjson
    from nvshim.policy.request import request_triggers

    pol = policy(accept_env_unprivileged=env_unprivileged, **changes)
    words = request_triggers(pol)
    rng = random.Random(12)
    checked = 0
    for spec in _asking_specs(pol):
        try:
            asked = request_from_spec(spec, pol) is not None
        except RequestError:
            asked = True
        assert asked, spec
        for text in _encodings(spec, rng):
            assert fastjson.loads(text.encode()) == spec  # the runtime reads the same spec
            assert any(w in text for w in words), text
            checked += 1
    assert checked > 500


def test_trigger_words_leave_plain_specs_alone():
    """What the front exists for: runc's own default spec, and one with annotations and
    an env of a CRI container asking for no GPU, has none of the words."""
    from nvshim.policy.request import request_triggers
    from tests.runc_util import runc_spec

    spec = runc_spec()
    spec["process"]["env"] += ["HOSTNAME=pod", "KUBERNETES_SERVICE_HOST=10.0.0.1"]
    spec["annotations"] = {
        "io.kubernetes.cri.container-type": "sandbox",
        "io.kubernetes.cri.sandbox-name": "web-0",
        "io.containerd.cri.runtime-handler": "nvshim",
    }
    text = json.dumps(spec, indent=1)
    assert request_from_spec(spec, POLICY) is None
    assert not any(w in text for w in request_triggers(POLICY))
    assert not any(w in json.dumps(runc_spec()) for w in request_triggers(POLICY))


def test_trigger_words_name_the_configured_kind():
    from nvshim.policy.request import request_triggers

    assert "nvidia.com/gpu" in request_triggers(POLICY)
    acme = request_triggers(policy(cdi_vendor="acme.io", cdi_class="accel"))
    assert "acme.io/accel" in acme and "nvidia.com/gpu" not in acme
    assert "\\" in request_triggers(policy(cdi_class='g"pu'))


def test_spec_text_is_utf8_only(tmp_path):
    """The front greps the bytes: a spec in another encoding (UTF-16 hides every ASCII
    word behind NUL bytes) must be one the runtime refuses to read, not one it edits."""
    from nvshim.oci.bundle import load_spec

    spec = spec_with(["NVIDIA_VISIBLE_DEVICES=all"], PRIV)
    for codec in ("utf-16", "utf-16-le", "utf-32"):
        (tmp_path / "config.json").write_bytes(json.dumps(spec).encode(codec))
        with pytest.raises(NvshimError, match="config.json"):
            load_spec(str(tmp_path))
