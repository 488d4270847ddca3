"""The one-node cluster harness (tests/k8s/cluster.py) on containerd 1.6 and 1.7: the node
is Ready on the chosen containerd; pods run, log and exec; pods get addresses on the bridge
and reach each other and the API server's service address; a DaemonSet's hostPath writes
land in the cluster's scratch space and not on the host; the simulated GPU host is the
driver root with real char nodes in the cluster's /dev only; containerd comes back after
the SIGHUP an installer sends; a stopped cluster leaves no process, mount or cgroup."""

from __future__ import annotations

import ipaddress
import os
import signal
import stat
import time

import pytest

from tests.k8s import artifacts
from tests.k8s.cluster import (
    CONTAINERD_CONFIG,
    DRIVER_ROOT,
    NODE_IP,
    NODE_NAME,
    POD_SUBNET,
    Cluster,
)

BUSYBOX = artifacts.BUSYBOX


def pod(name: str, command: str, **spec) -> dict:
    """A busybox pod running ``sh -c command`` (never restarted)."""
    container = {"name": "main", "image": BUSYBOX, "command": ["sh", "-c", command]}
    container.update(spec.pop("container", {}))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                 "containers": [container], **spec},
    }  # fmt: skip


def apply_in(k8s: Cluster, ns: str, *objs: dict) -> None:
    for obj in objs:
        obj["metadata"]["namespace"] = ns
    k8s.apply(list(objs))


def test_node_ready_on_chosen_containerd(k8s):
    node = k8s.get("node", NODE_NAME)
    conditions = {c["type"]: c["status"] for c in node["status"]["conditions"]}
    assert conditions["Ready"] == "True"
    info = node["status"]["nodeInfo"]
    assert info["containerRuntimeVersion"].startswith(f"containerd://{k8s.containerd_version}.")
    assert info["kubeletVersion"] == "v1.36.2"
    addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
    assert addresses["InternalIP"] == NODE_IP
    assert not node["spec"].get("taints")
    # the engine config is a real, editable file where an installer expects it
    config = k8s.path(CONTAINERD_CONFIG)
    assert stat.S_ISREG(os.lstat(config).st_mode)
    text = open(config).read()
    assert f'sandbox_image = "{artifacts.PAUSE}"' in text
    assert ("enable_cdi = true" in text) == (k8s.containerd_version != "1.6")
    # the node's own binaries are that version, where an installer looks for them
    for binary in ("containerd", "ctr"):
        out = k8s.nsenter([f"/usr/bin/{binary}", "--version"]).stdout
        assert f" {k8s.containerd_version}." in out, out


def test_pod_runs_logs_and_exec(k8s, k8s_ns):
    apply_in(k8s, k8s_ns, pod("hello", "echo hello from $(hostname); exec sleep 3600"))
    k8s.wait("-n", k8s_ns, "pod/hello", "--for=condition=Ready")
    assert k8s.kubectl("logs", "-n", k8s_ns, "hello").stdout == "hello from hello\n"
    out = k8s.kubectl("exec", "-n", k8s_ns, "hello", "--", "sh", "-c", "echo $((6*7)) $0")
    assert out.stdout == "42 sh\n"
    failed = k8s.kubectl("exec", "-n", k8s_ns, "hello", "--", "sh", "-c", "exit 3", check=False)
    assert failed.returncode == 3


