"""CDI name rules: vendor, class, device names, kinds and fully qualified names."""

import pytest

from nvshim.cdi.names import (
    CLASS_RE,
    DEVICE_RE,
    VENDOR_RE,
    parse_kind,
    parse_qualified_name,
    qualified_name,
    quote,
    validate_class,
    validate_device_name,
    validate_vendor,
    why_invalid,
)


@pytest.mark.parametrize(
    "vendor",
    ["nvidia.com", "a", "Z9", "example-vendor_1.io", "k8s.io"],
)
def test_valid_vendor(vendor):
    assert validate_vendor(vendor) == vendor
    assert VENDOR_RE.fullmatch(vendor)


@pytest.mark.parametrize(
    "vendor, message",
    [
        ("", 'vendor "": must not be empty'),
        ("1nvidia.com", 'vendor "1nvidia.com": must start with a letter'),
        (".nvidia", 'vendor ".nvidia": must start with a letter'),
        ("nvidia.com.", 'vendor "nvidia.com.": must end with a letter or digit'),
        ("nvidia-", 'vendor "nvidia-": must end with a letter or digit'),
        ("nvi dia", 'vendor "nvi dia": character " " is not allowed'),
        ("nvidia:x", 'vendor "nvidia:x": character ":" is not allowed'),
        ("nvidïa", 'vendor "nvid\\u00efa": character "\\u00ef" is not allowed'),
        ("nvidia\n", 'vendor "nvidia\\n": character "\\n" is not allowed'),
        (7, 'vendor "7": must be a string, got int'),
    ],
)
def test_invalid_vendor(vendor, message):
    with pytest.raises(ValueError) as err:
        validate_vendor(vendor)
    assert str(err.value) == message


@pytest.mark.parametrize(
    "cls, message",
    [
        ("gpu", None),
        ("gpu.mig", None),  # valid name; needs cdiVersion 0.6.0 (nvshim.cdi.version)
        ("g", None),
        ("0gpu", "must start with a letter"),
        ("gpu_", "must end with a letter or digit"),
        ("gpu=0", 'character "=" is not allowed'),
        ("gpu/x", 'character "/" is not allowed'),
    ],
)
def test_class_rule(cls, message):
    assert why_invalid("class", cls) == message
    assert (CLASS_RE.fullmatch(cls) is not None) == (message is None)
    if message is None:
        assert validate_class(cls) == cls
    else:
        with pytest.raises(ValueError, match="^class "):
            validate_class(cls)


@pytest.mark.parametrize(
    "name, message",
    [
        ("0", None),
        ("all", None),
        ("0:1", None),
        ("MIG-5e2f6b4c-1d3a-5b7e-9c0d-2f4a6b8c0e1d", None),
        ("GPU-0f3e", None),
        ("a_b.c:d-e", None),
        ("", "must not be empty"),
        (":0", "must start with a letter or digit"),
        ("0:", "must end with a letter or digit"),
        ("gpu0-", "must end with a letter or digit"),
        ("../../etc", "must start with a letter or digit"),
        ("a/b", 'character "/" is not allowed'),
        ("a=b", 'character "=" is not allowed'),
        ("a,b", 'character "," is not allowed'),
    ],
)
def test_device_name_rule(name, message):
    assert why_invalid("device name", name) == message
    assert (DEVICE_RE.fullmatch(name) is not None) == (message is None)
    if message is not None:
        with pytest.raises(ValueError) as err:
            validate_device_name(name)
        assert str(err.value) == f"device name {quote(name)}: {message}"


def test_trailing_newline_is_not_accepted_by_the_regexes():
    # ``$`` would match before a final newline; the rules must not.
    for regex in (VENDOR_RE, CLASS_RE, DEVICE_RE):
        assert regex.fullmatch("abc\n") is None


@pytest.mark.parametrize(
    "kind, expected",
    [
        ("nvidia.com/gpu", ("nvidia.com", "gpu")),
        ("example.com/gpu.partition", ("example.com", "gpu.partition")),
        ("nvidia.com", 'kind "nvidia.com": must have the form vendor/class'),
        ("/gpu", 'kind "/gpu": must have the form vendor/class'),
        ("nvidia.com/", 'kind "nvidia.com/": must have the form vendor/class'),
        (
            "nvidia.com/gpu/x",
            'kind "nvidia.com/gpu/x": class "gpu/x": character "/" is not allowed',
        ),
        ("1x/gpu", 'kind "1x/gpu": vendor "1x": must start with a letter'),
        (None, 'kind must be a string, got NoneType "None"'),
    ],
)
def test_parse_kind(kind, expected):
    if isinstance(expected, tuple):
        assert parse_kind(kind) == expected
    else:
        with pytest.raises(ValueError) as err:
            parse_kind(kind)
        assert str(err.value) == expected


@pytest.mark.parametrize(
    "device, expected",
    [
        ("nvidia.com/gpu=0", ("nvidia.com", "gpu", "0")),
        ("nvidia.com/gpu=all", ("nvidia.com", "gpu", "all")),
        ("nvidia.com/gpu=1:2", ("nvidia.com", "gpu", "1:2")),
        ("nvidia.com/gpu=MIG-1234", ("nvidia.com", "gpu", "MIG-1234")),
        ("nvidia.com/gpu", 'CDI device "nvidia.com/gpu": must have the form vendor/class=name'),
        ("gpu=0", 'CDI device "gpu=0": must have the form vendor/class=name'),
        ("nvidia.com/gpu=", 'CDI device "nvidia.com/gpu=": must have the form vendor/class=name'),
        ("=0", 'CDI device "=0": must have the form vendor/class=name'),
        ("/dev/nvidia0", 'CDI device "/dev/nvidia0": must have the form vendor/class=name'),
        (
            "nvidia.com/gpu=0=1",
            'CDI device "nvidia.com/gpu=0=1": device name "0=1": character "=" is not allowed',
        ),
        (
            "nvidia.com/gpu=../../etc",
            'CDI device "nvidia.com/gpu=../../etc": device name "../../etc": '
            "must start with a letter or digit",
        ),
        (
            "nvidia.com/gp u=0",
            'CDI device "nvidia.com/gp u=0": class "gp u": character " " is not allowed',
        ),
        (
            "-x/gpu=0",
            'CDI device "-x/gpu=0": vendor "-x": must start with a letter',
        ),
    ],
)
def test_parse_qualified_name(device, expected):
    if isinstance(expected, tuple):
        assert parse_qualified_name(device) == expected
        assert qualified_name(*expected) == device
    else:
        with pytest.raises(ValueError) as err:
            parse_qualified_name(device)
        assert str(err.value) == expected


def test_qualified_name_validates_each_part():
    assert qualified_name("nvidia.com", "gpu", "0") == "nvidia.com/gpu=0"
    with pytest.raises(ValueError, match='^device name "0:": must end'):
        qualified_name("nvidia.com", "gpu", "0:")
    with pytest.raises(ValueError, match='^vendor "": must not be empty'):
        qualified_name("", "gpu", "0")


def test_hostile_values_give_one_short_line():
    value = "a" * 10_000 + "\n$(rm -rf /)"
    with pytest.raises(ValueError) as err:
        parse_qualified_name(f"nvidia.com/gpu={value}")
    text = str(err.value)
    assert "\n" not in text
    assert len(text) < 300
