"""Creates as the benches take them: an nvshim package made runnable, one timed create."""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import subprocess
import sys
import time

from bench.runtime_start import write_bench_config
from nvshim.launch import import_roots
from tests.runc_util import start_daemon

RUNC = shutil.which("runc") or "/usr/sbin/runc"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def timed_create(runtime: str, state: str, bundle: str, cid: str, env: dict[str, str]) -> float:
    """Wall time of ``runtime create`` of ``bundle`` with a pid file, as engines call it.
    The container is then deleted with runc and the bundle removed (not timed)."""
    errors = os.path.join(os.path.dirname(bundle), f"{cid}.err")
    with open(errors, "w") as err:  # a file: the created process keeps its stdio open
        start = time.perf_counter()
        proc = subprocess.run(
            [runtime, "--root", state, "create", "--pid-file", os.path.join(bundle, "pid"),
             "--bundle", bundle, cid],
            env=env, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
        )  # fmt: skip
        elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{runtime} create: {open(errors).read().strip()}")
    os.unlink(errors)
    subprocess.run([RUNC, "--root", state, "delete", "--force", cid], check=True)
    shutil.rmtree(bundle)
    return elapsed


def roots(root: str) -> list[str]:
    """``sys.path`` for the nvshim package under ``root``: ``root``, then where this
    interpreter finds nvshim's dependencies (a venv, or a carried ``site``)."""
    return list(dict.fromkeys([root, *import_roots()]))


def _in_tree(path: list[str], code: str, *args: str, env: dict[str, str] | None = None) -> None:
    """Run ``code`` in a fresh interpreter that imports from ``path`` first (an nvshim tree
    and its dependencies: ``path`` there), its arguments ``sys.argv[2:]``."""
    prefix = "import sys; path = sys.argv[1].split(':'); sys.path[:0] = path; "
    subprocess.run([sys.executable, "-I", "-c", prefix + code, ":".join(path), *args],
                   env=env, check=True)  # fmt: skip


def _write_launchers(bin_dir: str, path: list[str], cache_dir: str) -> None:
    """The launchers of the nvshim package first on ``path``, written by that package
    (an earlier tree's front and launcher code, not this one's)."""
    code = ("from nvshim.launch import write_launchers; "
            "write_launchers(sys.argv[2], roots=path, cache_dir=sys.argv[3])")  # fmt: skip
    _in_tree(path, code, bin_dir, cache_dir)


def installed(work: str, name: str, root: str, sim) -> tuple[str, dict[str, str]]:
    """Launchers and a config for the nvshim package under ``root``: (runtime, env). Its
    low-level runtime is ``RUNC``, the benches' bare runc (wherever it was found)."""
    directory = os.path.join(work, name)
    bin_dir = os.path.join(directory, "bin")
    os.makedirs(directory, exist_ok=True)
    _write_launchers(bin_dir, roots(root), os.path.join(directory, "cache"))
    config = write_bench_config(directory, sim, bin_dir, f"runtimes = [{RUNC!r}]\n")
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "NVSHIM_CONFIG": config}
    return os.path.join(bin_dir, "nvshim-runtime"), env


@contextlib.contextmanager
def running_daemon(bin_dir: str, env: dict[str, str], prefix: tuple[str, ...] = ()):
    """``nvshim-runtimed`` of the launchers in ``bin_dir``, listening (stopped at exit);
    its messages go to ``nvshim-runtimed-<pid>.err`` beside ``bin_dir``. ``prefix``: a
    command it runs under (``nsenter`` into an engine's mount namespace)."""
    log = os.path.join(os.path.dirname(bin_dir), f"nvshim-runtimed-{os.getpid()}-{len(prefix)}.err")
    try:
        proc = start_daemon(bin_dir, env, log, "--verbose", prefix=prefix)
    except RuntimeError as err:
        raise SystemExit(str(err)) from None
    _account(proc.pid)
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        _release(proc.pid)
        lines = open(log).read().splitlines()
        declined = [ln for ln in lines if "declined:" in ln]
        slot = sum(" by slot " in ln and " served: " in ln for ln in lines)
        sock = sum(" by socket served: " in ln for ln in lines)
        print(f"nvshim-runtimed served {slot} calls by slot, {sock} by socket, declined "
              f"{len(declined)}", file=sys.stderr)  # fmt: skip
        reasons: dict[str, int] = {}  # those calls ran in-process: the figures mix both paths
        for line in declined:
            why = line.split("declined: ", 1)[1].split(" (")[0]
            why = " ".join(w for w in why.split() if not w.isdigit())
            reasons[why] = reasons.get(why, 0) + 1
        for why, count in sorted(reasons.items(), key=lambda item: -item[1]):
            print(f"  declined {count}: {why}", file=sys.stderr)


