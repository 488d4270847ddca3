"""The test build cache: one build per input set, bounded to the newest few."""

from __future__ import annotations

import os

from tests import debroot


def test_cache_builds_once_per_input_and_keeps_the_newest(tmp_path, monkeypatch):
    monkeypatch.setattr(debroot, "CACHE", str(tmp_path))
    builds = []

    def build(path: str) -> None:
        builds.append(path)
        with open(path, "w") as fh:
            fh.write(str(len(builds)))

    first = debroot.cached("thing", {"v": 0}, build)
    assert debroot.cached("thing", {"v": 0}, build) == first and len(builds) == 1
    paths = [debroot.cached("thing", {"v": i}, build) for i in range(1, 6)]
    kept = sorted(e for e in os.listdir(tmp_path) if not e.endswith(".lock"))
    assert kept == sorted(os.path.basename(p) for p in paths[-debroot.KEEP :])
    assert not any(e.endswith(".building") for e in os.listdir(tmp_path))
