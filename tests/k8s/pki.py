"""Certificates and kubeconfigs for a test cluster, made with the openssl CLI (EC P-256:
quick to generate). One CA signs every serving and client certificate; the service-account
key pair is a separate EC key."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

# name: (subject, SAN extension or None, extended key usage)
CLIENTS = {
    "admin": "/O=system:masters/CN=kubernetes-admin",
    "controller-manager": "/CN=system:kube-controller-manager",
    "scheduler": "/CN=system:kube-scheduler",
    "apiserver-kubelet-client": "/O=system:masters/CN=kube-apiserver-kubelet-client",
}


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {proc.stderr.strip()}")


def _key(pki: Path, name: str) -> None:
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", f"{name}.key", cwd=pki)
    os.chmod(pki / f"{name}.key", 0o600)


def _signed(pki: Path, name: str, subject: str, usage: str, sans: list[str] | None = None) -> None:
    _key(pki, name)
    ext = [
        "basicConstraints=critical,CA:FALSE",
        "keyUsage=critical,digitalSignature,keyEncipherment",
        f"extendedKeyUsage={usage}",
    ]
    if sans:
        ext.append("subjectAltName=" + ",".join(sans))
    (pki / f"{name}.ext").write_text("\n".join(ext) + "\n")
    _openssl("req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr", cwd=pki)
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "30", "-sha256", "-extfile", f"{name}.ext",
        "-out", f"{name}.crt", cwd=pki,
    )  # fmt: skip
    (pki / f"{name}.csr").unlink()
    (pki / f"{name}.ext").unlink()


def make_pki(pki: Path, node_name: str, node_ip: str, service_ip: str) -> None:
    """Write ca, apiserver (serving), the client pairs of ``CLIENTS`` plus
    ``node`` (system:node:<node_name>), and ``sa.key``/``sa.pub`` into ``pki``."""
    pki.mkdir(parents=True, exist_ok=True)
    _key(pki, "ca")
    _openssl(
        "req", "-x509", "-new", "-key", "ca.key", "-subj", "/CN=nvshim-test-ca", "-days", "30",
        "-sha256", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature", "-out", "ca.crt",
        cwd=pki,
    )  # fmt: skip
    sans = [
        "IP:127.0.0.1",
        f"IP:{node_ip}",
        f"IP:{service_ip}",
        f"DNS:{node_name}",
        "DNS:localhost",
        "DNS:kubernetes",
        "DNS:kubernetes.default",
        "DNS:kubernetes.default.svc",
        "DNS:kubernetes.default.svc.cluster.local",
    ]
    _signed(pki, "apiserver", "/CN=kube-apiserver", "serverAuth", sans)
    for name, subject in CLIENTS.items():
        _signed(pki, name, subject, "clientAuth")
    _signed(pki, "node", f"/O=system:nodes/CN=system:node:{node_name}", "clientAuth")
    _key(pki, "sa")
    _openssl("ec", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)


def kubeconfig(path: Path, pki: Path, client: str, server: str) -> Path:
    """A kubeconfig at ``path`` for client pair ``client`` against ``server``."""
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters:
- name: nvshim-test
  cluster:
    certificate-authority: {pki / "ca.crt"}
    server: {server}
users:
- name: {client}
  user:
    client-certificate: {pki / (client + ".crt")}
    client-key: {pki / (client + ".key")}
contexts:
- name: nvshim-test
  context: {{cluster: nvshim-test, user: {client}, namespace: default}}
current-context: nvshim-test
"""
    )
    return path
