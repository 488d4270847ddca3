"""What a test cluster runs, built or unpacked once into the test cache (tests/debroot.py's
``cached``: keyed by inputs, locked, pruned):

- ``k8s_bin()``: the Kubernetes server binaries and kubectl unpacked from
  ``../shared/k8s/kubernetes-v*.tar.xz`` (keyed by the archive's sha256);
- ``containerd_bin("1.6" | "1.7")``: a directory holding ``containerd``,
  ``containerd-shim-runc-v2`` and ``ctr``: Debian bookworm's from apt (1.6), or trixie's
  1.7 fetched with a private apt state (the system's sources untouched) and ``dpkg-deb -x``;
- ``crio_dir()``: CRI-O 1.36.3 (``bin/crio``, ``bin/pinns``, ``bin/runc-oomclamp``) unpacked
  from ``../shared/crio/crio-*-linux-amd64.tar.xz`` (keyed by the archive's sha256);
- ``base_images()``: docker archives of a static ``pause`` and of a static busybox.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import shutil
import subprocess
import tempfile

from tests.debroot import REPO, cached

PAUSE = "nvshim.test/pause:k8s"
BUSYBOX = "nvshim.test/busybox:k8s"
CONTAINERD_VERSIONS = ("1.6", "1.7")
ENGINES = (*CONTAINERD_VERSIONS, "crio")  # what a test cluster runs: containerd 1.6/1.7, CRI-O

# The pod sandbox: sleeps until told to stop, reaps nothing it does not own.
_PAUSE_C = r"""#include <signal.h>
#include <unistd.h>
#include <sys/wait.h>
static void stop(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, 0, WNOHANG) > 0) {} }
int main(void) {
    signal(SIGINT, stop); signal(SIGTERM, stop); signal(SIGCHLD, reap);
    for (;;) pause();
}
"""


class MissingPart(RuntimeError):
    """A part the cluster needs is not on this machine (tests/setup.sh installs it)."""


def _shared_archive(variable: str, pattern: str) -> str | None:
    """``$variable`` when set, else the newest ``pattern`` (under ``shared/``) beside or
    inside the checkout."""
    given = os.environ.get(variable)
    if given:
        return given if os.path.isfile(given) else None
    for shared in (
        os.path.join(os.path.dirname(REPO), "shared"),
        os.path.join(REPO, "shared"),
        "/work/shared",
    ):
        found = sorted(glob.glob(os.path.join(shared, pattern)))
        if found:
            return found[-1]
    return None


def k8s_archive() -> str | None:
    """The Kubernetes server archive: ``$NVSHIM_K8S_ARCHIVE``, else the first
    ``kubernetes-*-linux-amd64.tar.xz`` in ``shared/k8s`` beside or inside the checkout."""
    return _shared_archive("NVSHIM_K8S_ARCHIVE", "k8s/kubernetes-*-linux-amd64.tar.xz")


def crio_archive() -> str | None:
    """The CRI-O archive: ``$NVSHIM_CRIO_ARCHIVE``, else ``shared/crio/crio-*.tar.xz``."""
    return _shared_archive("NVSHIM_CRIO_ARCHIVE", "crio/crio-*-linux-amd64.tar.xz")


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def k8s_bin() -> str:
    """A directory with kube-apiserver, kube-controller-manager, kube-scheduler, kubelet
    and kubectl (unpacked once per archive content)."""
    return _unpacked("k8s-bin", k8s_archive(), "Kubernetes")


def _unpacked(name: str, archive: str | None, what: str) -> str:
    """``archive`` unpacked once per content into the test cache."""
    if archive is None:
        raise MissingPart(f"no {what} archive (../shared)")

    def build(path: str) -> None:
        os.makedirs(path)
        subprocess.run(["tar", "-C", path, "-xJf", archive], check=True, capture_output=True)

    return cached(name, {"sha256": _sha256(archive)}, build)


def crio_dir() -> str:
    """CRI-O unpacked (``bin/crio``, ``bin/pinns``, ``bin/runc-oomclamp``), once per archive
    content; conmon and runc come from apt."""
    for needed in ("conmon", "runc", "podman"):
        if shutil.which(needed) is None:
            raise MissingPart(f"{needed} is not installed (tests/setup.sh installs it)")
    return _unpacked("crio", crio_archive(), "CRI-O")


def _debian_mirror() -> str:
    """The Debian mirror apt already uses (first ``.../debian`` URI of its sources)."""
    texts = []
    for pattern in ("/etc/apt/sources.list", "/etc/apt/sources.list.d/*"):
        for path in glob.glob(pattern):
            try:
                with open(path, encoding="utf-8", errors="replace") as fh:
                    texts.append(fh.read())
            except OSError:
                continue
    for text in texts:
        for match in re.finditer(r"(?:^deb\s+(?:\[[^]]*\]\s+)?|^URIs:\s*)(\S+)", text, re.M):
            uri = match.group(1).rstrip("/")
            if uri.endswith("/debian"):
                return uri
    return "http://deb.debian.org/debian"


def _fetch_containerd_17(path: str) -> None:
    """Download trixie's containerd .deb with a private apt state and unpack its binaries
    into ``path`` (FACTS §15): nothing of the system's apt configuration or cache changes."""
    with tempfile.TemporaryDirectory(prefix="nvshim-apt-") as work:
        sources = os.path.join(work, "sources.list")
        with open(sources, "w") as fh:
            fh.write(f"deb {_debian_mirror()} trixie main\n")
        for sub in ("lists/partial", "archives/partial", "cache"):
            os.makedirs(os.path.join(work, sub))
        opts = [
            f"-oDir::Etc::sourcelist={sources}",
            "-oDir::Etc::sourceparts=-",
            f"-oDir::State::Lists={work}/lists",
            f"-oDir::Cache={work}/cache",
            f"-oDir::Cache::archives={work}/archives",
            "-oAPT::Sandbox::User=root",
            "-qq",
        ]
        for cmd in (["update"], ["download", "containerd"]):
            proc = subprocess.run(
                ["apt-get", *opts, *cmd], cwd=work, capture_output=True, text=True
            )
            if proc.returncode != 0:
                raise MissingPart(f"apt-get {cmd[0]} (trixie containerd) failed: {proc.stderr}")
        (deb,) = glob.glob(os.path.join(work, "containerd_*.deb"))
        unpacked = os.path.join(work, "x")
        subprocess.run(["dpkg-deb", "-x", deb, unpacked], check=True, capture_output=True)
        os.makedirs(path)
        for name in os.listdir(os.path.join(unpacked, "usr/bin")):
            shutil.copy2(os.path.join(unpacked, "usr/bin", name), os.path.join(path, name))
        with open(os.path.join(path, "VERSION"), "w") as fh:
            fh.write(os.path.basename(deb) + "\n")