def test_pods_reach_each_other_and_the_api(k8s, k8s_ns):
    server = pod("server", "mkdir /www && echo served-$(hostname) > /www/x && "
                 "exec httpd -f -p 8080 -h /www")  # fmt: skip
    server["spec"]["containers"][0]["readinessProbe"] = {
        "tcpSocket": {"port": 8080},
        "periodSeconds": 1,
    }
    apply_in(k8s, k8s_ns, server)
    k8s.wait("-n", k8s_ns, "pod/server", "--for=condition=Ready")
    server_ip = k8s.get("-n", k8s_ns, "pod/server")["status"]["podIP"]
    assert ipaddress.ip_address(server_ip) in ipaddress.ip_network(POD_SUBNET)
    # the node (a test scraping an exporter) reaches it at its pod IP
    assert k8s.http_get(f"http://{server_ip}:8080/x") == "served-server\n"
    # an in-cluster client (kubectl with the pod's service account, no kubeconfig) reaches
    # the API server through the kubernetes service address
    fetch = f"wget -qO- http://{server_ip}:8080/x && /k8s/kubectl get --raw /version"
    client = pod("client", fetch, volumes=[{"name": "k", "hostPath": {"path": k8s.k8s_bin}}],
                 container={"volumeMounts": [{"name": "k", "mountPath": "/k8s"}]})  # fmt: skip
    apply_in(k8s, k8s_ns, client)
    phase = k8s.wait_pod_done("client", k8s_ns)
    out = k8s.kubectl("logs", "-n", k8s_ns, "client").stdout
    assert phase == "Succeeded", out
    assert k8s.get("-n", k8s_ns, "pod/client")["status"]["podIP"] != server_ip
    assert out.startswith("served-server\n")
    assert '"gitVersion": "v1.36.2"' in out


def test_hostpath_writes_land_in_scratch(k8s, k8s_ns):
    targets = {
        "etc": f"/etc/nvshim-k8s-probe-{k8s_ns}",
        "usr-local": f"/usr/local/nvshim-k8s-probe-{k8s_ns}",
        "opt": f"/opt/nvshim-k8s-probe-{k8s_ns}",
        "var-run-cdi": "/var/run/cdi",
    }
    before = {path: os.path.lexists(path) for path in targets.values()}
    assert not any(before[p] for p in targets.values() if "probe" in p)
    volumes = [
        {"name": name, "hostPath": {"path": path, "type": "DirectoryOrCreate"}}
        for name, path in targets.items()
    ]
    mounts = [{"name": name, "mountPath": f"/host/{name}"} for name in targets]
    writes = " && ".join(f"echo {k8s_ns} > /host/{name}/probe" for name in targets)
    # the installer's shape: the node's root at /root-fs, Bidirectional; a file through
    # it and a mount made under it (as MPS does) stay in the cluster
    root_file = f"/usr/local/nvshim-k8s-root-{k8s_ns}"
    root_mount = f"/run/nvshim-k8s-mnt-{k8s_ns}"
    volumes.append({"name": "root", "hostPath": {"path": "/", "type": "Directory"}})
    mounts.append({"name": "root", "mountPath": "/root-fs", "mountPropagation": "Bidirectional"})
    writes += (
        f" && echo {k8s_ns} > /root-fs{root_file}"
        f" && mkdir /root-fs{root_mount} && mount -t tmpfs nvshim-probe /root-fs{root_mount}"
    )
    ds = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "writer"},
        "spec": {
            "selector": {"matchLabels": {"app": "writer"}},
            "template": {
                "metadata": {"labels": {"app": "writer"}},
                "spec": {
                    "terminationGracePeriodSeconds": 0,
                    "volumes": volumes,
                    "containers": [
                        {
                            "name": "w",
                            "image": BUSYBOX,
                            "volumeMounts": mounts,
                            "securityContext": {"privileged": True},
                            "command": ["sh", "-c", f"{writes} && touch /ok && exec sleep 3600"],
                            "readinessProbe": {
                                "exec": {"command": ["cat", "/ok"]},
                                "periodSeconds": 1,
                            },
                        }
                    ],  # fmt: skip
                },
            },
        },
    }
    apply_in(k8s, k8s_ns, ds)
    k8s.kubectl("rollout", "status", "-n", k8s_ns, "ds/writer", "--timeout=60s")
    for path in targets.values():
        inside = os.path.join(path, "probe")
        assert open(k8s.path(inside)).read() == f"{k8s_ns}\n", inside
        assert not os.path.lexists(inside), f"{inside} written on the host"
    assert os.path.isfile(k8s.scratch(targets["etc"] + "/probe"))
    assert os.path.isfile(k8s.scratch(targets["usr-local"] + "/probe"))
    # /var/run is the host's symlink to /run: the cluster's own tmpfs
    assert os.path.isfile(k8s.path("/run/cdi/probe"))
    assert {path: os.path.lexists(path) for path in targets.values()} == before
    assert open(k8s.path(root_file)).read() == f"{k8s_ns}\n"
    assert not os.path.lexists(root_file) and not os.path.lexists(root_mount)
    with open(f"/proc/{k8s.pid}/mountinfo") as fh:
        assert f" {root_mount} " in fh.read(), "the mount did not reach the node"
    with open("/proc/self/mountinfo") as fh:
        assert root_mount not in fh.read(), "the mount reached the host"


