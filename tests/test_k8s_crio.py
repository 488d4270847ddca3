"""nvshim on a CRI-O node (issue 31): the test cluster's CRI-O 1.36.3 (tests/k8s/cluster.py,
``engine="crio"``; one cluster for the session, shared with the e2e module's CRI-O cells)
and what the installer and the docs rely on there:

- the node runs on CRI-O; pods log and exec; a privileged and a Guaranteed pod run (these
  machines lack CAP_SYS_RESOURCE); the node's ``systemctl restart crio`` (the supervisor's
  stand-in) restarts CRI-O and a running container survives it;
- a runtime handler added by a drop-in plus SIGHUP is NOT served by CRI-O 1.36.3 (pods fail
  with "failed to find runtime handler"); after a restart it is; a drop-in table replaces
  the whole handler; CRI-O parses every file in crio.conf.d whatever its name;
- the OCI hook path: the openshift overlay (the crio one plus the privileged SCC's role
  binding) with ``CRIO_CONFIG_MODE=hook`` writes only the hook file to hooks.d, CRI-O's
  config stays as it was, a pod without a runtime class gets exactly the GPU it mounts,
  and the uninstall leaves nothing;
- the DRA driver on CRI-O, which reads the claims' CDI specs itself (CDI on by default).
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from tests.k8s import artifacts
from tests.k8s.cluster import CRIO_DROP_INS, NODE_NAME, Cluster
from tests.test_k8s_node_e2e import ENVIRONMENT, TEST_OVERLAY, engine_files

KUBE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "packaging",
                    "kubernetes")  # fmt: skip
SHOW = "ls /dev /dev/nvidia-caps 2>/dev/null; echo CVD=$CUDA_VISIBLE_DEVICES"
HOOK_FILE = "/usr/share/containers/oci/hooks.d/oci-nvshim-hook.json"


def pod(name: str, ns: str, command: str, **spec) -> dict:
    container = {"name": "main", "image": artifacts.BUSYBOX, "command": ["sh", "-c", command]}
    container.update(spec.pop("container", {}))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                 "containers": [container], **spec},
    }  # fmt: skip


def events(k8s: Cluster, ns: str, name: str) -> str:
    out = k8s.kubectl("get", "events", "-n", ns, "--field-selector",
                      f"involvedObject.name={name}", "-o", "json")  # fmt: skip
    return "\n".join(e.get("message", "") for e in json.loads(out.stdout)["items"])


def wait_for(predicate, timeout: float, detail=lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, str(detail())[-3000:]
        time.sleep(0.3)


def test_node_runs_on_crio_pods_log_exec_and_survive_a_restart(k8s_crio, k8s_ns):
    k8s = k8s_crio
    info = k8s.get("node", NODE_NAME)["status"]["nodeInfo"]
    assert info["containerRuntimeVersion"] == "cri-o://1.36.3"
    guaranteed = {"limits": {"cpu": "100m", "memory": "64Mi"}}
    k8s.apply([
        pod("p", k8s_ns, "echo hi from $(hostname); exec sleep 3600"),
        pod("priv", k8s_ns, "grep CapEff /proc/self/status",
            container={"securityContext": {"privileged": True}}),
        pod("guaranteed", k8s_ns, "cat /proc/self/oom_score_adj",
            container={"resources": guaranteed}),
    ])  # fmt: skip
    k8s.wait("-n", k8s_ns, "pod/p", "--for=condition=Ready")
    assert k8s.kubectl("logs", "-n", k8s_ns, "p").stdout == "hi from p\n"
    for name in ("priv", "guaranteed"):
        assert k8s.wait_pod_done(name, k8s_ns) == "Succeeded", events(k8s, k8s_ns, name)
    old = k8s.engine_pid()
    # the node's systemctl restarts CRI-O as systemd would: stop, start, wait for it
    done = k8s.nsenter(["systemctl", "restart", "crio"])
    assert done.returncode == 0, done.stderr
    assert k8s.wait_engine(not_pid=old) != old
    assert "crio restarted" in k8s.log("nsinit")
    # the container ran on under conmon: same process, exec works
    deadline = time.monotonic() + 20
    while True:
        proc = k8s.kubectl("exec", "-n", k8s_ns, "p", "--", "echo", "still-here", check=False)
        if proc.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert proc.stdout == "still-here\n", proc.stderr
    status = k8s.get("pod", "-n", k8s_ns, "p")["status"]["containerStatuses"][0]
    assert status["restartCount"] == 0


HANDLER = """\
[crio.runtime.runtimes.extra]
runtime_path = "{runc}"
runtime_type = "oci"
runtime_root = "/run/runc-extra"
monitor_path = "/usr/bin/conmon"
monitor_cgroup = "pod"
"""


def _handler(k8s: Cluster, name: str) -> dict:
    """Handler ``name`` as the running CRI-O has it (``crio status config``)."""
    import tomllib

    out = k8s.nsenter(["crio", "status", "config"])
    assert out.returncode == 0, out.stderr
    return tomllib.loads(out.stdout)["crio"]["runtime"]["runtimes"][name]


def test_a_new_handler_needs_a_restart_and_every_file_in_crio_conf_d_counts(k8s_crio, k8s_ns):
    """What the installer's CRI-O restart and its drop-in rules rest on (CRI-O 1.36.3)."""
    k8s = k8s_crio
    runc = str(k8s.workdir / "runc-clamp")
    dropin = k8s.path(f"{CRIO_DROP_INS}/50-extra.conf")
    spare = k8s.path(f"{CRIO_DROP_INS}/50-extra.conf.bak")
    k8s.apply({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
               "metadata": {"name": "extra"}, "handler": "extra"})  # fmt: skip
    try:
        with open(dropin, "w") as fh:
            fh.write(HANDLER.format(runc=runc))
        old = k8s.engine_pid()
        os.kill(old, signal.SIGHUP)  # a reload: logged, and not applied to handlers
        k8s.apply(pod("reloaded", k8s_ns, "true", runtimeClassName="extra"))
        wait_for(lambda: "failed to find runtime handler extra" in events(k8s, k8s_ns,
                 "reloaded"), 60, lambda: events(k8s, k8s_ns, "reloaded"))  # fmt: skip
        assert k8s.engine_pid() == old and "Reloading configuration" in k8s.log("crio", 200000)
        k8s.kubectl("delete", "pod", "-n", k8s_ns, "reloaded")
        # a file of any name in crio.conf.d is read, and its table replaces the whole
        # handler: a "backup" naming only runtime_path drops the .conf's runtime_root
        with open(spare, "w") as fh:
            fh.write(f'[crio.runtime.runtimes.extra]\nruntime_path = "{runc}"\n')
        assert k8s.nsenter(["systemctl", "restart", "crio"]).returncode == 0
        assert _handler(k8s, "extra").get("runtime_root", "") == ""
        os.unlink(spare)
        # a restart applies the handler
        assert k8s.nsenter(["systemctl", "restart", "crio"]).returncode == 0
        k8s.apply(pod("restarted", k8s_ns, "echo ran", runtimeClassName="extra"))
        phase = k8s.wait_pod_done("restarted", k8s_ns, timeout=90)
        assert phase == "Succeeded", events(k8s, k8s_ns, "restarted")
        assert _handler(k8s, "extra")["runtime_root"] == "/run/runc-extra"
    finally:
        for path in (dropin, spare):
            if os.path.exists(path):
                os.unlink(path)
        k8s.kubectl("delete", "pods", "--all", "-n", k8s_ns, "--wait=true", check=False)
        k8s.nsenter(["systemctl", "restart", "crio"])
        k8s.kubectl("delete", "runtimeclass", "extra", check=False)


