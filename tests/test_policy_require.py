"""The CUDA/driver table and NVIDIA_REQUIRE_* grammar and checks."""

import pytest

from nvshim.errors import NvshimError
from nvshim.policy.cuda_table import (
    compare_versions,
    driver_supports_cuda,
    min_driver_for_cuda,
    newest_cuda_for_driver,
    version_tuple,
)
from nvshim.policy.require import (
    Condition,
    RequirementError,
    check_requirements,
    parse_requirement,
)

# What the nvidia/cuda:12.6 images carry (brand/driver alternatives = minor-version compat).
IMAGE_REQUIRE = (
    "cuda>=12.6 brand=unknown,driver>=470,driver<471 brand=tesla,driver>=535,driver<536 "
    "brand=nvidia,driver>=535,driver<536"
)

# --- CUDA table -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "driver, newest",
    [
        ("610.43.02", "13.3"),
        ("999.1", "13.3"),
        ("590.44.01", "13.1"),
        ("590.44.00", "13.0"),
        ("580.65.06", "13.0"),
        ("580.65.05", "12.9"),
        ("575.51.03", "12.9"),
        ("570.26", "12.8"),
        ("570.25.99", "12.6"),
        ("560.35.03", "12.6"),
        ("550.90.12", "12.4"),
        ("550.54.14", "12.4"),
        ("550.54.13", "12.3"),
        ("535.104.05", "12.2"),
        ("525.60.13", "12.0"),
        ("525.60.12", "11.8"),
        ("470.82.01", "11.4"),
        ("455.23", "11.1"),
        ("455.23.0", "11.1"),
        ("450.36.06", "11.0"),
        ("440.33.01", "10.2"),
        ("418.39", "10.1"),
        ("384.81", "9.0"),
        ("346.46", "7.0"),
        ("340.29", ""),
    ],
)
def test_newest_cuda_for_driver(driver, newest):
    assert newest_cuda_for_driver(driver) == newest


@pytest.mark.parametrize(
    "cuda, minor_compat, driver",
    [
        ("12.4", False, "550.54.14"),
        ("12.4.1", False, "550.54.14"),
        ("12", False, "525.60.13"),
        ("12.7", False, "570.26"),  # no 12.7 release: the next listed one
        ("11.1", False, "455.23"),
        ("13.1", False, "590.44.01"),
        ("12.9", True, "525"),
        ("12.0", True, "525"),
        ("11.8", True, "450"),
        ("13.1", True, "580"),
        ("10.2", True, "440.33"),  # no minor-version compatibility before 11
        ("12.10", False, None),
        ("14.0", False, None),
        ("14.0", True, None),
    ],
)
def test_min_driver_for_cuda(cuda, minor_compat, driver):
    assert min_driver_for_cuda(cuda, minor_compat) == driver


@pytest.mark.parametrize(
    "driver, cuda, minor_compat, ok",
    [
        ("535.104.05", "12.6", False, False),
        ("535.104.05", "12.6", True, True),  # 12.x on >= 525
        ("525.60.13", "12.9", True, True),
        ("520.61.05", "12.0", True, False),
        ("470.82.01", "11.8", True, True),  # 11.x on >= 450
        ("470.82.01", "11.8", False, False),
        ("575.51.03", "13.0", True, False),  # 13.x needs >= 580
        ("580.65.06", "13.1", True, True),
        ("580.65.06", "13.1", False, False),
        ("999", "15.0", True, False),  # unknown toolkit
    ],
)
def test_driver_supports_cuda(driver, cuda, minor_compat, ok):
    assert driver_supports_cuda(driver, cuda, minor_compat) is ok


@pytest.mark.parametrize(
    "a, b, order",
    [
        ("12.0", "12", 0),
        ("12.0.0", "12", 0),
        ("12.10", "12.9", 1),
        ("470.82.01", "470", 1),
        ("470.82.01", "471", -1),
        ("9.0", "10.0", -1),
        ("007.1", "7.1", 0),
    ],
)
def test_compare_versions(a, b, order):
    assert compare_versions(a, b) == order
    assert compare_versions(b, a) == -order


@pytest.mark.parametrize("bad", ["", "12.", ".1", "12..1", "12.a", "1e3", "-1", "١٢", "1" * 10])
def test_version_tuple_rejects(bad):
    with pytest.raises(ValueError):
        version_tuple(bad)


