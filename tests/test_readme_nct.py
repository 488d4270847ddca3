"""docs/coming-from-nvidia-toolkit.md, run step by step as written: every
`nvshim` line of its code blocks, in order, with the exit code its comment states, on a
reference-configured containerd file, the device-plugin ConfigMap and a simulated host."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import tomllib

import pytest

from tests.conftest import REPO, run_nvshim
from tests.engines.corpus_cases import containerd_dump
from tests.test_configure_inherit import REFERENCE

PAGE = os.path.join(REPO, "docs", "coming-from-nvidia-toolkit.md")
CONFIGMAP = os.path.join(REPO, "tests", "sharing_corpus", "configmap-per-node.yaml")


def section_blocks() -> list[list[str]]:
    """The ```sh blocks of the page, each a list of its lines."""
    with open(PAGE) as fh:
        text = fh.read()
    return [block.strip().splitlines() for block in re.findall(r"```sh\n(.*?)```", text, re.S)]


def steps(lines: list[str]) -> list[tuple[list[str], int]]:
    """(argv, expected exit code) of each `nvshim` line; `# exit N` in its comment."""
    out = []
    for line in lines:
        command, _, comment = line.partition("#")
        if not command.strip().startswith("nvshim "):
            continue
        found = re.match(r"\s*exit (\d+)", comment)
        out.append((shlex.split(command)[1:], int(found.group(1)) if found else 0))
    return out


def test_the_section_has_the_migration_and_the_way_back():
    blocks = section_blocks()
    assert len(blocks) == 2
    assert [argv[0] for argv, _ in steps(blocks[0])] == [
        "configure",
        "configure",
        "configure",
        "config",
        "info",
    ]
    assert [argv[0] for argv, _ in steps(blocks[1])] == ["unconfigure"]


def test_migration_and_back_as_the_page_says(tmp_path, sim_hosts):
    sim = sim_hosts("h100x8-mig")
    containerd = tmp_path / "config.toml"
    containerd.write_text(REFERENCE)
    sharing = tmp_path / "sharing.yaml"
    shutil.copy(CONFIGMAP, sharing)
    nvshim_config = tmp_path / "nvshim.toml"
    nvshim_config.write_text(
        f'[host]\ndriver-root = "{sim.driver_root}"\ndev-root = "{sim.dev_root}"\n'
        f'[sharing]\nconfig = "{sharing}"\nconfig-name = "a100-40gb"\n'
    )
    env = {
        "CONTAINERD_CONFIG": str(containerd),
        "NVSHIM_CONFIG": str(nvshim_config),
        "NVSHIM_CONTAINERD_VERSION": "1.6.20",
        "NVSHIM_CGROUP_DRIVER": "cgroupfs",
    }
    migrate, back = (steps(b) for b in section_blocks())
    outputs = []
    for argv, code in migrate:
        proc = run_nvshim(*argv, env=env)
        assert proc.returncode == code, (argv, proc.stdout, proc.stderr)
        outputs.append(proc.stdout)
        if argv[0] == "configure" and code == 1:
            assert containerd.read_text() == REFERENCE  # --check writes nothing
    table = tomllib.loads(containerd.read_text())["plugins"]["io.containerd.grpc.v1.cri"]
    nvidia = table["containerd"]["runtimes"]["nvidia"]
    assert nvidia["options"] == {"BinaryName": "/usr/bin/nvshim-runtime", "SystemdCgroup": True}
    assert table["containerd"]["default_runtime_name"] == "nvidia"
    assert 'config-name = "a100-40gb"' in outputs[3]
    rows = {line.split()[0]: line for line in outputs[4].splitlines() if line.strip()}
    assert rows["0"].rstrip().endswith("time-slicing x8")  # a100-40gb: mixed, gpu x8
    assert rows["6:2"].rstrip().endswith("none")
    if shutil.which("containerd"):
        assert 'BinaryName = "/usr/bin/nvshim-runtime"' in containerd_dump(containerd)

    for argv, code in back:
        proc = run_nvshim(*argv, env=env)
        assert proc.returncode == code, (argv, proc.stdout, proc.stderr)
    assert containerd.read_bytes() == REFERENCE.encode()
    assert sorted(os.listdir(tmp_path)) == ["config.toml", "nvshim.toml", "sharing.yaml"]


@pytest.mark.parametrize("bad", ["version: v3\n", "sharing: {mps: {resources: []}}\n"])
def test_config_show_step_fails_on_a_bad_sharing_file(tmp_path, bad):
    sharing = tmp_path / "sharing.yaml"
    sharing.write_text(bad)
    config = tmp_path / "nvshim.toml"
    config.write_text(f'[sharing]\nconfig = "{sharing}"\n')
    proc = run_nvshim("config", "show", env={"NVSHIM_CONFIG": str(config)})
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"nvshim: error: {sharing}: ")
