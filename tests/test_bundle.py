"""The self-contained host bundle and staged installs: built from this checkout, installed
below staging roots, run on a glibc 2.31 root with no Python, and through runc."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from nvshim.hostbundle import interp_slot, read_marker
from nvshim.runtime import frontbin
from tests.conftest import NVSHIM, run_nvshim
from tests.debroot import bundle_dir, debian_root_tar, unpack

HOOKS_D = "/usr/share/containers/oci/hooks.d"


@pytest.fixture(scope="module")
def bundle() -> str:
    return bundle_dir()


def interp_of(elf: str) -> str:
    offset, size = interp_slot(elf)
    with open(elf, "rb") as fh:
        fh.seek(offset)
        return fh.read(size).split(b"\0")[0].decode()


def bundle_install(bundle: str, *args: str) -> subprocess.CompletedProcess:
    """``nvshim install`` run by the bundle's own interpreter."""
    cmd = [os.path.join(bundle, "bin", "nvshim"), "install", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd="/")


def files_mentioning(root: str, needle: bytes) -> list[str]:
    found = []
    for top, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(top, name)
            if not os.path.islink(path):
                with open(path, "rb") as fh:
                    if needle in fh.read():
                        found.append(os.path.relpath(path, root))
    return found


def test_bundle_runs_on_its_own_libraries_from_any_directory(bundle, tmp_path):
    """The interpreter maps only the bundle's loader and libraries, and nothing from the
    caller's environment (PYTHONPATH, a hostile cwd) reaches it."""
    evil = tmp_path / "evil"
    (evil / "nvshim").mkdir(parents=True)
    (evil / "nvshim" / "__init__.py").write_text("raise SystemExit('hijacked')\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(evil), "PYTHONHOME": str(evil)}
    proc = subprocess.run(
        [os.path.join(bundle, "bin", "nvshim"), "--version"],
        capture_output=True, text=True, cwd=evil, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("nvshim version ")
    maps = subprocess.run(
        [os.path.join(bundle, "bin", "python3"), "-IS", "-c",
         "import ctypes, ssl; print(open('/proc/self/maps').read())"],
        capture_output=True, text=True, cwd=evil, check=True,
    ).stdout  # fmt: skip
    paths = {line.split()[-1] for line in maps.splitlines() if len(line.split()) == 6}
    mapped = {path for path in paths if ".so" in path}
    assert mapped and all(path.startswith(bundle + "/") for path in mapped), mapped
    assert any(os.path.basename(p) == "libc.so.6" for p in mapped)


@pytest.mark.parametrize("source", ["bundle", "venv"])
def test_staged_install_names_final_paths(bundle, tmp_path, source):
    """A staged install writes below --root and names only the final paths: launchers,
    links, the hook JSON, the interpreter's loader and the manifest."""
    stage = tmp_path / "stage"
    args = ("--root", str(stage), "--prefix", "/opt/nvshim", "--bin-dir", "/usr/bin",
            "--hooks-dir", HOOKS_D)  # fmt: skip
    proc = bundle_install(bundle, *args) if source == "bundle" else run_nvshim("install", *args)
    assert proc.returncode == 0, proc.stderr
    prefix = stage / "opt" / "nvshim"
    assert files_mentioning(str(stage), str(stage).encode()) == []
    hook = json.loads((stage / HOOKS_D.lstrip("/") / "oci-nvshim-hook.json").read_text())
    assert hook["hook"]["path"] == "/opt/nvshim/bin/nvshim-hook"
    assert hook["hook"]["env"] and hook["stages"] == ["prestart"]
    names = ["nvshim-hook", "nvshim-runtime"] + (["nvshim"] if source == "bundle" else [])
    for name in names:
        assert os.readlink(stage / "usr" / "bin" / name) == f"/opt/nvshim/bin/{name}"
    shebang = (prefix / "bin" / "nvshim-hook").read_text().splitlines()[0]
    # nvshim-runtime is the compiled front (the bundle and the checkout carry a build): it
    # execs the same interpreter for what Python must see
    front = frontbin.fields_of((prefix / "bin" / "nvshim-runtime").read_bytes())
    assert front["interpreter"] == shebang[2:-4] and front["code"].startswith("import sys\n")
    manifest = json.loads((prefix / "install-manifest.json").read_text())
    assert manifest["prefix"] == "/opt/nvshim"
    assert "/usr/share/containers/oci/hooks.d/oci-nvshim-hook.json" in manifest["files"]
    if source == "bundle":
        assert shebang == "#!/opt/nvshim/bin/python3 -IS"
        assert (
            interp_of(str(prefix / "bin" / "python3"))
            == "/opt/nvshim/lib/" + (read_marker(str(prefix))["loader"])
        )
        assert read_marker(str(prefix))["prefix"] == "/opt/nvshim"
    else:
        assert (
            shebang == f"#!{os.path.realpath(os.path.join(os.path.dirname(NVSHIM), 'python3'))} -IS"
        )


def test_bundle_on_glibc_2_31_without_python(bundle, sim_hosts, tmp_path):
    """Installed into a fresh Debian 11 root (glibc 2.31, no Python), the bundle's
    commands work in a chroot without /proc against a simulated host."""
    root = unpack(debian_root_tar("bullseye"), str(tmp_path / "root"))
    assert not os.path.exists(os.path.join(root, "usr/bin/python3"))
    proc = bundle_install(
        bundle, "--root", root, "--prefix", "/opt/nvshim", "--bin-dir", "/usr/bin"
    )
    assert proc.returncode == 0, proc.stderr
    sim = sim_hosts("h100x8-mig")
    top = os.path.commonpath([sim.driver_root, sim.dev_root])
    roots = ("--driver-root", sim.driver_root, "--dev-root", sim.dev_root)
    script = (
        f"set -e; mkdir -p {root}{top}; mount --bind {top} {root}{top}; "
        f"chroot {root} /usr/bin/nvshim --version; "
        f"chroot {root} /usr/bin/nvshim info --json {' '.join(roots)} > {tmp_path}/info.json; "
        f"chroot {root} /usr/bin/nvshim cdi generate -o /tmp/nvidia.yaml {' '.join(roots)}; "
        f"chroot {root} /usr/bin/nvshim cdi validate /tmp/nvidia.yaml"
    )
    proc = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("nvshim version ")
    info = json.loads((tmp_path / "info.json").read_text())
    uuids = json.dumps(info)
    assert all(uuid in uuids for uuid in sim.gpu_uuids() + sim.mig_uuids())
    spec = (tmp_path / "root" / "tmp" / "nvidia.yaml").read_text()
    assert "/dev/nvidia0" in spec


def test_runc_container_through_installed_bundle(bundle, sim_hosts, tmp_path):
    """nvshim-runtime and nvshim-hook from an installed bundle give a runc container
    exactly its GPU."""
    from tests.podman_util import make_busybox_rootfs
    from tests.test_runtime import Runtime, gpu_nodes

    prefix = str(tmp_path / "final")
    proc = bundle_install(bundle, "--prefix", prefix, "--bin-dir", "")
    assert proc.returncode == 0, proc.stderr
    rootfs = make_busybox_rootfs(tmp_path / "rootfs")
    rt = Runtime(sim_hosts("single"), os.path.join(prefix, "bin"), tmp_path, rootfs,
                 accept_env_unprivileged=True)  # fmt: skip
    uuid = rt.sim.gpu_uuids()[0]
    view = rt.view(rt.run(env={"NVIDIA_VISIBLE_DEVICES": uuid})[0])
    assert gpu_nodes(view) == {f"nvidia{rt.sim.gpu(0)['minor']}"}
    assert view["CVD"] == [uuid]


def test_reinstall_keeps_the_tree_and_uninstall_removes_only_ours(bundle, tmp_path):
    stage = str(tmp_path / "stage")
    args = ("--root", stage, "--prefix", "/opt/nv", "--bin-dir", "/usr/bin", "--hooks-dir", HOOKS_D)
    assert bundle_install(bundle, *args).returncode == 0
    python = os.path.join(stage, "opt/nv/bin/python3")
    inode = os.stat(python).st_ino
    assert bundle_install(bundle, *args).returncode == 0
    assert os.stat(python).st_ino == inode  # same build: not copied again
    # an operator replaced one command: uninstall leaves it
    os.unlink(os.path.join(stage, "usr/bin/nvshim"))
    os.symlink("/usr/local/bin/other", os.path.join(stage, "usr/bin/nvshim"))
    from nvshim.install import uninstall_host

    removed = uninstall_host(stage, "/opt/nv")
    assert os.path.join(stage, "usr/bin/nvshim-runtime") in removed
    assert not os.path.exists(os.path.join(stage, "opt/nv"))
    assert not os.path.exists(os.path.join(stage, HOOKS_D.lstrip("/"), "oci-nvshim-hook.json"))
    assert os.readlink(os.path.join(stage, "usr/bin/nvshim")) == "/usr/local/bin/other"
    assert uninstall_host(stage, "/opt/nv") == []


@pytest.mark.parametrize(
    "args, message",
    [
        (("--prefix", "relative/dir"), "relative/dir: an install path must be absolute"),
        (("--prefix", "/" + "x" * 400), "longer than the"),
    ],
)
def test_bad_install_input_is_one_line_and_writes_nothing(bundle, tmp_path, args, message):
    stage = tmp_path / "stage"
    stage.mkdir()
    proc = bundle_install(bundle, "--root", str(stage), *args, "--bin-dir", "/usr/bin")
    assert proc.returncode != 0
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("source", ["bundle", "venv"])
@pytest.mark.parametrize(
    "args, message",
    [
        (("--hooks-dir", "/etc/nvshim"), "hooks dir /etc/nvshim: not a directory"),
        (("--hooks-dir", "/etc/nvshim/hooks.d"), "hooks dir /etc/nvshim/hooks.d: not a directory"),
        (("--bin-dir", "/etc/nvshim"), "bin dir /etc/nvshim: not a directory"),
        (("--prefix", "/etc/nvshim/opt"), "prefix /etc/nvshim/opt: not a directory"),
    ],
)
def test_a_destination_that_is_a_file_stops_the_install_before_any_write(
    bundle, tmp_path, source, args, message
):
    """A destination below a file (a typo naming a file): one line naming it, and the
    stage as it was (no launchers written before the hook file fails)."""
    stage = tmp_path / "stage"
    (stage / "etc").mkdir(parents=True)
    (stage / "etc" / "nvshim").write_text("a file\n")
    args = ("--root", str(stage), "--bin-dir", "/usr/bin", *args)
    proc = bundle_install(bundle, *args) if source == "bundle" else run_nvshim("install", *args)
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"nvshim: error: {message}"), proc.stderr
    assert len(proc.stderr.splitlines()) == 1
    assert [p.name for p in stage.iterdir()] == ["etc"]
    assert [p.name for p in (stage / "etc").iterdir()] == ["nvshim"]


def test_bundle_ships_no_test_only_modules(bundle):
    """CPython's test and obsolete extension modules stay out of the node's bundle."""
    shipped = {
        name.split(".")[0]
        for _top, _dirs, files in os.walk(os.path.join(bundle, "lib"))
        for name in files
        if name.endswith(".so") or name.endswith(".py")
    }
    for module in ("_testcapi", "_testbuffer", "_xxtestfuzz", "ossaudiodev", "xxlimited"):
        assert module not in shipped
    assert {"_ssl", "_ctypes", "_json"} <= shipped  # what nvshim does import is still there


def test_an_unpacked_bundle_runs_from_anywhere_until_installed(bundle, tmp_path):
    """docs/install.md's staged install, run as written from a bundle that is not where
    it was built (unpacked elsewhere): its `nvshim` finds itself; the installed launchers
    then name the final prefix."""
    import shlex
    import shutil

    from tests.conftest import REPO

    moved = tmp_path / "unpacked" / "nvshim-bundle"
    shutil.copytree(bundle, moved, symlinks=True)
    with open(os.path.join(REPO, "docs", "install.md")) as fh:
        (line,) = [ln for ln in fh if ln.startswith("/tmp/nvshim-bundle/bin/nvshim install --root")]
    argv = shlex.split(line.replace("/tmp/nvshim-bundle", str(moved)))
    argv = [a.replace("/tmp/stage", str(tmp_path / "stage")) for a in argv]
    evil = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path), "PYTHONHOME": str(tmp_path)}
    proc = subprocess.run(argv, capture_output=True, text=True, cwd="/", env=evil)
    assert proc.returncode == 0, proc.stderr
    prefix = tmp_path / "stage" / "usr" / "lib" / "nvshim"
    shebang = (prefix / "bin" / "nvshim").read_text().splitlines()[0]
    assert shebang == "#!/usr/lib/nvshim/bin/python3 -IS"
    # through a link elsewhere too (readlink -f), with the hostile environment
    os.symlink(moved / "bin" / "nvshim", tmp_path / "nvshim")
    proc = subprocess.run([str(tmp_path / "nvshim"), "--version"], capture_output=True,
                          text=True, cwd=tmp_path, env=evil)  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.startswith("nvshim version "), proc.stderr
