"""`nvshim cdi generate` through nvshim.entry (no click): the same options as the click
command, the same output, messages and exit codes, and none of the slow imports."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from nvshim import entry
from nvshim.cli.cdi import generate as click_generate
from nvshim.host.files import split_so
from tests.conftest import NVSHIM, REPO


def test_reader_knows_exactly_the_click_options():
    options, flags = {}, {}
    # what click passes the command when the line names no option
    defaults = click_generate.make_context("generate", []).params
    for param in click_generate.params:
        for opt in param.opts:
            if param.is_flag:
                flags[opt] = param.name
            else:
                choices = getattr(param.type, "choices", None)
                options[opt] = (param.name, tuple(choices) if choices else None, param.multiple)
    assert options == entry.GENERATE_OPTIONS
    assert flags == entry.GENERATE_FLAGS
    assert defaults == entry.GENERATE_DEFAULTS


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["--mode", "bogus"],
        ["--format"],
        ["--unknown"],
        ["extra"],
        ["--", "-o", "x"],
    ],
)
def test_lines_it_does_not_take_go_to_click(args):
    assert entry.generate_arguments(["cdi", "generate", *args]) is None


def test_reading():
    got = entry.generate_arguments(
        ["cdi", "generate", "-ox.json", "--device-name-strategy=uuid"]
        + ["--device-name-strategy", "index", "--no-all-device", "--class=c", "--vendor", "v"]
    )
    assert got == {
        **entry.GENERATE_DEFAULTS,
        "output": "x.json",
        "strategies": ("uuid", "index"),
        "no_all_device": True,
        "cls": "c",
        "vendor": "v",
    }
    assert entry.generate_arguments(["cdi", "list"]) is None


def run(argv: list[str], click_only: bool, env: dict) -> subprocess.CompletedProcess:
    """``nvshim ARGV`` through the console script, or straight through the click CLI."""
    if click_only:
        command = [sys.executable, "-c", "from nvshim.cli import main; main()", *argv]
    else:
        command = [NVSHIM, *argv]
    return subprocess.run(command, capture_output=True, text=True, env=env)


CASES = [
    ["-o", "{tmp}/a/b/spec.yaml"],
    ["--format", "json", "--device-name-strategy", "type-index", "--no-all-device"],
    ["--mode", "management", "--vendor", "example.com", "--class", "dev"],
    ["--capabilities", "all,bogus", "--hook-path", "/x/nvshim-hook"],
    ["-o", "{tmp}/spec.txt"],  # no format from the extension: a usage error
    ["--vendor", "9bad"],  # a bad vendor: a usage error
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_same_results_as_the_click_command(sim_hosts, tmp_path, case):
    sim = sim_hosts("h100x8-mig")
    env = {**os.environ, "NVSHIM_CONFIG": os.devnull}
    results = []
    for click_only in (False, True):
        tmp = tmp_path / ("click" if click_only else "entry")
        tmp.mkdir()
        args = [a.replace("{tmp}", str(tmp)) for a in CASES[case]]
        argv = ["cdi", "generate", "--driver-root", sim.driver_root, "--dev-root", sim.dev_root]
        proc = run(argv + args, click_only, env)
        files = sorted(
            (os.path.relpath(os.path.join(d, f), tmp), open(os.path.join(d, f)).read())
            for d, _, names in os.walk(tmp)
            for f in names
        )
        results.append((proc.returncode, proc.stdout, proc.stderr.replace(str(tmp), "TMP"), files))
    assert results[0] == results[1]


def test_no_nvml_is_one_line(tmp_path):
    env = {**os.environ, "NVSHIM_CONFIG": os.devnull}
    proc = run(["cdi", "generate", "--driver-root", str(tmp_path)], False, env)
    assert proc.returncode == 1
    assert proc.stderr == (
        f"nvshim: error: driver root {tmp_path}: no NVML library (libnvidia-ml.so.1) found\n"
    )


SLOW = ("click", "yaml", "pynvml", "re", "typing", "json", "tomllib", "dataclasses", "ctypes")


def test_generate_imports_none_of_the_slow_modules(sim_hosts, tmp_path):
    sim = sim_hosts("h100x8-mig")
    code = (
        "import sys\n"
        f"sys.path[:0] = [{REPO!r}]\n"
        "from nvshim.entry import main\n"
        "try:\n"
        "    main()\n"
        "finally:\n"
        "    print(' '.join(sorted(sys.modules)))\n"
    )
    argv = ["cdi", "generate", "--driver-root", sim.driver_root, "--dev-root", sim.dev_root]
    for _ in range(2):  # the second with the parsed config cached (no tomllib)
        proc = subprocess.run(  # as the isolated launcher starts Python
            [sys.executable, "-I", "-S", "-c", code, *argv, "-o", str(tmp_path / "spec.yaml")],
            capture_output=True,
            text=True,
            env={**os.environ, "NVSHIM_CONFIG": os.devnull},
        )
        assert proc.returncode == 0, proc.stderr
    loaded = set(proc.stdout.split())
    assert "nvshim.cdi.generate" in loaded
    assert loaded.isdisjoint(SLOW), sorted(loaded & set(SLOW))


@pytest.mark.parametrize(
    "name",
    [
        "libcuda.so",
        "libcuda.so.1",
        "libcuda.so.550.90.12",
        "libnvidia-ml.so.550.90.12",
        "libfoo.so.1.so.2",
        "libx.sox.so.3",
        "libx.so.a1",
        "libx.so.",
        "libx.so.1a",
        ".so.1",
        "a.so.1.2.",
        "libGLX_nvidia.so.0",
        "plain.txt",
    ],
)
def test_split_so_matches_the_rule_it_replaced(name):
    import re

    m = re.match(r"^(?P<stem>.+?)\.so(?:\.(?P<ver>[0-9][0-9.]*))?$", name)
    want = (m.group("stem"), m.group("ver") or "") if m else None
    assert split_so(name) == want
