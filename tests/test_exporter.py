"""`nvshim exporter` on a loopback port, scraped over HTTP: its metrics match what the test
did (containers run through nvshim-runtime and runc, one refused, an MPS daemon killed)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from nvshim.cli.exporter import parse_listen
from nvshim.errors import UsageError
from tests.conftest import NVSHIM, run_nvshim
from tests.podman_util import make_busybox_rootfs
from tests.runc_util import make_bundle, runc_run
from tests.sharing_util import mixed_sharing
from tests.sim import fake_mps_control
from tests.sim.simhost import build_host
from tests.test_mps_daemon import MpsHost, _cleanup

# MPS on every whole GPU (0-5); mixed leaves GPUs 6 and 7, in MIG mode, out
SHARING = mixed_sharing("mps", {"nvidia.com/gpu": 2})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int, timeout: float = 30.0) -> dict[tuple[str, tuple], float]:
    """``{(sample name, sorted labels): value}`` of one scrape (retried until it answers)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
                text = r.read().decode()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


@pytest.fixture
def node(tmp_path, launchers):
    sim = build_host(
        "h100x8-mig", str(tmp_path / "host"), extra_files=fake_mps_control.extra_files()
    )
    (tmp_path / "sharing.yaml").write_text(SHARING)
    (tmp_path / "cdi").mkdir()
    config = tmp_path / "config.toml"
    config.write_text(
        f'[host]\ndriver-root = "{sim.driver_root}"\ndev-root = "{sim.dev_root}"\n'
        f'[runtime]\nlog-file = "{tmp_path}/nvshim.log"\ninventory-dir = "{tmp_path}/state"\n'
        f'hook-path = "{launchers}/nvshim-hook"\n'
        f"[policy]\naccept-env-unprivileged = true\n"
        f'[sharing]\nconfig = "{tmp_path}/sharing.yaml"\nmps-root = "{tmp_path}/mps"\n'
    )
    ctx = MpsHost(sim, None, str(config), str(tmp_path / "mps"))
    yield ctx
    _cleanup(ctx)


def test_scraped_metrics_match_what_happened(node, tmp_path, launchers):
    env = {"NVSHIM_CONFIG": node.config}
    for args in (
        ("mps", "start"),
        ("cdi", "generate", "-o", str(tmp_path / "cdi" / "nvidia.yaml")),
    ):
        proc = node.nvshim(*args)
        assert proc.returncode == 0, proc.stderr
    gpu1 = node.sim.gpu_uuids()[1]
    os.kill(node.pid(gpu1), signal.SIGKILL)  # GPU 1's daemon dies

    rootfs = make_busybox_rootfs(tmp_path / "rootfs")
    runtime = os.path.join(launchers, "nvshim-runtime")

    def run(name: str, request: str | None) -> int:
        extra = {"NVIDIA_VISIBLE_DEVICES": request} if request else {}
        bundle = make_bundle(tmp_path, rootfs, ["true"], env=extra, name=name)
        return runc_run(bundle, f"exp-{os.getpid()}-{name}", runtime=runtime, env=env).returncode

    assert [run("a", "2"), run("b", "3"), run("plain", None)] == [0, 0, 0]
    assert run("bad", "9") != 0  # no GPU 9: refused

    port = free_port()
    exporter = subprocess.Popen(
        [
            NVSHIM,
            "exporter",
            "--listen",
            f"127.0.0.1:{port}",
            "--doctor-interval",
            "0",
            "--cdi-dir",
            str(tmp_path / "cdi"),
            "--hooks-dir",
            str(tmp_path / "hooks"),
            "--engine",
            "containerd",
            "--engine-config",
            str(tmp_path / "none.toml"),
            "--socket",
            str(tmp_path / "none.sock"),
        ],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        metrics = scrape(port)
        assert run("c", "4") == 0
        again = scrape(port)
    finally:
        exporter.terminate()
        _out, err = exporter.communicate(timeout=30)
    assert exporter.returncode == 0, err

    def value(sample, m=metrics, **labels):
        return m.get((sample, tuple(sorted(labels.items()))))

    runtime_tool = {"tool": "nvshim-runtime"}
    assert value("nvshim_containers_total", **runtime_tool, decision="injected", source="env") == 2
    assert (
        value("nvshim_containers_total", **runtime_tool, decision="refused", source="unknown") == 1
    )
    assert value("nvshim_refusals_total", **runtime_tool, reason="request") == 1
    assert (
        value("nvshim_containers_total", again, **runtime_tool, decision="injected", source="env")
        == 3
    )
    up = {labels: v for (sample, labels), v in metrics.items() if sample == "nvshim_mps_daemon_up"}
    uuids = node.sim.gpu_uuids()
    assert up == {
        (("device", str(i)), ("uuid", uuids[i])): 0 if i == 1 else 1 for i in range(6)
    }  # GPU 1's daemon down, none for the GPUs in MIG mode
    assert value("nvshim_doctor_check", check="mps-daemons", status="fail") == 1
    assert value("nvshim_doctor_check", check="driver", status="ok") == 1
    assert value("nvshim_doctor_healthy") == 0
    age = value("nvshim_cdi_spec_age_seconds", path=str(tmp_path / "cdi" / "nvidia.yaml"))
    assert age is not None and 0 <= age < 600
    assert value("nvshim_log_unparsed_lines_total") == 0


def test_listen_addresses():
    assert parse_listen("127.0.0.1:9400") == ("127.0.0.1", 9400)
    assert parse_listen("[::1]:9400") == ("::1", 9400)
    assert parse_listen(":9400") == ("0.0.0.0", 9400)
    for bad in ("9400", "host:", "host:99999", "host:x"):
        with pytest.raises(UsageError):
            parse_listen(bad)


def test_port_in_use_is_one_error_line(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = run_nvshim("exporter", "--listen", f"127.0.0.1:{port}", timeout=60)
    assert proc.returncode == 1  # the work failed: not a usage error
    assert proc.stderr.strip().splitlines() == [
        f"nvshim: error: --listen 127.0.0.1:{port}: Address already in use"
    ]


def test_log_counts_survive_rotation_between_polls(tmp_path):
    from nvshim import log
    from nvshim.config import Config, RuntimeConfig
    from nvshim.exporter.logtail import LogStats

    log_file = str(tmp_path / "nvshim.log")
    config = Config(runtime=RuntimeConfig(log_file=log_file, log_max_size=1024, log_backups=1))
    stats = LogStats(str(tmp_path / "nvshim.log"))
    written = 0
    for batch in (3, 5, 4, 6, 5, 7):  # each batch < one file's worth: nothing is lost between polls
        for _ in range(batch):
            log.log_decision(config, "nvshim-runtime", f"c{written}", source="cdi", devices="GPU-1")
            written += 1
        stats.poll()
    assert (tmp_path / "nvshim.log.1").exists()  # it did rotate
    assert stats.containers == {("nvshim-runtime", "injected", "cdi"): written}