def containerd_bin(version: str) -> str:
    """A directory holding containerd ``version``'s ``containerd``, its runc shim and
    ``ctr``: "1.6" is the system's (apt, bookworm), "1.7" trixie's (fetched once)."""
    if version == "1.6":
        found = shutil.which("containerd")
        if not found:
            raise MissingPart("containerd is not installed (tests/setup.sh installs it)")
        return os.path.dirname(os.path.realpath(found))
    if version == "1.7":
        return cached("containerd-1.7", {"suite": "trixie", "package": "containerd"},
                      _fetch_containerd_17)  # fmt: skip
    raise ValueError(f"containerd version {version!r}: choose one of {CONTAINERD_VERSIONS}")


def base_images() -> dict[str, str]:
    """Docker archives of the pause image (``PAUSE``) and a busybox image (``BUSYBOX``:
    static busybox, every applet; default command ``sleep``), built once."""
    from tests.cri_util import image_archive
    from tests.podman_util import make_busybox_rootfs

    busybox = shutil.which("busybox") or "/bin/busybox"
    inputs = {"busybox": _sha256(busybox), "pause": _PAUSE_C, "refs": [PAUSE, BUSYBOX]}

    def build(path: str) -> None:
        os.makedirs(path)
        pause_root = os.path.join(path, "pause-root")
        os.makedirs(pause_root)
        src = os.path.join(path, "pause.c")
        with open(src, "w") as fh:
            fh.write(_PAUSE_C)
        subprocess.run(
            ["gcc", "-static", "-Os", "-o", os.path.join(pause_root, "pause"), src],
            check=True,
            capture_output=True,
        )
        image_archive(pause_root, os.path.join(path, "pause.tar"), [PAUSE], cmd=["/pause"])
        rootfs = make_busybox_rootfs(os.path.join(path, "busybox-root"), glibc_loader=False)
        listed = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=True)
        for applet in listed.stdout.split():
            link = os.path.join(rootfs, "bin", applet)
            if not os.path.lexists(link) and applet != "busybox":
                os.symlink("busybox", link)
        image_archive(rootfs, os.path.join(path, "busybox.tar"), [BUSYBOX])
        shutil.rmtree(pause_root)
        shutil.rmtree(rootfs)
        os.unlink(src)

    built = cached("k8s-images", inputs, build)
    return {PAUSE: os.path.join(built, "pause.tar"), BUSYBOX: os.path.join(built, "busybox.tar")}
