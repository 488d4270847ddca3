"""A one-node Kubernetes for tests: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, the engine (containerd 1.6 or 1.7, or CRI-O 1.36) and the kubelet, all inside
private mount, network and PID namespaces, so the host's own files never change (FACTS §15,
§16).

Inside the namespaces (PID 1 is tests/k8s/nsinit.py):
- ``/run`` is a tmpfs; ``/etc``, ``/opt``, ``/usr/local``, ``/var/lib``, ``/var/log``,
  ``/var/cache`` and ``/dev`` are overlays whose upper dirs live in the cluster's work dir:
  every host path a DaemonSet writes through a hostPath lands there (``/var/run`` is the
  host's symlink to ``/run``); ``/var/lib/containerd`` and ``/var/lib/kubelet`` are bind
  mounts of plain directories of the work dir;
- the containerd config is a real file at ``/etc/containerd/config.toml``; containerd is
  restarted whenever it exits (as systemd would: an installer's SIGHUP makes it exit);
- CRI-O (``engine="crio"``) reads ``/etc/crio/crio.conf`` and ``/etc/crio/crio.conf.d/``; its
  image store is a plain directory of the work dir (overlay storage cannot sit on an
  overlayfs), filled by podman through the same store; ``/usr/bin`` and
  ``/usr/share/containers`` are overlays too (CRI-O creates its hooks directory there), and
  ``/usr/bin/systemctl`` is a stand-in that restarts CRI-O through the supervisor, as
  ``systemctl restart crio`` would (an installer must restart CRI-O 1.36: SIGHUP does not
  apply runtime handler changes); ``/proc/cgroups`` shows hugetlb disabled (on these hybrid
  hosts hugetlb is not a v1 hierarchy, and CRI-O would have runc set hugetlb limits); the
  runc handler runs through ``RUNC_CLAMP`` (no CAP_SYS_RESOURCE here);
- ``lo`` carries the node address ``NODE_IP``; pods get addresses from the bridge CNI
  (``cni0``, ``POD_SUBNET``); ``SERVICE_IP`` (the ``kubernetes`` service) is DNATed to the
  API server, so in-cluster clients work (there is no kube-proxy and no cluster DNS);
- a simulated GPU host (tests/sim) is the driver root at ``DRIVER_ROOT`` and its device
  nodes are real char nodes in ``/dev`` (made in the ``/dev`` overlay, never the host's);
- the kubelet's sysctls are files bind-mounted over ``/proc/sys``; its cgroups live under
  a cgroup root of the cluster's own, removed at the end.

    with Cluster(containerd="1.7") as k8s:          # or Cluster(engine="crio")
        k8s.kubectl("get", "nodes")
        k8s.apply(manifest_text)
        k8s.path("/etc/containerd/config.toml")   # that file, from outside

By hand: ``python3 -m tests.k8s.cluster --containerd 1.7 --shell`` (or ``--engine crio``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tests.k8s import artifacts
from tests.k8s.pki import kubeconfig, make_pki

NODE_NAME = "nvshim-node"
NODE_IP = "10.200.0.1"
POD_SUBNET = "10.88.0.0/16"
SERVICE_RANGE = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"
API_PORT = 6443
DRIVER_ROOT = "/run/nvidia/driver"
CONTAINERD_SOCKET = "/run/containerd/containerd.sock"
CONTAINERD_CONFIG = "/etc/containerd/config.toml"
CRIO_SOCKET = "/run/crio/crio.sock"
CRIO_CONFIG = "/etc/crio/crio.conf"
CRIO_DROP_INS = "/etc/crio/crio.conf.d"
CRIO_RUNROOT = "/run/containers/storage"
OVERLAYS = ("/etc", "/opt", "/usr/local", "/var/lib", "/var/log", "/var/cache")
CRIO_OVERLAYS = ("/usr/bin", "/usr/share/containers")  # the systemctl stand-in, hooks.d
CGROUP_FS = "/sys/fs/cgroup"
# The kubelet sets these (and reads vm.panic_on_oom): files with its values go over them.
SYSCTLS = {
    "vm/overcommit_memory": "1",
    "vm/panic_on_oom": "0",
    "kernel/panic": "10",
    "kernel/panic_on_oops": "1",
    "kernel/keys/root_maxkeys": "1000000",
    "kernel/keys/root_maxbytes": "25000000",
}
NSINIT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nsinit.py")
WORKDIR_PREFIX = "nvshim-k8s-"
MAX_EXITS = 5  # a component that exits this often before the node is Ready is broken
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class ClusterError(RuntimeError):
    """The cluster did not come up (the message carries the relevant logs)."""


def _containerd_config(version: str, bin_dir: str, sandbox_image: str, cdi: bool) -> str:
    """containerd's own default config (``containerd config default``) made to run here:
    a local sandbox image, no negative oom_score_adj, the system's CNI plugins; CDI on
    for 1.7 when ``cdi``."""
    import tomlkit

    text = subprocess.run(
        [os.path.join(bin_dir, "containerd"), "config", "default"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    doc = tomlkit.parse(text)
    cri = doc["plugins"]["io.containerd.grpc.v1.cri"]
    cri["sandbox_image"] = sandbox_image
    cri["restrict_oom_score_adj"] = True
    cri["cni"]["bin_dir"] = "/usr/lib/cni"
    cri["cni"]["conf_dir"] = "/etc/cni/net.d"
    if version != "1.6":
        cri["enable_cdi"] = cdi
        cri["cdi_spec_dirs"] = ["/etc/cdi", "/var/run/cdi"]
    return tomlkit.dumps(doc)


# runc for CRI-O's runc handler on these machines (no CAP_SYS_RESOURCE): before create, run
# and exec, a negative oomScoreAdj is raised to ours (as ../shared/crio's runc-oomclamp and
# containerd's restrict_oom_score_adj do) and capabilities outside our bounding set are
# dropped (CRI-O gives a privileged container every capability it knows; containerd gives
# the ones it has).
RUNC_CLAMP = """#!/usr/bin/python3 -IS
import json, os, sys

