"""The decision log: pod names from a real containerd's CRI annotations, JSON lines,
levels, size-based rotation across many writers, journald, and reading lines back."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

from nvshim import log
from nvshim.config import Config, RuntimeConfig
from tests.conftest import write_config
from tests.cri_util import configure_containerd, cri_ready_config, cri_session, image_archive
from tests.engines.containerd_instance import private_containerd
from tests.engines.corpus_cases import CORPUS
from tests.podman_util import make_busybox_rootfs

V16 = (CORPUS / "containerd-1.6-default" / "input" / "config.toml").read_text()
IMAGE = "nvshim.test/busybox:log"
PAUSE = "nvshim.test/pause:log"
HOSTILE = 'a "quoted"\nvalue\\with=signs\r\x1b[2J\tend'


def config_for(path, **runtime) -> Config:
    """An nvshim Config whose [runtime] log fields are ``runtime``."""
    return Config(runtime=RuntimeConfig(log_file=str(path), **runtime))


def pod(n: int) -> dict[str, str]:
    return {
        "io.kubernetes.cri.sandbox-namespace": f"team-{n % 3}",
        "io.kubernetes.cri.sandbox-name": f"trainer-{n}",
        "io.kubernetes.cri.container-name": "main",
    }


@pytest.mark.skipif(shutil.which("containerd") is None, reason="needs containerd")
def test_cri_pod_line_names_namespace_pod_and_container(
    tmp_path, sim_hosts, launchers, monkeypatch
):
    sim = sim_hosts("single")
    nv_log = tmp_path / "nvshim.log"
    nv_config = tmp_path / "nvshim.toml"
    write_config(nv_config, sim, launchers, tmp_path / "state", nv_log)
    monkeypatch.setenv("NVSHIM_CONFIG", str(nv_config))  # containerd -> shim -> runtime
    rootfs = make_busybox_rootfs(tmp_path / "rootfs")
    os.symlink("busybox", os.path.join(rootfs, "bin", "sleep"))
    archive = image_archive(rootfs, tmp_path / "image.tar", [IMAGE, PAUSE])
    config = tmp_path / "containerd.toml"
    config.write_text(cri_ready_config(V16, tmp_path / "scratch", PAUSE))
    configure_containerd(config, os.path.join(launchers, "nvshim-runtime"), "--enable-cdi")
    (tmp_path / "pod-logs").mkdir()
    with private_containerd(tmp_path, config) as ctd:
        assert ctd.ctr("-n", "k8s.io", "images", "import", archive).returncode == 0
        with cri_session(ctd.socket, IMAGE) as cri:
            sandbox = cri.run_pod("inference-7f9c", tmp_path / "pod-logs", "nvshim")
            result = cri.run_container(
                sandbox,
                "worker",
                IMAGE,
                ["true"],
                annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=0"},
            )
    assert result.exit_code == 0
    lines = [log.parse_line(x) for x in nv_log.read_text().splitlines()]
    mine = [r for r in lines if r and r["id"] == result.container_id]
    assert len(mine) == 1, nv_log.read_text()
    record = mine[0]
    assert (record["namespace"], record["pod"], record["container"]) == (
        "nvshim",
        "inference-7f9c",
        "worker",
    )
    assert record["tool"] == "nvshim-runtime" and record["level"] == "info"
    assert record["devices"] == sim.gpu_uuids()[0] and record["source"] == "cdi"


def test_json_lines_parse_and_keep_hostile_values_whole(tmp_path):
    path = tmp_path / "nvshim.log"
    config = config_for(path, log_format="json")
    annotations = {**pod(1), "io.kubernetes.cri.container-name": HOSTILE}
    log.log_decision(
        config, "nvshim-runtime", "c1", annotations=annotations, source="cdi", devices="GPU-1"
    )
    log.log_decision(
        config, "nvshim-runtime", "c2", error="no such GPU 9", echo=False, annotations=pod(2)
    )
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["id"] for r in records] == ["c1", "c2"]
    assert records[0]["container"] == HOSTILE and records[0]["pod"] == "trainer-1"
    assert records[0]["level"] == "info" and records[1]["level"] == "error"
    assert records[1]["error"] == "no such GPU 9" and records[1]["reason"] == "error"
    assert [log.parse_line(x) for x in path.read_text().splitlines()][0]["container"] == HOSTILE


def test_text_lines_read_back_exactly(tmp_path):
    path = tmp_path / "nvshim.log"
    log.log_decision(
        config_for(path),
        "nvshim-hook",
        "c3",
        annotations={
            "io.kubernetes.pod.namespace": "crio-ns",
            "io.kubernetes.pod.name": "p",
            "io.kubernetes.container.name": HOSTILE,
        },
        step="prestart",
    )
    (line,) = path.read_text().splitlines()
    assert not any(c < " " or c == "\x7f" for c in line)  # no control character reaches it
    record = log.parse_line(line)
    assert record["container"] == HOSTILE and record["namespace"] == "crio-ns"
    assert record["step"] == "prestart" and record["tool"] == "nvshim-hook"


def test_refusal_reason_comes_from_the_error_class(tmp_path):
    from nvshim.policy.require import RequirementError

    path = tmp_path / "nvshim.log"
    log.log_decision(
        config_for(path), "nvshim-runtime", "c4", error=RequirementError("cuda>=13"), echo=False
    )
    assert log.parse_line(path.read_text())["reason"] == "requirement"


def test_level_drops_lower_records(tmp_path):
    path = tmp_path / "nvshim.log"
    config = config_for(path, log_level="error")
    log.log_decision(config, "nvshim-runtime", "ok1", devices="GPU-1")
    log.log_decision(config, "nvshim-runtime", "bad1", error="boom", echo=False)
    assert [log.parse_line(x)["id"] for x in path.read_text().splitlines()] == ["bad1"]


def test_rotation_keeps_the_file_under_its_bound(tmp_path):
    path = tmp_path / "nvshim.log"
    config = config_for(path, log_max_size=4096, log_backups=2)
    ids = []
    for n in range(400):
        ids.append(f"container-{n:04d}")
        log.log_decision(config, "nvshim-runtime", ids[-1], annotations=pod(n), devices="GPU-1")
        assert path.stat().st_size <= 4096
    names = sorted(os.listdir(tmp_path))
    assert names == ["nvshim.log", "nvshim.log.1", "nvshim.log.2"]
    kept = [
        log.parse_line(x)["id"]
        for n in (".2", ".1", "")
        for x in (tmp_path / f"nvshim.log{n}").read_text().splitlines()
    ]
    assert kept == ids[-len(kept) :]  # the newest records, in order, none torn
    assert all((tmp_path / n).stat().st_size <= 4096 for n in names)


_WRITER = """
import sys
from nvshim import log
from nvshim.config import Config, RuntimeConfig
config = Config(runtime=RuntimeConfig(log_file=sys.argv[1], log_max_size=8192, log_backups=3))
for n in range(150):
    log.log_decision(config, "nvshim-runtime", f"{sys.argv[2]}-{n}",
                     annotations={"io.kubernetes.cri.sandbox-name": f"pod-{n}"}, devices="GPU-1")
