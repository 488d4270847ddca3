"""`nvshim node` and the GPU Operator's toolkit variables (FACTS §10): each variable nvshim
honours, one case each, with the file or setting it must change; every Go ParseBool
spelling; variables it cannot honour are named in a warning; bad values are one error
line, a non-zero exit, and not one byte changed on the scratch host."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tomllib

import pytest
import yaml

from nvshim.envbool import GO_FALSE, GO_TRUE
from nvshim.node.env import UNHONOURED, resolve_node
from tests.node_util import SIM_DIR, Scratch, node, start_node, wait_for


def toml(path) -> dict:
    return tomllib.loads(path.read_text())


def cri(doc: dict) -> dict:
    return doc["plugins"]["io.containerd.grpc.v1.cri"]


def installed(scratch: Scratch, **env: str) -> subprocess.CompletedProcess:
    done = node("install", env=scratch.env(**env))
    assert done.returncode == 0, done.stderr
    return done


# --- one case per honoured variable -------------------------------------------------


def test_runtime_config_alone_edits_the_named_file(scratch):
    other = scratch.path("/etc/k8s/containerd.toml")
    other.parent.mkdir(parents=True)
    other.write_bytes(scratch.original)
    installed(scratch, RUNTIME_CONFIG="/etc/k8s/containerd.toml")
    assert "nvshim" in cri(toml(other))["containerd"]["runtimes"]
    assert scratch.config.read_bytes() == scratch.original  # the default path untouched


@pytest.mark.parametrize("alias", ["CONTAINERD_CONFIG"])
def test_config_alias_and_first_wins(scratch, alias):
    for name in ("a.toml", "b.toml"):
        scratch.path(f"/etc/{name}").write_bytes(scratch.original)
    installed(scratch, **{alias: "/etc/b.toml"})
    assert "nvshim" in cri(toml(scratch.path("/etc/b.toml")))["containerd"]["runtimes"]
    # RUNTIME_CONFIG comes first among the aliases
    node("uninstall", env=scratch.env(**{alias: "/etc/b.toml"}))
    installed(scratch, RUNTIME_CONFIG="/etc/a.toml", **{alias: "/etc/b.toml"})
    assert "nvshim" in cri(toml(scratch.path("/etc/a.toml")))["containerd"]["runtimes"]
    assert scratch.path("/etc/b.toml").read_bytes() == scratch.original


def test_runtime_docker_is_the_default_engine_with_docker_config(scratch):
    env = scratch.env(DOCKER_CONFIG="/etc/docker/custom.json")
    del env["RUNTIME"]
    done = node("install", env=env)
    assert done.returncode == 0, done.stderr
    daemon = json.loads(scratch.path("/etc/docker/custom.json").read_text())
    assert daemon["runtimes"]["nvshim"]["path"] == "/usr/local/nvshim/bin/nvshim-runtime"
    assert daemon["default-runtime"] == "nvshim"  # NVIDIA_RUNTIME_SET_AS_DEFAULT: true


def test_host_root_mount_and_toolkit_install_dir(scratch):
    installed(scratch, TOOLKIT_INSTALL_DIR="/opt/gpu/nvshim")
    entry = cri(toml(scratch.config))["containerd"]["runtimes"]["nvshim"]
    assert entry["options"]["BinaryName"] == "/opt/gpu/nvshim/bin/nvshim-runtime"
    assert os.access(scratch.path("/opt/gpu/nvshim/bin/nvshim-runtime"), os.X_OK)
    host_config = toml(scratch.path("/etc/nvshim/config.toml"))
    assert host_config["runtime"]["hook-path"] == "/opt/gpu/nvshim/bin/nvshim-hook"


def test_root_is_an_alias_of_toolkit_install_dir(scratch):
    installed(scratch, ROOT="/opt/other")
    assert os.access(scratch.path("/opt/other/bin/nvshim-hook"), os.X_OK)


def test_runtime_name_set_as_default_and_enable_cdi(scratch):
    installed(
        scratch,
        CONTAINERD_RUNTIME_CLASS="gpu",
        CONTAINERD_SET_AS_DEFAULT="false",
        RUNTIME_ENABLE_CDI="true",
    )
    table = cri(toml(scratch.config))
    assert "gpu" in table["containerd"]["runtimes"]
    assert table["containerd"]["default_runtime_name"] == "runc"
    assert table["enable_cdi"] is True


def test_nvidia_runtime_name_wins_over_containerd_runtime_class(scratch):
    installed(scratch, NVIDIA_RUNTIME_NAME="first", CONTAINERD_RUNTIME_CLASS="second")
    runtimes = cri(toml(scratch.config))["containerd"]["runtimes"]
    assert "first" in runtimes and "second" not in runtimes


def test_drop_in_names_the_host_path_in_imports(scratch):
    scratch.config.write_text('version = 3\n[plugins."io.containerd.cri.v1.runtime"]\n')
    installed(
        scratch,
        NVSHIM_CONTAINERD_VERSION="2.1.0",
        RUNTIME_DROP_IN_CONFIG="/elsewhere/99-nvshim.toml",
        RUNTIME_DROP_IN_CONFIG_HOST_PATH="/etc/containerd/conf.d/99-nvshim.toml",
    )
    main = toml(scratch.config)
    assert main["imports"] == ["/etc/containerd/conf.d/99-nvshim.toml"]
    drop_in = toml(scratch.path("/etc/containerd/conf.d/99-nvshim.toml"))
    assert "nvshim" in drop_in["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]
    assert not scratch.path("/elsewhere").exists()


def test_driver_and_dev_roots_with_container_paths(tmp_path, scratch):
    # The driver is at /run/nvidia/driver on the host, mounted somewhere else here.
    installed(
        scratch,
        CDI_ENABLED="true",
        NVIDIA_DRIVER_ROOT="/run/nvidia/driver",
        DRIVER_ROOT_CTR_PATH=scratch.sim.driver_root,
        NVIDIA_DEV_ROOT="/",
        DEV_ROOT_CTR_PATH=scratch.sim.dev_root,
    )
    spec = yaml.safe_load(scratch.path("/var/run/cdi/nvshim.yaml").read_text())
    mounts = [m["hostPath"] for m in spec["containerEdits"]["mounts"]]
    assert mounts and all(m.startswith("/run/nvidia/driver/") for m in mounts), mounts
    nodes = [
        n.get("hostPath", n["path"])
        for d in spec["devices"]
        for n in d["containerEdits"]["deviceNodes"]
    ]
    assert nodes and all(n.startswith("/dev/") for n in nodes), nodes
    host = toml(scratch.path("/etc/nvshim/config.toml"))["host"]
    assert host == {"driver-root": "/run/nvidia/driver", "dev-root": "/"}


def test_cdi_output_dir_kind_and_names(scratch):
    installed(scratch, ENABLE_CDI="1", CDI_OUTPUT_DIR="/etc/cdi", CDI_KIND="example.com/accel")
    spec = yaml.safe_load(scratch.path("/etc/cdi/nvshim.yaml").read_text())
    assert spec["kind"] == "example.com/accel"
    names = [d["name"] for d in spec["devices"]]
    assert names == ["0", scratch.sim.gpu_uuids()[0], "all"]
    assert not scratch.path("/var/run/cdi/nvshim.yaml").exists()
    hooks = [h["path"] for h in spec["containerEdits"]["hooks"]]
    assert set(hooks) == {"/usr/local/nvshim/bin/nvshim-hook"}  # the host's path
    for node_ in spec["devices"][0]["containerEdits"]["deviceNodes"]:
        assert node_["hostPath"].startswith(SIM_DIR + "/dev/")  # not the scratch root's


def test_policy_variables_reach_the_host_config(scratch):
    installed(
        scratch,
        ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED="true",
        ACCEPT_NVIDIA_VISIBLE_DEVICES_AS_VOLUME_MOUNTS="false",
        NVIDIA_CONTAINER_RUNTIME_MODES_CDI_ANNOTATION_PREFIXES="cdi.k8s.io/,example.com/",
        NVIDIA_CONTAINER_RUNTIME_RUNTIMES="crun,/usr/sbin/runc",
    )
    config = toml(scratch.path("/etc/nvshim/config.toml"))
    assert config["policy"] == {
        "accept-env-unprivileged": True,
        "accept-volume-mounts": False,
        "cdi-annotation-prefixes": ["cdi.k8s.io/", "example.com/"],
    }
    assert config["runtime"]["runtimes"] == ["crun", "/usr/sbin/runc"]


def test_no_runtime_config_leaves_the_engine_alone(scratch):
    installed(scratch, NO_RUNTIME_CONFIG="true")
    assert scratch.config.read_bytes() == scratch.original
    assert scratch.path("/usr/local/nvshim/bin/nvshim-runtime").exists()


def test_crio_hook_mode_writes_the_hook_file(scratch):
    installed(scratch, RUNTIME="crio", CRIO_CONFIG_MODE="hook", CRIO_HOOKS_DIR="/etc/hooks.d")
    hook = json.loads(scratch.path("/etc/hooks.d/oci-nvshim-hook.json").read_text())
    assert hook["hook"]["path"] == "/usr/local/nvshim/bin/nvshim-hook"
    assert not scratch.path("/etc/crio").exists()
    done = node(
        "uninstall",
        env=scratch.env(RUNTIME="crio", CRIO_CONFIG_MODE="hook", CRIO_HOOKS_DIR="/etc/hooks.d"),
    )
    assert done.returncode == 0, done.stderr
    assert not scratch.path("/etc/hooks.d/oci-nvshim-hook.json").exists()


def test_crio_config_mode_edits_the_drop_in(scratch):
    installed(scratch, RUNTIME="crio")
    drop_in = toml(scratch.path("/etc/crio/crio.conf.d/99-nvshim.toml"))
    assert drop_in["crio"]["runtime"]["runtimes"]["nvshim"]["runtime_path"] == (
        "/usr/local/nvshim/bin/nvshim-runtime"
    )
    # not the default runtime (the manifests' setting): its runc state apart, so the
    # uninstall tells nvshim's containers by it; nothing else in crio.conf.d
    installed(scratch, RUNTIME="crio", NVIDIA_RUNTIME_SET_AS_DEFAULT="false")
    drop_in = toml(scratch.path("/etc/crio/crio.conf.d/99-nvshim.toml"))
    assert drop_in["crio"]["runtime"]["runtimes"]["nvshim"]["runtime_root"] == "/run/nvshim-runc"
    assert os.listdir(scratch.path("/etc/crio/crio.conf.d")) == ["99-nvshim.toml"]


MINE = '{"runtime_root": "/run/mine"}'


@pytest.mark.parametrize(
    "env, root",
    [
        ({"NVIDIA_RUNTIME_SET_AS_DEFAULT": "false"}, "/run/nvshim-runc"),
        ({"NVIDIA_RUNTIME_SET_AS_DEFAULT": "true"}, None),  # default pods keep runc's
        ({"NVIDIA_RUNTIME_SET_AS_DEFAULT": "false", "RUNTIME_CONFIG_OVERRIDE": MINE}, None),
    ],
)
def test_crio_handler_runc_root_of_its_own(tmp_path, env, root):
    s = resolve_node({}, {"RUNTIME": "crio", "HOST_ROOT_MOUNT": str(tmp_path), **env})
    assert s.crio_runtime_root == root
    mine = "/run/mine" if "RUNTIME_CONFIG_OVERRIDE" in env else None
    assert s.engine.override.get("runtime_root") == (root or mine)


FAKE_ENGINE = r"""
import os, signal, socket, sys
path, out = sys.argv[1], sys.argv[2]
def hup(*_):
    with open(out, "a") as fh:
        fh.write("HUP\n")