# --- grammar --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expr, alternatives",
    [
        ("", ()),
        ("   ", ()),
        ("cuda>=12.0", ((("cuda", ">=", "12.0"),),)),
        ("CUDA>=12.0", ((("cuda", ">=", "12.0"),),)),
        ("driver<471", ((("driver", "<", "471"),),)),
        ("arch=8.0", ((("arch", "=", "8.0"),),)),
        ("arch!=7.5", ((("arch", "!=", "7.5"),),)),
        ("arch<=9", ((("arch", "<=", "9"),),)),
        ("arch>7", ((("arch", ">", "7"),),)),
        ("brand=Tesla", ((("brand", "=", "Tesla"),),)),
        ("brand!=geforce", ((("brand", "!=", "geforce"),),)),
        (
            "cuda>=12.0 brand=tesla,driver>=470,driver<471",
            (
                (("cuda", ">=", "12.0"),),
                (("brand", "=", "tesla"), ("driver", ">=", "470"), ("driver", "<", "471")),
            ),
        ),
        ("  cuda>=12.0\t\tdriver>=550  ", ((("cuda", ">=", "12.0"),), (("driver", ">=", "550"),))),
    ],
)
def test_parse_requirement(expr, alternatives):
    parsed = parse_requirement(expr, "NVIDIA_REQUIRE_X")
    got = tuple(tuple((c.prop, c.op, c.value) for c in alt) for alt in parsed.alternatives)
    assert got == alternatives


@pytest.mark.parametrize(
    "expr, token",
    [
        ("cuda", "'cuda'"),
        ("cuda>=", "'cuda>='"),
        ("cuda >= 12.0", "'cuda'"),
        ("cuda=>12", "'cuda=>12'"),
        ("cuda==12", "'cuda==12'"),
        ("cuda>=12.x", "'cuda>=12.x'"),
        ("cuda>=12..0", "'cuda>=12..0'"),
        ("cuda<12>3", "'cuda<12>3'"),
        ("foo>=1", "'foo>=1'"),
        (">=12", "'>=12'"),
        ("brand>tesla", "'brand>tesla'"),
        ("brand=tes/la", "'brand=tes/la'"),
        ("brand=", "'brand='"),
        ("cuda>=12.0,", "'cuda>=12.0,'"),
        (",cuda>=12.0", "',cuda>=12.0'"),
        ("cuda>=12.0,,driver>=1", "empty condition"),
        ("cuda>=12;rm", "'cuda>=12;rm'"),
        ("cuda>=\x0012", "\\x00"),
    ],
)
def test_parse_requirement_rejects(expr, token):
    with pytest.raises(RequirementError) as err:
        parse_requirement(expr, "NVIDIA_REQUIRE_CUDA")
    message = str(err.value)
    assert message.startswith("NVIDIA_REQUIRE_CUDA:")
    assert token in message
    assert isinstance(err.value, NvshimError)


def test_parse_requirement_caps_length():
    with pytest.raises(RequirementError, match="longer than"):
        parse_requirement("cuda>=1 " * 10000, "NVIDIA_REQUIRE_CUDA")


def test_brand_compares_case_insensitively():
    cond = Condition("brand", "=", "Tesla")
    assert cond.holds({"brand": "tesla"}) and cond.holds({"brand": "TESLA"})
    assert not cond.holds({"brand": "nvidia"})
    assert Condition("brand", "!=", "tesla").holds({"brand": "nvidia"})


# --- checks ---------------------------------------------------------------------------------

H100 = ("9.0", "nvidia")
A100 = ("8.0", "tesla")
T4 = ("7.5", "tesla")


@pytest.mark.parametrize(
    "requirements, cuda, driver, devices",
    [
        ({}, "12.4", "550.54.14", [H100]),
        ({"NVIDIA_REQUIRE_CUDA": ""}, "12.4", "550.54.14", [H100]),
        ({"NVIDIA_REQUIRE_CUDA": "cuda>=12.4"}, "12.4", "550.54.14", [H100]),
        ({"NVIDIA_REQUIRE_CUDA": "cuda>=12.0 cuda>=99"}, "12.4", "550.54.14", [H100]),
        ({"NVIDIA_REQUIRE_CUDA": "cuda>=12.4"}, "", "550.54.14", [H100]),  # derived from driver
        # minor-version compat alternative of the real images: tesla on 535
        ({"NVIDIA_REQUIRE_CUDA": IMAGE_REQUIRE}, "12.2", "535.104.05", [A100, T4]),
        ({"NVIDIA_REQUIRE_CUDA": IMAGE_REQUIRE}, "12.6", "560.35.03", [H100]),
        ({"NVIDIA_REQUIRE_ARCH": "arch>=8.0"}, "12.4", "550.54.14", [H100, A100]),
        (
            {"NVIDIA_REQUIRE_A": "arch>=8.0", "NVIDIA_REQUIRE_B": "driver>=550"},
            "12.4",
            "550.54.14",
            [A100],
        ),
        # no device (a `none` request): arch and brand hold vacuously
        ({"NVIDIA_REQUIRE_ARCH": "arch>=9.0"}, "12.4", "550.54.14", []),
        ({"NVIDIA_REQUIRE_CUDA": IMAGE_REQUIRE}, "12.2", "535.104.05", []),
    ],
)
def test_requirements_met(requirements, cuda, driver, devices):
    check_requirements(requirements, cuda, driver, devices)


