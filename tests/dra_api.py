"""A real kube-apiserver (with its etcd) and nothing else, for the DRA driver's API-side tests
(ResourceSlices, claims): the binaries of ``../shared/k8s`` (unpacked once into the test
cache), certificates from the openssl CLI, an admin kubeconfig. About 5 s to start."""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import time
from pathlib import Path

from nvshim.dra.kube import Kube, from_kubeconfig


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _openssl(pki: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=pki, check=True, capture_output=True)


def _pki(pki: Path) -> None:
    pki.mkdir(parents=True)
    _openssl(pki, "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "ca.key")
    _openssl(pki, "req", "-x509", "-new", "-key", "ca.key", "-subj", "/CN=dra-test-ca",
             "-days", "2", "-out", "ca.crt")  # fmt: skip
    for name, subject, ext in (
        ("apiserver", "/CN=kube-apiserver", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
        ("admin", "/O=system:masters/CN=admin", "extendedKeyUsage=clientAuth"),
    ):
        _openssl(pki, "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", f"{name}.key")
        _openssl(pki, "req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr")
        (pki / f"{name}.ext").write_text(ext + "\n")
        _openssl(pki, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext",
                 "-out", f"{name}.crt")  # fmt: skip
    _openssl(pki, "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "sa.key")
    _openssl(pki, "ec", "-in", "sa.key", "-pubout", "-out", "sa.pub")


def k8s_bin() -> str:
    """The Kubernetes binaries of ../shared/k8s, unpacked once into the test cache."""
    import glob
    import hashlib

    from tests.debroot import REPO, cached

    found = sorted(
        glob.glob(os.path.join(os.path.dirname(REPO), "shared/k8s/kubernetes-*-linux-amd64.tar.xz"))
        + glob.glob("/work/shared/k8s/kubernetes-*-linux-amd64.tar.xz")
    )
    archive = found[-1]
    with open(archive, "rb") as fh:
        digest = hashlib.file_digest(fh, "sha256").hexdigest()

    def build(path: str) -> None:
        os.makedirs(path)
        subprocess.run(["tar", "-C", path, "-xJf", archive], check=True, capture_output=True)

    return cached("k8s-bin", {"sha256": digest}, build)


class ApiServer:
    """etcd + kube-apiserver under ``root``; ``kube`` is an admin client."""

    def __init__(self, root: Path):
        self.root = root
        self.procs: list[subprocess.Popen] = []
        pki = root / "pki"
        _pki(pki)
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
        self.kubeconfig = root / "admin.kubeconfig"
        self.kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters:\n- name: t\n  cluster:\n    certificate-authority: {pki / 'ca.crt'}\n"
            f"    server: https://127.0.0.1:{api_port}\n"
            f"users:\n- name: a\n  user:\n    client-certificate: {pki / 'admin.crt'}\n"
            f"    client-key: {pki / 'admin.key'}\n"
            "contexts:\n- name: t\n  context: {cluster: t, user: a}\ncurrent-context: t\n"
        )
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
