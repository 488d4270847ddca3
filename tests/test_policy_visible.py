"""CUDA_VISIBLE_DEVICES: default to injected UUIDs; keep a user value only when every
entry names an injected device."""

import pytest

from nvshim.policy.visible import cuda_visible_devices

G0 = "GPU-8f6a2c1e-0b3d-4e5f-9a7b-1c2d3e4f5a60"
G1 = "GPU-8f6b0000-1111-2222-3333-444455556666"
M0 = "MIG-4b1e9d2a-7c3f-5e6a-8b9c-0d1e2f3a4b5c"
LEGACY = "MIG-GPU-8f6a2c1e-0b3d-4e5f-9a7b-1c2d3e4f5a60/1/0"
INJECTED = [G0, G1, M0]


@pytest.mark.parametrize(
    "user, injected, value",
    [
        (None, INJECTED, ",".join(INJECTED)),
        (None, [], ""),
        ("", INJECTED, ""),  # hide every GPU: the user's choice
        ("0", INJECTED, "0"),
        ("2,0", INJECTED, "2,0"),
        ("0, 1", INJECTED, "0, 1"),
        (G1, INJECTED, G1),
        (f"{M0},{G0}", INJECTED, f"{M0},{G0}"),
        ("GPU-8f6a", INJECTED, "GPU-8f6a"),  # unique prefix
        ("GPU-8F6A2C", INJECTED, "GPU-8F6A2C"),  # hex case does not matter
        ("MIG-4b", INJECTED, "MIG-4b"),
        (LEGACY, [G1, LEGACY], LEGACY),
        ("MIG-GPU-8f6a2c1e", [G1, LEGACY], "MIG-GPU-8f6a2c1e"),
    ],
)
def test_kept(user, injected, value):
    assert cuda_visible_devices(user, injected) == (value, None)


@pytest.mark.parametrize(
    "user, injected, why",
    [
        ("3", INJECTED, "out of range"),  # a host index copied in
        ("0", [], "out of range"),
        ("-1", INJECTED, "not a device index"),
        ("GPU-8f6", INJECTED, "prefix of several"),
        ("GPU-", INJECTED, "not a device index"),
        ("GPU-ffff", INJECTED, "not an injected device"),
        ("MIG-8f6a", INJECTED, "not an injected device"),  # GPU uuid body under MIG-
        (f"GPU-{M0[4:]}", INJECTED, "not an injected device"),
        ("0,,1", INJECTED, "empty entry"),
        ("0,", INJECTED, "empty entry"),
        ("0,0", INJECTED, "a second time"),
        (f"0,{G0}", INJECTED, "a second time"),  # index and UUID of one device
        ("all", INJECTED, "not a device index"),
        ("0\n1", INJECTED, "control characters"),
        ("0" * 5000, INJECTED, "longer than 4096"),
        ("١", INJECTED, "not a device index"),  # non-ASCII digit
    ],
)
def test_replaced(user, injected, why):
    value, reason = cuda_visible_devices(user, injected)
    assert value == ",".join(injected)
    assert reason is not None and why in reason
    assert reason.startswith("CUDA_VISIBLE_DEVICES=")
    assert "\n" not in reason and len(reason) < 300