# the e2e's test overlay (the environment only) plus the hook mode
HOOK_ENVIRONMENT = (
    ENVIRONMENT
    + """\
        - name: CRIO_CONFIG_MODE
          value: hook
"""
)


def test_oci_hook_mode_gives_pods_without_a_runtime_class_their_gpu(k8s_crio, k8s_ns, tmp_path):
    """``CRIO_CONFIG_MODE=hook`` on the openshift overlay: the installer writes the OCI
    hook to CRI-O's hooks.d and leaves CRI-O's config (and CRI-O) alone; the hook serves
    pods on CRI-O's own runc."""
    k8s = k8s_crio
    k8s.import_node_image()
    base = os.path.relpath(os.path.join(KUBE, "overlays", "openshift"), tmp_path)
    (tmp_path / "kustomization.yaml").write_text(TEST_OVERLAY.format(base=base))
    (tmp_path / "environment.yaml").write_text(HOOK_ENVIRONMENT)
    before = engine_files(k8s)
    engine = k8s.engine_pid()
    k8s.kubectl("label", "node", NODE_NAME, "nvidia.com/gpu.present=true", "--overwrite")
    try:
        k8s.kubectl("apply", "-k", str(tmp_path))
        k8s.kubectl("-n", "nvshim", "rollout", "status", "daemonset/nvshim-node",
                    "--timeout=180s", timeout=240)  # fmt: skip
        binding = k8s.get("rolebinding", "-n", "nvshim", "nvshim-node-privileged-scc")
        assert binding["roleRef"]["name"] == "system:openshift:scc:privileged"
        hook = json.load(open(k8s.path(HOOK_FILE)))
        assert hook["hook"]["path"] == "/usr/local/nvshim/bin/nvshim-hook"
        assert hook["stages"] == ["prestart"]
        assert engine_files(k8s) == before and k8s.engine_pid() == engine
        logs = k8s.kubectl("logs", "-n", "nvshim", "daemonset/nvshim-node", "-c",
                           "nvshim-node").stdout  # fmt: skip
        assert "engine configuration skipped" in logs, logs
        request = {"name": "gpu", "mountPath": "/var/run/nvidia-container-devices/1",
                   "readOnly": True}  # fmt: skip
        devnull = [{"name": "gpu", "hostPath": {"path": "/dev/null", "type": "CharDevice"}}]
        k8s.apply([
            pod("hooked", k8s_ns, SHOW, volumes=devnull, container={"volumeMounts": [request]}),
            pod("plain", k8s_ns, SHOW),
        ])  # fmt: skip
        for name in ("hooked", "plain"):
            assert k8s.wait_pod_done(name, k8s_ns) == "Succeeded", events(k8s, k8s_ns, name)
        out = k8s.kubectl("logs", "-n", k8s_ns, "hooked").stdout
        assert "nvidia1\n" in out and "nvidia0\n" not in out and "nvidiactl\n" in out, out
        # a prestart hook runs after the process's environment is fixed: the device nodes
        # are the isolation, CUDA_VISIBLE_DEVICES is the runtime class's to set
        assert "CVD=\n" in out, out
        out = k8s.kubectl("logs", "-n", k8s_ns, "plain").stdout
        assert "nvidia" not in out and "CVD=\n" in out, out
        k8s.kubectl("delete", "pods", "--all", "-n", k8s_ns, "--wait=true")
        k8s.kubectl("delete", "-k", str(tmp_path), "--wait=true", timeout=400)
        assert not os.path.exists(k8s.path(HOOK_FILE))
        assert not os.path.lexists(k8s.path("/usr/local/nvshim"))
        assert engine_files(k8s) == before and k8s.engine_pid() == engine
    finally:
        k8s.kubectl("delete", "-k", str(tmp_path), "--ignore-not-found", "--wait=true",
                    check=False, timeout=400)  # fmt: skip
        k8s.kubectl("label", "node", NODE_NAME, "nvidia.com/gpu.present-", check=False)