signal.signal(signal.SIGHUP, hup)
srv = socket.socket(socket.AF_UNIX)
srv.bind(path)
srv.listen(8)
print("listening", flush=True)
while True:
    conn, _ = srv.accept()
    conn.close()
"""


def test_runtime_socket_and_signal_restart(scratch, tmp_path):
    sock = scratch.path("/run/engine/engine.sock")
    sock.parent.mkdir(parents=True)
    got = tmp_path / "signals"
    engine = subprocess.Popen(
        [sys.executable, "-c", FAKE_ENGINE, str(sock), str(got)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert engine.stdout.readline().strip() == "listening"
        installed(
            scratch, RUNTIME_RESTART_MODE="signal", CONTAINERD_SOCKET="/run/engine/engine.sock"
        )
        wait_for(lambda: got.exists() and got.read_text() == "HUP\n")
    finally:
        engine.kill()
        engine.wait()


def test_systemd_restart_runs_in_the_host_root(scratch, tmp_path):
    busybox = shutil.which("busybox")
    for d in ("bin", "usr/bin", "tmp"):
        scratch.path("/" + d).mkdir(parents=True, exist_ok=True)
    shutil.copy(busybox, scratch.path("/bin/sh"))
    systemctl = scratch.path("/usr/bin/systemctl")
    systemctl.write_text('#!/bin/sh\necho "$@" > /tmp/systemctl-args\n')
    systemctl.chmod(0o755)
    installed(scratch, RUNTIME_RESTART_MODE="systemd")
    assert scratch.path("/tmp/systemctl-args").read_text() == "restart containerd\n"


def test_no_daemon_run_exits_after_install_and_pid_file(scratch, tmp_path):
    log = tmp_path / "log"
    proc = start_node(scratch.env(TOOLKIT_PID_FILE="/run/toolkit/toolkit.pid"), log)
    pid_file = scratch.path("/run/toolkit/toolkit.pid")
    try:
        wait_for(scratch.ready.exists, proc=proc, log=log)
        assert pid_file.read_text() == f"{proc.pid}\n"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()
    assert not pid_file.exists()
    done = node("run", env=scratch.env(NO_DAEMON="true"), timeout=60)
    assert done.returncode == 0, done.stderr
    assert scratch.ready.exists()
    assert "nvshim" in cri(toml(scratch.config))["containerd"]["runtimes"]


def test_toolkit_debug_prints_the_settings(scratch):
    done = installed(scratch, TOOLKIT_DEBUG="true")
    assert '"engine_name": "containerd"' in done.stderr


# --- booleans, warnings, bad values ---------------------------------------------------


@pytest.mark.parametrize("spelling", GO_TRUE + GO_FALSE)
def test_every_parsebool_spelling(spelling):
    s = resolve_node({}, {"RUNTIME": "containerd", "CDI_ENABLED": spelling, "NO_DAEMON": spelling})
    assert s.cdi_enabled is (spelling in GO_TRUE)
    assert s.no_daemon is (spelling in GO_TRUE)


def test_parsebool_spellings_through_the_installer(scratch):
    for spelling in GO_TRUE:
        installed(scratch, CDI_ENABLED=spelling)
        assert scratch.path("/var/run/cdi/nvshim.yaml").exists(), spelling
        assert node("uninstall", env=scratch.env()).returncode == 0
    for spelling in GO_FALSE:
        installed(scratch, CDI_ENABLED=spelling)
        assert not scratch.path("/var/run/cdi/nvshim.yaml").exists(), spelling


def test_unhonoured_variables_are_named_in_warnings():
    env = {"RUNTIME": "containerd", "CONTAINERD_RUNTIME_TYPE": "io.containerd.kata.v2"}
    for names, _why in UNHONOURED:
        env[names[0]] = "x"
    warnings = resolve_node({}, env).warnings
    for names, _why in UNHONOURED:
        assert any(w.startswith(f"{names[0]} is not honoured") for w in warnings), names
    assert any(w.startswith("CONTAINERD_RUNTIME_TYPE=") for w in warnings)
    ok = resolve_node(
        {}, {"RUNTIME": "containerd", "CONTAINERD_RUNTIME_TYPE": "io.containerd.runc.v2"}
    )
    assert ok.warnings == []


BAD = [
    ({"CDI_ENABLED": "yes"}, "CDI_ENABLED='yes'"),
    ({"NO_DAEMON": "2"}, "NO_DAEMON='2'"),
    ({"CONTAINERD_SET_AS_DEFAULT": "tRuE"}, "CONTAINERD_SET_AS_DEFAULT='tRuE'"),
    ({"RUNTIME": "podman"}, "RUNTIME='podman'"),
    ({"RUNTIME_RESTART_MODE": "sometimes"}, "RUNTIME_RESTART_MODE"),
    ({"TOOLKIT_INSTALL_DIR": "usr/local/nvshim"}, "TOOLKIT_INSTALL_DIR="),
    ({"RUNTIME_CONFIG": "etc/containerd.toml"}, "RUNTIME_CONFIG="),
    ({"CDI_KIND": "nvidia.com"}, "CDI_KIND="),
    ({"NVIDIA_RUNTIME_NAME": "runc"}, "NVIDIA_RUNTIME_NAME"),
    ({"CRIO_CONFIG_MODE": "both"}, "CRIO_CONFIG_MODE='both'"),
    ({"NVSHIM_SHARING_CONFIG": "{sharing}"}, "NVSHIM_SHARING_CONFIG="),
    ({"CREATE_DEVICE_NODES": "all"}, "CREATE_DEVICE_NODES='all'"),
    ({"RUNTIME_CONFIG_OVERRIDE": "{not json"}, "RUNTIME_CONFIG_OVERRIDE"),
    # written into the host's config, where every container would then fail to load it
    (
        {"NVIDIA_CONTAINER_RUNTIME_RUNTIMES": "runc,bin/crun"},
        "NVIDIA_CONTAINER_RUNTIME_RUNTIMES: 'bin/crun' is not a program name or an absolute",
    ),
]


@pytest.mark.parametrize(("env", "named"), BAD, ids=[next(iter(e)) for e, _ in BAD])
def test_bad_values_are_refused_with_nothing_changed(scratch, env, named):
    before = scratch.snapshot()
    done = node("install", env=scratch.env(**{"CDI_ENABLED": "true", **env}))
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nvshim: error: ") and named in lines[0], lines
    assert "Traceback" not in done.stderr
    assert scratch.snapshot() == before
    assert not scratch.ready.exists()


@pytest.mark.parametrize("command", ["install", "uninstall"])
@pytest.mark.parametrize("kind", ["missing", "file"])
def test_a_host_root_that_is_no_directory_is_refused(tmp_path, command, kind):
    """A mistyped HOST_ROOT_MOUNT: uninstall created <root>/usr/local on its way (and
    said it removed nvshim from there, exit 0); install named only a socket under it."""
    root = tmp_path / "host"
    if kind == "file":
        root.write_text("")
    done = node(command, env={"RUNTIME": "containerd", "HOST_ROOT_MOUNT": str(root)})
    assert done.returncode == 2
    assert done.stderr == (
        f"nvshim: error: HOST_ROOT_MOUNT={str(root)!r}: not a directory;"
        f" try 'nvshim node {command} --help'\n"
    )
    assert os.listdir(tmp_path) == ([] if kind == "missing" else ["host"])


def test_bad_sharing_config_is_refused_with_nothing_changed(scratch, tmp_path):
    bad = tmp_path / "sharing.yaml"
    bad.write_text("version: v1\nsharing:\n  mps:\n    resources: all\n")
    before = scratch.snapshot()
    done = node("install", env=scratch.env(NVSHIM_SHARING_CONFIG=str(bad)))
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0], lines
    assert scratch.snapshot() == before


def test_socket_missing_for_signal_restart_changes_nothing(scratch):
    before = scratch.snapshot()
    done = node("install", env=scratch.env(RUNTIME_RESTART_MODE="signal"))
    assert done.returncode != 0
    assert "socket not found" in done.stderr
    assert scratch.snapshot() == before


def test_nvshim_configure_reads_runtime_config_too(tmp_path):
    from tests.conftest import run_nvshim
    from tests.node_util import CONTAINERD_16

    target = tmp_path / "containerd.toml"
    target.write_bytes(CONTAINERD_16.read_bytes())
    env = {"RUNTIME_CONFIG": str(target), "NVSHIM_CONTAINERD_VERSION": "1.6.20"}
    done = run_nvshim("configure", "--engine", "containerd", env=env)
    assert done.returncode == 0, done.stderr
    assert "nvshim" in cri(toml(target))["containerd"]["runtimes"]
    refused = run_nvshim(
        "configure", "--engine", "containerd", env={**env, "CONTAINERD_SET_AS_DEFAULT": "yes"}
    )
    assert refused.returncode == 2 and "CONTAINERD_SET_AS_DEFAULT='yes'" in refused.stderr


def test_sharing_config_that_does_not_fit_the_host_changes_nothing(scratch, tmp_path):
    sharing = tmp_path / "sharing.yaml"
    sharing.write_text(
        "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n"
        "      replicas: 1000\n"
    )
    before = scratch.snapshot()
    done = node("install", env=scratch.env(NVSHIM_SHARING_CONFIG=str(sharing)))
    assert done.returncode != 0
    assert str(sharing) in done.stderr.strip().splitlines()[-1]
    assert scratch.snapshot() == before


def test_create_device_nodes_control(scratch):
    missing = [scratch.path(f"{SIM_DIR}/dev/nvidia0"), scratch.path(f"{SIM_DIR}/dev/nvidiactl")]
    before = {p: os.stat(p) for p in missing}
    for path in missing:
        path.unlink()
    installed(scratch, CREATE_DEVICE_NODES="control")
    for path, st in before.items():
        now = os.stat(path)
        assert (now.st_mode, now.st_rdev) == (st.st_mode, st.st_rdev), path


def test_runtime_config_override_reaches_the_runtime_entry(scratch):
    installed(scratch, RUNTIME_CONFIG_OVERRIDE='{"SystemdCgroup": true}')
    options = cri(toml(scratch.config))["containerd"]["runtimes"]["nvshim"]["options"]
    assert options["SystemdCgroup"] is True
