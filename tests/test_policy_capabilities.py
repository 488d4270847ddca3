"""NVIDIA_DRIVER_CAPABILITIES parsing."""

import pytest

from nvshim.defaults import CAPABILITIES
from nvshim.policy.capabilities import parse_capabilities

DEFAULT = "utility,compute"


@pytest.mark.parametrize(
    "value, default, expected, warned",
    [
        (None, DEFAULT, ("compute", "utility"), []),
        ("", DEFAULT, ("compute", "utility"), []),
        (" , ", DEFAULT, ("compute", "utility"), []),
        ("all", DEFAULT, CAPABILITIES, []),
        ("ALL", DEFAULT, CAPABILITIES, []),
        ("compute,all", DEFAULT, CAPABILITIES, []),
        ("video", DEFAULT, ("video",), []),
        # canonical order whatever the order given, duplicates folded
        ("graphics, utility ,compute,utility", DEFAULT, ("compute", "utility", "graphics"), []),
        ("Display,NGX,compat32", DEFAULT, ("display", "ngx", "compat32"), []),
        # unknown names ignored with a warning
        ("compute,bogus", DEFAULT, ("compute",), ["bogus"]),
        ("compute,../../x", DEFAULT, ("compute",), ["../../x"]),
        # nothing known left: the default applies, and the warning says why
        ("bogus", DEFAULT, ("compute", "utility"), ["bogus"]),
        ("a,b", "video", ("video",), ["'a'", "'b'"]),
        # the default itself may be all, or broken (then utility,compute)
        (None, "all", CAPABILITIES, []),
        (None, "", ("compute", "utility"), []),
        (None, "nonsense", ("compute", "utility"), ["nonsense"]),
        ("x" * 5000, DEFAULT, ("compute", "utility"), ["longer than 4096"]),
    ],
)
def test_parse_capabilities(value, default, expected, warned):
    warnings: list[str] = []
    assert parse_capabilities(value, default, warnings) == expected
    assert len(warnings) == len(warned)
    for needle, warning in zip(warned, warnings, strict=True):
        assert needle in warning


def test_warnings_are_optional_and_bounded():
    assert parse_capabilities("compute,zzz", DEFAULT) == ("compute",)
    warnings: list[str] = []
    parse_capabilities("compute," + "z" * 3000, DEFAULT, warnings)
    assert len(warnings) == 1 and len(warnings[0]) < 200
