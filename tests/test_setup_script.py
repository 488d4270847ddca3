"""tests/setup.sh's apt step waits for another apt holding its locks (real apt-get, on a
private lists directory: no network, no host file written)."""

from __future__ import annotations

import fcntl
import os
import subprocess
import threading
import time

import pytest

from tests.debroot import REPO

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="apt-get update needs root")


def _private_update(tmp_path) -> list[str]:
    """An `apt-get update` that reads no source and writes only under ``tmp_path``."""
    lists, parts = tmp_path / "lists", tmp_path / "parts"
    (lists / "partial").mkdir(parents=True)
    parts.mkdir()
    return [
        "apt-get", "update", "-qq",
        f"-o=Dir::State::Lists={lists}",
        "-o=Dir::Etc::SourceList=/dev/null",
        f"-o=Dir::Etc::SourceParts={parts}",
    ]  # fmt: skip


def _apt_wait(cmd: list[str]) -> subprocess.CompletedProcess:
    script = 'source tests/apt_wait.sh; apt_wait "$@"'
    env = dict(os.environ, APT_WAIT_STEP="1", APT_WAIT_SECONDS="30")
    return subprocess.run(
        ["bash", "-c", script, "apt_wait", *cmd],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_waits_while_another_apt_holds_the_lists_lock(tmp_path):
    cmd = _private_update(tmp_path)
    fd = os.open(tmp_path / "lists" / "lock", os.O_RDWR | os.O_CREAT, 0o640)
    fcntl.lockf(fd, fcntl.LOCK_EX)
    release = threading.Timer(3, os.close, (fd,))  # closing the fd drops the lock
    release.start()
    started = time.monotonic()
    try:
        proc = _apt_wait(cmd)
    finally:
        release.join()
    assert proc.returncode == 0, proc.stderr
    assert "waiting for another apt or dpkg to finish (apt-get update)" in proc.stderr
    assert time.monotonic() - started >= 3


def test_other_apt_errors_fail_at_once_with_apt_s_words(tmp_path):
    cmd = _private_update(tmp_path) + ["-o=Dir::Etc::SourceList=/nonexistent/sources.list"]
    (tmp_path / "parts" / "bad.list").write_text("deb not-a-uri\n")
    proc = _apt_wait(cmd)
    assert proc.returncode != 0
    assert "waiting" not in proc.stderr
    assert "E:" in proc.stderr
