"""The document editors under `nvshim configure`: exact layout of what they add and remove."""

from __future__ import annotations

import shutil

import pytest

from nvshim.engines.containerd import installed_version, parse_version
from nvshim.engines.doc import MISSING, same
from nvshim.engines.jsondoc import JsonDoc
from nvshim.engines.tomldoc import TomlDoc, find_line
from nvshim.errors import InputFileError

RT = ("plugins", "io.containerd.grpc.v1.cri", "containerd", "runtimes")
NVSHIM = {"runtime_type": "io.containerd.runc.v2", "options": {"BinaryName": "/x"}}

TRAILING = """\
version = 2

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

# Metrics for the node exporter.
[metrics]
  address = "127.0.0.1:1338"
"""


def test_comment_leading_into_the_next_table_stays_in_front_of_it():
    doc = TomlDoc(TRAILING, "c.toml")
    doc.set(RT + ("nvshim",), NVSHIM)
    assert doc.render().decode() == TRAILING.replace(
        "\n# Metrics",
        '\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvshim]\n'
        '  runtime_type = "io.containerd.runc.v2"\n\n'
        '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvshim.options]\n'
        '  BinaryName = "/x"\n\n# Metrics',
    )
    doc.delete(RT + ("nvshim",))
    assert doc.render().decode() == TRAILING


def test_new_key_takes_sibling_indent_and_keeps_the_files_quotes():
    text = "[a]\n    x = 'one'  # why\n    y = 2\n\n    [a.b]\n    z = 3\n"
    doc = TomlDoc(text, "q.toml")
    doc.set(("a", "x"), "two")
    doc.set(("a", "w"), ["p", "q"])
    assert doc.render().decode() == (
        "[a]\n    x = 'two'  # why\n    y = 2\n    w = ['p', 'q']\n\n    [a.b]\n    z = 3\n"
    )


def test_crlf_file_gets_crlf_lines():
    text = 'version = 2\r\n\r\n[plugins."io.containerd.grpc.v1.cri"]\r\n  x = 1\r\n'
    doc = TomlDoc(text, "w.toml")
    doc.set(RT + ("nvshim",), NVSHIM)
    out = doc.render()
    assert out.startswith(text.encode())
    assert b"\n" not in out.replace(b"\r\n", b"")


def test_inline_table_on_the_way_is_refused_with_its_line():
    text = (
        'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\nruntimes = { runc = {} }\n'
    )
    doc = TomlDoc(text, "i.toml")
    inline = r"^i\.toml:3: cannot add to .*runtimes: it is an inline"
    with pytest.raises(InputFileError, match=inline):
        doc.set(RT + ("nvshim",), NVSHIM)


def test_out_of_order_tables_get_the_key_in_their_declared_part():
    text = (
        '[plugins."io.containerd.grpc.v1.cri".containerd]\n  snapshotter = "overlayfs"\n\n'
        '[plugins."io.containerd.grpc.v1.cri".cni]\n  bin_dir = "/opt/cni/bin"\n\n'
        '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\n  x = 1\n'
    )
    doc = TomlDoc(text, "o.toml")
    doc.set(("plugins", "io.containerd.grpc.v1.cri", "containerd", "default_runtime_name"), "n")
    assert doc.render().decode() == text.replace(
        '  snapshotter = "overlayfs"\n',
        '  snapshotter = "overlayfs"\n  default_runtime_name = "n"\n',
    )


def test_find_line_skips_multiline_values():
    text = 'a = """\n[fake]\nx = 1\n"""\nlist = [\n  "[x]",\n]\n[real]\nx = 2\n'
    assert find_line(text, ("real", "x")) == 9
    assert find_line(text, ("real",)) == 8
    assert find_line(text, ("fake",)) is None


def test_json_keeps_order_indent_and_one_line_members():
    text = '{\n\t"b": 1,\n\t"a": {"k": [1, 2]},\n\t"c": [\n\t\t"x"\n\t]\n}'
    doc = JsonDoc(text, "d.json")
    doc.set(("a", "new"), True)
    doc.set(("z",), {"p": []})
    assert doc.render().decode() == (
        '{\n\t"b": 1,\n\t"a": {"k": [1, 2], "new": true},\n\t"c": [\n\t\t"x"\n\t],\n'
        '\t"z": {\n\t\t"p": []\n\t}\n}'
    )
    assert doc.line_of(("c",)) == 4
    assert doc.get(("missing", "x")) is MISSING


def test_same_tells_booleans_from_numbers():
    assert not same(True, 1) and not same(1, 1.0) and same({"a": [1]}, {"a": [1]})
    assert same({"a": 1, "b": 2}, {"b": 2, "a": 1})


@pytest.mark.parametrize(
    "text, version",
    [
        ("containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3", (1, 6, 20)),
        ("containerd containerd.io 1.7.27 05044ec0a9a75232cad458027ca83437aae3f4da", (1, 7, 27)),
        ("containerd github.com/containerd/containerd/v2 v2.1.1 cb1076646aa3", (2, 1, 1)),
        ("2.0", (2, 0, 0)),
        ("nonsense", None),
    ],
)
def test_parse_containerd_version(text, version):
    assert parse_version(text) == version


@pytest.mark.skipif(shutil.which("containerd") is None, reason="containerd not installed")
def test_installed_containerd_version_is_detected():
    found = installed_version()
    assert found is not None and found >= (1, 0, 0)
