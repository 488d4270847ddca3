"""The protobuf wire format of the kubelet's plugin APIs, by hand.

The messages of ``pluginregistration/v1`` and ``dra/v1`` / ``dra/v1beta1`` (the ``.proto``
files are in ``nvshim/dra/proto/``, from k8s.io/kubelet, Apache-2.0) hold only strings,
bools, nested messages and string-keyed maps: a schema-driven encoder and decoder of
those is smaller than generated code and ties nvshim to no protobuf runtime version.
Messages are plain dicts; a schema maps a field name to ``(number, kind, sub-schema)``
with kind ``str``, ``bool``, ``[str]`` (repeated), ``msg``, ``[msg]`` or ``map`` (string
key to message). Unknown fields are skipped, as protobuf does.
"""

from __future__ import annotations

from typing import Any

Schema = dict[str, tuple]

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5


class WireError(ValueError):
    """Bytes that are not a valid message of the schema."""


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise WireError("truncated or overlong varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _field(number: int, wire: int) -> bytes:
    return _varint(number << 3 | wire)


def _bytes_field(number: int, payload: bytes) -> bytes:
    return _field(number, _LEN) + _varint(len(payload)) + payload


def encode(message: dict[str, Any], schema: Schema) -> bytes:
    """The wire bytes of ``message`` (proto3: empty strings and false are left out)."""
    out = bytearray()
    for name, (number, kind, *sub) in schema.items():
        value = message.get(name)
        if value is None:
            continue
        if kind == "str":
            if value:
                out += _bytes_field(number, value.encode())
        elif kind == "opt-str":  # proto3 ``optional``: present even when empty
            out += _bytes_field(number, value.encode())
        elif kind == "bool":
            if value:
                out += _field(number, _VARINT) + b"\x01"
        elif kind == "[str]":
            for item in value:
                out += _bytes_field(number, item.encode())
        elif kind == "msg":
            out += _bytes_field(number, encode(value, sub[0]))
        elif kind == "[msg]":
            for item in value:
                out += _bytes_field(number, encode(item, sub[0]))
        elif kind == "map":
            for key, item in value.items():
                entry = _bytes_field(1, key.encode()) + _bytes_field(2, encode(item, sub[0]))
                out += _bytes_field(number, entry)
        else:
            raise ValueError(f"unknown field kind {kind!r}")
    return bytes(out)


def _skip(data: bytes, pos: int, wire: int) -> int:
    if wire == _VARINT:
        return _read_varint(data, pos)[1]
    if wire == _I64:
        return pos + 8
    if wire == _I32:
        return pos + 4
    if wire == _LEN:
        length, pos = _read_varint(data, pos)
        return pos + length
    raise WireError(f"unsupported wire type {wire}")


def decode(data: bytes, schema: Schema) -> dict[str, Any]:
    """The message in ``data``; repeated fields and maps are always present (maybe empty)."""
    by_number = {spec[0]: (name, spec[1], spec[2:]) for name, spec in schema.items()}
    out: dict[str, Any] = {}
    for name, (_, kind, *_sub) in schema.items():
        if kind in ("[str]", "[msg]"):
            out[name] = []
        elif kind == "map":
            out[name] = {}
        elif kind == "str":
            out[name] = ""
        elif kind == "bool":
            out[name] = False
    pos = 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        number, wire = key >> 3, key & 7
        known = by_number.get(number)
        if known is None:
            pos = _skip(data, pos, wire)
            continue
        name, kind, sub = known
        if kind == "bool":
            if wire != _VARINT:
                raise WireError(f"field {name}: wire type {wire}, expected varint")
            value, pos = _read_varint(data, pos)
            out[name] = bool(value)
            continue
        if wire != _LEN:
            raise WireError(f"field {name}: wire type {wire}, expected length-delimited")
        length, pos = _read_varint(data, pos)
        payload = data[pos : pos + length]
        if len(payload) != length:
            raise WireError(f"field {name}: truncated")
        pos += length
        if kind in ("str", "opt-str"):
            out[name] = _text(payload, name)
        elif kind == "[str]":
            out[name].append(_text(payload, name))
        elif kind == "msg":
            out[name] = decode(payload, sub[0])
        elif kind == "[msg]":
            out[name].append(decode(payload, sub[0]))
        elif kind == "map":
            entry = decode(payload, {"key": (1, "str"), "value": (2, "msg", sub[0])})
            out[name][entry["key"]] = entry.get("value") or decode(b"", sub[0])
    return out


def _text(payload: bytes, name: str) -> str:
    try:
        return payload.decode()
    except UnicodeDecodeError:
        raise WireError(f"field {name}: not UTF-8") from None


# pluginregistration (package ``pluginregistration``)
PLUGIN_INFO: Schema = {
    "type": (1, "str"),
    "name": (2, "str"),
    "endpoint": (3, "str"),
    "supported_versions": (4, "[str]"),
}
REGISTRATION_STATUS: Schema = {"plugin_registered": (1, "bool"), "error": (2, "str")}
EMPTY: Schema = {}

# dra v1 and v1beta1 (the same messages; ``share_id`` is v1 only and v1beta1 ignores it)
CLAIM: Schema = {"namespace": (1, "str"), "uid": (2, "str"), "name": (3, "str")}
CLAIMS_REQUEST: Schema = {"claims": (1, "[msg]", CLAIM)}
DEVICE: Schema = {
    "request_names": (1, "[str]"),
    "pool_name": (2, "str"),
    "device_name": (3, "str"),
    "cdi_device_ids": (4, "[str]"),
    "share_id": (5, "opt-str"),
}
PREPARE_RESULT: Schema = {"devices": (1, "[msg]", DEVICE), "error": (2, "str")}
PREPARE_RESPONSE: Schema = {"claims": (1, "map", PREPARE_RESULT)}
UNPREPARE_RESULT: Schema = {"error": (1, "str")}
UNPREPARE_RESPONSE: Schema = {"claims": (1, "map", UNPREPARE_RESULT)}