def test_simulated_gpu_host(k8s, k8s_ns):
    sim = k8s.sim
    gpu0 = sim.gpu(0)
    node = k8s.path("/dev/nvidia0")
    st = os.stat(node)
    assert stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) == 195
    assert os.minor(st.st_rdev) == gpu0["minor"]
    assert not os.path.exists("/dev/nvidia0"), "a device node appeared in the host's /dev"
    lib = f"{DRIVER_ROOT}{sim.lib_dir}/libnvidia-ml.so.{sim.driver_version}"
    check = f"ls -l /dev/nvidia0 /dev/nvidiactl && test -f /driver{lib[len(DRIVER_ROOT) :]}"
    spec = pod("gpu-host", check, volumes=[{"name": "d", "hostPath": {"path": DRIVER_ROOT}}],
               container={"volumeMounts": [{"name": "d", "mountPath": "/driver"}],
                          "securityContext": {"privileged": True}})  # fmt: skip
    apply_in(k8s, k8s_ns, spec)
    phase = k8s.wait_pod_done("gpu-host", k8s_ns)
    out = k8s.kubectl("logs", "-n", k8s_ns, "gpu-host").stdout
    assert phase == "Succeeded", out
    assert "195," in out and "nvidiactl" in out
    assert os.path.isfile(k8s.path(lib))


def test_containerd_restarts_after_sighup(k8s, k8s_ns):
    apply_in(k8s, k8s_ns, pod("survivor", "exec sleep 3600"))
    k8s.wait("-n", k8s_ns, "pod/survivor", "--for=condition=Ready")
    old = k8s.containerd_pid()
    os.kill(old, signal.SIGHUP)  # what an installer's "signal" restart mode does
    new = k8s.wait_containerd(not_pid=old)
    assert new != old
    # the kubelet redials the runtime after its gRPC backoff (about a second)
    deadline = time.monotonic() + 20
    while True:
        proc = k8s.kubectl("exec", "-n", k8s_ns, "survivor", "--", "echo", "still-here",
                           check=False)  # fmt: skip
        if proc.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert proc.stdout == "still-here\n", proc.stderr
    assert "containerd restarted" in k8s.log("nsinit")
    # a plain stop (SIGTERM), as `systemctl restart` would do it
    assert k8s.restart_containerd() not in (old, new)


def _host_view(paths: list[str]) -> dict[str, object]:
    return {p: sorted(os.listdir(p)) if os.path.isdir(p) else None for p in paths}


@pytest.mark.parametrize("engine", ["1.7", "crio"])
def test_teardown_leaves_nothing(engine):
    """A cluster of its own (containerd 1.7 or CRI-O, without a sim host; 1.6 is torn down
    by the session) with a running pod on the pod network and a hostPath write, then
    stopped."""
    # where the kubelet, containerd and the CNI plugins write by default (not /run or
    # /var/lib as a whole: other processes on the machine change those meanwhile)
    watched = ["/etc/containerd", "/etc/cni/net.d", "/var/lib/cni", "/var/lib/kubelet",
               "/var/log/pods", "/var/log/containers", "/opt/cni", "/opt/containerd",
               "/run/nvidia", "/usr/local/bin", "/etc/crio", "/etc/containers",
               "/var/lib/containers", "/var/lib/crio", "/var/log/crio", "/run/crio",
               "/usr/share/containers", "/usr/bin"]  # fmt: skip
    before = _host_view(watched)
    if engine == "crio":
        cluster = Cluster(engine="crio", sim=None)
    else:
        cluster = Cluster(containerd=engine, sim=None)
    cluster.start()
    try:
        workdir, cgroup = str(cluster.workdir), cluster.cgroup_root
        obj = pod("p", "echo x > /h/f && exec sleep 3600",
                  volumes=[{"name": "h", "hostPath": {"path": "/etc/nvshim-k8s-teardown",
                                                      "type": "DirectoryOrCreate"}}],
                  container={"volumeMounts": [{"name": "h", "mountPath": "/h"}]})  # fmt: skip
        cluster.apply(obj)
        cluster.wait("pod/p", "--for=condition=Ready")
        assert cluster.leftovers(), "the running cluster shows no process"
        pidns = cluster.pidns
    finally:
        left = cluster.stop()
    assert left == []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                assert os.readlink(f"/proc/{entry}/ns/pid") != pidns, f"process {entry} left"
            except OSError:  # gone, or not ours to inspect
                pass
    with open("/proc/self/mountinfo") as fh:
        assert workdir not in fh.read()
    for hierarchy in os.listdir("/sys/fs/cgroup"):
        assert not os.path.exists(f"/sys/fs/cgroup/{hierarchy}{cgroup}")
    assert not os.path.exists(workdir)
    assert not os.path.exists("/etc/nvshim-k8s-teardown")
    assert _host_view(watched) == before


