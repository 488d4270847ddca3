"""The Debian package: built from a clean clone with dpkg-buildpackage, lintian-clean, then
installed with dpkg into a fresh minimal Debian 12 root (no Python), used there against a
simulated GPU host (CLI, CDI, a runc container through /usr/bin/nvshim-runtime), upgraded
with its config kept, removed and purged without a trace."""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
import shutil
import subprocess

import pytest

from nvshim.runtime import DAEMON_SOCKET, frontbin
from tests.conftest import REPO, write_config
from tests.debroot import bundle_dir, cached, debian_root_tar, unpack
from tests.docs_commands import documented
from tests.runc_util import daemon_calls, make_bundle
from tests.test_runtime import SHOW, gpu_nodes

PREFIX = "/usr/lib/nvshim"
HOOK_FILE = "/usr/share/containers/oci/hooks.d/oci-nvshim-hook.json"
ENGINE_CONFIGS = {
    "etc/containerd/config.toml": 'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n',
    "etc/docker/daemon.json": '{"log-level": "warn"}\n',
    "etc/crio/crio.conf": "[crio.runtime]\n",
}
# dpkg's and init-system-helpers' own bookkeeping: not the package's files
BOOKKEEPING = ("var/lib/dpkg/", "var/log/", "var/cache/debconf/", "var/cache/ldconfig/")


