"""pytest fixtures for tests on the one-node cluster (loaded by tests/conftest.py):

- ``k8s_clusters``: ``get(version)`` starts (once per session) and returns the cluster on
  containerd ``version`` ("1.6" or "1.7") or on CRI-O ("crio"); all are stopped at the end
  of the session, and anything they left behind fails it;
- ``k8s``: parametrized over both containerd versions (tests on it run on 1.6, then 1.7);
  ``k8s_16`` / ``k8s_17`` / ``k8s_crio``: one engine only;
- ``k8s_ns``: a fresh namespace for one test, deleted (without waiting) afterwards; its
  pods and events go to the test's captured output (pytest shows them when it failed).

A machine without the Kubernetes archive (``../shared/k8s``) skips these tests; where it is
there, nothing skips.
"""

from __future__ import annotations

import itertools
import os

import pytest

from tests.k8s import artifacts
from tests.k8s.cluster import Cluster

_counter = itertools.count()


@pytest.fixture(scope="session")
def k8s_clusters():
    if artifacts.k8s_archive() is None:
        pytest.skip("no Kubernetes archive (../shared/k8s, $NVSHIM_K8S_ARCHIVE)")
    started: dict[str, Cluster] = {}

    def get(version: str) -> Cluster:
        if version not in started:
            if version == "crio":
                started[version] = Cluster(engine="crio").start()
            else:
                started[version] = Cluster(containerd=version).start()
        return started[version]

    yield get
    left = []
    for version, cluster in started.items():
        left += [f"{version}: {item}" for item in cluster.stop()]
    assert not left, f"the test clusters left: {left}"


@pytest.fixture(scope="session", params=artifacts.CONTAINERD_VERSIONS, ids=lambda v: f"ctd{v}")
def k8s(request, k8s_clusters) -> Cluster:
    return k8s_clusters(request.param)


@pytest.fixture(scope="session")
def k8s_16(k8s_clusters) -> Cluster:
    return k8s_clusters("1.6")


@pytest.fixture(scope="session")
def k8s_17(k8s_clusters) -> Cluster:
    return k8s_clusters("1.7")


@pytest.fixture(scope="session")
def k8s_crio(k8s_clusters) -> Cluster:
    return k8s_clusters("crio")


@pytest.fixture
def k8s_ns(request) -> str:
    """A namespace of its own for the test, on the cluster its ``k8s``/``k8s_16``/``k8s_17``
    fixture gives (the first of those it uses)."""
    for name in ("k8s", "k8s_16", "k8s_17", "k8s_crio"):
        if name in request.fixturenames:
            cluster = request.getfixturevalue(name)
            break
    else:
        raise RuntimeError("k8s_ns needs one of the k8s, k8s_16, k8s_17, k8s_crio fixtures")
    ns = f"t{os.getpid() % 10000}-{next(_counter)}"
    cluster.kubectl("create", "namespace", ns)
    cluster.wait_service_account(ns)
    yield ns
    # shown by pytest only when the test failed: what the namespace held and its events
    state = cluster.kubectl("get", "pods,events", "-n", ns, "-o", "wide", check=False)
    print(f"== kubectl get pods,events -n {ns}\n{state.stdout}{state.stderr}")
    cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
