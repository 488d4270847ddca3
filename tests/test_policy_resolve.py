"""Device ids -> the host's GPUs and MIG devices."""

import pytest

from nvshim.host.model import Gpu, Host, MigDevice
from nvshim.policy.request import DeviceList, RequestError, parse_visible_devices
from nvshim.policy.resolve import all_devices, requirement_facts, resolve_devices


def _gpu(index, uuid, mig=(), cc="9.0", brand="nvidia"):
    return Gpu(
        index=index,
        minor=index,
        uuid=uuid,
        name="NVIDIA H100 80GB HBM3",
        pci_bus_id=f"00000000:{index + 0x10:02X}:00.0",
        memory_total=80 << 30,
        compute_capability=cc,
        architecture="hopper",
        brand=brand,
        mig_enabled=bool(mig),
        mig_devices=tuple(mig),
    )


def _mig(parent, index, gi, ci, uuid):
    return MigDevice(parent, index, gi, ci, uuid, "3g.40gb", 40 << 30)


U0 = "GPU-00000000-0000-0000-0000-000000000000"
U1 = "GPU-1111aaaa-1111-1111-1111-111111111111"
U2 = "GPU-22222222-2222-2222-2222-222222222222"
U3 = "GPU-33333333-3333-3333-3333-333333333333"
M20 = _mig(2, 0, 1, 0, "MIG-aaaaaaaa-0000-0000-0000-000000000000")
M21 = _mig(2, 1, 2, 0, "MIG-bbbbbbbb-0000-0000-0000-000000000000")
HOST = Host(
    driver_version="550.90.12",
    cuda_version="12.4",
    gpus=[
        _gpu(0, U0),
        _gpu(1, U1, cc="8.0", brand="tesla"),
        _gpu(2, U2, mig=(M20, M21), cc="8.0", brand="tesla"),
        _gpu(3, U3, mig=()),  # MIG capable but not in MIG mode
    ],
)


def names(devices):
    return [d.uuid for d in devices]


@pytest.mark.parametrize(
    "value, expected",
    [
        ("all", [U0, U1, U3, M20.uuid, M21.uuid]),
        ("none", []),
        ("void", []),
        (None, []),
        ("1", [U1]),
        ("3,0", [U3, U0]),
        (U1, [U1]),
        ("GPU-" + U1[4:].upper(), [U1]),  # UUIDs compare case-insensitively
        ("2:1", [M21.uuid]),
        ("2:0,2:1", [M20.uuid, M21.uuid]),
        (M20.uuid, [M20.uuid]),
        (M20.uuid.upper(), [M20.uuid]),
        (f"MIG-{U2}/2/0", [M21.uuid]),
        # the same device named several ways appears once, first position kept
        (f"1,{U1},0,1::3", [U1, U0]),
        (f"2:0,{M20.uuid},MIG-{U2}/1/0", [M20.uuid]),
        ("0::1,0::2,2:1::5", [U0, M21.uuid]),
    ],
)
def test_resolve(value, expected):
    assert names(resolve_devices(HOST, parse_visible_devices(value))) == expected


@pytest.mark.parametrize(
    "value, needles",
    [
        ("4", ["'4'", "4 GPU(s) and 2 MIG device(s)"]),
        ("GPU-ffff", ["'GPU-ffff'", "4 GPU(s)"]),
        ("2", ["MIG mode", "2:0, 2:1"]),
        (U2, ["MIG mode", "2:0, 2:1"]),
        ("0:0", ["not in MIG mode"]),
        ("2:5", ["'2:5'"]),
        ("9:0", ["'9:0'"]),
        ("MIG-cccc", ["'MIG-cccc'"]),
        (f"MIG-{U2}/9/0", ["/9/0"]),
        (f"MIG-{U0}/1/0", [U0]),
        ("0,4", ["'4'"]),
    ],
)
def test_resolve_errors(value, needles):
    with pytest.raises(RequestError) as err:
        resolve_devices(HOST, parse_visible_devices(value))
    for needle in needles:
        assert needle in str(err.value)


@pytest.mark.parametrize("bad", ["../../etc", "0/1", "١", "0:x", "GPU-a/b"])
def test_hand_built_lists_are_validated(bad):
    with pytest.raises(RequestError):
        resolve_devices(HOST, DeviceList("list", (bad,)))


def test_all_on_a_host_without_gpus():
    assert resolve_devices(Host("550.90.12", "12.4"), DeviceList("all")) == []


def test_all_devices_order_and_requirement_facts():
    devices = all_devices(HOST)
    assert names(devices) == [U0, U1, U3, M20.uuid, M21.uuid]
    # a MIG device reports its parent's compute capability and brand
    assert requirement_facts(HOST, devices) == [
        ("9.0", "nvidia"),
        ("8.0", "tesla"),
        ("9.0", "nvidia"),
        ("8.0", "tesla"),
        ("8.0", "tesla"),
    ]
