"""nvshim.fastjson parses and writes exactly what the json module does."""

from __future__ import annotations

import json
import math

import pytest

from nvshim import fastjson
from tests.runc_util import runc_spec

DOCUMENTS = [
    '{"a": [1, 2.5, -3e4, true, false, null, "x\\u00e9\\ud83d\\ude00"], "b": {}}',
    "  [1] \n",
    '"just a string"',
    "12",
    '{"dup": 1, "dup": 2}',
    '{"deep": ' * 50 + "0" + "}" * 50,
]
BAD = ["", "   ", "[1,", "[1,]", '{"a" 1}', '{"a": 1} x', "{'a': 1}", "[1] [2]", "\ufeff{}"]


@pytest.mark.parametrize("text", DOCUMENTS)
def test_loads_matches_json(text):
    assert fastjson.loads(text) == json.loads(text)
    assert fastjson.loads(text.encode()) == json.loads(text)


def test_nan_and_infinity_as_json_reads_them():
    value = fastjson.loads("[NaN, Infinity, -Infinity]")
    assert math.isnan(value[0]) and value[1:] == [math.inf, -math.inf]


@pytest.mark.parametrize("text", BAD)
def test_bad_documents_raise_value_error(text):
    with pytest.raises(ValueError):
        json.loads(text)
    with pytest.raises(ValueError):
        fastjson.loads(text)


def test_invalid_utf8_is_a_value_error():
    with pytest.raises(ValueError):
        fastjson.loads(b'{"a": "\xff"}')


def test_dumps_is_compact_json():
    spec = runc_spec()
    spec["annotations"] = {"é": '😀\n\t"q"', "n": None}
    assert fastjson.dumps(spec) == json.dumps(spec, separators=(",", ":"))
    assert fastjson.loads(fastjson.dumps(spec)) == spec
    assert fastjson.dumps({"t": (1, 2), 3: True}) == '{"t":[1,2],"3":true}'
    with pytest.raises(TypeError, match="not JSON serializable"):
        fastjson.dumps({"a": object()})
    loop: list = []
    loop.append(loop)
    with pytest.raises(ValueError):
        fastjson.dumps(loop)
