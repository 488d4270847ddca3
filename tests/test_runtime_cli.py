"""nvshim-runtime's command line is runc's: the parser against runc's own behaviour, the
same argument vectors through runc and through nvshim-runtime, and the sh front (which
calls reach Python, and that a create is never handed to runc unedited)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time

import pytest

from nvshim.launch import real_interpreter, write_launchers
from nvshim.runtime.args import parse_runc_args
from tests.conftest import write_config
from tests.runc_util import RUNC_ENV, make_bundle, make_busybox_rootfs, runc_run

GPU_ENV = {"NVIDIA_VISIBLE_DEVICES": "0"}
# by path, as nvshim-runtime execs it (runc names its argv[0] in some messages)
RUNC = shutil.which("runc") or "/usr/sbin/runc"


@pytest.mark.parametrize(
    "argv, action, bundle, cid",
    [
        (["create", "--bundle", "B", "id"], "create", "B", "id"),
        (["create", "-b=B", "id"], "create", "B", "id"),
        (["create", "--bundle=B", "id"], "create", "B", "id"),
        (["create", "-bundle", "B", "id"], "create", "B", "id"),
        (["create", "--b", "B", "id"], "create", "B", "id"),
        (["create", "id", "-b", "B"], "create", "B", "id"),  # flags after the id move ahead
        (["run", "--pid-file=P", "-d", "--bundle", "B", "id"], "run", "B", "id"),
        (["run", "-d", "id", "--bundle", "B"], "error", None, "id"),  # -d takes 'id' along
        (["--root", "create", "create", "run"], "create", None, "run"),
        (["--root=R", "--debug", "run", "create"], "run", None, "create"),
        (["--debug=false", "--", "create", "x"], "create", None, "x"),
        (["create", "--", "x"], "create", None, "x"),
        (["create", "-b", "B", "--", "x", "-b", "C"], "error", "B", "x"),
        (["create", "--pid-file", "--bundle", "B", "id"], "error", None, "B"),
        (["create", "-b", "B", "--bundle", "C", "id"], "error", None, None),
        (["create", "-db", "x"], "error", None, None),  # no combined short flags
        (["create", "x", "--help"], "help", None, "x"),
        (["create", "-help"], "help", None, None),
        (["create", "--help=false", "x"], "create", None, "x"),
        (["create", "--help=maybe", "x"], "error", None, None),
        (["create", "-h", "--help", "x"], "error", None, None),
        (["--help", "create", "x"], "help", None, None),
        (["-v"], "version", None, None),
        (["--version=0", "list"], "other", None, None),
        (["create", "-b"], "error", None, None),
        (["create", "---bundle", "B", "x"], "error", None, None),
        (["create", ""], "error", None, ""),
        (["create"], "error", None, None),
        (["create", "a", "b"], "error", None, "a"),
        (["exec", "x", "-h"], "exec", None, "x"),  # exec: flags after the id are the command's
        (["exec", "-h", "x"], "help", None, "x"),
        (["exec", "--cwd", "--", "x", "ls"], "exec", None, "x"),
        (["list", "--root", "R"], "other", None, None),
    ],
)
def test_parse_like_runc(argv, action, bundle, cid):
    args = parse_runc_args(argv)
    assert args.action == action
    if action not in ("error", "help", "version", "other"):
        assert (args.bundle, args.container_id) == (bundle, cid)


def test_exec_flag_spans():
    argv = ["--root", "R", "exec", "-e", "A=1", "--process=/p", "-t", "--", "ctr", "sh"]
    args = parse_runc_args(argv)
    assert args.action == "exec" and args.container_id == "ctr"
    assert args.values("env") == ["A=1"] and args.value("process") == "/p"
    assert argv[args.flags_end] == "--" and args.positional == ["ctr", "sh"]
    spans = [(f.name, argv[f.start : f.end]) for f in args.flags]
    assert spans == [("env", ["-e", "A=1"]), ("process", ["--process=/p"]), ("tty", ["-t"])]


# --- the same argument vectors through runc and nvshim-runtime ------------------------

COMMANDS = (
    "checkpoint create delete events exec kill list pause ps restore resume run spec start"
    " state update features help"
).split()
FORMS = (
    ["--help"],
    ["-h"],
    ["-help"],
    ["--help=true"],
    ["--help=false", "no-such-ctr"],
    ["no-such-ctr", "--help"],
    ["no-such-ctr"],
    ["--bogus", "no-such-ctr"],
    ["-db", "no-such-ctr"],
    ["-h", "--help"],
    ["--", "--help"],
)
GLOBAL_FORMS = (
    [],
    ["--debug"],
    ["--log-format=json"],
    ["--debug=false", "--systemd-cgroup=0"],
    ["--"],
)
TIME = re.compile(r'time="[^"]*"')


# these would create a container (id "no-such-ctr" or "--help"): not for this test
VALID_CREATES = (["no-such-ctr"], ["--help=false", "no-such-ctr"], ["--", "--help"])


def _vectors():
    for command in COMMANDS:
        for form in FORMS:
            if command not in ("create", "run") or form not in VALID_CREATES:
                yield [command, *form]
    for globals_ in GLOBAL_FORMS:
        yield [*globals_, "state", "no-such-ctr"]
    yield from (
        ["--help"],
        ["-h", "create"],
        ["--help=maybe", "list"],
        ["--bogus"],
        ["no-such-command"],
        [],
        ["list", "--root", "/x"],
        ["create", "-b=."],
        ["run", "--bundle=.", "a", "b"],
        ["create", "--pid-file"],
        ["exec", "-p"],
        ["exec", "--bogus=1", "no-such-ctr", "ls"],
        ["-v", "--version"],
    )


@pytest.fixture(scope="module")
def gpu_bundle_dir(tmp_path_factory, sim_hosts, launchers):
    tmp = tmp_path_factory.mktemp("fidelity")
    rootfs = make_busybox_rootfs(tmp / "rootfs")
    bundle = make_bundle(tmp, rootfs, ["true"], env=GPU_ENV, name="bundle")
    config = write_config(
        tmp / "config.toml",
        sim_hosts("single"),
        launchers,
        tmp / "state",
        tmp / "nvshim.log",
        accept_env_unprivileged=True,
    )
    return tmp, bundle, config


def _call(binary: str, argv: list[str], cwd: str, root: str, config: str):
    env = {**RUNC_ENV, "NVSHIM_CONFIG": config}
    proc = subprocess.run(
        [binary, "--root", root, *argv] if argv[:1] != ["--root"] else [binary, *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    return proc.returncode, proc.stdout, TIME.sub("time=T", proc.stderr)


def test_same_result_as_runc_and_gpu_bundle_untouched(gpu_bundle_dir, launchers):
    """Every vector: runc's exit code, stdout and stderr; the GPU bundle in the working
    directory (and named by -b) is byte-identical afterwards, the log has no line."""
    tmp, bundle, config = gpu_bundle_dir
    runtime = os.path.join(launchers, "nvshim-runtime")
    before = open(os.path.join(bundle, "config.json"), "rb").read()
    root = str(tmp / "runc-root")
    os.makedirs(root, exist_ok=True)
    for argv in _vectors():
        theirs = _call(RUNC, argv, bundle, root, config)
        ours = _call(runtime, argv, bundle, root, config)
        assert ours == theirs, argv
        after = open(os.path.join(bundle, "config.json"), "rb").read()
        assert after == before, argv
    assert not (tmp / "nvshim.log").exists()
    assert os.listdir(root) == []  # nothing was created


def test_version_names_nvshim_then_runc(gpu_bundle_dir, launchers):
    tmp, bundle, config = gpu_bundle_dir
    runtime = os.path.join(launchers, "nvshim-runtime")
    from nvshim import __version__

    for flag in ("--version", "-v", "-version"):
        code, out, err = _call(runtime, [flag], str(tmp), str(tmp), config)
        theirs = _call(RUNC, [flag], str(tmp), str(tmp), config)
        assert code == 0 and err == ""
        assert out == f"nvshim-runtime version {__version__}\n" + theirs[1]
    hook = subprocess.run(
        [os.path.join(launchers, "nvshim-hook"), "--version"], capture_output=True, text=True
    )
    assert hook.returncode == 0 and hook.stdout == f"nvshim-hook version {__version__}\n"


# --- the front: which calls start Python, and creates always edited ----------------------

_COUNTER = """#!/bin/sh
echo start >> {log}
exec {python} "$@"
"""
_FAKE_RUNC = """#!/bin/sh
# records each call and whether the bundle was already edited when runc saw it
if grep -q nvshim.io/injected {bundle}/config.json; then s=edited; else s=plain; fi
printf '%s %s\\n' "$s" "$*" >> {log}
"""


def counting_runtime(tmp_path, host, compiled: bool | None = None):
    """``nvshim-runtime`` (in ``tmp_path/bin``) whose interpreter records every start in
    a file, with a config for the simulated ``host`` and a cache directory of its own
    (exec markers and the front's cache of one test). Returns the runtime, that file,
    the environment to call it with (config and cache directory named) and the config.
    ``compiled``: the compiled front (True), the sh front (False), whichever is built."""
    log = tmp_path / "python-starts"
    counter = tmp_path / "python"
    counter.write_text(_COUNTER.format(log=log, python=real_interpreter()))
    counter.chmod(0o755)
    bin_dir = str(tmp_path / "bin")
    cache = str(tmp_path / "cache")
    write_launchers(bin_dir, interpreter=str(counter), cache_dir=cache, compiled=compiled)
    config = write_config(
        tmp_path / "config.toml",
        host,
        bin_dir,
        tmp_path / "state",
        tmp_path / "nvshim.log",
        accept_env_unprivileged=True,
    )
    env = {**RUNC_ENV, "NVSHIM_CACHE_DIR": cache, "NVSHIM_CONFIG": config}
    return os.path.join(bin_dir, "nvshim-runtime"), log, env, config


def count_lines(path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.fixture(params=["compiled", "sh"])
def front(request, tmp_path, sim_hosts):
    """Launchers whose interpreter records every start, a fake low-level runtime that
    records every call, and bundles (a GPU bundle unless told otherwise); every test of
    the front runs on the compiled front and on the sh front."""
    compiled = request.param == "compiled"
    runtime, log, base_env, config = counting_runtime(tmp_path, sim_hosts("single"), compiled)
    rootfs = make_busybox_rootfs(tmp_path / "rootfs")
    calls = tmp_path / "runc-calls"
    fake = tmp_path / "fake-runc"

    class Front:
        cache = base_env["NVSHIM_CACHE_DIR"]

        def bundle(self, name, env=GPU_ENV, **kw):
            """A bundle (``make_bundle``'s keywords); the fake runtime checks it."""
            path = make_bundle(tmp_path, rootfs, ["true"], env=env, name=name, **kw)
            fake.write_text(_FAKE_RUNC.format(bundle=path, log=calls))
            fake.chmod(0o755)
            return path

        def call(self, *argv, cwd=None):
            return subprocess.run(
                [self.runtime, *argv],
                env=base_env,
                cwd=cwd,
                capture_output=True,
                text=True,
                timeout=60,
            )

        def starts(self) -> int:
            return count_lines(log)

        def calls(self) -> list[str]:
            return calls.read_text().splitlines() if calls.exists() else []

        def configure(self, text: str) -> None:
            """Append to the config file (the front's cache misses: not newer)."""
            with open(self.config, "a") as fh:
                fh.write(text)

    text = open(config).read().replace("[runtime]\n", f'[runtime]\nruntimes = ["{fake}"]\n')
    with open(config, "w") as fh:
        fh.write(text)
    past = os.stat(config).st_mtime_ns - 10 * 10**9  # an entry written now is settled
    os.utime(config, ns=(past, past))
    f = Front()
    f.runtime, f.config = runtime, config
    return f


def test_pass_through_calls_never_start_python(front, tmp_path):
    front.bundle("b")
    assert front.call("--root", str(tmp_path), "list").returncode == 0
    assert front.starts() == 1  # the first call resolves the runtime and caches it
    vectors = [
        ["list"],
        ["--root", str(tmp_path), "state", "create"],
        ["--root=/r", "--log", "run", "delete", "--force", "run"],
        ["kill", "create", "KILL"],
        ["start", "x"],
        ["exec", "-e", "A=1", "--tty", "unprepared", "sh"],
        ["exec", "--", "unprepared"],
        ["--version"],
        ["-h"],
        ["exec", "-h", "x"],
        ["--", "ps", "x"],
    ]
    for argv in vectors:
        front.call(*argv)
    assert front.starts() == 1
    assert front.calls()[-len(vectors) :] == [f"plain {' '.join(v)}" for v in vectors]


# create/run lines in the forms the front reads itself ({b}: the bundle)
CREATE_FORMS = [
    ["create", "--bundle", "{b}", "create"],
    ["create", "run", "--bundle", "{b}"],
    ["create", "-b={b}", "run"],
    ["create", "--bundle={b}", "--pid-file=/p", "x"],
    ["--root", "/r", "--debug", "create", "-b", "{b}", "x"],
    ["--root=create", "run", "-d", "--bundle", "{b}", "x"],
    ["--", "create", "--b", "{b}", "x"],
    ["run", "--bundle", "{b}", "--", "x"],
    ["create", "--console-socket", "/s", "x", "-b", "{b}"],
]


@pytest.mark.parametrize(
    "argv",
    [
        *CREATE_FORMS,
        ["--debug=true", "create", "-bundle", "{b}", "x"],
        ["run", "--no-pivot=true", "--bundle", "{b}", "--", "x"],
    ],
)
def test_create_never_reaches_runc_unedited(front, argv):
    bundle = front.bundle("b")
    argv = [a.replace("{b}", bundle) for a in argv]
    proc = front.call(*argv)
    # then a create runs the finishing steps, which the fake runtime's "container" (it
    # has none) fails: what counts is the first call
    assert front.calls()[0] == f"edited {' '.join(argv)}", proc.stderr


def test_create_in_the_working_directory_is_edited(front):
    bundle = front.bundle("b")
    front.call("run", "--no-pivot=true", "x", cwd=bundle)
    assert front.calls()[-1].startswith("edited ")


def test_help_never_reads_the_bundle(front):
    bundle = front.bundle("b")
    before = open(os.path.join(bundle, "config.json"), "rb").read()
    for argv in (["create", "--help"], ["run", "-h", "x"], ["create", "x", "-help=1"]):
        front.call(*argv, "-b", bundle)
        assert front.calls()[-1].startswith("plain ")
    assert open(os.path.join(bundle, "config.json"), "rb").read() == before


def test_front_cache_follows_config_and_path(front, tmp_path):
    front.bundle("b")
    front.call("list")
    assert front.starts() == 1
    with open(front.config, "a") as fh:
        fh.write("# edited\n")
    front.call("list")
    assert front.starts() == 2  # the config changed: Python resolved again
    front.call("list")
    assert front.starts() == 2
    env = {
        **RUNC_ENV,
        "NVSHIM_CACHE_DIR": front.cache,
        "NVSHIM_CONFIG": front.config,
        "PATH": "/usr/bin:/bin",
    }
    subprocess.run([front.runtime, "list"], env=env, capture_output=True)
    assert front.starts() == 3  # another PATH
    front.call("list")
    subprocess.run([front.runtime, "list"], env=env, capture_output=True)
    assert front.starts() == 3  # both PATHs are remembered (engines call with their own)
    assert json.dumps(front.calls()).count("list") == 6


def test_front_ignores_a_cache_it_cannot_trust(front):
    """A cache entry owned by someone else, or a symlink, is never used."""
    front.bundle("b")
    front.call("list")
    entry = os.path.join(front.cache, "runtime-front")
    starts = front.starts()
    os.chown(entry, 65534, 65534)
    front.call("list")
    assert front.starts() == starts + 1  # Python resolved it and wrote its own entry
    assert os.stat(entry).st_uid == os.geteuid()
    os.rename(entry, entry + ".real")
    os.symlink(entry + ".real", entry)
    try:
        front.call("list")
        assert front.starts() == starts + 2
    finally:
        if os.path.islink(entry):
            os.unlink(entry)
            os.rename(entry + ".real", entry)


# --- the front: a create/run that cannot ask for a GPU never starts Python ----------------

NO_GPU_FORMS = [
    *CREATE_FORMS,
    ["run", "-bundle={b}", "--keep", "--no-subreaper", "--preserve-fds", "0", "x"],
    ["create", "--pid-file", "-b", "--bundle", "{b}", "x"],  # '-b' is the pid file
    ["create", "-b", "{b}", "--", "-"],
]


@pytest.mark.parametrize("argv", NO_GPU_FORMS)
def test_no_gpu_create_is_exec_d_without_python(front, argv):
    bundle = front.bundle("b", env={"CUDA_VISIBLE_DEVICES": "0", "HOME": "/root"})
    before = open(os.path.join(bundle, "config.json"), "rb").read()
    front.call("list")
    assert front.starts() == 1
    argv = [a.replace("{b}", bundle) for a in argv]
    proc = front.call(*argv)
    assert proc.returncode == 0, proc.stderr
    assert front.calls()[-1] == f"plain {' '.join(argv)}"
    assert front.starts() == 1
    assert open(os.path.join(bundle, "config.json"), "rb").read() == before


def test_no_gpu_create_in_the_working_directory(front):
    bundle = front.bundle("b", env={})
    front.call("list")
    front.call("run", "--no-pivot", "x", cwd=bundle)
    front.call("create", "-b=", "y", cwd=bundle)  # an empty bundle is the working directory
    assert front.calls()[-2:] == ["plain run --no-pivot x", "plain create -b= y"]
    assert front.starts() == 1


@pytest.mark.parametrize(
    "argv",
    [
        ["create", "--no-pivot=true", "-b", "{b}", "x"],  # '=BOOL' forms
        ["create", "-d", "-b", "{b}", "x"],  # a run flag: runc refuses it for create
        ["create", "--bogus", "-b", "{b}", "x"],
        ["create", "-b", "{b}", "--bundle", "{b}", "x"],  # two forms: runc's error
        ["create", "-b", "{b}", "x", "y"],
        ["create", "-b", "{b}"],
        ["create", "-b", "{b}", ".."],
        ["-v", "create", "-b", "{b}", "x"],
    ],
)
def test_doubtful_no_gpu_lines_go_to_python(front, argv):
    """What the front cannot classify goes to Python, which hands runc the same line."""
    bundle = front.bundle("b", env={})
    front.call("list")
    front.call(*[a.replace("{b}", bundle) for a in argv])
    assert front.starts() == 2
    assert all(c.startswith("plain ") for c in front.calls())


GPU_ASKS = {
    "env": {"env": GPU_ENV},
    "legacy CUDA image": {"env": {"CUDA_VERSION": "12.2"}},
    "CDI annotation": {"annotations": {"cdi.k8s.io/x": "nvidia.com/gpu=0"}},
    "device mount": {
        "mounts": [
            {
                "destination": "/var/run/nvidia-container-devices/0",
                "type": "bind",
                "source": "/dev/null",
                "options": ["ro"],
            }
        ]
    },
    "rdma pairing": {"env": GPU_ENV, "annotations": {"nvshim.io/rdma": "false"}},
}


@pytest.mark.parametrize("ask", GPU_ASKS.values(), ids=GPU_ASKS.keys())
@pytest.mark.parametrize("argv", NO_GPU_FORMS[:6])
def test_gpu_create_is_never_passed_unedited(front, ask, argv):
    """With the front's cache warm, every way of asking for a GPU still reaches Python."""
    bundle = front.bundle("b", **{"env": {}, **ask})
    front.call("list")
    argv = [a.replace("{b}", bundle) for a in argv]
    front.call(*argv)
    assert front.starts() == 2
    assert front.calls()[1] == f"edited {' '.join(argv)}"


@pytest.mark.parametrize(
    "raw, new",
    [
        ('"NVIDIA_VISIBLE_DEVICES=0"', '"NVIDIA\\u005fVISIBLE_DEVICES=0"'),
        ('"nvidia.com/gpu=0"', '"nvidia.com\\/gpu=0"'),
        ('"nvidia.com/gpu=0"', '"\\u006evidia.com/gpu=0"'),
        ('"/var/run/nvidia-container-devices/0"', '"/var/run/nvidia-container\\u002ddevices/0"'),
    ],
)
def test_escaped_requests_go_to_python(front, raw, new):
    """A JSON escape can hide a word from grep: Python decodes it and edits the bundle."""
    ask = GPU_ASKS["CDI annotation" if "gpu=" in raw else "env"]
    if "devices/0" in raw:
        ask = GPU_ASKS["device mount"]
    bundle = front.bundle("b", **{"env": {}, **ask})
    path = os.path.join(bundle, "config.json")
    text = open(path).read()
    assert raw in text
    with open(path, "w") as fh:
        fh.write(text.replace(raw, new))
    front.call("list")
    front.call("create", "-b", bundle, "x")
    assert front.starts() == 2
    assert front.calls()[1] == f"edited create -b {bundle} x"


def test_unreadable_config_json_goes_to_python(front, tmp_path):
    """A FIFO, a directory, a dangling link, a file grep cannot read: Python decides (and
    refuses them), never a hang."""
    front.bundle("b", env={})
    front.call("list")
    assert front.starts() == 1
    cases = {
        "fifo": lambda p: os.mkfifo(p),
        "dir": lambda p: os.mkdir(p),
        "dangling": lambda p: os.symlink(str(tmp_path / "nowhere"), p),
        "eio": lambda p: os.symlink("/proc/self/mem", p),  # a regular file: read fails
        "missing": lambda p: None,
    }
    for n, (name, make) in enumerate(cases.items(), start=2):
        bundle = tmp_path / name
        bundle.mkdir()
        make(str(bundle / "config.json"))
        proc = front.call("create", "-b", str(bundle), "x")
        assert proc.returncode == 1 and "config.json" in proc.stderr, name
        assert front.starts() == n, name
    assert front.calls() == ["plain list"]


def test_stale_exec_marker_goes_to_python(front):
    """A no-GPU container reusing the id of one nvshim prepared: Python drops the marker
    (an exec would otherwise start Python for nothing)."""
    bundle = front.bundle("b", env={})
    front.call("list")
    marker = os.path.join(front.cache, "exec", "reused-id")
    os.makedirs(os.path.dirname(marker), exist_ok=True)
    open(marker, "w").close()
    front.call("create", "-b", bundle, "reused-id")
    assert front.starts() == 2 and not os.path.exists(marker)
    front.call("create", "-b", bundle, "reused-id")
    assert front.starts() == 2
    assert front.calls()[1:] == [f"plain create -b {bundle} reused-id"] * 2


def test_configured_cdi_kind_follows_config_edits(front):
    """A CDI annotation of any vendor goes to Python (issue 27: no CDI request dropped): a
    name no spec defines is refused; once the config makes it nvshim's own kind, the same
    create is edited; the front's refreshed cache still passes a no-GPU create through."""
    bundle = front.bundle("b", env={}, annotations={"cdi.k8s.io/x": "acme.io/accel=0"})
    front.call("list")
    assert front.starts() == 1  # the list through Python wrote the front's cache
    refused = front.call("create", "-b", bundle, "x")
    assert refused.returncode != 0 and "acme.io/accel=0" in refused.stderr, refused.stderr
    assert (front.starts(), front.calls()[-1]) == (2, "plain list")  # runc never created it
    front.configure('cdi-vendor = "acme.io"\ncdi-class = "accel"\n')
    front.call("create", "-b", bundle, "x")
    assert (front.starts(), front.calls()[1]) == (3, f"edited create -b {bundle} x")
    # that create refreshed the front's cache: the next no-GPU create needs no Python
    plain = front.bundle("c", env={})
    front.call("create", "-b", plain, "y")
    assert (front.starts(), front.calls()[-1]) == (3, f"plain create -b {plain} y")


def test_a_trigger_word_holding_a_newline_leaves_no_cache(front):
    """A configured CDI annotation prefix holding a newline would end its line in the
    front's cache: none is written, every call starts Python and is still done."""
    text = (
        open(front.config)
        .read()
        .replace("[policy]\n", '[policy]\ncdi-annotation-prefixes = ["cdi.k8s.io/", "x\\ny/"]\n')
    )
    with open(front.config, "w") as fh:
        fh.write(text)
    past = os.stat(front.config).st_mtime_ns - 10 * 10**9
    os.utime(front.config, ns=(past, past))
    front.bundle("b")
    for n in (1, 2):
        assert front.call("list").returncode == 0
        assert front.starts() == n
    assert not os.path.exists(os.path.join(front.cache, "runtime-front"))
    assert front.calls() == ["plain list", "plain list"]


def test_first_create_writes_the_cache_and_keeps_it(front):
    """No pass-through call needed: the first create through Python leaves the cache, a
    later create through Python does not rewrite it."""
    gpu = front.bundle("g")
    front.call("create", "-b", gpu, "g1")
    entry = os.path.join(front.cache, "runtime-front")
    identity = os.stat(entry).st_ino, os.stat(entry).st_mtime_ns
    plain = front.bundle("p", env={})
    front.call("create", "-b", plain, "p1")
    assert front.starts() == 1
    gpu = front.bundle("g2")
    front.call("create", "-b", gpu, "g2")
    assert front.starts() == 2
    assert (os.stat(entry).st_ino, os.stat(entry).st_mtime_ns) == identity
    lines = open(entry).read().split("\n")
    words = lines[lines.index("", 3) + 1 :]  # after the pairs
    assert words[:2] == ["NVIDIA_", "CUDA_VERSION"] and "nvidia.com/gpu" in words


def test_real_runc_no_gpu_create_untouched_gpu_create_edited(tmp_path, sim_hosts):
    """Through real runc: a no-GPU container created and started with no Python start,
    its config.json byte-identical; a GPU container still gets its GPU."""
    runtime, starts, env, config = counting_runtime(tmp_path, sim_hosts("single"))
    root = str(tmp_path / "runc-root")
    show = ["/bin/sh", "-c", "echo DEV: $(ls /dev | grep nvidia)"]

    def call(*argv, **kw):
        return subprocess.run([runtime, "--root", root, *argv], env=env, timeout=60, **kw)

    call("list", capture_output=True)
    assert count_lines(starts) == 1
    plain = make_bundle(tmp_path, make_busybox_rootfs(tmp_path / "r1"), show, name="plain")
    before = open(os.path.join(plain, "config.json"), "rb").read()
    out = tmp_path / "plain.out"
    with open(out, "w") as fh:  # create's child keeps stdout until it exits: a file
        proc = call("create", "--bundle", plain, "plain", stdout=fh, stderr=fh)
    assert proc.returncode == 0, out.read_text()
    assert call("start", "plain").returncode == 0
    for _ in range(200):
        state = call("state", "plain", capture_output=True, text=True)
        if json.loads(state.stdout)["status"] == "stopped":
            break
        time.sleep(0.05)
    assert call("delete", "plain").returncode == 0
    assert out.read_text() == "DEV:\n"
    assert open(os.path.join(plain, "config.json"), "rb").read() == before
    assert count_lines(starts) == 1  # create, start, state, delete: no Python
    gpu = make_bundle(tmp_path, make_busybox_rootfs(tmp_path / "r2"), show, env=GPU_ENV)
    proc = runc_run(gpu, "gpu", runtime=runtime, root=root, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "nvidia0" in proc.stdout.split()
    assert "nvshim.io/injected" in json.load(open(os.path.join(gpu, "config.json")))["annotations"]
    assert count_lines(starts) > 1


def test_every_launcher_prints_its_version(launchers):
    """``--version`` of each isolated launcher: its name and nvshim's version, first line,
    exit 0 (nvshim-runtime goes on with the low-level runtime's own lines)."""
    from nvshim import __version__
    from nvshim.launch import LAUNCHERS

    env = {**RUNC_ENV, "PATH": os.environ["PATH"]}
    for name in LAUNCHERS:
        proc = subprocess.run([os.path.join(launchers, name), "--version"],
                              capture_output=True, text=True, env=env, timeout=60)  # fmt: skip
        assert proc.returncode == 0, (name, proc.stderr)
        assert proc.stdout.splitlines()[0] == f"{name} version {__version__}", proc.stdout
        assert proc.stderr == ""
