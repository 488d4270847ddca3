"""nvshim's CDI YAML writer (nvshim.cdi.yamlout) against PyYAML's own safe_dump: the same
bytes for every string it decides, every shipped host's specs, and PyYAML's output for
what it hands over."""

from __future__ import annotations

import itertools
import random

import pytest
import yaml

from nvshim.cdi import yamlout
from nvshim.cdi.writer import build_management_spec, build_spec, dump_spec
from nvshim.host.discover import discover_host
from tests.sim.simhost import shipped_hosts


def pyyaml(data) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


def candidate_strings() -> set[str]:
    """Every short string over number-ish characters, random strings over YAML's
    indicators, and the YAML 1.1 words and number shapes that read back as other types."""
    strings = {"".join(t) for n in range(1, 5) for t in itertools.product("0159:-+.", repeat=n)}
    alphabet = "0123456789:-+._#a YNnoO~=<>,[]{}?!'\"&*|%@`/xXe\t"
    rnd = random.Random(24)
    for _ in range(40000):
        strings.add("".join(rnd.choice(alphabet) for _ in range(rnd.randint(1, 8))))
    strings |= set(yamlout.NOT_STRINGS) | yamlout.FLOAT_WORDS
    strings |= {"", "-.inf", "-.nan", "---x", "...", "a:", "0:0", "1:0", "1:60", "12:5:7"}
    strings |= {"0.5.0", "1.5", "1.", "1..2", "-1.5", "+0.6.0", "1.2.3:4"}
    strings |= {"09", "07", "00", "-0", "+1", "0x1f", "0b1", "2001-12-14", "1e3", "1_0", "é"}
    return strings


def test_every_decided_string_is_written_as_pyyaml_writes_it():
    decided = 0
    for text in candidate_strings():
        data = {"k": text, "l": [text]}
        assert yamlout.dump(data) == pyyaml(data), repr(text)
        try:
            yamlout.plain(text)
            decided += 1
        except yamlout.Unsupported:
            pass
    assert decided > 20000  # most of them are written without PyYAML


@pytest.mark.parametrize(
    "text",
    ["with space", "tab\there", "ünïcode", "1e5", "2001-12-14", "-.5", ".5", "1.2:3"],
)
def test_undecided_strings_are_left_to_pyyaml(text):
    with pytest.raises(yamlout.Unsupported):
        yamlout.plain(text)
    data = {"env": [f"X={text}", text], "n": 1}
    assert yamlout.dump(data) == pyyaml(data)


def test_shapes():
    data = {
        "a": {},
        "b": [],
        "c": [{}, {"x": [1, True, None, False]}, "s"],
        "d": {"e": {"f": ["g"]}},
        "h": [[1]],  # a nested sequence: PyYAML writes it
    }
    assert yamlout.dump(data) == pyyaml(data)
    assert yamlout.dump({}) == pyyaml({})
    assert yamlout.dump({"f": 1.5}) == pyyaml({"f": 1.5})


@pytest.mark.parametrize("name", shipped_hosts())
def test_specs_of_every_shipped_host_match_pyyaml(sim_hosts, name):
    sim = sim_hosts(name)
    host = discover_host(sim.driver_root, sim.dev_root)
    specs = [
        build_spec(host, ["utility", "compute"], "/usr/bin/nvshim-hook", strategies=strategy)
        for strategy in (("index", "uuid"), ("type-index",))
    ]
    specs.append(build_spec(host, ["all"], "/usr/bin/nvshim-hook", all_device=False))
    specs.append(build_management_spec(host, "/usr/bin/nvshim-hook"))
    for spec in specs:
        text = dump_spec(spec, "yaml")
        assert text == pyyaml(spec)
        assert yaml.safe_load(text) == spec


# -- a property test: generated documents, keys included --------------------------------

KEY_ALPHABET = "abcXYZ019:-+._#~=<>,[]{}?!'\"&*|%@`/ "


def _text(rnd: random.Random) -> str:
    """A key or string: mostly short over YAML's indicators, some empty, some near and past
    PyYAML's simple-key limit (128) and its 1024-character limit."""
    roll = rnd.random()
    if roll < 0.05:
        return ""
    if roll < 0.12:
        size = rnd.choice([rnd.randint(95, 140), rnd.randint(1020, 1100)])
        return "".join(rnd.choice("abc-_.") for _ in range(size))
    if roll < 0.2:
        return rnd.choice(sorted(yamlout.NOT_STRINGS | yamlout.FLOAT_WORDS | {"0.5.0", "-1", "07"}))
    return "".join(rnd.choice(KEY_ALPHABET) for _ in range(rnd.randint(1, 9)))


SCALARS = [_text, _text, _text, lambda r: r.randint(-(10**6), 10**6),
           lambda r: r.random() < 0.5, lambda r: None, lambda r: r.random()]  # fmt: skip


def _scalar(rnd: random.Random):
    return rnd.choice(SCALARS)(rnd)


def _node(rnd: random.Random, depth: int, made: list):
    """A scalar, dict or list; now and then one made before (PyYAML anchors those)."""
    if made and rnd.random() < 0.03:
        return rnd.choice(made)
    roll = rnd.random()
    if depth >= 4 or roll < 0.5:
        return _scalar(rnd)
    if roll < 0.8:
        node = {_text(rnd): _node(rnd, depth + 1, made) for _ in range(rnd.randint(0, 4))}
    else:
        node = [_node(rnd, depth + 1, made) for _ in range(rnd.randint(0, 4))]
    made.append(node)
    return node


def test_generated_documents_are_written_as_pyyaml_writes_them():
    """Random documents (fixed seed): yamlout's bytes are PyYAML's, whichever of the two
    wrote them, and most are written by yamlout itself."""
    rnd, own = random.Random(28), 0
    for _ in range(1500):
        made: list = []
        doc = {_text(rnd) or "k": _node(rnd, 1, made) for _ in range(rnd.randint(1, 5))}
        assert yamlout.dump(doc) == pyyaml(doc), repr(doc)[:2000]
        try:
            yamlout._mapping(doc, "", "", [], set())
            own += 1
        except yamlout.Unsupported:
            pass
    assert own > 150


@pytest.mark.parametrize(
    "doc",
    [{"": "v"}, {"k" * 127: 1}, {"k" * 128: 1}, {"k" * 1025: 1}, {"a": {}, "b": None}],
    ids=["empty-key", "key-127", "key-128", "key-1025", "plain"],
)
def test_issue_28_keys(doc):
    assert yamlout.dump(doc) == pyyaml(doc)
    assert yaml.safe_load(yamlout.dump(doc)) == doc


def test_an_object_used_twice_gets_pyyamls_anchor():
    shared = {"path": "/dev/nvidia0"}
    doc = {"a": [shared], "b": shared, "c": [], "d": []}
    doc["d"] = doc["c"]
    assert yamlout.dump(doc) == pyyaml(doc) and "&id001" in yamlout.dump(doc)
