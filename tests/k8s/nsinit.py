"""PID 1 of a test cluster's namespaces (started by tests/k8s/cluster.py, standalone:
imports only the standard library).

``python3 -I nsinit.py SPEC.json`` inside ``unshare --mount --net --pid --fork --mount-proc
--propagation private``: makes the mounts the spec lists (tmpfs, overlays, binds, files over
``/proc/sys`` entries, device nodes), brings up ``lo`` with the node address, starts the
components in order (those marked ``after_api`` once the API server's ``/readyz`` answers),
restarts each one ``restart_delay`` after it exits (as systemd's ``Restart=always`` would; a
kubelet that finds no runtime yet exits), keeps each one's pid in ``pid_dir/NAME.pid`` (the
node's ``systemctl`` stand-in restarts the engine through it), logs every exit to ``exits``
in the state dir, reaps every orphan, and writes ``ready`` in the state directory once the
node is Ready and the default service account exists. SIGTERM stops the components (all
at once, killed after a short grace); when this process ends the kernel kills whatever is
left in the PID namespace.
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.request


def log(msg: str) -> None:
    print(f"nsinit {time.strftime('%H:%M:%S')}: {msg}", flush=True)


def run(*argv: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"nsinit: {' '.join(argv)} failed: {proc.stderr.strip()}")


def make_mounts(spec: dict) -> None:
    for m in spec["mounts"]:
        kind, target = m["kind"], m["target"]
        if m.get("mkdir"):
            os.makedirs(target, exist_ok=True)
        if kind == "tmpfs":
            run("mount", "-t", "tmpfs", "-o", m.get("options", "mode=0755"), "nvshim-k8s", target)
        elif kind == "overlay":
            opts = f"lowerdir={target},upperdir={m['upper']},workdir={m['work']}"
            run("mount", "-t", "overlay", "overlay", "-o", opts, target)
        elif kind == "bind":
            run("mount", "--rbind" if m.get("recursive") else "--bind", m["source"], target)
        elif kind == "devpts":
            run("mount", "-t", "devpts", "-o", "newinstance,ptmxmode=0666,mode=0620", "devpts",
                target)  # fmt: skip
        elif kind == "mqueue":
            run("mount", "-t", "mqueue", "mqueue", target)
        else:
            raise SystemExit(f"nsinit: unknown mount kind {kind}")
    for path, major, minor, mode in spec.get("dev_nodes", []):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if not os.path.exists(path):
            os.mknod(path, 0o020000 | mode, os.makedev(major, minor))
            os.chmod(path, mode)
    for entry, source in spec.get("sysctl_files", {}).items():
        run("mount", "--bind", source, entry)
    run("mount", "--make-rshared", "/")


def setup_network(spec: dict) -> None:
    run("ip", "link", "set", "lo", "up")
    run("ip", "addr", "add", f"{spec['node_ip']}/32", "dev", "lo")
    for rule in spec.get("iptables", []):
        run("iptables", *rule)


class Component:
    def __init__(self, c: dict, logs: str, pid_dir: str | None = None) -> None:
        self.name = c["name"]
        self.argv = c["argv"]
        self.env = c["env"]
        self.restart = c.get("restart", True)
        self.restart_delay = c.get("restart_delay", 0.5)
        self.restart_at: float | None = None
        self.after_api = c.get("after_api", False)
        self.log_path = os.path.join(logs, f"{self.name}.log")
        self.pid_path = os.path.join(pid_dir, f"{self.name}.pid") if pid_dir else None
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        with open(self.log_path, "ab") as out:
            if self.starts > 1:
                out.write(f"--- nsinit: restart {self.starts - 1} ---\n".encode())
            self.proc = subprocess.Popen(
                self.argv, env=self.env, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, cwd="/",
            )  # fmt: skip
        if self.pid_path:
            with open(self.pid_path + ".new", "w") as fh:
                fh.write(f"{self.proc.pid}\n")
            os.rename(self.pid_path + ".new", self.pid_path)

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()

    def wait(self, deadline: float) -> None:
        """Wait for it to end until ``deadline`` (monotonic), then kill it."""
        if self.proc is None:
            return
        try:
            self.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Api:
    def __init__(self, spec: dict) -> None:
        self.url = spec["api_url"]
        self.ctx = ssl.create_default_context(cafile=spec["ca"])
        self.ctx.load_cert_chain(spec["admin_cert"], spec["admin_key"])

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.url + path, context=self.ctx, timeout=2) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as err:
            return err.code, b""
        except OSError:
            return 0, b""

    def node_ready(self, node: str) -> bool:
        status, body = self.get(f"/api/v1/nodes/{node}")
        if status != 200:
            return False
        node = json.loads(body)
        conditions = node.get("status", {}).get("conditions", [])
        taints = [t["key"] for t in node.get("spec", {}).get("taints", [])]
        # Ready, and the node controller has lifted its not-ready taint (pods schedule)
        return "node.kubernetes.io/not-ready" not in taints and any(
            c["type"] == "Ready" and c["status"] == "True" for c in conditions
        )


def main(spec_path: str) -> int:
    with open(spec_path) as fh:
        spec = json.load(fh)
    state = spec["state_dir"]
    stopping = False

    def on_term(_sig, _frame) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    make_mounts(spec)
    setup_network(spec)
    log("mounts and network ready")
    pid_dir = spec.get("pid_dir")
    if pid_dir:
        os.makedirs(pid_dir, exist_ok=True)
    comps = [Component(c, spec["logs_dir"], pid_dir) for c in spec["components"]]
    for comp in comps:
        if not comp.after_api:
            comp.start()
    api = Api(spec)
    api_up = ready = False
    while not stopping:
        # reap every child: ours (to restart or report) and orphans (shims' leftovers)
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            for comp in comps:
                if comp.proc is not None and comp.proc.pid == pid:
                    comp.proc.returncode = os.waitstatus_to_exitcode(status)
                    log(f"{comp.name} exited ({comp.proc.returncode})")
                    with open(os.path.join(state, "exits"), "a") as fh:
                        fh.write(f"{comp.name} {comp.proc.returncode}\n")
                    if comp.restart:
                        comp.restart_at = time.monotonic() + comp.restart_delay
        for comp in comps:
            if comp.restart_at is not None and time.monotonic() >= comp.restart_at:
                comp.restart_at = None
                comp.start()
                log(f"{comp.name} restarted")
        if not api_up and api.get("/readyz")[0] == 200:
            api_up = True
            log("API server ready")
            for comp in comps:
                if comp.after_api:
                    comp.start()
        if api_up and not ready:
            if api.node_ready(spec["node_name"]) and (
                api.get("/api/v1/namespaces/default/serviceaccounts/default")[0] == 200
            ):
                ready = True
                log("node Ready")
                with open(os.path.join(state, "ready"), "w") as fh:
                    fh.write("ready\n")
        time.sleep(0.1 if not ready else 0.25)
    # all at once, each given the same grace: the cluster's state is thrown away, so a
    # graceful shutdown serves nothing (the API server's alone can drain for 5 s)
    log("stopping")
    began = time.monotonic()
    for comp in reversed(comps):
        comp.restart = False
        comp.terminate()
    for comp in reversed(comps):
        comp.wait(began + spec.get("grace", 2.0))
        log(f"{comp.name} stopped after {time.monotonic() - began:.2f}s")
    log("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
