"""nvshim.dra.wire against protobuf's own implementation: the kubelet's DRA and plugin
registration messages built from descriptors (as protoc would from nvshim/dra/proto/*.proto)
must decode what nvshim encodes and the other way round."""

from __future__ import annotations

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from nvshim.dra import wire

F = descriptor_pb2.FieldDescriptorProto
PACKAGE = "k8s.io.kubelet.pkg.apis.dra.v1"


def _field(msg, name, number, ftype, repeated=False, type_name=None, optional=False):
    f = msg.field.add(name=name, number=number, type=ftype)
    f.label = F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL
    if type_name:
        f.type_name = type_name
    if optional:
        f.proto3_optional = True
        f.oneof_index = len(msg.oneof_decl)
        msg.oneof_decl.add(name=f"_{name}")
    return f


def _map_entry(msg, name, value_type):
    entry = msg.nested_type.add(name=name)
    entry.options.map_entry = True
    _field(entry, "key", 1, F.TYPE_STRING)
    _field(entry, "value", 2, F.TYPE_MESSAGE, type_name=value_type)


@pytest.fixture(scope="module")
def pb():
    """Message classes of the dra v1 and pluginregistration protos."""
    dra = descriptor_pb2.FileDescriptorProto(
        name="nvshim_test_dra_v1.proto", package=PACKAGE, syntax="proto3"
    )
    claim = dra.message_type.add(name="Claim")
    for i, n in enumerate(("namespace", "uid", "name"), 1):
        _field(claim, n, i, F.TYPE_STRING)
    req = dra.message_type.add(name="NodePrepareResourcesRequest")
    _field(req, "claims", 1, F.TYPE_MESSAGE, True, f".{PACKAGE}.Claim")
    dev = dra.message_type.add(name="Device")
    _field(dev, "request_names", 1, F.TYPE_STRING, True)
    _field(dev, "pool_name", 2, F.TYPE_STRING)
    _field(dev, "device_name", 3, F.TYPE_STRING)
    _field(dev, "cdi_device_ids", 4, F.TYPE_STRING, True)
    _field(dev, "share_id", 5, F.TYPE_STRING, optional=True)
    one = dra.message_type.add(name="NodePrepareResourceResponse")
    _field(one, "devices", 1, F.TYPE_MESSAGE, True, f".{PACKAGE}.Device")
    _field(one, "error", 2, F.TYPE_STRING)
    resp = dra.message_type.add(name="NodePrepareResourcesResponse")
    _map_entry(resp, "ClaimsEntry", f".{PACKAGE}.NodePrepareResourceResponse")
    _field(
        resp,
        "claims",
        1,
        F.TYPE_MESSAGE,
        True,
        f".{PACKAGE}.NodePrepareResourcesResponse.ClaimsEntry",
    )
    reg = descriptor_pb2.FileDescriptorProto(
        name="nvshim_test_reg.proto", package="pluginregistration", syntax="proto3"
    )
    info = reg.message_type.add(name="PluginInfo")
    for i, n in enumerate(("type", "name", "endpoint"), 1):
        _field(info, n, i, F.TYPE_STRING)
    _field(info, "supported_versions", 4, F.TYPE_STRING, True)
    status = reg.message_type.add(name="RegistrationStatus")
    _field(status, "plugin_registered", 1, F.TYPE_BOOL)
    _field(status, "error", 2, F.TYPE_STRING)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(dra)
    pool.Add(reg)

    def cls(name):
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))

    return {
        n.split(".")[-1]: cls(n)
        for n in (
            f"{PACKAGE}.NodePrepareResourcesRequest",
            f"{PACKAGE}.NodePrepareResourcesResponse",
            "pluginregistration.PluginInfo",
            "pluginregistration.RegistrationStatus",
        )
    }