CAPS = ("CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP "
        "LINUX_IMMUTABLE NET_BIND_SERVICE NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER "
        "SYS_MODULE SYS_RAWIO SYS_CHROOT SYS_PTRACE SYS_PACCT SYS_ADMIN SYS_BOOT SYS_NICE "
        "SYS_RESOURCE SYS_TIME SYS_TTY_CONFIG MKNOD LEASE AUDIT_WRITE AUDIT_CONTROL SETFCAP "
        "MAC_OVERRIDE MAC_ADMIN SYSLOG WAKE_ALARM BLOCK_SUSPEND AUDIT_READ PERFMON BPF "
        "CHECKPOINT_RESTORE").split()
args = sys.argv[1:]
command, bundle, process, prev = None, ".", None, None
for arg in args:
    if prev in ("--bundle", "-b"):
        bundle = arg
    elif prev in ("--process", "-p"):
        process = arg
    elif arg.startswith("--bundle="):
        bundle = arg.split("=", 1)[1]
    elif arg.startswith("--process="):
        process = arg.split("=", 1)[1]
    elif command is None and arg in ("create", "run", "exec"):
        command = arg
    prev = arg
path = process if command == "exec" else os.path.join(bundle, "config.json") if command else None
if path and os.path.isfile(path):
    with open(path) as fh:
        doc = json.load(fh)
    proc = doc if command == "exec" else doc.get("process") or {}
    with open("/proc/self/oom_score_adj") as fh:
        mine = int(fh.read())
    if proc.get("oomScoreAdj", 0) < mine:
        proc["oomScoreAdj"] = mine
    with open("/proc/self/status") as fh:
        bnd = int(next(l for l in fh if l.startswith("CapBnd:")).split()[1], 16)
    have = {"CAP_" + n for i, n in enumerate(CAPS) if bnd >> i & 1}
    for key, caps in (proc.get("capabilities") or {}).items():
        proc["capabilities"][key] = [c for c in caps if c in have]
    with open(path, "w") as fh:
        json.dump(doc, fh)
os.execv("/usr/sbin/runc", ["runc", *args])
"""


def _crio_config(crio_dir: str, runc: str, storage: str, sandbox_image: str) -> str:
    """CRI-O's ``crio.conf`` for these machines (../shared/crio/README.md): runc through
    ``RUNC_CLAMP`` as the default (1.36's built-in default is crun), cgroupfs, the store on
    the real filesystem."""
    return f"""\
# CRI-O for the nvshim test cluster (tests/k8s/cluster.py)
[crio]
root = "{storage}"
runroot = "{CRIO_RUNROOT}"
storage_driver = "overlay"
log_dir = "/var/log/crio/pods"

[crio.api]
listen = "{CRIO_SOCKET}"

[crio.runtime]
default_runtime = "runc"
cgroup_manager = "cgroupfs"
conmon_cgroup = "pod"
pinns_path = "{crio_dir}/bin/pinns"
hooks_dir = ["/usr/share/containers/oci/hooks.d"]
irqbalance_config_restore_file = "disable"

[crio.runtime.runtimes.runc]
runtime_path = "{runc}"
runtime_type = "oci"
runtime_root = "/run/runc"
monitor_path = "/usr/bin/conmon"
monitor_cgroup = "pod"

[crio.image]
pause_image = "{sandbox_image}"
pause_command = "/pause"
signature_policy = "/etc/crio/policy.json"

[crio.network]
network_dir = "/etc/cni/net.d/"
plugin_dirs = ["/usr/lib/cni"]
"""


# The node's systemctl: systemd's restart/reload/is-active of the engine unit, done by the
# cluster's supervisor (tests/k8s/nsinit.py restarts a component that exits).
SYSTEMCTL = """#!/bin/sh
# nvshim test cluster: stand-in for systemctl (tests/k8s/cluster.py). The unit crio[.service]
# is the supervisor's component crio: restart = SIGTERM, then wait (as systemd's restart of a
# Type=notify unit does) until a new crio serves its socket; reload = SIGHUP.
verb=
unit=
for arg; do
    case $arg in -*) ;; *) if [ -z "$verb" ]; then verb=$arg; else unit=${arg%.service}; fi ;; esac
done
pidfile=/run/nsinit/$unit.pid
case $verb in
daemon-reload) exit 0 ;;
esac
if [ "$unit" != crio ] || [ ! -f "$pidfile" ]; then
    echo "systemctl (test stand-in): unit $unit not found" >&2
    exit 5
fi
old=$(cat "$pidfile")
case $verb in
is-active) kill -0 "$old" 2>/dev/null && { echo active; exit 0; }; echo inactive; exit 3 ;;
reload) exec kill -HUP "$old" ;;
restart|try-restart|reload-or-restart) ;;
*) echo "systemctl (test stand-in): $verb not supported" >&2; exit 1 ;;
esac
kill -TERM "$old" || exit 1
n=0
while [ $n -lt 900 ]; do
    new=$(cat "$pidfile" 2>/dev/null)
    if [ -n "$new" ] && [ "$new" != "$old" ] && [ -S /run/crio/crio.sock ] \\
        && ! kill -0 "$old" 2>/dev/null; then
        exit 0
    fi
    sleep 0.1
    n=$((n + 1))
