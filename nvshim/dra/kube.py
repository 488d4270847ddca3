"""A small Kubernetes API client over the standard library (urllib + ssl).

Credentials come from a kubeconfig (``--kubeconfig``: the current context's server, CA,
client certificate/key or bearer token, inline ``-data`` forms too) or, in a pod, from the
service account (``/var/run/secrets/kubernetes.io/serviceaccount`` and
``KUBERNETES_SERVICE_HOST``/``_PORT``). Every failure is one ``KubeError`` line naming
the request.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from nvshim.errors import NvshimError

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
TIMEOUT = 15.0
RESOURCE_API = "/apis/resource.k8s.io/v1"
MAX_INT_DIGITS = 40


class KubeError(NvshimError):
    """An API request that failed; ``status`` is the HTTP status (0: no answer)."""

    def __init__(self, message: str, status: int = 0):
        super().__init__(message)
        self.status = status


class Kube:
    """An API server endpoint with its TLS context and optional bearer token."""

    def __init__(self, server: str, context: ssl.SSLContext, token: str | None = None):
        self.server = server.rstrip("/")
        self.context = context
        self.token = token

    def request(
        self, method: str, path: str, body: Any = None, query: dict[str, str] | None = None
    ) -> Any:
        """The decoded JSON answer of ``method path``; KubeError on a non-2xx status."""
        url = self.server + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, context=self.context, timeout=TIMEOUT) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as err:
            raise KubeError(f"{method} {path}: {err.code} {_reason(err)}", err.code) from None
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise KubeError(f"{method} {path}: {self.server}: {reason}") from None
        try:
            return json.loads(raw, parse_int=_bounded_int) if raw else {}
        except ValueError as err:
            raise KubeError(f"{method} {path}: an answer that is not JSON: {err}") from None

    def get(self, path: str, **query: str) -> Any:
        return self.request("GET", path, query=query or None)

    def create(self, path: str, body: Any) -> Any:
        return self.request("POST", path, body)

    def replace(self, path: str, body: Any) -> Any:
        return self.request("PUT", path, body)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)


def _bounded_int(text: str) -> int | str:
    """A JSON integer; one longer than any Kubernetes value stays text (``int()`` of
    thousands of digits is refused, and slow), so the field's own check refuses it."""
    return int(text) if len(text) <= MAX_INT_DIGITS else text


def _reason(err: urllib.error.HTTPError) -> str:
    """The API's Status message, else the HTTP reason."""
    try:
        status = json.loads(err.read() or b"{}")
        return " ".join(str(status.get("message") or err.reason).split())[:300]
    except (ValueError, OSError):
        return str(err.reason)


def _read(path: str, what: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read().strip()
    except OSError as err:
        raise NvshimError(f"{what} {path}: {err.strerror}") from None


def in_cluster() -> Kube:
    """The API server of the pod this runs in, with its service account."""
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise NvshimError("not in a pod (KUBERNETES_SERVICE_HOST unset): pass --kubeconfig")
    context = ssl.create_default_context(cafile=os.path.join(SA_DIR, "ca.crt"))
    token = _read(os.path.join(SA_DIR, "token"), "service account token")
    server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
    return Kube(server, context, token)


def from_kubeconfig(path: str) -> Kube:
    """The current context of the kubeconfig at ``path``."""
    import yaml

    try:
        with open(path, encoding="utf-8") as fh:
            doc = yaml.safe_load(fh)
    except OSError as err:
        raise NvshimError(f"kubeconfig {path}: {err.strerror}") from None
    except yaml.YAMLError:
        raise NvshimError(f"kubeconfig {path}: invalid YAML") from None
    try:
        current = doc["current-context"]
        ctx = _named(doc["contexts"], current)["context"]
        cluster = _named(doc["clusters"], ctx["cluster"])["cluster"]
        user = _named(doc.get("users") or [], ctx.get("user", ""), {"user": {}})["user"] or {}
        server = cluster["server"]
    except (KeyError, TypeError):
        raise NvshimError(f"kubeconfig {path}: no usable current context") from None
    base = os.path.dirname(os.path.abspath(path))
    try:
        context = _tls_context(cluster, user, base)
    except (ValueError, OSError) as err:  # bad base64 or PEM, a missing file
        raise NvshimError(f"kubeconfig {path}: unusable TLS settings: {err}") from None
    token = user.get("token")
    if not token and user.get("tokenFile"):
        token = _read(os.path.join(base, user["tokenFile"]), "token file")
    return Kube(server, context, token)


def _tls_context(cluster: dict, user: dict, base: str) -> ssl.SSLContext:
    """The cluster's CA and the user's client certificate (paths relative to ``base``)."""
    context = ssl.create_default_context()
    if cluster.get("certificate-authority-data"):
        ca = base64.b64decode(cluster["certificate-authority-data"]).decode()
        context = ssl.create_default_context(cadata=ca)
    elif cluster.get("certificate-authority"):
        context = ssl.create_default_context(
            cafile=os.path.join(base, cluster["certificate-authority"])
        )
    if cluster.get("insecure-skip-tls-verify"):
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    _client_cert(context, user, base)
    return context


def _named(items: list, name: str, default: Any = None) -> dict:
    for item in items or ():
        if item.get("name") == name:
            return item
    if default is not None:
        return default
    raise KeyError(name)


def _client_cert(context: ssl.SSLContext, user: dict, base: str) -> None:
    """Load the user's client certificate and key (files, or inline data through a private
    temporary directory removed at once)."""
    cert, key = user.get("client-certificate"), user.get("client-key")
    if cert and key:
        context.load_cert_chain(os.path.join(base, cert), os.path.join(base, key))
        return
    cert_data, key_data = user.get("client-certificate-data"), user.get("client-key-data")
    if not (cert_data and key_data):
        return
    with tempfile.TemporaryDirectory(prefix="nvshim-kube-") as tmp:
        cert_path, key_path = os.path.join(tmp, "crt"), os.path.join(tmp, "key")
        for path, data in ((cert_path, cert_data), (key_path, key_data)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(base64.b64decode(data))
        context.load_cert_chain(cert_path, key_path)


def connect(kubeconfig: str | None) -> Kube:
    """A client from ``kubeconfig`` when given (or ``KUBECONFIG``), else in-cluster."""
    path = kubeconfig or os.environ.get("KUBECONFIG")
    return from_kubeconfig(path) if path else in_cluster()