def test_request_from_protobuf_decodes(pb):
    msg = pb["NodePrepareResourcesRequest"]()
    msg.claims.add(namespace="ns", uid="1234-ab", name="c")
    msg.claims.add(namespace="other", uid="ü-uid", name="d")
    got = wire.decode(msg.SerializeToString(), wire.CLAIMS_REQUEST)
    assert got == {
        "claims": [
            {"namespace": "ns", "uid": "1234-ab", "name": "c"},
            {"namespace": "other", "uid": "ü-uid", "name": "d"},
        ]
    }


def test_response_encoded_by_nvshim_parses_in_protobuf(pb):
    answer = {
        "claims": {
            "uid-1": {
                "devices": [
                    {
                        "request_names": ["gpu"],
                        "pool_name": "node1",
                        "device_name": "gpu-0",
                        "cdi_device_ids": ["k8s.gpu.nvshim.io/claim=uid-1-gpu-0"],
                    },
                    {
                        "request_names": ["a", "b"],
                        "pool_name": "node1",
                        "device_name": "mig-6-1",
                        "cdi_device_ids": ["x/y=1", "x/y=2"],
                        "share_id": "",
                    },
                ],
                "error": "",
            },
            "uid-2": {"devices": [], "error": "device gpu-0 is already prepared"},
        }
    }
    msg = pb["NodePrepareResourcesResponse"].FromString(wire.encode(answer, wire.PREPARE_RESPONSE))
    one = msg.claims["uid-1"]
    assert [d.device_name for d in one.devices] == ["gpu-0", "mig-6-1"]
    assert list(one.devices[1].request_names) == ["a", "b"]
    assert list(one.devices[1].cdi_device_ids) == ["x/y=1", "x/y=2"]
    assert not one.devices[0].HasField("share_id")
    assert one.devices[1].HasField("share_id")  # proto3 optional: present though empty
    assert msg.claims["uid-2"].error == "device gpu-0 is already prepared"
    assert len(msg.claims["uid-2"].devices) == 0
    # and back: protobuf's bytes decode to the same dict (share_id only where present)
    again = wire.decode(msg.SerializeToString(), wire.PREPARE_RESPONSE)
    assert again["claims"]["uid-2"] == answer["claims"]["uid-2"]
    assert again["claims"]["uid-1"]["devices"][1] == answer["claims"]["uid-1"]["devices"][1]


def test_registration_messages(pb):
    info = {
        "type": "DRAPlugin",
        "name": "gpu.nvshim.io",
        "endpoint": "/var/lib/kubelet/plugins/gpu.nvshim.io/dra.sock",
        "supported_versions": ["v1.DRAPlugin", "v1beta1.DRAPlugin"],
    }
    parsed = pb["PluginInfo"].FromString(wire.encode(info, wire.PLUGIN_INFO))
    assert (parsed.type, parsed.name, parsed.endpoint) == (
        info["type"],
        info["name"],
        info["endpoint"],
    )
    assert list(parsed.supported_versions) == info["supported_versions"]
    status = pb["RegistrationStatus"](plugin_registered=True, error="")
    assert wire.decode(status.SerializeToString(), wire.REGISTRATION_STATUS) == {
        "plugin_registered": True,
        "error": "",
    }
    refused = pb["RegistrationStatus"](error="version not supported")
    assert wire.decode(refused.SerializeToString(), wire.REGISTRATION_STATUS) == {
        "plugin_registered": False,
        "error": "version not supported",
    }


def test_unknown_fields_skipped_and_garbage_refused(pb):
    msg = pb["PluginInfo"](type="DRAPlugin", name="x")
    extra = b"\x28\x96\x01" + b"\x31" + b"\x00" * 8 + b"\x3a\x02hi"  # fields 5, 6, 7
    assert wire.decode(msg.SerializeToString() + extra, wire.PLUGIN_INFO)["name"] == "x"
    with pytest.raises(wire.WireError):
        wire.decode(b"\x0a\x05ab", wire.CLAIM)  # length past the end
    with pytest.raises(wire.WireError):
        wire.decode(b"\x0a\x02\xff\xfe", wire.CLAIM)  # not UTF-8