done
echo "systemctl (test stand-in): crio did not come back" >&2
exit 1
"""


def _cni_conflist() -> str:
    return json.dumps(
        {
            "cniVersion": "0.4.0",
            "name": "nvshim-pods",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": "cni0",
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_SUBNET}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                    },
                }
            ],
        },
        indent=1,
    )


def _kubelet_config(pki: Path, cgroup_root: str, socket: str) -> str:
    return json.dumps(
        {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "authentication": {
                "x509": {"clientCAFile": str(pki / "ca.crt")},
                "webhook": {"enabled": True},
                "anonymous": {"enabled": False},
            },
            "authorization": {"mode": "Webhook"},
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": cgroup_root,
            "failCgroupV1": False,
            "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{socket}",
            "podLogsDir": "/var/log/pods",
            "resolvConf": "/etc/resolv.conf",
            "clusterDomain": "cluster.local",
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "1Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
            },
            "serializeImagePulls": False,
            "syncFrequency": "10s",
        },
        indent=1,
    )


def _cgroup_hierarchies() -> list[str]:
    """Mount points of the cgroup hierarchies (v1 controllers, named, unified)."""
    out = []
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        for line in fh:
            fields = line.split()
            fstype = fields[fields.index("-") + 1]
            if fstype in ("cgroup", "cgroup2") and fields[4].startswith(CGROUP_FS):
                out.append(fields[4])
    return sorted(set(out))


def _make_cgroup_root(name: str) -> None:
    for hierarchy in _cgroup_hierarchies():
        path = os.path.join(hierarchy, name.lstrip("/"))
        os.makedirs(path, exist_ok=True)
        for knob in ("cpuset.cpus", "cpuset.mems"):  # a v1 cpuset starts empty
            parent = os.path.join(hierarchy, knob)
            if os.path.exists(parent):
                with open(parent) as src, open(os.path.join(path, knob), "w") as dst:
                    dst.write(src.read())


def _remove_cgroup_root(name: str, timeout: float = 10.0) -> list[str]:
    """Remove the cgroup root ``name`` bottom-up in every hierarchy; what is left."""
    deadline = time.monotonic() + timeout
    while True:
        left = []
        for hierarchy in _cgroup_hierarchies():
            top = os.path.join(hierarchy, name.lstrip("/"))
            if not os.path.isdir(top):
                continue
            for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda w: -len(w[0])):
                try:
                    os.rmdir(dirpath)
                except OSError:
                    left.append(dirpath)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def _abandoned(workdir: str) -> bool:
    """True when ``workdir``'s cluster is gone: no live process holds its lock and no
    process names it on its command line (the namespaces' PID 1 does while it runs)."""
    import fcntl

    try:
        fd = os.open(os.path.join(workdir, "lock"), os.O_RDWR)
    except FileNotFoundError:
        fd = None
        if time.time() - os.stat(workdir).st_mtime < 120:
            return False  # a cluster takes its lock right after making its dir
    if fd is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        finally:
            os.close(fd)
    needle = os.fsencode(workdir + "/")
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    if needle in fh.read():
                        return False
            except OSError:
                continue
    return True


def sweep_stale(base: str | None = None) -> list[str]:
    """Remove the work dirs and cgroup roots of clusters whose process was killed before
    it could clean up (a killed test run): those no live process holds the lock of.
    Kept work dirs (``stop(keep_workdir=True)``) stay. Returns what was removed.

    Processes need no sweeping: the namespaces' PID 1 dies with the process that started
    the cluster (``setpriv --pdeathsig``, ``unshare --kill-child``)."""
    base = base or tempfile.gettempdir()
    removed = []
    for name in sorted(os.listdir(base)):
        workdir = os.path.join(base, name)
        if not name.startswith(WORKDIR_PREFIX) or not os.path.isdir(workdir):
            continue
        if not _abandoned(workdir):
            continue
        # the cgroup root is named after the work dir (a root without one is left alone:
        # it may belong to a live cluster whose work dir is elsewhere)
        if not _remove_cgroup_root("/" + name, timeout=0):
            removed.append(f"cgroup /{name}")
        if not os.path.exists(os.path.join(workdir, "kept")):
            shutil.rmtree(workdir, ignore_errors=True)
            removed.append(workdir)
    return removed


class Cluster:
    """A one-node cluster; ``start()``/``stop()`` or use it as a context manager.

    ``containerd``: "1.6" (bookworm, apt) or "1.7" (trixie); ``engine``: "containerd" or
    "crio" (CRI-O 1.36.3 from ../shared/crio; ``containerd`` is then unused). ``sim``: a
    shipped simulated host name (tests/sim/hosts) to serve as the driver root, or None.
    ``cdi``: containerd 1.7's ``enable_cdi`` (CRI-O always reads CDI specs).
    """

    def __init__(
        self,
        containerd: str = "1.6",
        sim: str | None = "h100x8-mig",
        cdi: bool = True,
        workdir: str | None = None,
        engine: str = "containerd",
    ) -> None:
        if engine not in ("containerd", "crio"):
            raise ValueError(f"engine {engine!r}: containerd or crio")
        if engine == "containerd" and containerd not in artifacts.CONTAINERD_VERSIONS:
            raise ValueError(f"containerd {containerd!r}: one of {artifacts.CONTAINERD_VERSIONS}")
        self.engine = engine
        self.socket = CRIO_SOCKET if engine == "crio" else CONTAINERD_SOCKET
        self.containerd_version = containerd
        self.sim_name = sim
        self.cdi = cdi
        sweep_stale()
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix=WORKDIR_PREFIX))
        # held while this process lives: sweep_stale leaves the cluster alone
        self._lock = os.open(self.workdir / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        import fcntl

        fcntl.flock(self._lock, fcntl.LOCK_EX)
        self.cgroup_root = "/" + self.workdir.name
        self.pki = self.workdir / "pki"
        self.logs = self.workdir / "logs"
        self.state = self.workdir / "state"
        self.kubeconfig = self.workdir / "admin.kubeconfig"
        self.sim = None  # tests.sim.simhost.SimHost (host paths under the work dir)
        self._proc: subprocess.Popen | None = None
        self.pid = 0  # PID 1 of the namespaces, as the host sees it
        self.pidns = ""
        self.mntns = ""
        self.k8s_bin = ""
        self.containerd_bin = ""
        self.crio_dir = ""
        self.crio_storage = self.workdir / "crio-storage"  # on the real filesystem
        self._imported: set[tuple[str, int, int]] = set()  # archives (import_image)

    @property
    def name(self) -> str:
        """What the cluster runs: "1.6", "1.7" (containerd) or "crio"."""
        return "crio" if self.engine == "crio" else self.containerd_version

    @property
    def engine_config(self) -> str:
        """The engine's main config file inside the cluster."""
        return CRIO_CONFIG if self.engine == "crio" else CONTAINERD_CONFIG

    # -- life cycle -------------------------------------------------------------------

    def __enter__(self) -> Cluster:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self, timeout: float = 90.0) -> Cluster:
        """Bring the cluster up: node Ready, default service account there, the base
        images (``artifacts.PAUSE``, ``artifacts.BUSYBOX``) imported."""
        started = time.monotonic()
        try:
            self._prepare()
            self._launch()
            self._wait_socket(timeout)
            for archive in artifacts.base_images().values():
                self.import_image(archive)
            self._wait_ready(started + timeout)
        except BaseException:
            self.stop()  # the error carries the logs; NVSHIM_K8S_KEEP=1 keeps the dir too
            raise
        self.start_seconds = time.monotonic() - started
        return self

    def _prepare(self) -> None:
        w = self.workdir
        self.k8s_bin = artifacts.k8s_bin()
        if self.engine == "crio":
            self.crio_dir = artifacts.crio_dir()
            self.crio_storage.mkdir()
        else:
            self.containerd_bin = artifacts.containerd_bin(self.containerd_version)
        for d in (self.logs, self.state, w / "containerd-root", w / "kubelet", w / "sysctl"):
            d.mkdir(parents=True, exist_ok=True)
        make_pki(self.pki, NODE_NAME, NODE_IP, SERVICE_IP)
        server = f"https://127.0.0.1:{API_PORT}"
        kubeconfig(self.kubeconfig, self.pki, "admin", server)
        for client in ("controller-manager", "scheduler", "node"):
            kubeconfig(w / f"{client}.kubeconfig", self.pki, client, server)
        mounts, dev_nodes = self._mounts()
        sysctl_files = {}
        for entry, value in SYSCTLS.items():
            src = w / "sysctl" / entry.replace("/", ".")
            src.write_text(value + "\n")
            sysctl_files[f"/proc/sys/{entry}"] = str(src)
        # what the engine and the CNI find in /etc once the overlay is on
        etc = w / "upper/etc"
        if self.engine == "crio":
            self._prepare_crio(etc, sysctl_files)
        else:
            (etc / "containerd").mkdir(parents=True, exist_ok=True)
            (etc / "containerd/config.toml").write_text(
                _containerd_config(
                    self.containerd_version, self.containerd_bin, artifacts.PAUSE, self.cdi
                )
            )
        netd = etc / "cni/net.d"
        netd.mkdir(parents=True, exist_ok=True)
        os.setxattr(netd, "trusted.overlay.opaque", b"y")  # the host's CNI confs stay out
        (netd / "10-nvshim-pods.conflist").write_text(_cni_conflist())
        (w / "kubelet-config.json").write_text(
            _kubelet_config(self.pki, self.cgroup_root, self.socket)
        )
        _make_cgroup_root(self.cgroup_root)
        env = {"PATH": self._path_var(), "HOME": "/root", "LC_ALL": "C.UTF-8"}
        spec = {
            "mounts": mounts,
            "dev_nodes": dev_nodes,
            "sysctl_files": sysctl_files,
            "node_ip": NODE_IP,
            "node_name": NODE_NAME,
            "iptables": [
                f"-t nat -A {chain} -d {SERVICE_IP}/32 -p tcp --dport 443 -j DNAT "
                f"--to-destination {NODE_IP}:{API_PORT}".split()
                for chain in ("PREROUTING", "OUTPUT")
            ],
            "state_dir": str(self.state),
            "pid_dir": "/run/nsinit",
            "logs_dir": str(self.logs),
            "api_url": f"https://127.0.0.1:{API_PORT}",
            "ca": str(self.pki / "ca.crt"),
            "admin_cert": str(self.pki / "admin.crt"),
            "admin_key": str(self.pki / "admin.key"),
            "components": self._components(env),
        }
        (w / "spec.json").write_text(json.dumps(spec, indent=1))

    def _path_var(self) -> str:
        engine_bin = f"{self.crio_dir}/bin" if self.engine == "crio" else self.containerd_bin
        return f"{engine_bin}:{self.k8s_bin}:{BASE_PATH}"

    def _overlays(self) -> tuple[str, ...]:
        return OVERLAYS + (CRIO_OVERLAYS if self.engine == "crio" else ())

    def _prepare_crio(self, etc: Path, proc_files: dict[str, str]) -> None:
        """CRI-O's config, signature policy, the systemctl stand-in, and ``/proc/cgroups``
        with hugetlb off (the README's pitfall 2)."""
        crio = etc / "crio"
        (crio / "crio.conf.d").mkdir(parents=True)
        runc = self.workdir / "runc-clamp"
        runc.write_text(RUNC_CLAMP)
        runc.chmod(0o755)
        (crio / "crio.conf").write_text(
            _crio_config(self.crio_dir, str(runc), str(self.crio_storage), artifacts.PAUSE)
        )
        policy = {"default": [{"type": "insecureAcceptAnything"}]}
        (crio / "policy.json").write_text(json.dumps(policy) + "\n")
        usr_bin = self.workdir / "upper/usr-bin"
        usr_bin.mkdir(parents=True, exist_ok=True)
        (usr_bin / "systemctl").write_text(SYSTEMCTL)
        (usr_bin / "systemctl").chmod(0o755)
        lines = []
        with open("/proc/cgroups", encoding="utf-8") as fh:
            for line in fh:
                fields = line.split("\t")
                if fields[0] == "hugetlb" and len(fields) == 4:
                    fields[3] = "0\n"
                lines.append("\t".join(fields))
        cgroups = self.workdir / "sysctl" / "cgroups"
        cgroups.write_text("".join(lines))
        proc_files["/proc/cgroups"] = str(cgroups)

    def _mounts(self) -> tuple[list[dict], list[list]]:
        """The mounts nsinit makes, in order, and the device nodes it makes in /dev."""
        w = self.workdir
        mounts: list[dict] = [{"kind": "tmpfs", "target": "/run"},
                              {"kind": "tmpfs", "target": "/var/tmp"}]  # fmt: skip
        for target in self._overlays():
            if not os.path.isdir(target):
                continue
            name = target.strip("/").replace("/", "-")
            upper, work = w / "upper" / name, w / "ovl-work" / name
            upper.mkdir(parents=True, exist_ok=True)
            work.mkdir(parents=True, exist_ok=True)
            mounts.append({"kind": "overlay", "target": target, "upper": str(upper),
                           "work": str(work)})  # fmt: skip
        # /dev: an overlay too (device nodes of the simulated GPUs), with its own pts/shm
        (w / "upper/dev").mkdir(parents=True, exist_ok=True)
        (w / "ovl-work/dev").mkdir(parents=True, exist_ok=True)
        mounts += [
            {"kind": "overlay", "target": "/dev", "upper": str(w / "upper/dev"),
             "work": str(w / "ovl-work/dev")},
            {"kind": "devpts", "target": "/dev/pts", "mkdir": True},
            {"kind": "tmpfs", "target": "/dev/shm", "mkdir": True, "options": "mode=1777"},
            {"kind": "mqueue", "target": "/dev/mqueue", "mkdir": True},
            {"kind": "bind", "target": "/var/lib/containerd", "mkdir": True,
             "source": str(w / "containerd-root")},
            {"kind": "bind", "target": "/var/lib/kubelet", "mkdir": True,
             "source": str(w / "kubelet")},
        ]  # fmt: skip
        # the node's containerd is the chosen one at the usual place (/usr/bin), so an
        # installer that runs `containerd --version` or `config dump` meets that version
        if self.containerd_bin not in ("", "/usr/bin"):
            for name in sorted(os.listdir(self.containerd_bin)):
                if os.path.isfile(f"/usr/bin/{name}"):
                    mounts.append({"kind": "bind", "target": f"/usr/bin/{name}",
                                   "source": f"{self.containerd_bin}/{name}"})  # fmt: skip
        dev_nodes = []
        if self.sim_name:
            from tests.sim.simhost import build_host

            self.sim = build_host(self.sim_name, str(w / "sim"))
            mounts.append({"kind": "bind", "target": DRIVER_ROOT, "mkdir": True,
                           "source": self.sim.driver_root, "recursive": True})  # fmt: skip
            dev_nodes = [[n.path, n.major, n.minor, n.mode] for n in self.sim.expected_nodes()]
        return mounts, dev_nodes

    def _components(self, env: dict[str, str]) -> list[dict]:
        p, w = self.pki, self.workdir
        kb = self.k8s_bin

        def comp(name: str, argv: list[str], **kw) -> dict:
            return {"name": name, "argv": argv, "env": env, **kw}

        etcd_url = "http://127.0.0.1:2379"
        return [
            comp("etcd", [shutil.which("etcd") or "/usr/bin/etcd", "--name", "nvshim",
                          "--data-dir", "/run/etcd-data", "--listen-client-urls", etcd_url,
                          "--advertise-client-urls", etcd_url,
                          "--listen-peer-urls", "http://127.0.0.1:2380",
                          "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
                          "--initial-cluster", "nvshim=http://127.0.0.1:2380",
                          "--logger", "zap", "--log-level", "warn"]),
            comp("kube-apiserver", [
                f"{kb}/kube-apiserver", f"--etcd-servers={etcd_url}",
                f"--advertise-address={NODE_IP}", "--bind-address=0.0.0.0",
                f"--secure-port={API_PORT}", f"--tls-cert-file={p}/apiserver.crt",
                f"--tls-private-key-file={p}/apiserver.key", f"--client-ca-file={p}/ca.crt",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={p}/sa.pub",
                f"--service-account-signing-key-file={p}/sa.key",
                f"--service-cluster-ip-range={SERVICE_RANGE}",
                "--authorization-mode=Node,RBAC", "--allow-privileged=true",
                f"--kubelet-client-certificate={p}/apiserver-kubelet-client.crt",
                f"--kubelet-client-key={p}/apiserver-kubelet-client.key",
                "--kubelet-preferred-address-types=InternalIP", "--profiling=false",
                "--enable-priority-and-fairness=false"]),
            comp("crio", [f"{self.crio_dir}/bin/crio"], restart_delay=0.1)
            if self.engine == "crio"
            else comp("containerd", ["/usr/bin/containerd", "--config", CONTAINERD_CONFIG],
                      restart_delay=0.1),
            comp("kubelet", [
                f"{kb}/kubelet", f"--config={w}/kubelet-config.json",
                f"--kubeconfig={w}/node.kubeconfig", f"--node-ip={NODE_IP}",
                f"--hostname-override={NODE_NAME}", "--root-dir=/var/lib/kubelet",
                "--cert-dir=/var/lib/kubelet/pki"]),
            comp("kube-controller-manager", [
                f"{kb}/kube-controller-manager", f"--kubeconfig={w}/controller-manager.kubeconfig",
                "--leader-elect=false", "--use-service-account-credentials",
                f"--service-account-private-key-file={p}/sa.key", f"--root-ca-file={p}/ca.crt",
                f"--cluster-signing-cert-file={p}/ca.crt", f"--cluster-signing-key-file={p}/ca.key",
                "--bind-address=127.0.0.1", "--profiling=false",
                "--node-monitor-period=1s"], after_api=True),
            comp("kube-scheduler", [
                f"{kb}/kube-scheduler", f"--kubeconfig={w}/scheduler.kubeconfig",
                "--leader-elect=false", "--bind-address=127.0.0.1", "--profiling=false"],
                after_api=True),
        ]  # fmt: skip

    def _launch(self) -> None:
        # setpriv: unshare dies with this process; --kill-child: PID 1 dies with unshare
        # (and with it every process in the namespaces), so a killed test run leaves none
        argv = ["setpriv", "--pdeathsig", "KILL", "unshare", "--kill-child", "--mount", "--net"]
        argv += ["--pid", "--fork", "--mount-proc"]
        argv += ["--propagation", "private", "--", sys.executable, "-I", NSINIT]
        argv += [str(self.workdir / "spec.json")]
        with open(self.logs / "nsinit.log", "ab") as out:
            self._proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                children = Path(f"/proc/{self._proc.pid}/task/{self._proc.pid}/children")
                kids = children.read_text().split()
            except OSError:
                kids = []
            if kids:
                self.pid = int(kids[0])
                self.pidns = os.readlink(f"/proc/{self.pid}/ns/pid")
                self.mntns = os.readlink(f"/proc/{self.pid}/ns/mnt")
                return
            if self._proc.poll() is not None:
                break
            time.sleep(0.01)
        raise ClusterError(f"the namespaces did not start:\n{self.log('nsinit')}")

    def _check_alive(self) -> None:
        if self._proc is None or self._proc.poll() is not None:
            raise ClusterError(f"the cluster's PID 1 exited:\n{self.log('nsinit')}")
        exits = self.state / "exits"
        if exits.exists():  # restarted each time; one that keeps failing is broken
            names = [line.split()[0] for line in exits.read_text().splitlines() if line]
            for name in set(names):
                if names.count(name) >= MAX_EXITS and name not in ("containerd", "crio"):
                    raise ClusterError(f"{name} exited {MAX_EXITS} times:\n{self.log(name)}")

    def _wait_socket(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not os.path.exists(self.path(self.socket)):
            self._check_alive()
            if time.monotonic() > deadline:
                name = "crio" if self.engine == "crio" else "containerd"
                raise ClusterError(f"{name} did not start:\n{self.log(name)}")
            time.sleep(0.05)

    def _wait_ready(self, deadline: float) -> None:
        while not (self.state / "ready").exists():
            self._check_alive()
            if time.monotonic() > deadline:
                exits = self.state / "exits"
                exited = exits.read_text().split()[::2] if exits.exists() else []
                names = dict.fromkeys(["nsinit", "kubelet", *exited])
                logs = "\n".join(f"== {n}\n{self.log(n)}" for n in names)
                raise ClusterError(f"the node did not become Ready:\n{logs}")
            time.sleep(0.1)

    def stop(self, keep_workdir: bool | None = None) -> list[str]:
        """Stop everything and clean up; returns what was left behind (empty: nothing).
        ``keep_workdir`` (default: ``$NVSHIM_K8S_KEEP`` set) keeps the work dir (logs)."""
        if keep_workdir is None:
            keep_workdir = bool(os.environ.get("NVSHIM_K8S_KEEP"))
        if self._proc is not None:
            if self._proc.poll() is None and self.pid:
                try:
                    os.kill(self.pid, signal.SIGTERM)
                    self._proc.wait(timeout=15)
                except (OSError, subprocess.TimeoutExpired):
                    pass
            if self._proc.poll() is None:
                try:
                    os.kill(self.pid, signal.SIGKILL)
                except OSError:
                    pass
                try:
                    self._proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait()
        left = self.leftovers(wait=30.0)
        left += _remove_cgroup_root(self.cgroup_root, timeout=30.0)
        if keep_workdir:
            (self.workdir / "kept").touch()
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None
        self._proc = None
        return left

    def leftovers(self, wait: float = 0.0) -> list[str]:
        """Processes still in the cluster's PID or mount namespace (waits up to ``wait``
        seconds for the kernel to finish killing them)."""
        if not self.pidns:
            return []
        deadline = time.monotonic() + wait
        while True:
            found = []
            for entry in os.listdir("/proc"):
                if not entry.isdigit():
                    continue
                try:
                    ns = (os.readlink(f"/proc/{entry}/ns/pid"),
                          os.readlink(f"/proc/{entry}/ns/mnt"))  # fmt: skip
                except OSError:
                    continue
                if self.pidns in ns or self.mntns in ns:
                    found.append(f"process {entry}")
            if not found or time.monotonic() > deadline:
                return found
            time.sleep(0.1)

    # -- using it ---------------------------------------------------------------------
    def pids(self, match: Callable[[list[bytes]], bool]) -> list[int]:
        """Host pids of the processes in the cluster's PID namespace whose argv (a list of
        bytes) ``match`` accepts."""
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                if os.readlink(f"/proc/{entry}/ns/pid") != self.pidns:
                    continue
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    argv = fh.read().split(b"\0")
            except OSError:
                continue
            if match(argv):
                found.append(int(entry))
        return found

    def path(self, inside: str) -> str:
        """The host path through which a path inside the namespaces is reached (reads and
        writes go to the cluster's view: its overlays, its /run). Symbolic links on the way
        are resolved inside the cluster's root (``/var/run`` -> ``/run`` is absolute)."""
        from nvshim.host.rootpath import host_path, resolve_in_root

        root = f"/proc/{self.pid}/root"
        parent, name = os.path.split(inside.rstrip("/") or "/")
        return host_path(root, os.path.join(resolve_in_root(root, parent), name))

    def scratch(self, inside: str) -> Path:
        """Where the overlays keep a file written inside under ``inside`` (for /etc, /opt,
        /usr/local, /var/lib, /var/log, /var/cache, /dev; CRI-O: /usr/bin,
        /usr/share/containers); host paths otherwise untouched."""
        for target in (*self._overlays(), "/dev"):
            if inside == target or inside.startswith(target + "/"):
                name = target.strip("/").replace("/", "-")
                return self.workdir / "upper" / name / os.path.relpath(inside, target)
        raise ValueError(f"{inside} is not under an overlay")

    def env(self) -> dict[str, str]:
        """Environment for commands run inside (``nsenter``): KUBECONFIG, PATH."""
        return {
            "KUBECONFIG": str(self.kubeconfig),
            "PATH": self._path_var(),
            "HOME": "/root",
            "LC_ALL": "C.UTF-8",
            "CONTAINERD_ADDRESS": CONTAINERD_SOCKET,
            "CONTAINERD_NAMESPACE": "k8s.io",
            "CONTAINER_RUNTIME_ENDPOINT": f"unix://{self.socket}",
        }

    def nsenter(self, argv: list[str], net_only: bool = False, **kw) -> subprocess.CompletedProcess:
        """Run ``argv`` inside the cluster's namespaces (all three; ``net_only``: only its
        network namespace, host mounts); output captured as text unless given."""
        ns = ["--net"] if net_only else ["--mount", "--net", "--pid"]
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        kw.setdefault("timeout", 120)
        env = {**self.env(), **kw.pop("env", {})}
        return subprocess.run(["nsenter", f"--target={self.pid}", *ns, "--", *argv], env=env, **kw)

    def popen(self, argv: list[str], net_only: bool = False, **kw) -> subprocess.Popen:
        """Start ``argv`` inside the cluster's namespaces (as ``nsenter`` does) without
        waiting: e.g. a node-side daemon such as a kubelet plugin. It dies with the
        cluster at the latest (it is in the PID namespace unless ``net_only``)."""
        ns = ["--net"] if net_only else ["--mount", "--net", "--pid"]
        env = {**self.env(), **kw.pop("env", {})}
        return subprocess.Popen(
            ["nsenter", f"--target={self.pid}", *ns, "--", *argv], env=env, **kw
        )

    def http_get(self, url: str, timeout: float = 10.0) -> str:
        """GET ``url`` from the node's network namespace (a pod IP, the node address)
        with this machine's Python; the body as text. Raises ClusterError on failure."""
        code = (
            "import sys, urllib.request\n"
            "with urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2])) as r:\n"
            "    sys.stdout.write(r.read().decode())\n"
        )
        proc = self.nsenter(["/usr/bin/python3", "-I", "-S", "-c", code, url, str(timeout)],
                            net_only=True, timeout=timeout + 10)  # fmt: skip
        if proc.returncode != 0:
            lines = proc.stderr.strip().splitlines() or ["no output"]
            raise ClusterError(f"GET {url} failed: {lines[-1]}")
        return proc.stdout

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess:
        """``kubectl`` as cluster admin; raises on failure unless ``check=False``."""
        proc = self.nsenter(
            [f"{self.k8s_bin}/kubectl", f"--kubeconfig={self.kubeconfig}", *args],
            net_only=True, input=input, timeout=timeout,
        )  # fmt: skip
        if check and proc.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)} failed ({proc.returncode}): "
                               f"{proc.stderr.strip() or proc.stdout.strip()}")  # fmt: skip
        return proc

    def apply(self, manifest: str | dict | list) -> str:
        """``kubectl apply -f -`` of YAML text, or of an object (or list of them)."""
        if not isinstance(manifest, str):
            import yaml

            docs = manifest if isinstance(manifest, list) else [manifest]
            manifest = yaml.safe_dump_all(docs)
        return self.kubectl("apply", "-f", "-", input=manifest).stdout

    def get(self, *args: str) -> dict:
        """``kubectl get ARGS -o json``, parsed."""
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def wait(self, *args: str, timeout: float = 60) -> None:
        """``kubectl wait ARGS --timeout``, e.g. ``wait("pod/x", "--for=condition=Ready")``."""
        self.kubectl("wait", *args, f"--timeout={int(timeout)}s", timeout=timeout + 30)

    def wait_pod_done(self, name: str, namespace: str = "default", timeout: float = 60) -> str:
        """Wait until pod ``name`` has ended (phase Succeeded or Failed); its phase."""
        deadline = time.monotonic() + timeout
        while True:
            proc = self.kubectl("get", "pod", name, "-n", namespace, "-o",
                                "jsonpath={.status.phase}", check=False)  # fmt: skip
            if proc.stdout in ("Succeeded", "Failed"):
                return proc.stdout
            if time.monotonic() > deadline:
                described = self.kubectl("describe", "pod", name, "-n", namespace, check=False)
                raise ClusterError(f"pod {namespace}/{name} did not end:\n{described.stdout}")
            time.sleep(0.3)

    def wait_service_account(self, namespace: str, timeout: float = 30.0) -> None:
        """Wait for the ``default`` service account of ``namespace`` (pods need it)."""
        deadline = time.monotonic() + timeout
        while True:
            args = ("get", "serviceaccount", "default", "-n", namespace, "-o", "name")
            if self.kubectl(*args, check=False).returncode == 0:
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"no default service account in {namespace}")
            time.sleep(0.2)

    def ctr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """``ctr -n k8s.io ARGS`` against the cluster's containerd (from outside)."""
        return subprocess.run(
            [f"{self.containerd_bin}/ctr", "--address", self.path(CONTAINERD_SOCKET),
             "-n", "k8s.io", *args],
            capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip

    def podman(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """``podman ARGS`` on CRI-O's image store (inside the cluster's mounts: the store's
        run root is the cluster's /run)."""
        return self.nsenter(
            ["podman", "--root", str(self.crio_storage), "--runroot", CRIO_RUNROOT,
             "--storage-driver", "overlay", "--cgroup-manager", "cgroupfs",
             "--events-backend", "none", *args],
            timeout=timeout,
        )  # fmt: skip

    def tag_image(self, image: str, tag: str) -> None:
        """Give ``image`` the extra name ``tag`` in the engine's image store."""
        if self.engine == "crio":
            proc = self.podman("tag", image, tag)
        else:
            proc = self.ctr("images", "tag", "--force", image, tag)
        if proc.returncode != 0:
            raise ClusterError(f"tag {image} {tag} failed: {proc.stderr.strip()}")

    def import_image(self, archive: str | os.PathLike) -> None:
        """Import a docker or OCI archive into the engine's images: containerd's ``k8s.io``
        namespace, or CRI-O's store through podman (its names usable by pods with
        ``imagePullPolicy: IfNotPresent`` / a non-latest tag). An archive this cluster has
        imported already (same path, size and mtime) is not imported again: the images
        stay (the kubelet's image GC never starts here, nothing removes them)."""
        stat = os.stat(archive)
        key = (os.path.realpath(archive), stat.st_size, stat.st_mtime_ns)
        if key in self._imported:
            return
        deadline = time.monotonic() + 30
        while True:
            if self.engine == "crio":
                proc = self.podman("load", "-q", "-i", os.fspath(archive))
            else:
                proc = self.ctr("images", "import", os.fspath(archive))
            if proc.returncode == 0:
                self._imported.add(key)
                return
            # containerd may be restarting (an installer signalled it): retry a while
            if time.monotonic() > deadline:
                raise ClusterError(f"import {archive} failed: {proc.stderr.strip()}")
            time.sleep(0.3)

    def import_node_image(self, tag: str = "localhost/nvshim-node:test") -> str:
        """Build (cached) and import the nvshim node installer image (tests/node_image.py)
        as ``tag``; returns ``tag``."""
        from tests.k8s.images import node_image_archive

        self.import_image(node_image_archive(tag))
        return tag

    def engine_pid(self) -> int:
        """Host PID of the engine serving the socket now (changes on a restart)."""
        from tests.engines.containerd_instance import peer_pid

        return peer_pid(self.path(self.socket))

    def restart_engine(self, timeout: float = 30.0) -> int:
        """SIGTERM the engine, wait for the one the supervisor starts again; its PID."""
        old = self.engine_pid()
        os.kill(old, signal.SIGTERM)
        return self.wait_engine(old, timeout)

    containerd_pid = engine_pid
    restart_containerd = restart_engine

    def wait_containerd(self, not_pid: int | None = None, timeout: float = 30.0) -> int:
        return self.wait_engine(not_pid, timeout)

    def wait_engine(self, not_pid: int | None = None, timeout: float = 30.0) -> int:
        """Wait until an engine (other than ``not_pid``) serves the socket and its CRI
        service reports the runtime and network ready; its PID."""
        import grpc
        from cri_api.v1 import api_pb2, api_pb2_grpc

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                pid = self.engine_pid()
            except OSError:
                pid = None
            if pid is not None and pid != not_pid:
                with grpc.insecure_channel(f"unix://{self.path(self.socket)}") as ch:
                    try:
                        reply = api_pb2_grpc.RuntimeServiceStub(ch).Status(
                            api_pb2.StatusRequest(), timeout=2
                        )
                        if all(c.status for c in reply.status.conditions):
                            return pid
                    except grpc.RpcError:
                        pass
            time.sleep(0.05)
        name = "crio" if self.engine == "crio" else "containerd"
        raise ClusterError(f"{name} did not come back:\n{self.log(name)}")

    def remove_ended_sandboxes(self, namespace: str) -> int:
        """Remove the ended (not ready) pod sandboxes of ``namespace``, and so their
        containers, through the engine's CRI: what the kubelet's container GC does for
        deleted pods, once a minute. How many were removed."""
        import grpc

        from tests.cri_util import CriClient

        cri = CriClient(self.path(self.socket))
        api = cri.api
        try:
            ended = api.PodSandboxFilter(
                state=api.PodSandboxStateValue(state=api.SANDBOX_NOTREADY),
                label_selector={"io.kubernetes.pod.namespace": namespace},
            )
            found = cri.runtime.ListPodSandbox(api.ListPodSandboxRequest(filter=ended), timeout=30)
            for sandbox in found.items:
                request = api.RemovePodSandboxRequest(pod_sandbox_id=sandbox.id)
                for attempt in range(10):
                    try:
                        cri.runtime.RemovePodSandbox(request, timeout=60)
                        break
                    except grpc.RpcError:
                        # the kubelet's own GC may be removing one of its containers at the
                        # same moment (one caller at a time on a real node): try again
                        if attempt == 9:
                            raise
                        time.sleep(0.5)
        finally:
            cri.close()
        return len(found.items)

    def log(self, name: str, tail: int = 4000) -> str:
        """The last ``tail`` characters of a component's log (nsinit, etcd, kube-apiserver,
        containerd or crio, kubelet, kube-controller-manager, kube-scheduler)."""
        try:
            return (self.logs / f"{name}.log").read_text(errors="replace")[-tail:]
        except OSError:
            return ""


def main(argv: list[str] | None = None) -> int:
    """``python3 -m tests.k8s.cluster [--containerd 1.6|1.7] [--sim NAME|none] [--shell |
    -- CMD...]``: start a cluster, then run a shell (or CMD) inside it with KUBECONFIG set;
    the cluster stops when it exits. Without --shell or CMD it waits for Ctrl-C."""
    parser = argparse.ArgumentParser(prog="python3 -m tests.k8s.cluster")
    parser.add_argument("--containerd", choices=artifacts.CONTAINERD_VERSIONS, default="1.6")
    parser.add_argument("--engine", choices=("containerd", "crio"), default="containerd")
    parser.add_argument("--sim", default="h100x8-mig", help="simulated host, or none")
    parser.add_argument("--no-cdi", action="store_true", help="containerd 1.7: enable_cdi off")
    parser.add_argument("--shell", action="store_true", help="run $SHELL inside")
    parser.add_argument("--keep", action="store_true", help="keep the work dir at the end")
    parser.add_argument("command", nargs="*", help="a command to run inside instead")
    args = parser.parse_args(argv)
    sim = None if args.sim == "none" else args.sim
    cluster = Cluster(containerd=args.containerd, sim=sim, cdi=not args.no_cdi,
                      engine=args.engine)  # fmt: skip
    try:
        cluster.start()
    except ClusterError as err:
        print(f"cluster: {err}", file=sys.stderr)
        return 1
    print(f"cluster: up in {cluster.start_seconds:.1f}s; work dir {cluster.workdir}; "
          f"PID 1 {cluster.pid}; enter with nsenter -t {cluster.pid} -m -n -p",
          file=sys.stderr)  # fmt: skip
    rc = 0
    try:
        if args.shell or args.command:
            cmd = args.command or [os.environ.get("SHELL", "/bin/bash")]
            rc = cluster.nsenter(cmd, capture_output=False, text=False, timeout=None).returncode
        else:
            signal.signal(signal.SIGTERM, signal.default_int_handler)
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        left = cluster.stop(keep_workdir=args.keep)
        if left:
            print(f"cluster: left behind: {', '.join(left)}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
