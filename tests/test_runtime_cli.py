"""nvshim-runtime's command line is runc's: the parser against runc's own behaviour, the
same argument vectors through runc and through nvshim-runtime, and the sh front (which
calls reach Python, and that a create is never handed to runc unedited)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

from nvshim.launch import real_interpreter, write_launchers
from nvshim.runtime.args import parse_runc_args
from tests.conftest import write_config
from tests.runc_util import RUNC_ENV, make_bundle, make_busybox_rootfs

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


@pytest.fixture
def front(tmp_path, sim_hosts):
    """Launchers whose interpreter records every start, a fake low-level runtime that
    records every call, and a GPU bundle."""
    log = tmp_path / "python-starts"
    counter = tmp_path / "python"
    counter.write_text(_COUNTER.format(log=log, python=real_interpreter()))
    counter.chmod(0o755)
    bin_dir = tmp_path / "bin"
    write_launchers(
        str(bin_dir), interpreter=str(counter), cache_dir=os.environ["NVSHIM_CACHE_DIR"]
    )
    rootfs = make_busybox_rootfs(tmp_path / "rootfs")
    calls = tmp_path / "runc-calls"
    fake = tmp_path / "fake-runc"
    config = write_config(
        tmp_path / "config.toml",
        sim_hosts("single"),
        str(bin_dir),
        tmp_path / "state",
        tmp_path / "nvshim.log",
        accept_env_unprivileged=True,
    )

    class Front:
        runtime = str(bin_dir / "nvshim-runtime")

        def bundle(self, name):
            path = make_bundle(tmp_path, rootfs, ["true"], env=GPU_ENV, name=name)
            fake.write_text(_FAKE_RUNC.format(bundle=path, log=calls))
            fake.chmod(0o755)
            return path

        def call(self, *argv, cwd=None):
            env = {**RUNC_ENV, "NVSHIM_CONFIG": self.config}
            return subprocess.run(
                [self.runtime, *argv], env=env, cwd=cwd, capture_output=True, text=True
            )

        def starts(self) -> int:
            return len(log.read_text().splitlines()) if log.exists() else 0

        def calls(self) -> list[str]:
            return calls.read_text().splitlines() if calls.exists() else []

    text = open(config).read().replace("[runtime]\n", f'[runtime]\nruntimes = ["{fake}"]\n')
    with open(config, "w") as fh:
        fh.write(text)
    f = Front()
    f.config = config
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


@pytest.mark.parametrize(
    "argv",
    [
        ["create", "--bundle", "{b}", "create"],
        ["create", "run", "--bundle", "{b}"],
        ["create", "-b={b}", "run"],
        ["create", "--bundle={b}", "--pid-file=/p", "x"],
        ["--root", "/r", "--debug", "create", "-b", "{b}", "x"],
        ["--root=create", "run", "-d", "--bundle", "{b}", "x"],
        ["--debug=true", "create", "-bundle", "{b}", "x"],
        ["--", "create", "--b", "{b}", "x"],
        ["run", "--no-pivot=true", "--bundle", "{b}", "--", "x"],
        ["create", "--console-socket", "/s", "x", "-b", "{b}"],
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
    env = {**RUNC_ENV, "NVSHIM_CONFIG": front.config, "PATH": "/usr/bin:/bin"}
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
    entry = os.path.join(os.environ["NVSHIM_CACHE_DIR"], "runtime-front")
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
