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
