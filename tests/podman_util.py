"""Run real podman (4.x) against a busybox rootfs without touching any global state.

``podman_run`` starts podman inside a private mount namespace (``unshare --mount``) where
``/run``, ``/dev/shm`` and ``/etc/cdi`` (when present) are fresh tmpfs mounts: podman then
sees only the CDI specs of the given directory (bound on ``/run/cdi`` = ``/var/run/cdi``,
podman 4.3 has no option for a spec directory), keeps its run root, tmp dir, runc state and
SHM locks private, and its storage, volume and network directories live under ``tmp_path``.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from collections.abc import Sequence

BUSYBOX_APPLETS = ("sh", "ls", "cat", "readlink", "env", "test", "find", "grep", "stat", "true")

PODMAN_BASE_ENV = {
    **{k: v for k, v in os.environ.items() if k == "NVSHIM_CACHE_DIR"},  # tests/conftest.py
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "LC_ALL": "C.UTF-8",
}

# Runs as /bin/sh inside the new mount namespace. $1: the CDI dir (or empty); $2: a scratch
# dir to hold the host's /run; $3: how many host /run paths to keep; those paths; podman argv.
_NAMESPACE_SCRIPT = """set -e
cdi_dir=$1; hostrun=$2; nkeep=$3; shift 3
mount --rbind /run "$hostrun"
mount -t tmpfs -o mode=0755 nvshim-test-run /run
mount -t tmpfs -o mode=1777 nvshim-test-shm /dev/shm
mkdir -m 0755 /run/cdi
if [ -n "$cdi_dir" ]; then mount --bind "$cdi_dir" /run/cdi; fi
if [ -d /etc/cdi ]; then mount -t tmpfs -o mode=0755 nvshim-test-etc-cdi /etc/cdi; fi
while [ "$nkeep" -gt 0 ]; do
    rel=${1#/run/}; shift; nkeep=$((nkeep - 1))
    if [ -d "$hostrun/$rel" ]; then mkdir -p "/run/$rel"
    else mkdir -p "$(dirname "/run/$rel")"; : > "/run/$rel"; fi
    mount --rbind "$hostrun/$rel" "/run/$rel"
done
exec "$@"
"""


def _is_static_elf(path: str) -> bool:
    """True when ``path`` is an ELF executable without a PT_INTERP (dynamic loader) header."""
    with open(path, "rb") as fh:
        head = fh.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2:  # 64-bit only
            return False
        endian = "<" if head[5] == 1 else ">"
        (phoff,) = struct.unpack_from(endian + "Q", head, 32)
        phentsize, phnum = struct.unpack_from(endian + "HH", head, 54)
        fh.seek(phoff)
        table = fh.read(phentsize * phnum)
    for i in range(phnum):
        (p_type,) = struct.unpack_from(endian + "I", table, i * phentsize)
        if p_type == 3:  # PT_INTERP
            return False
    return True


# The host's glibc dynamic loader and where glibc programs look for it (PT_INTERP).
GLIBC_LOADERS = {
    "x86_64": "/lib64/ld-linux-x86-64.so.2",
    "aarch64": "/lib/ld-linux-aarch64.so.1",
}


def static_busybox() -> str:
    """The static busybox on ``PATH`` (else ``/bin/busybox``). Raises RuntimeError when
    there is none or it is not static."""
    busybox = shutil.which("busybox") or "/bin/busybox"
    if not os.path.exists(busybox) or not _is_static_elf(busybox):
        raise RuntimeError(
            f"{busybox}: a static busybox is needed (apt-get install busybox-static)"
        )
    return busybox


def make_busybox_rootfs(dest: str | os.PathLike, glibc_loader: bool = True) -> str:
    """Create a minimal rootfs at ``dest``: static busybox, applet links, /etc/passwd, /etc/group.

    Applets: ``BUSYBOX_APPLETS``. With ``glibc_loader`` (as in ``busybox:glibc`` and every
    CUDA image) a copy of the host's glibc dynamic loader sits at its standard path, so
    the image counts as one that reads an ld.so cache. Returns ``dest`` as a string.
    """
    dest = os.fspath(dest)
    busybox = static_busybox()
    for sub in ("bin", "etc", "dev", "proc", "sys", "tmp", "root"):
        os.makedirs(os.path.join(dest, sub), exist_ok=True)
    target = os.path.join(dest, "bin", "busybox")
    shutil.copyfile(busybox, target)
    os.chmod(target, 0o755)
    for applet in BUSYBOX_APPLETS:
        link = os.path.join(dest, "bin", applet)
        if not os.path.lexists(link):
            os.symlink("busybox", link)
    with open(os.path.join(dest, "etc", "passwd"), "w") as fh:
        fh.write("root:x:0:0:root:/root:/bin/sh\n")
    with open(os.path.join(dest, "etc", "group"), "w") as fh:
        fh.write("root:x:0:\n")
    if glibc_loader:
        loader = GLIBC_LOADERS[os.uname().machine]
        target = os.path.join(dest, loader.lstrip("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(os.path.realpath(loader), target)
        os.chmod(target, 0o755)
    return dest


def podman_run(
    tmp_path: str | os.PathLike,
    rootfs: str,
    args: list[str],
    cdi_dir: str | None = None,
    hooks_dir: str | None = None,
    env: dict[str, str] | None = None,
    *,
    runtime: str = "runc",
    keep_run: Sequence[str] = (),
    timeout: float = 180,
) -> subprocess.CompletedProcess:
    """Run ``podman run --rm ... --rootfs ROOTFS`` isolated; return the finished process (text).

    ``args`` are ``podman run`` options, then ``"--"``, then the command to run in the
    container (without ``"--"`` all of ``args`` is the command). ``cdi_dir``: the only CDI
    spec directory podman sees (none when ``None``). ``hooks_dir``: the only OCI hooks
    directory (an empty one when ``None``, so host hooks never run). ``env``: extra
    variables for the podman process (they reach conmon, the OCI runtime and hooks'
    parent; container variables go in ``args`` as ``-e``). ``runtime``: name or path of
    the OCI runtime. ``keep_run``: host paths under ``/run`` (``/var/run``) to keep visible
    in the private ``/run`` (a driver root at ``/run/nvidia/driver``, an MPS pipe dir...).
    The caller checks ``returncode``, ``stdout`` and ``stderr``.
    """
    if "--" in args:
        cut = args.index("--")
        run_opts, command = list(args[:cut]), list(args[cut + 1 :])
    else:
        run_opts, command = [], list(args)
    argv = [
        *podman_command(tmp_path, hooks_dir, runtime),
        "run", "--rm",
        "--network", "none",
        "--ulimit", "nofile=1024:1024",
        "--ulimit", "nproc=1024:1024",
        *run_opts,
        "--rootfs", os.path.abspath(rootfs),
        *command,
    ]  # fmt: skip
    return in_podman_namespace(tmp_path, argv, cdi_dir, env, keep_run, timeout)


def podman_command(
    tmp_path: str | os.PathLike, hooks_dir: str | None = None, runtime: str = "runc"
) -> list[str]:
    """``podman`` with the global options that keep its state under ``tmp_path``."""
    state = os.path.join(os.fspath(tmp_path), "podman-state")
    names = ("root", "volumes", "networks", "hooks", "host-run")
    dirs = {name: os.path.join(state, name) for name in names}
    for path in dirs.values():
        os.makedirs(path, exist_ok=True)
    podman = shutil.which("podman") or "/usr/bin/podman"
    return [
        podman,
        "--root", dirs["root"],
        "--runroot", "/run/podman-test/runroot",  # private tmpfs; podman wants <= 50 chars
        "--tmpdir", "/run/podman-test/tmp",
        "--volumepath", dirs["volumes"],
        "--network-config-dir", dirs["networks"],
        "--hooks-dir", os.path.abspath(hooks_dir) if hooks_dir else dirs["hooks"],
        "--storage-driver", "vfs",
        "--events-backend", "none",
        "--cgroup-manager", "cgroupfs",
        "--runtime", runtime,
    ]  # fmt: skip


def in_podman_namespace(
    tmp_path: str | os.PathLike,
    argv: list[str],
    cdi_dir: str | None = None,
    env: dict[str, str] | None = None,
    keep_run: Sequence[str] = (),
    timeout: float = 180,
) -> subprocess.CompletedProcess:
    """Run ``argv`` (podman, or a shell running several podman commands) in the private
    mount namespace described in the module docstring; text output captured.
    ``tmp_path``: where ``podman_command`` keeps podman's state for this test."""
    host_run = os.path.join(os.fspath(tmp_path), "podman-state", "host-run")
    os.makedirs(host_run, exist_ok=True)
    cdi = os.path.abspath(cdi_dir) if cdi_dir else ""
    if cdi.startswith(("/run/", "/var/run/", "/dev/shm/")):
        raise ValueError(f"{cdi_dir}: the CDI dir must not live under /run or /dev/shm")
    full = ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c"]
    keep = []
    for path in keep_run:
        path = os.path.normpath(
            "/run" + path[len("/var/run") :] if path.startswith("/var/run/") else path
        )
        if not path.startswith("/run/"):
            raise ValueError(f"{path}: keep_run takes paths under /run")
        keep.append(path)
    full += [_NAMESPACE_SCRIPT, "podman-ns", cdi, host_run, str(len(keep)), *keep, *argv]
    return subprocess.run(
        full,
        env={**PODMAN_BASE_ENV, **(env or {})},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