def head_tree() -> str:
    return subprocess.run(
        ["git", "-C", REPO, "rev-parse", "HEAD^{tree}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


@pytest.fixture(scope="module")
def package() -> str:
    """A directory holding the .deb, .changes and lintian's report, built (cached by the
    committed tree and the bundle) from a clean clone of this repository's HEAD."""
    bundle = bundle_dir()

    def build(path: str) -> None:
        src = os.path.join(path, "src")
        os.makedirs(path)
        subprocess.run(["git", "clone", "--quiet", REPO, src], check=True)
        # docs/install.md's lines, as written
        link, build = (documented("docs/install.md", p) for p in ("ln -s ", "dpkg-buildpackage"))
        lint = shlex.split(documented("docs/install.md", "lintian "))
        subprocess.run(["sh", "-c", link], cwd=src, check=True)
        # a private /run: the build runs nvshim, which keeps caches there. -d: with a
        # prebuilt bundle, the bundle build's tools (python3-venv) are not needed
        script = f"mount -t tmpfs tmpfs /run && {build} -d"
        proc = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
            cwd=src,
            env={**os.environ, "NVSHIM_BUNDLE": bundle},
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
        assert os.path.isfile(os.path.join(src, lint[-1]))  # the .changes the page names
        lint = subprocess.run(
            [lint[0], "--tag-display-limit", "0", *lint[1:]], cwd=src, capture_output=True,
            text=True,
        )  # fmt: skip
        with open(os.path.join(path, "lintian.txt"), "w") as fh:
            fh.write(lint.stdout)
        status = subprocess.run(
            ["git", "-C", src, "status", "--porcelain"], capture_output=True, text=True, check=True
        )
        with open(os.path.join(path, "git-status.txt"), "w") as fh:
            fh.write(status.stdout)
        shutil.rmtree(src)

    return cached("deb", {"tree": head_tree(), "bundle": bundle}, build)


def deb_path(package: str) -> str:
    (deb,) = glob.glob(os.path.join(package, "nvshim_*_amd64.deb"))
    return deb


def test_the_documented_build_leaves_the_checkout_clean(package):
    """What `ln -s packaging/debian debian && dpkg-buildpackage` leaves is all ignored."""
    with open(os.path.join(package, "git-status.txt")) as fh:
        assert fh.read() == ""


def test_lintian_reports_no_errors_and_the_packaging_notes_list_each_warning(package):
    with open(os.path.join(package, "lintian.txt")) as fh:
        report = fh.read()
    assert not [x for x in report.splitlines() if x.startswith("E:")], report
    warnings = set(re.findall(r"^W: nvshim: ([a-z0-9-]+)", report, re.M))
    with open(os.path.join(REPO, "docs", "install.md")) as fh:
        notes = fh.read().split("## Packaging notes", 1)[1]
    assert warnings and all(f"`{tag}`" in notes for tag in warnings), warnings


def test_package_contents_name_final_paths(package, tmp_path):
    deb = deb_path(package)
    tree = tmp_path / "tree"
    subprocess.run(["dpkg-deb", "-x", deb, str(tree)], check=True)
    for name in ("nvshim", "nvshim-runtime", "nvshim-hook", "nvshim-runtimed"):
        link = tree / "usr" / "bin" / name
        assert os.path.realpath(link) == str(tree) + f"{PREFIX}/bin/{name}"
        launcher = (tree / PREFIX.lstrip("/") / "bin" / name).read_bytes()
        python = f"{PREFIX}/bin/python3"
        if name == "nvshim-runtime":  # the compiled front execs the same interpreter
            assert frontbin.fields_of(launcher)["interpreter"] == python
        else:
            assert launcher.startswith(f"#!{python} -IS\n".encode())
    hook = json.loads((tree / HOOK_FILE.lstrip("/")).read_text())
    assert hook["hook"]["path"] == f"{PREFIX}/bin/nvshim-hook"
    # nothing staged names the staging directory
    leaked = subprocess.run(
        ["grep", "-rl", "--", f"{package}/src", str(tree)], capture_output=True, text=True
    )
    assert leaked.stdout == ""
    control = tmp_path / "control"
    subprocess.run(["dpkg-deb", "-e", deb, str(control)], check=True)
    assert (control / "conffiles").read_text().split() == ["/etc/nvshim/config.toml"]
    units = ("nvshim-cdi-refresh.service", "nvshim-cdi-refresh.path", "nvshim-mps.service",
             "nvshim-runtimed.service")  # fmt: skip
    for unit in units:
        assert (tree / "lib" / "systemd" / "system" / unit).is_file()
    assert (tree / "lib" / "udev" / "rules.d" / "60-nvshim-cdi-refresh.rules").is_file()
    assert not list(tree.rglob("__pycache__"))
    # the default config is every default, commented out, and parses to the defaults
    from nvshim.config import Config, parse_config

    text = (tree / "etc" / "nvshim" / "config.toml").read_text()
    assert parse_config(text.encode(), "config.toml").warnings == []
    uncommented = re.sub(r"^# ([a-z-]+ = )", r"\1", text, flags=re.M).encode()
    assert parse_config(uncommented, "config.toml") == Config(path="config.toml")


INVOKED = "/ctr/deb-systemd-invoke.log"
SOCKET = f"/run/nvshim/{DAEMON_SOCKET}"  # the package's nvshim-runtimed (default cache dir)


def invoked(root: str, unit: str) -> list[str]:
    """The stand-in deb-systemd-invoke's calls naming ``unit``."""
    with open(root + INVOKED) as fh:
        return [x for x in fh.read().splitlines() if unit in x]


def snapshot(root: str) -> dict[str, str]:
    """Every path under ``root`` (minus mount points, scaffolding and bookkeeping) with
    its type and, for files and links, content digest or target."""
    out = {}
    for top, dirs, files in os.walk(root):
        rel_top = os.path.relpath(top, root)
        if rel_top in ("proc", "sys", "dev", "tmp", "ctr", "sim"):
            dirs[:] = []
            continue
        for name in dirs + files:
            rel = os.path.normpath(os.path.join(rel_top, name))
            if rel.startswith(BOOKKEEPING):
                continue
            full = os.path.join(root, rel)
            if os.path.islink(full):
                out[rel] = "link " + os.readlink(full)
            elif os.path.isdir(full):
                out[rel] = "dir"
            else:
                with open(full, "rb") as fh:
                    out[rel] = "file " + str(hash(fh.read()))
    return out


class DebianRoot:
    """A fresh Debian 12 minbase root with the simulated host bound in at /sim."""

    def __init__(self, tmp_path, sim):
        self.root = unpack(debian_root_tar("bookworm"), str(tmp_path / "root"))
        self.sim = sim
        for rel in ("sim", "ctr"):
            os.makedirs(os.path.join(self.root, rel), exist_ok=True)
        # runc for the container test (scaffolding, not the package's)
        shutil.copy(shutil.which("runc") or "/usr/sbin/runc", self.root + "/usr/local/sbin/")

    def run(self, command: str, check: bool = True) -> subprocess.CompletedProcess:
        """``command`` (sh) chrooted into the root, with /proc, /sys, /dev and the
        simulated host mounted (in a private mount namespace)."""
        r = self.root
        script = (
            # the root a mount point (runc makes "/" a slave mount), then the API mounts
            f"set -e; mount --bind {r} {r}; mount -t proc proc {r}/proc; "
            f"mount --rbind /sys {r}/sys; mount --rbind /dev {r}/dev; "
            f"mount --bind {self.sim.root} {r}/sim; "
            f"exec chroot {r} /usr/bin/env -i "
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "
            'LC_ALL=C.UTF-8 DEBIAN_FRONTEND=noninteractive /bin/sh -ec "$0"'
        )
        proc = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "--pid", "--fork",
             "sh", "-c", script, command],
            capture_output=True, text=True,
        )  # fmt: skip
        if check:
            assert proc.returncode == 0, f"{command}\n{proc.stdout}\n{proc.stderr}"
        return proc


