"""`nvshim node` on a host root that looks like a real node's (issue 23): absolute symlinks
such as ``/var/run -> /run`` resolved inside the host root; the bundle replaced while a
process runs from it (versioned trees, one symlink switch, no "Text file busy"); a failed
install leaving nothing (first install) or the earlier install (upgrade); the uninstall
leaving a pass-through runtime while a containerd shim still names it, removed by that
container's delete."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess

import pytest

from nvshim.hostbundle import relocate
from nvshim.runtime import frontbin
from tests.debroot import bundle_dir
from tests.node_util import Scratch, clean_env, reap_started, start_node, wait_for
from tests.test_node_lifecycle import files_of, stop

RUNTIME = "/usr/local/nvshim/bin/nvshim-runtime"


@pytest.fixture(autouse=True)
def _reap():
    """An installer a failed test left running is killed."""
    yield
    reap_started()


def private_run(argv: list[str], env: dict[str, str], binds: dict[str, str] | None = None):
    """``argv`` in a private mount namespace with a fresh tmpfs on ``/run`` (a path the
    installer resolved against its own root would land there, never in the host's) and
    ``binds`` (scratch dir -> path) mounted."""
    script = "mount -t tmpfs nvshim-test /run"
    for source, target in (binds or {}).items():
        script += f" && mkdir -p {target} && mount --bind {source} {target}"
    script += ' && exec "$@"'
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *argv],
        env=clean_env(env),
        capture_output=True,
        text=True,
        timeout=300,
    )


def nvshim_node(*args: str, env: dict[str, str], nvshim: str | None = None):
    from tests.conftest import NVSHIM

    return private_run([nvshim or NVSHIM, "node", *args], env)


def test_absolute_symlinks_of_the_host_resolve_inside_the_host_root(tmp_path):
    """Debian, Ubuntu and RHEL have ``/var/run -> /run``; a host may have ``/usr/local``
    on another filesystem through an absolute link. Everything lands in the host root."""
    scratch = Scratch(tmp_path)
    (scratch.root / "run").mkdir()
    (scratch.root / "var").mkdir()
    os.symlink("/run", scratch.root / "var/run")
    (scratch.root / "opt/local").mkdir(parents=True)
    (scratch.root / "usr").mkdir()
    os.symlink("/opt/local", scratch.root / "usr/local")
    before = scratch.snapshot()
    env = scratch.env(CDI_ENABLED="true", CDI_OUTPUT_DIR="/var/run/cdi")
    done = nvshim_node("install", env=env)
    assert done.returncode == 0, done.stderr
    spec = scratch.root / "run/cdi/nvshim.yaml"
    assert spec.is_file(), done.stderr
    assert f"{spec}: written" in done.stderr
    assert (scratch.root / "opt/local/nvshim/bin/nvshim-runtime").is_file()
    # the engine names the host's own path (the host resolves its link itself)
    assert f'BinaryName = "{RUNTIME}"' in scratch.config.read_text()
    done = nvshim_node("uninstall", env=env)
    assert done.returncode == 0, done.stderr
    assert scratch.config.read_bytes() == scratch.original
    assert files_of(scratch.snapshot()) == files_of(before)


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> tuple[str, str]:
    """The checkout's bundle, and a copy of it that claims another build (an upgrade)."""
    first = bundle_dir()
    second = str(tmp_path_factory.mktemp("b2") / "bundle")
    shutil.copytree(first, second, symlinks=True)
    marker = os.path.join(second, "nvshim-bundle.json")
    with open(marker, encoding="utf-8") as fh:
        record = json.load(fh)
    record["build"] = "0" * 12 + record["build"][12:]
    with open(marker, "w", encoding="utf-8") as fh:
        json.dump(record, fh)
    relocate(second, second)  # runs from where it lies, as its own build
    return first, second


def version_of(scratch: Scratch) -> str:
    link = scratch.path("/usr/local/nvshim")
    assert link.is_symlink()
    target = os.readlink(link)
    assert target.startswith("nvshim-versions/"), target
    return target.split("/", 1)[1]


def test_upgrade_while_the_old_bundle_runs_then_delete(tmp_path, bundles):
    """The sidecar (chrooted into the host, as the DaemonSet's exporter) runs the
    installed interpreter; the installer crashes and comes back as another build: the
    new tree goes in beside the old and the prefix switches, the running one is left
    until nothing runs from it, and the delete takes everything."""
    first, second = bundles
    scratch = Scratch(tmp_path)
    before = scratch.snapshot()
    env = scratch.env(CDI_ENABLED="true")
    log = tmp_path / "log-a"
    proc = start_node(env, log, nvshim=os.path.join(first, "bin/nvshim"))
    wait_for(scratch.ready.exists, proc=proc, log=log)
    old = version_of(scratch)
    tree = scratch.path(f"/usr/local/nvshim-versions/{old}")
    marker = json.loads((tree / "nvshim-bundle.json").read_text())
    assert marker["prefix"] == f"/usr/local/nvshim-versions/{old}"
    front = frontbin.fields_of((tree / "bin/nvshim-runtime").read_bytes())  # the compiled one
    assert front["interpreter"] == f"/usr/local/nvshim-versions/{old}/bin/python3"
    sidecar = subprocess.Popen(
        [
            "chroot",
            str(scratch.root),
            "/usr/local/nvshim/bin/python3",
            "-c",
            "import time; time.sleep(120)",
        ],
    )
    try:
        wait_for(lambda: os.readlink(f"/proc/{sidecar.pid}/exe").endswith("/bin/python3"))
        proc.kill()  # the installer crashes; the pod restarts it as the second build
        proc.wait()
        scratch.ready.unlink(missing_ok=True)
        log = tmp_path / "log-b"
        proc = start_node(env, log, nvshim=os.path.join(second, "bin/nvshim"))
        wait_for(scratch.ready.exists, proc=proc, log=log)
        new = version_of(scratch)
        assert new != old and new.endswith("-000000000000")
        assert "Text file busy" not in log.read_text()
        assert tree.is_dir(), "a tree a process runs from was removed"
        assert sidecar.poll() is None
    finally:
        sidecar.kill()
        sidecar.wait()
    stop(proc, log)
    assert scratch.config.read_bytes() == scratch.original
    assert files_of(scratch.snapshot()) == files_of(before)
    assert not scratch.path("/usr/local/nvshim-versions").exists()


def test_a_failed_first_install_leaves_nothing(tmp_path, bundles):
    scratch = Scratch(tmp_path)
    scratch.config.write_text("version = 2\n[plugins\n")  # the engine config cannot be read
    before = scratch.snapshot()
    done = nvshim_node(
        "install",
        env=scratch.env(CDI_ENABLED="true"),
        nvshim=os.path.join(bundles[0], "bin/nvshim"),
    )
    assert done.returncode != 0
    assert "install failed" in done.stderr and "taking back" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert files_of(scratch.snapshot()) == files_of(before)
    assert not scratch.path("/usr/local").exists() or not os.listdir(scratch.path("/usr/local"))


def test_a_failed_upgrade_keeps_the_working_install(tmp_path, bundles):
    first, second = bundles
    scratch = Scratch(tmp_path)
    env = scratch.env(CDI_ENABLED="true")
    done = nvshim_node("install", env=env, nvshim=os.path.join(first, "bin/nvshim"))
    assert done.returncode == 0, done.stderr
    old = version_of(scratch)
    working = scratch.config.read_bytes()
    scratch.config.write_bytes(working + b"\n[broken\n")
    done = nvshim_node("install", env=env, nvshim=os.path.join(second, "bin/nvshim"))
    assert done.returncode != 0
    assert "the earlier install stays" in done.stderr, done.stderr
    assert version_of(scratch) == old
    assert os.listdir(scratch.path("/usr/local/nvshim-versions")) == [old]
    assert scratch.path("/etc/nvshim/config.toml").is_file()


def test_uninstall_leaves_a_pass_through_while_a_shim_names_the_runtime(tmp_path):
    """A containerd shim (its working directory the container's bundle, whose ``runtime``
    file names nvshim-runtime) keeps calling the runtime after nvshim is gone: the path
    stays a pass-through to runc until that container's delete, which removes it."""
    scratch = Scratch(tmp_path)
    before = scratch.snapshot()
    env = scratch.env(CDI_ENABLED="true")
    done = nvshim_node("install", env=env)
    assert done.returncode == 0, done.stderr
    shim_bin = tmp_path / "bin/containerd-shim-runc-v2"
    shim_bin.parent.mkdir()
    shutil.copy("/bin/sleep", shim_bin)
    bundle = tmp_path / "task/k8s.io/sandbox-1"
    bundle.mkdir(parents=True)
    (bundle / "runtime").write_text(RUNTIME)
    other = tmp_path / "task/k8s.io/plain-runc"
    other.mkdir(parents=True)
    (other / "runtime").write_text("runc")
    shims = [subprocess.Popen([shim_bin, "120"], cwd=d) for d in (bundle, other)]
    try:
        wait_for(lambda: all(os.readlink(f"/proc/{s.pid}/exe") == str(shim_bin) for s in shims))
        markers = scratch.path("/run/nvshim/exec")
        markers.mkdir(parents=True)
        (markers / "sandbox-1").touch()  # what nvshim-runtime's create left
        done = nvshim_node("uninstall", env=env)
        assert done.returncode == 0, done.stderr
        assert "1 container(s) still run through nvshim (sandbox-1)" in done.stderr
        assert (markers / "sandbox-1").exists()  # a reinstall must still enforce its execs
        assert scratch.config.read_bytes() == scratch.original
        link = scratch.path("/usr/local/nvshim")
        assert os.readlink(link) == "nvshim-versions/pass-through"
        assert sorted(os.listdir(scratch.path("/usr/local/nvshim-versions"))) == ["pass-through"]
        assert not scratch.path("/etc/nvshim/config.toml").exists()
        # the shim's calls (the caller's working directory its sandbox's bundle, the
        # host's /usr/local); a runc stand-in that drops a container's state on delete
        fake = tmp_path / "fakebin"
        fake.mkdir()
        calls = tmp_path / "runc-calls"
        (fake / "runc").write_text(
            "#!/bin/sh\n"
            f'echo "$*" >> {calls}\n'
            "for a; do :; done\n"
            'case " $* " in *" delete "*) rm -rf "$2/$a" ;; esac\n'
        )
        (fake / "runc").chmod(0o755)
        state = tmp_path / "runc-state"
        for name in ("sandbox-1", "app-1"):
            (state / name).mkdir(parents=True)
        app = tmp_path / "task/k8s.io/app-1"
        app.mkdir()
        (app / "runtime").write_text(RUNTIME)
        binds = {str(scratch.path("/usr/local")): "/usr/local"}
        binds[str(scratch.path("/run/nvshim"))] = "/run/nvshim"
        path = {"PATH": f"{fake}:/usr/bin:/bin"}

        def shim_call(*args: str):
            argv = ["sh", "-c", 'cd "$0" && "$@"; exit $?', str(bundle), RUNTIME, *args]
            return private_run(argv, path, binds)

        listed = shim_call("--root", str(state), "state", "app-1")
        assert listed.returncode == 0, listed.stderr
        assert shim_call("--root", str(state), "delete", "--force", "app-1").returncode == 0
        assert link.is_symlink()  # the sandbox is still ours and alive
        assert shim_call("--root", str(state), "delete", "--force", "sandbox-1").returncode == 0
        assert not os.path.lexists(link)
        assert not markers.exists()
        assert calls.read_text().splitlines() == [
            f"--root {state} state app-1",
            f"--root {state} delete --force app-1",
            f"--root {state} delete --force sandbox-1",
        ]
    finally:
        for shim in shims:
            shim.kill()
            shim.wait()
    assert files_of(scratch.snapshot()) == files_of(before)
    assert not scratch.path("/usr/local/nvshim-versions").exists()


def test_uninstall_on_crio_keeps_the_pass_through_while_its_handler_has_containers(tmp_path):
    """CRI-O has no shim: CRI-O calls the handler's runtime for exec, kill and delete, and
    a restarted CRI-O cannot manage a container whose handler is gone. The containers of
    nvshim's handler are those in its own runc root: while one is there the uninstall
    leaves CRI-O unrestarted and the pass-through in place; the delete (as CRI-O calls it)
    that empties the root removes the pass-through."""
    scratch = Scratch(tmp_path)
    before = scratch.snapshot()
    env = scratch.env(RUNTIME="crio", NVIDIA_RUNTIME_SET_AS_DEFAULT="false")
    done = nvshim_node("install", env=env)
    assert done.returncode == 0, done.stderr
    assert (
        'runtime_root = "/run/nvshim-runc"'
        in scratch.path("/etc/crio/crio.conf.d/99-nvshim.toml").read_text()
    )
    state = scratch.path("/run/nvshim-runc")
    (state / "ctr-1").mkdir(parents=True)  # what runc keeps for a container of the handler
    done = nvshim_node("uninstall", env=env)
    assert done.returncode == 0, done.stderr
    assert "not restarting crio: 1 container(s) of handler 'nvshim'" in done.stderr
    assert "failed to find runtime handler" in done.stderr
    link = scratch.path("/usr/local/nvshim")
    assert os.readlink(link) == "nvshim-versions/pass-through"
    assert [f for _d, _s, f in os.walk(scratch.path("/etc/crio")) if f] == []  # drop-in gone
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "runc").write_text(
        "#!/bin/sh\n"
        "for a; do case $a in --root=*) root=${a#--root=} ;; esac; done\n"
        "for a; do :; done\n"
        'case " $* " in *" delete "*) rm -rf "$root/$a" ;; esac\n'
    )
    (fake / "runc").chmod(0o755)
    binds = {str(scratch.path("/usr/local")): "/usr/local", str(state): "/run/nvshim-runc"}
    path = {"PATH": f"{fake}:/usr/bin:/bin"}

    def crio_call(*args: str):  # CRI-O: the handler's runtime_root as --root=
        return private_run([RUNTIME, "--root=/run/nvshim-runc", *args], path, binds)

    assert crio_call("state", "ctr-1").returncode == 0
    assert link.is_symlink() and (state / "ctr-1").is_dir()
    assert crio_call("delete", "--force", "ctr-1").returncode == 0
    assert not os.path.lexists(link)
    assert not scratch.path("/usr/local/nvshim-versions").exists()
    state.rmdir()  # (a bind mount point in there: the script's rmdir of it failed quietly)
    assert files_of(scratch.snapshot()) == files_of(before)


def test_uninstall_lines_come_before_the_engine_restart(tmp_path):
    """The uninstall's lines come before the engine restart (the pod log sees them)."""
    scratch = Scratch(tmp_path)
    log = tmp_path / "log"
    proc = start_node(scratch.env(), log)
    wait_for(scratch.ready.exists, proc=proc, log=log)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0
    lines = log.read_text().splitlines()
    restart = next(i for i, line in enumerate(lines) if "restarting containerd" in line)
    restored = next(i for i, line in enumerate(lines) if "restored the original" in line)
    removed = next(i for i, line in enumerate(lines) if "/etc/nvshim/config.toml: removed" in line)
    assert restored < restart and removed < restart
    assert lines[-1].endswith("nvshim node: uninstalled")
    assert not scratch.path("/run/nvshim").exists()