"""


def test_rotation_under_concurrent_writers(tmp_path):
    path = tmp_path / "nvshim.log"
    procs = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(path), f"w{i}"]) for i in range(4)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    files = sorted(os.listdir(tmp_path))
    assert files == ["nvshim.log", "nvshim.log.1", "nvshim.log.2", "nvshim.log.3"]
    longest = 200
    for name in files:
        text = (tmp_path / name).read_text()
        assert len(text) <= 8192 + 4 * longest  # at most one line per racing writer over
        assert all(log.parse_line(x)["id"].startswith("w") for x in text.splitlines())


def test_journald_target(tmp_path, monkeypatch):
    sock_path = str(tmp_path / "journal.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(sock_path)
    server.settimeout(5)
    monkeypatch.setattr(log, "JOURNAL_SOCKET", sock_path)
    config = config_for(tmp_path / "unused.log", log_target="journald")
    log.log_decision(
        config, "nvshim-runtime", "c9", error="daemon down", echo=False, annotations=pod(4)
    )
    entry = dict(x.split("=", 1) for x in server.recv(65536).decode().splitlines())
    server.close()
    assert entry["SYSLOG_IDENTIFIER"] == "nvshim-runtime" and entry["PRIORITY"] == "3"
    assert entry["NVSHIM_POD"] == "trainer-4" and entry["NVSHIM_NAMESPACE"] == "team-1"
    assert 'error="daemon down"' in entry["MESSAGE"]
    assert not (tmp_path / "unused.log").exists()