@pytest.mark.parametrize(
    "requirements, cuda, driver, devices, needles",
    [
        (
            {"NVIDIA_REQUIRE_CUDA": "cuda>=12.6"},
            "12.4",
            "550.54.14",
            [H100],
            ["NVIDIA_REQUIRE_CUDA", "cuda>=12.6 (host cuda 12.4)", "550.54.14", "CUDA 12.4"],
        ),
        (
            # geforce-class brand on 535 is not covered by the compat alternatives
            {"NVIDIA_REQUIRE_CUDA": IMAGE_REQUIRE},
            "12.2",
            "535.104.05",
            [("8.6", "geforce")],
            ["cuda>=12.6", "brand=unknown (host brand geforce)", "brand=tesla (host", "CUDA 12.2"],
        ),
        (
            # every device must pass: the second one fails
            {"NVIDIA_REQUIRE_ARCH": "arch>=8.0"},
            "12.4",
            "550.54.14",
            [H100, T4],
            ["on device 1", "arch>=8.0 (host arch 7.5)"],
        ),
        (
            {"NVIDIA_REQUIRE_A": "driver>=1", "NVIDIA_REQUIRE_B": "driver<550"},
            "12.4",
            "550.54.14",
            [H100],
            ["NVIDIA_REQUIRE_B", "driver<550 (host driver 550.54.14)"],
        ),
        (
            # a driver older than the table: cuda unknown, so cuda conditions fail
            {"NVIDIA_REQUIRE_CUDA": "cuda>=7.0"},
            "",
            "340.29",
            [],
            ["cuda>=7.0 (host cuda None)", "no CUDA release nvshim knows"],
        ),
    ],
)
def test_requirements_failed(requirements, cuda, driver, devices, needles):
    with pytest.raises(RequirementError) as err:
        check_requirements(requirements, cuda, driver, devices)
    message = str(err.value)
    assert "\n" not in message
    assert "update the driver or use an older CUDA image" in message
    for needle in needles:
        assert needle in message


def test_disable_skips_even_malformed_requirements():
    check_requirements({"NVIDIA_REQUIRE_CUDA": "cuda>=99 ???"}, "12.4", "550.54.14", [], True)


def test_malformed_requirement_names_variable_and_token():
    with pytest.raises(RequirementError, match=r"NVIDIA_REQUIRE_FOO: .*'cuda~12'"):
        check_requirements({"NVIDIA_REQUIRE_FOO": "cuda~12"}, "12.4", "550.54.14", [H100])


def test_unusable_host_version_is_a_clear_error():
    with pytest.raises(RequirementError, match="driver 'bogus'"):
        check_requirements({"NVIDIA_REQUIRE_CUDA": "cuda>=1"}, "12.4", "bogus", [H100])


def test_failure_message_stays_bounded_for_long_conditions():
    long_value = "cuda>=" + ".".join(["99"] * 2000)
    with pytest.raises(RequirementError) as err:
        check_requirements({"NVIDIA_REQUIRE_CUDA": long_value}, "12.4", "550.54.14", [H100])
    assert len(str(err.value)) < 400


def test_requirements_together_are_capped():
    """Each variable under its own cap, thousands of them (a 16 MiB config.json holds
    250 of 64 KiB) were all parsed and compared again for every device: seconds of a
    worker's time per GPU. Now refused, naming the variables, before any is parsed."""
    expr = "cuda>=" + ".".join(["1"] * 30000)  # holds: 12.4 >= 1.1.1...
    requirements = {f"NVIDIA_REQUIRE_{i}": expr for i in range(5)}
    with pytest.raises(RequirementError, match=r"NVIDIA_REQUIRE_\*: 5 variables, longer than"):
        check_requirements(requirements, "12.4", "550.54.14", [H100] * 8)
    check_requirements(dict(list(requirements.items())[:4]), "12.4", "550.54.14", [H100] * 8)
