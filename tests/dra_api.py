"""A real kube-apiserver (with its etcd) and nothing else, for the DRA driver's API-side tests
(ResourceSlices, claims): the cluster harness's binaries and certificates (tests/k8s), an
admin kubeconfig. About 2 s to start."""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import time
from pathlib import Path

from nvshim.dra.kube import Kube, from_kubeconfig
from tests.k8s.artifacts import k8s_bin
from tests.k8s.pki import kubeconfig, make_pki


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ApiServer:
    """etcd + kube-apiserver under ``root``; ``kube`` is an admin client."""

    def __init__(self, root: Path):
        self.root = root
        self.procs: list[subprocess.Popen] = []
        pki = root / "pki"
        make_pki(pki, "dra-node", "127.0.0.1", "10.96.0.1")
        etcd_port, peer_port, api_port = _free_port(), _free_port(), _free_port()
        self._start(
            "etcd",
            [
                "etcd",
                "--data-dir", str(root / "etcd"),
                "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
                "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
                "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
                "--initial-cluster", f"default=http://127.0.0.1:{peer_port}",
            ],
        )  # fmt: skip
        self._start(
            "apiserver",
            [
                os.path.join(k8s_bin(), "kube-apiserver"),
                "--etcd-servers", f"http://127.0.0.1:{etcd_port}",
                "--bind-address", "127.0.0.1",
                "--advertise-address", "127.0.0.1",
                "--secure-port", str(api_port),
                "--cert-dir", str(root / "certs"),
                "--tls-cert-file", str(pki / "apiserver.crt"),
                "--tls-private-key-file", str(pki / "apiserver.key"),
                "--client-ca-file", str(pki / "ca.crt"),
                "--authorization-mode", "RBAC",
                "--allow-privileged=true",
                "--service-account-issuer", "https://kubernetes.default.svc",
                "--service-account-key-file", str(pki / "sa.pub"),
                "--service-account-signing-key-file", str(pki / "sa.key"),
                "--service-cluster-ip-range", "10.96.0.0/24",
            ],
        )  # fmt: skip
        server = f"https://127.0.0.1:{api_port}"
        self.kubeconfig = kubeconfig(root / "admin.kubeconfig", pki, "admin", server)
        self.kube = from_kubeconfig(str(self.kubeconfig))
        self.ca = str(pki / "ca.crt")
        self._wait_ready()

    def as_token(self, token: str) -> Kube:
        """A client authenticating with ``token`` only (no client certificate)."""
        return Kube(self.kube.server, ssl.create_default_context(cafile=self.ca), token)

    def _start(self, name: str, argv: list[str]) -> None:
        log = open(self.root / f"{name}.log", "wb")  # noqa: SIM115 - kept for the process
        self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))

    def _wait_ready(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"{proc.args[0]} exited: see {self.root}")
            try:
                self.kube.get("/apis/resource.k8s.io/v1/resourceslices")
                self.kube.get("/api/v1/namespaces/default")
                return
            except Exception:  # noqa: BLE001 - not up yet
                time.sleep(0.3)
        raise RuntimeError(f"kube-apiserver not ready in {timeout}s: see {self.root}")

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.terminate()
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