def children_cpu() -> float:
    """CPU seconds of this process's reaped children (the runtimes it ran)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# (hierarchy, a file only it has, the usage file, its unit in seconds): cgroup v1's
# cpuacct, else v2 (its cpu.stat is there without any controller)
CGROUPS = (("/sys/fs/cgroup/cpuacct", "cpuacct.usage", "cpuacct.usage", 1e-9),
           ("/sys/fs/cgroup", "cgroup.controllers", "cpu.stat", 1e-6))  # fmt: skip
_GROUPS: dict[int, tuple[str, str, float]] = {}  # a daemon's pid -> its cgroup, as made


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants."""
    return [pid, *(p for c in _children(pid) for p in _tree(c))]


def _account(pid: int) -> None:
    """Put the daemon ``pid`` and its workers in a cgroup of their own (kept in
    ``_GROUPS``), so that ``daemon_cpu`` reads their CPU exactly (with whatever they
    fork later, and the threads that ended); where none can be made, 10 ms ticks are
    read."""
    for top, marker, usage, unit in CGROUPS:
        if not os.path.exists(os.path.join(top, marker)):
            continue
        group = os.path.join(top, f"nvshim-bench-{pid}")
        try:
            os.mkdir(group)
            for p in _tree(pid):  # the parent first: what it forks meanwhile follows it
                with open(os.path.join(group, "cgroup.procs"), "w") as fh:
                    fh.write(str(p))
        except OSError:
            with contextlib.suppress(OSError):
                os.rmdir(group)
            continue
        _GROUPS[pid] = (group, usage, unit)
        return


def _release(pid: int) -> None:
    """Remove the daemon's cgroup, if ``_account`` made one, once its processes are
    gone (a few tries)."""
    group = _GROUPS.pop(pid, None)
    for _ in range(50) if group else ():
        try:
            os.rmdir(group[0])
            return
        except OSError:  # EBUSY while a worker is still exiting
            time.sleep(0.1)


def daemon_cpu(pid: int) -> float:
    """CPU seconds of the daemon ``pid``, its workers (with the children they reaped:
    the ld-cache step's ldconfig) and those it reaped: exact from its cgroup
    (``running_daemon``), else from 10 ms ticks of the live processes."""
    if pid in _GROUPS:
        group, usage, unit = _GROUPS[pid]
        text = open(os.path.join(group, usage)).read()
        if usage == "cpu.stat":  # "usage_usec N" first
            text = text.split("usage_usec", 1)[1].split()[0]
        return int(text) * unit

    def times(p: int) -> float:
        try:
            fields = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        ticks = sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
        return ticks / os.sysconf("SC_CLK_TCK")

    return times(pid) + sum(times(c) for c in _children(pid))


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    try:
        return [int(c) for c in open(f"/proc/{pid}/task/{pid}/children").read().split()]
    except FileNotFoundError:  # a kernel without CONFIG_PROC_CHILDREN: the parents in stat
        return [int(p) for p in os.listdir("/proc") if p.isdigit() and _parent(p) == pid]


def _parent(pid: str) -> int:
    """The parent of process ``pid`` (0 when it is gone)."""
    try:
        return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def edited_bundle(bundle: str, cid: str, env: dict[str, str]) -> None:
    """Have nvshim edit ``bundle`` for its GPU request, as a create would (not timed), with
    the driver's binds in the spec as well, as NVIDIA's CDI spec has runc make them
    (nvshim's create attaches them itself): bare runc then creates the same container,
    without the finishing steps. What any injecting runtime has runc do for a GPU."""
    code = "from bench.runc_edits import edit; edit(*sys.argv[2:])"
    _in_tree(roots(REPO), code, bundle, cid, env=env)