@pytest.fixture
def dra_plugin(k8s_crio, launchers, tmp_path):
    """``nvshim dra run`` on the CRI-O node (tests/test_k8s_dra.py's Plugin) with the
    shipped DeviceClasses."""
    import subprocess

    import yaml

    from tests.test_k8s_dra import Plugin

    k8s = k8s_crio
    config = tmp_path / "config.toml"
    config.write_text(f'[runtime]\nhook-path = "{launchers}/nvshim-hook"\n')
    rendered = subprocess.run(
        [f"{k8s.k8s_bin}/kubectl", "kustomize", os.path.join(KUBE, "dra")],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    classes = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "DeviceClass"]
    k8s.apply(classes)
    plugin = Plugin(k8s, str(config), str(tmp_path / "plugin.log"))
    plugin.start()
    try:
        yield plugin
    finally:
        plugin.stop()
        k8s.nsenter([os.path.join(launchers, "nvshim"), "dra", "withdraw",
                     f"--kubeconfig={k8s.kubeconfig}", f"--node-name={NODE_NAME}"],
                    env={"NVSHIM_CONFIG": str(config)})  # fmt: skip
        for doc in classes:
            k8s.kubectl("delete", "deviceclass", doc["metadata"]["name"], check=False)


def test_dra_claim_on_crio_gets_exactly_its_gpu(k8s_crio, k8s_ns, dra_plugin):
    """CRI-O applies the claim's CDI spec itself (the kubelet's CDIDevices; CDI needs no
    setting there): the pod sees exactly the prepared GPU."""
    from tests.test_k8s_dra import SHOW as DRA_SHOW
    from tests.test_k8s_dra import _apply, _host, _output, _pod, _prepared, _template

    k8s = k8s_crio
    _apply(k8s, k8s_ns, _template("one", {"deviceClassName": "gpu.nvshim.io"}),
           _pod("p", {"resourceClaimTemplateName": "one"}, DRA_SHOW))  # fmt: skip
    out = _output(k8s, k8s_ns, "p")
    (device,) = _prepared(dra_plugin.log(), k8s_ns)
    gpu = _host(k8s).gpu(int(device.split("-")[1]))
    assert out["node"] == [f"nvidia{gpu.minor}"]
    assert out["cvd"] == [gpu.uuid]
    k8s.kubectl("delete", "pod", "-n", k8s_ns, "p", "--wait=true")
