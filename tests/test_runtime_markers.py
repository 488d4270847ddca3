"""Per-container state goes when its container goes (issue 22, item 4), and a relative
runtime path resolves the same on every path. Real runc, the real front and
nvshim-runtimed: an exec marker records the low-level runtime's state root, the daemon
sweeps the markers whose container is gone (at start and periodically; never a young
one, one it cannot read as a marker or one without a root), ``nvshim doctor`` reports
those left without a daemon, and the front's runtime cache never holds a look-up that
depends on the working directory."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from nvshim.runtime.markers import state_root
from tests.conftest import run_nvshim
from tests.test_runtime_daemon import Daemon, _wait_for, creates  # noqa: F401
from tests.test_runtime_finish import RUNC
from tests.test_runtime_slots import bundle_for, create, serve, use_runtime, warm, wrapped_runc

SWEEP = ("--marker-sweep", "0.2")


def marker(c, cid: str) -> str:
    return os.path.join(c.cache_dir, "exec", cid)


def age(path: str, seconds: float = 120) -> None:
    """Make ``path`` (not a symlink's target) ``seconds`` old."""
    then = time.time() - seconds
    os.utime(path, (then, then), follow_symlinks=False)


def gone_by_runc(c, name: str) -> tuple[str, str]:
    """A GPU container created through nvshim-runtime, then deleted by runc itself (as
    after a delete that bypassed nvshim): its marker is left, made old."""
    bundle, cid = bundle_for(c, name)
    assert create(c, bundle, cid).returncode == 0, c.output(cid)
    assert c.call("delete", "--force", cid, runtime=RUNC).returncode == 0
    assert os.path.exists(marker(c, cid)) and c.state(cid) is None
    age(marker(c, cid))
    return bundle, cid


def plant(c, cid: str, data: bytes = b"", old: bool = True) -> str:
    path = marker(c, cid)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(data)
    if old:
        age(path)
    return path


def front(c, *argv: str, path: str, cwd) -> subprocess.CompletedProcess:
    """``nvshim-runtime --root R ARGV`` with ``PATH=path``, in ``cwd``."""
    return subprocess.run(
        [c.runtime, "--root", c.root, *argv], env={**c.env(), "PATH": path}, cwd=cwd,
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def doctor(c) -> dict:
    proc = run_nvshim("doctor", "--only", "exec-markers", "--json",
                      env={"NVSHIM_CACHE_DIR": c.cache_dir})  # fmt: skip
    assert proc.returncode == 0, proc.stderr  # a warning at most
    (result,) = json.loads(proc.stdout)["checks"]
    return result


# -- what a marker holds --------------------------------------------------------------


@pytest.mark.parametrize("path", ["in-process", "slot"])
def test_a_marker_holds_the_runtime_state_root(creates, path):  # noqa: F811
    daemon = serve(creates) if path == "slot" else None
    try:
        bundle, cid = bundle_for(creates, f"root-{path}")
        proc = create(creates, bundle, cid, "--pid-file", os.path.join(bundle, "pid"))
        assert proc.returncode == 0, creates.output(cid)
        with open(marker(creates, cid), "rb") as fh:
            assert fh.read() == f"{creates.root}\n".encode()
        assert creates.state(cid)["status"] == "created"
        assert os.path.isdir(os.path.join(creates.root, cid))  # what the sweep looks at
        if daemon is not None:
            assert creates.python_starts() == 0 and len(daemon.served()) == 1
    finally:
        if daemon is not None:
            assert daemon.stop() == 0


def test_the_state_root_is_known_for_runc_and_crun_only():
    """runc's and crun's defaults; another runtime's layout is not assumed (its marker
    is kept), nor a root that is relative or cannot be one line."""
    assert state_root("/run/containerd/runc/k8s.io", "/usr/sbin/runc") == (
        "/run/containerd/runc/k8s.io"
    )
    assert state_root(None, "/usr/bin/runc") == "/run/runc"  # the suite runs as root
    assert state_root(None, "rel/crun") == "/run/crun"
    for flag, runtime in [
        (None, "/usr/bin/runsc"),
        ("/run/youki", "/usr/bin/youki"),
        ("state", "/usr/sbin/runc"),
        ("", "/usr/sbin/runc"),
        ("/a\nb", "/usr/sbin/runc"),
    ]:
        assert state_root(flag, runtime) == "", (flag, runtime)


# -- the daemon sweeps markers whose container is gone ----------------------------------


def test_the_daemon_sweeps_the_markers_of_containers_that_are_gone(creates):  # noqa: F811
    """Only an old marker that names an existing root without its container goes; a
    young one (a create in flight), one without a root (an older nvshim's), one whose
    root is missing, and anything not a regular file of at most 4 KiB stay."""
    warm(creates)
    _, gone = gone_by_runc(creates, "gone")
    live_bundle, live = bundle_for(creates, "live")
    assert create(creates, live_bundle, live).returncode == 0, creates.output(live)
    age(marker(creates, live))
    kept = {
        "young": plant(creates, "young", f"{creates.root}\n".encode(), old=False),
        "no-root": plant(creates, "no-root"),
        "root-missing": plant(creates, "root-missing", f"{creates.tmp}/nowhere\n".encode()),
        "relative": plant(creates, "relative", b"runc-root\n"),
        "two-lines": plant(creates, "two-lines", f"{creates.root}\n/x\n".encode()),
        "big": plant(creates, "big", f"{creates.root}\n".encode() + b"#" * 5000),
    }
    fifo = marker(creates, "fifo")
    os.mkfifo(fifo)
    age(fifo)
    target = plant(creates, "target", f"{creates.root}\n".encode())
    os.rename(target, creates.tmp / "elsewhere")
    os.symlink(creates.tmp / "elsewhere", target)
    age(target)
    kept.update(fifo=fifo, symlink=target, live=marker(creates, live))

    daemon = Daemon(creates, "--workers", "1", "--verbose", *SWEEP)
    try:
        _wait_for(lambda: not os.path.exists(marker(creates, gone)), "the marker was not swept")
        swept = f"exec marker {gone} removed: no container {gone} in {creates.root}"
        assert swept in daemon.text()
        time.sleep(1)  # a few more sweeps
        assert [n for n, p in kept.items() if not os.path.lexists(p)] == []
        assert daemon.text().count("exec marker ") == 1
        # the daemon serves on: the next GPU create by slot, its marker written
        bundle, cid = bundle_for(creates, "after")
        creates.baseline = creates._starts()
        assert create(creates, bundle, cid).returncode == 0, creates.output(cid)
        assert creates.python_starts() == 0 and os.path.exists(marker(creates, cid))
    finally:
        assert daemon.stop() == 0


def test_the_daemon_sweeps_at_start_and_a_container_deleted_later(creates):  # noqa: F811
    _, before = gone_by_runc(creates, "before")  # in-process, no daemon yet
    live_bundle, live = bundle_for(creates, "later")
    assert create(creates, live_bundle, live).returncode == 0, creates.output(live)
    age(marker(creates, live))
    daemon = Daemon(creates, "--workers", "1", *SWEEP)
    try:
        assert not os.path.exists(marker(creates, before))  # gone before it listened
        assert os.path.exists(marker(creates, live))
        assert creates.call("delete", "--force", live, runtime=RUNC).returncode == 0
        _wait_for(lambda: not os.path.exists(marker(creates, live)), "the marker was not swept")
    finally:
        assert daemon.stop() == 0


def test_a_reused_id_renews_its_marker_and_keeps_it(creates):  # noqa: F811
    """A create of an id whose old marker was left rewrites the marker: young, and its
    container exists, so the sweep keeps it; an exec of it still gets the enforcement."""
    bundle, cid = gone_by_runc(creates, "reused")
    old = os.stat(marker(creates, cid)).st_mtime
    assert create(creates, bundle, cid).returncode == 0, creates.output(cid)
    assert os.stat(marker(creates, cid)).st_mtime > old + 60
    age(marker(creates, cid))  # old, but its container exists
    daemon = serve(creates, *SWEEP)
    try:
        time.sleep(1)
        assert os.path.exists(marker(creates, cid)) and "exec marker" not in daemon.text()
        proc = creates.call("exec", cid, "/bin/true", capture_output=True, text=True)
        assert creates.python_starts() == 1  # the marker sends it to Python
        assert "does not exist" not in proc.stderr
    finally:
        assert daemon.stop() == 0


def test_the_front_leaves_a_deleted_containers_marker_to_the_daemon(creates):  # noqa: F811
    """While nvshim-runtimed keeps its slots, the front execs a GPU container's delete and
    its marker waits for the sweep (kept while young, swept once old); a marker that
    names no state root (the sweep keeps those) is removed by the front itself, as is
    every marker without the daemon; a failed delete keeps its marker either way."""
    daemon = serve(creates, "--verbose", *SWEEP)
    try:
        ids = {}
        for name in ("swept", "no-root"):
            bundle, ids[name] = bundle_for(creates, name)
            assert create(creates, bundle, ids[name]).returncode == 0, creates.output(ids[name])
        open(marker(creates, ids["no-root"]), "w").close()  # as an older nvshim's
        for cid in ids.values():
            assert creates.call("delete", "--force", cid).returncode == 0
            assert creates.state(cid) is None
        time.sleep(0.6)  # sweeps: the young marker stays
        assert os.path.exists(marker(creates, ids["swept"]))
        assert not os.path.exists(marker(creates, ids["no-root"]))
        age(marker(creates, ids["swept"]))
        _wait_for(lambda: not os.path.exists(marker(creates, ids["swept"])), "not swept")
        swept = ids["swept"]
        assert f"exec marker {swept} removed: no container {swept} in {creates.root}" in (
            daemon.text()
        )
        assert creates.python_starts() == 0
    finally:
        assert daemon.stop() == 0
    bundle, cid = bundle_for(creates, "no-daemon")  # its slots went with it
    assert create(creates, bundle, cid).returncode == 0, creates.output(cid)
    assert os.path.exists(marker(creates, cid))
    assert creates.call("delete", cid, capture_output=True).returncode == 0  # created: no -f
    assert creates.state(cid) is None and not os.path.exists(marker(creates, cid))
    plant(creates, cid, f"{creates.root}\n".encode())
    assert creates.call("delete", cid, capture_output=True).returncode != 0  # not runc's
    assert os.path.exists(marker(creates, cid))


# -- without the daemon: nvshim doctor says what is left and how to clear it ----------------


def test_doctor_reports_markers_that_outlived_their_container(creates):  # noqa: F811
    assert doctor(creates)["status"] == "ok"  # none yet
    _, gone = gone_by_runc(creates, "doctor")
    plant(creates, "older-nvshim")
    result = doctor(creates)
    path = marker(creates, gone)
    assert result["status"] == "warn", result
    assert result["reason"] == (
        f"1 exec marker(s) in {os.path.dirname(path)} outlived their container (e.g. {gone}:"
        f" no {os.path.join(creates.root, gone)}); 1 name no state root (an older nvshim's,"
        " or another runtime's): they go when their container is deleted through"
        " nvshim-runtime, or at reboot"
    )
    assert result["fix"] == f"start nvshim-runtimed (it removes them), or rm -f -- {path}"
    daemon = Daemon(creates, "--workers", "1")
    try:
        result = doctor(creates)
        assert result["status"] == "ok" and result["reason"].startswith(
            f"1 exec marker(s) in {os.path.dirname(path)}, none stale; 1 name no state root"
        ), result
        _, later = gone_by_runc(creates, "doctor-later")  # after its sweep at start
        result = doctor(creates)  # the daemon's next sweep takes it: no warning
        assert result["status"] == "ok" and result["reason"].startswith(
            f"1 exec marker(s) in {os.path.dirname(path)} of containers that are gone,"
            " for nvshim-runtimed's next sweep; 1 name no state root"
        ), result
        assert os.path.exists(marker(creates, later))
    finally:
        assert daemon.stop() == 0


# -- relative runtime paths: the same runtime on every path -----------------------------


def test_a_relative_path_entry_is_looked_up_in_each_directory(creates, tmp_path):  # noqa: F811
    """``PATH=rel:/abs``: in a directory without ``rel/runc`` the runtime is
    ``/abs/runc``, in one with it ``rel/runc``, call after call (the front's cache, keyed
    by PATH, must not carry one directory's answer to another); an absolute PATH is
    still answered by the front alone."""
    log = tmp_path / "which"
    (tmp_path / "abs").mkdir()
    wrapped_runc(tmp_path / "abs" / "runc", f"echo abs >> {log}")
    (tmp_path / "plain").mkdir()
    (tmp_path / "with-rel" / "rel").mkdir(parents=True)
    wrapped_runc(tmp_path / "with-rel" / "rel" / "runc", f"echo rel >> {log}")
    use_runtime(creates, "runc")
    warm(creates)
    for cwd in ("plain", "with-rel", "plain", "with-rel"):
        proc = front(creates, "list", path=f"rel:{tmp_path}/abs", cwd=tmp_path / cwd)
        assert proc.returncode == 0, proc.stderr
    assert log.read_text().split() == ["abs", "rel", "abs", "rel"]
    assert creates.python_starts() == 4  # never answered from the cache
    with open(os.path.join(creates.cache_dir, "runtime-front")) as fh:
        assert "rel:" not in fh.read()
    for cwd in ("plain", "with-rel"):
        proc = front(creates, "list", path=f"{tmp_path}/abs", cwd=tmp_path / cwd)
        assert proc.returncode == 0, proc.stderr
    assert log.read_text().split()[4:] == ["abs", "abs"]
    assert creates.python_starts() == 5  # the first one wrote the pair


def test_a_planted_relative_pair_is_not_used(creates, tmp_path):  # noqa: F811
    """A cache entry holding a relative runtime (as an older nvshim wrote) is not
    exec'd by the front: Python does the call, and drops the pair."""
    use_runtime(creates, "runc")
    warm(creates)
    entry = os.path.join(creates.cache_dir, "runtime-front")
    lines = open(entry).read().split("\n")
    (tmp_path / "rel").mkdir()
    wrapped_runc(tmp_path / "rel" / "runc", f"echo planted >> {tmp_path / 'which'}")
    with open(entry, "w") as fh:  # the head, the planted pair, then the trigger words
        fh.write("\n".join([*lines[:3], "rel", "rel/runc", *lines[lines.index("", 3) :]]))
    proc = front(creates, "list", path="rel", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert creates.python_starts() == 1  # the front did not take rel/runc from the file
    assert (tmp_path / "which").read_text().split() == ["planted"]  # Python's own look-up
    assert "rel/runc" not in open(entry).read()


@pytest.mark.parametrize("path", ["in-process", "daemon"])
def test_a_delete_that_reaches_python_removes_the_marker(creates, tmp_path, path):  # noqa: F811
    """With a relative ``PATH`` entry every call starts Python, deletes included: a
    delete that succeeds removes the marker there too (in-process and through the
    daemon's socket); one that fails keeps it."""
    use_runtime(creates, "runc")
    daemon = serve(creates) if path == "daemon" else None
    try:
        bundle, cid = bundle_for(creates, f"py-delete-{path}")
        assert create(creates, bundle, cid).returncode == 0, creates.output(cid)
        assert os.path.exists(marker(creates, cid))
        starts = creates.python_starts()
        relative = f"rel:{os.path.dirname(RUNC)}"
        proc = front(creates, "delete", "--force", cid, path=relative, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert creates.state(cid) is None and not os.path.exists(marker(creates, cid))
        assert creates.python_starts() == starts + 1
        stale = plant(creates, "no-such-container", f"{creates.root}\n".encode())
        proc = front(creates, "delete", "no-such-container", path=relative, cwd=tmp_path)
        assert proc.returncode == 1 and "does not exist" in proc.stderr
        assert os.path.exists(stale)
        if daemon is not None:
            assert [c for c in daemon.served() if " delete " in f" {c} "] != []
    finally:
        if daemon is not None:
            assert daemon.stop() == 0