def test_install_use_upgrade_remove_purge(package, sim_hosts, tmp_path):
    sim = sim_hosts("single")
    node = DebianRoot(tmp_path, sim)
    root = node.root
    assert not os.path.exists(root + "/usr/bin/python3")  # nothing nvshim could lean on
    for rel, text in ENGINE_CONFIGS.items():
        os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
        with open(os.path.join(root, rel), "w") as fh:
            fh.write(text)
    # systemd "running": a stand-in deb-systemd-invoke records what the maintainer scripts
    # start, stop and restart
    os.makedirs(root + "/run/systemd/system", exist_ok=True)
    with open(root + "/usr/local/sbin/deb-systemd-invoke", "w") as fh:
        fh.write(f'#!/bin/sh\necho "$*" >> {INVOKED}\n')
    os.chmod(root + "/usr/local/sbin/deb-systemd-invoke", 0o755)
    before = snapshot(root)
    shutil.copy(deb_path(package), root + "/ctr/nvshim.deb")

    node.run("dpkg -i /ctr/nvshim.deb")
    wants = root + "/etc/systemd/system/multi-user.target.wants/"
    assert os.path.islink(wants + "nvshim-cdi-refresh.service")
    assert os.path.islink(wants + "nvshim-runtimed.service")
    assert not os.path.exists(wants + "nvshim-mps.service")
    assert invoked(root, "runtimed") == ["start nvshim-runtimed.service"]
    roots = "--driver-root /sim --dev-root /sim"
    out = node.run(
        f"nvshim --version; nvshim info {roots}; "
        f"nvshim cdi generate {roots} -o /ctr/nvidia.yaml; nvshim cdi validate /ctr/nvidia.yaml; "
        # what nvshim-cdi-refresh.service runs (RuntimeDirectory=cdi makes /run/cdi)
        f"mkdir -p /run/cdi; nvshim cdi refresh --output /var/run/cdi/nvidia.yaml {roots}"
    )
    assert out.stdout.startswith("nvshim version ")
    assert sim.gpu_uuids()[0] in out.stdout
    assert "/dev/nvidia0" in open(root + "/ctr/nvidia.yaml").read()
    assert "refreshed /var/run/cdi/nvidia.yaml" in out.stderr
    assert os.path.isfile(root + "/run/cdi/nvidia.yaml")

    # a runc container through the package's nvshim-runtime gets its GPU
    uuid = sim.gpu_uuids()[0]
    config = write_config(
        root + "/ctr/config.toml", sim, "/usr/bin", "/ctr/state", "/ctr/nvshim.log",
        accept_env_unprivileged=True,
    ).replace(root, "")  # fmt: skip
    text = open(root + config).read().replace(sim.root, "/sim")
    with open(root + config, "w") as fh:
        fh.write(text)
    from tests.podman_util import make_busybox_rootfs

    make_busybox_rootfs(root + "/ctr/c1/rootfs")
    bundle = make_bundle(root + "/ctr", root + "/ctr/c1/rootfs", ["/bin/sh", "-c", SHOW],
                         env={"NVIDIA_VISIBLE_DEVICES": uuid}, name="c1")  # fmt: skip
    with open(bundle + "/config.json") as fh:
        spec = json.load(fh)
    spec["root"]["path"] = "rootfs"
    with open(bundle + "/config.json", "w") as fh:
        json.dump(spec, fh)
    out = node.run(
        # --no-pivot: pivot_root cannot work under chroot
        f"NVSHIM_CONFIG={config} nvshim-runtime --root /ctr/runc-state run --no-pivot "
        f"--bundle /ctr/c1 nvshim-deb-{os.getpid()} </dev/null"
    )
    view = {}
    for line in out.stdout.splitlines():
        key, _, rest = line.partition(":" if not line.startswith("CVD=") else "=")
        view[key] = rest.split()
    assert gpu_nodes(view) == {"nvidia0"} and view["CVD"] == [uuid], out.stdout

    # the same through the package's nvshim-runtimed (what its unit runs): served there
    spec["root"]["path"] = "/ctr/c1/rootfs"
    os.makedirs(root + "/ctr/c2")
    with open(root + "/ctr/c2/config.json", "w") as fh:
        json.dump(spec, fh)
    out = node.run(
        "nvshim-runtimed --verbose 2>/ctr/runtimed.log & daemon=$!; i=0; "
        f"while [ ! -S {SOCKET} ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; "
        f"NVSHIM_CONFIG={config} nvshim-runtime --root /ctr/runc-state run --no-pivot "
        f"--bundle /ctr/c2 nvshim-deb-d{os.getpid()} </dev/null; "
        "kill $daemon; wait $daemon"
    )
    served = daemon_calls(root + "/ctr/runtimed.log")
    assert len(served) == 1 and " run --no-pivot " in served[0], served
    assert f"CVD={uuid}" in out.stdout.splitlines(), out.stdout
    assert not os.path.exists(root + SOCKET)

    # an upgrade (the same package again) keeps an operator's config
    with open(root + "/etc/nvshim/config.toml", "a") as fh:
        fh.write('[policy]\ncdi-vendor = "example.com"\n')
    edited = open(root + "/etc/nvshim/config.toml").read()
    os.unlink(root + INVOKED)
    node.run("dpkg -i /ctr/nvshim.deb")
    assert open(root + "/etc/nvshim/config.toml").read() == edited
    # stopped before the new files are unpacked, started after: never a restart of a
    # daemon that ran the old code over the new files
    assert invoked(root, "runtimed") == ["stop nvshim-runtimed.service",
                                         "start nvshim-runtimed.service"]  # fmt: skip

    os.unlink(root + INVOKED)
    node.run("dpkg -r nvshim")
    assert invoked(root, "runtimed") == ["stop nvshim-runtimed.service"]
    assert not os.path.lexists(root + "/usr/bin/nvshim")
    assert not os.path.exists(root + PREFIX)
    assert not os.path.exists(root + "/run/cdi/nvidia.yaml")  # it named the removed hook
    assert open(root + "/etc/nvshim/config.toml").read() == edited  # kept until purge
    node.run("dpkg -P nvshim")
    after = snapshot(root)
    left = {k: v for k, v in after.items() if before.get(k) != v}
    assert left == {}
    assert [k for k in before if k not in after] == []
    for rel, text in ENGINE_CONFIGS.items():
        assert open(os.path.join(root, rel)).read() == text