def test_node_image_imports_with_its_entrypoint(k8s_16, k8s_ns):
    """The nvshim installer image (tests/node_image.py's build) imports, and a pod of it
    runs its entrypoint (``nvshim node run``; here with ``--help``)."""
    tag = k8s_16.import_node_image()
    obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "installer-help", "namespace": k8s_ns},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "i", "image": tag, "args": ["--help"]}],
        },
    }
    k8s_16.apply(obj)
    phase = k8s_16.wait_pod_done("installer-help", k8s_ns, timeout=120)
    out = k8s_16.kubectl("logs", "-n", k8s_ns, "installer-help").stdout
    assert phase == "Succeeded", out
    assert "Usage:" in out and "node run" in out


def test_killed_run_leaves_no_process_and_is_swept(tmp_path):
    """A test run killed with SIGKILL: the cluster's processes die with it, and the next
    cluster's start sweeps its work dir and cgroup root (tests/k8s/cluster.sweep_stale)."""
    import subprocess
    import sys

    from tests.k8s.cluster import sweep_stale

    info = tmp_path / "info"
    script = (
        "import sys, time\n"
        "from tests.k8s.cluster import Cluster\n"
        "c = Cluster(containerd='1.6', sim=None).start()\n"
        "open(sys.argv[1], 'w').write(f'{c.workdir} {c.pid} {c.pidns}')\n"
        "time.sleep(600)\n"
    )
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.Popen([sys.executable, "-c", script, str(info)], cwd=repo)
    try:
        deadline = time.monotonic() + 120
        while not (info.exists() and info.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, "cluster did not start"
            time.sleep(0.2)
        workdir, _pid, pidns = info.read_text().split()
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 20
        while True:
            left = []
            for entry in os.listdir("/proc"):
                try:
                    if entry.isdigit() and os.readlink(f"/proc/{entry}/ns/pid") == pidns:
                        left.append(entry)
                except OSError:
                    pass
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert left == [], "processes outlived the killed run"
        name = os.path.basename(workdir)
        assert os.path.isdir(workdir) and os.path.isdir(f"/sys/fs/cgroup/memory/{name}")
        sweep_stale(os.path.dirname(workdir))  # (a concurrent cluster's start may go first)
        assert not os.path.exists(workdir)
        assert not [h for h in os.listdir("/sys/fs/cgroup") if os.path.exists(
            f"/sys/fs/cgroup/{h}/{name}")]  # fmt: skip
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_node_side_process(k8s, tmp_path):
    """A daemon started on the node (Cluster.popen, as a kubelet plugin would run) is in
    the cluster's namespaces and serves on the node address."""
    (tmp_path / "f").write_text("from-node\n")
    proc = k8s.popen(["busybox", "httpd", "-f", "-p", f"{NODE_IP}:9911", "-h", str(tmp_path)])
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                body = k8s.http_get(f"http://{NODE_IP}:9911/f", timeout=2)
                break
            except Exception:
                assert time.monotonic() < deadline, "the node-side server never answered"
                time.sleep(0.2)
        assert body == "from-node\n"
        kids = open(f"/proc/{proc.pid}/task/{proc.pid}/children").read().split()
        assert [os.readlink(f"/proc/{k}/ns/pid") for k in kids] == [k8s.pidns]
    finally:
        proc.terminate()
        proc.wait(10)
