"""The compiled nvshim-runtime front (nvshim/runtime/front.c): built by tests/setup.sh,
filled in at install, and deciding every call as the sh front does (the same argument
vectors through both; tests/test_runtime_cli.py runs each front test on both, and the
slot and trust tests run the compiled front beside each shell)."""

from __future__ import annotations

import itertools
import json
import os
import random
import subprocess

import pytest

from nvshim.errors import NvshimError
from nvshim.launch import LAUNCHERS, launcher_bytes, real_interpreter, write_launchers
from nvshim.runtime import frontbin
from tests.conftest import write_config
from tests.runc_util import RUNC_ENV, make_bundle, make_busybox_rootfs

RUNTIME = LAUNCHERS["nvshim-runtime"]
SEP = "\x1f"


def _program(path, text: str) -> str:
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


def test_the_installed_front_is_the_static_build_with_its_fields(tmp_path):
    """setup.sh built the front for this source, so an install writes it (no shell, no
    loader: a static binary); its payload holds what the sh front has in its text."""
    assert frontbin.built() is not None, "tests/setup.sh builds the front"
    write_launchers(str(tmp_path), cache_dir="/nowhere/cache")
    data = (tmp_path / "nvshim-runtime").read_bytes()
    assert data[:4] == b"\x7fELF" and b"/lib64/ld-linux" not in data  # no PT_INTERP
    assert os.stat(tmp_path / "nvshim-runtime").st_mode & 0o777 == 0o755
    got = frontbin.fields_of(data)
    assert got["cache-dir"] == "/nowhere/cache" and got["interpreter"] == real_interpreter()
    assert got["create-value"].split() == [
        "console-socket", "pid-file", "pidfd-socket", "preserve-fds"]  # fmt: skip
    sh = launcher_bytes(RUNTIME, cache_dir="/nowhere/cache", compiled=False).decode()
    assert sh.startswith("#!/bin/sh\n") and got["code"] in sh.replace("'\\''", "'")


def test_an_unfilled_build_refuses_to_run(tmp_path):
    proc = subprocess.run([frontbin.built(), "list"], capture_output=True, text=True)
    assert proc.returncode == 127 and proc.stdout == ""
    assert (
        proc.stderr
        == "nvshim-runtime: error: this front was never installed (run nvshim install)\n"
    )


def test_payload_limits(tmp_path):
    build = open(frontbin.built(), "rb").read()
    with pytest.raises(ValueError, match="'code' cannot be written"):
        frontbin.fill(build, {"code": "a\0b"})
    with pytest.raises(ValueError, match="more than 65536"):
        frontbin.fill(build, {"code": "x" * frontbin.PAYLOAD_SIZE})
    with pytest.raises(ValueError, match="not exactly one payload area"):
        frontbin.fill(build + build, {"code": "x"})
    assert frontbin.fields_of(build) is None and frontbin.fields_of(b"#!/bin/sh\n") is None
    filled = frontbin.fill(build, {"code": "x", "k": "a=b"})
    assert frontbin.fields_of(filled) == {"code": "x", "k": "a=b"}
    with pytest.raises(ValueError, match="not exactly one payload area"):
        frontbin.fill(filled, {"code": "y"})  # filled once: never again


def test_without_a_build_the_sh_front_is_written(tmp_path, monkeypatch):
    monkeypatch.setattr(frontbin, "BUILD_DIR", str(tmp_path / "none"))
    monkeypatch.setattr(frontbin.compiled_front, "__defaults__", (str(tmp_path / "none"),))
    assert launcher_bytes(RUNTIME).startswith(b"#!/bin/sh\n")
    with pytest.raises(NvshimError, match="no compiled nvshim-runtime front for this machine"):
        launcher_bytes(RUNTIME, compiled=True)


def test_a_build_is_made_once_and_named_by_its_source(tmp_path):
    out = frontbin.build(str(tmp_path))
    assert os.path.basename(out) == frontbin.binary_name() and frontbin.built(str(tmp_path)) == out
    before = os.stat(out).st_mtime_ns
    assert frontbin.build(str(tmp_path)) == out and os.stat(out).st_mtime_ns == before
    with pytest.raises(RuntimeError, match="could not build"):
        frontbin.build(str(tmp_path / "other"), compiler="/bin/false")
    assert os.listdir(tmp_path / "other") == []  # no half-built file left


# -- the same calls through both fronts --------------------------------------------------


@pytest.fixture
def fronts(tmp_path, sim_hosts):
    """The compiled and the sh front over one cache directory, a fake low-level runtime
    and an interpreter that, once the front's cache is written, only records its call."""
    calls, record = tmp_path / "calls", tmp_path / "record-only"
    python = _program(
        tmp_path / "python",
        f"""#!/bin/sh
if [ -e {record} ]; then
  shift 3; IFS=$(printf '\\037'); printf 'py %s\\n' "$*" >> {calls}; exit 0
fi
exec {real_interpreter()} "$@"
""",
    )
    fake = _program(
        tmp_path / "runc",
        f"""#!/bin/sh
IFS=$(printf '\\037'); printf 'rt %s\\n' "$*" >> {calls}
""",
    )
    cache = str(tmp_path / "cache")
    paths = {}
    for kind in ("compiled", "sh"):
        write_launchers(str(tmp_path / kind), interpreter=python, cache_dir=cache,
                        compiled=kind == "compiled")  # fmt: skip
        paths[kind] = str(tmp_path / kind / "nvshim-runtime")
    config = write_config(tmp_path / "config.toml", sim_hosts("single"), str(tmp_path / "sh"),
                          tmp_path / "state", tmp_path / "nvshim.log")  # fmt: skip
    text = open(config).read().replace("[runtime]\n", f'[runtime]\nruntimes = ["{fake}"]\n')
    with open(config, "w") as fh:
        fh.write(text)
    past = os.stat(config).st_mtime_ns - 10 * 10**9
    os.utime(config, ns=(past, past))
    env = {**RUNC_ENV, "NVSHIM_CACHE_DIR": cache, "NVSHIM_CONFIG": config}
    rootfs = make_busybox_rootfs(tmp_path / "rootfs")
    gpu = make_bundle(tmp_path, rootfs, ["true"], env={"NVIDIA_VISIBLE_DEVICES": "0"}, name="gpu")
    plain = make_bundle(tmp_path, rootfs, ["true"], env={}, name="plain")
    # runc's state of a container nvshim prepared (its marker lost): exec goes to Python
    state = tmp_path / "runc-root"
    (state / "labelled").mkdir(parents=True)
    (state / "labelled" / "state.json").write_text(
        json.dumps({"config": {"labels": ['nvshim.io/exec-env={"CUDA_VISIBLE_DEVICES":"0"}']}})
    )
    subprocess.run([paths["sh"], "list"], env=env, check=True, capture_output=True)
    assert os.path.exists(os.path.join(cache, "runtime-front"))
    record.touch()

    def call(kind: str, argv: list[str]) -> tuple:
        marker = os.path.join(cache, "exec", "marked")
        os.makedirs(os.path.dirname(marker), exist_ok=True)
        with open(marker, "w"):
            pass  # empty: names no state root, so a delete removes it itself
        calls.unlink(missing_ok=True)
        proc = subprocess.run([paths[kind], *argv], env=env, cwd=plain, capture_output=True,
                              text=True, timeout=30)  # fmt: skip
        said = calls.read_text().replace(paths[kind], "FRONT") if calls.exists() else ""
        return proc.returncode, proc.stdout, said.split("\n"), os.path.exists(marker)

    call.gpu, call.plain, call.state = gpu, plain, str(state)
    return call


def _vectors(gpu: str, plain: str, state: str, count: int) -> list[list[str]]:
    """Command lines built from runc's flags, well-formed and not."""
    pick = random.Random(28)
    globals_ = [
        [],
        ["--root", state],
        [f"--root={state}"],
        ["-root", state],
        ["--debug"],
        ["--log", "/dev/null"],
        ["--log-format=json"],
        ["-v"],
        ["--version"],
        ["-h"],
        ["--systemd-cgroup"],
        ["--bogus"],
        ["--debug=true"],
        ["--"],
        ["-"],
        ["--root"],
    ]
    commands = ["create", "run", "exec", "delete", "state", "list", "start", "kill", "ps", ""]
    options = [["--bundle", gpu], ["--bundle", plain], ["-b", plain], [f"-b={gpu}"],
               [f"--bundle={plain}"], ["-b="], ["--pid-file", "/dev/null"], ["--no-pivot"],
               ["--detach"], ["-d"], ["--keep"], ["--console-socket", "/s"], ["--"], ["-h"],
               ["--help"], ["--force"], ["-f"], ["--env", "X=1"], ["-e=X=1"], ["--tty"],
               ["--unknown"], ["--no-pivot=true"], ["--preserve-fds=3"], ["-p", "/p"],
               ["--cwd", "/"], ["c1"], ["c1"], ["marked"], ["labelled"], ["."], ["a/b"], [""],
               ["--pidfd-socket", "/s"], ["KILL"], ["sh", "-c", "true"]]  # fmt: skip
    vectors = []
    for _ in range(count):
        argv = [a for g in pick.sample(globals_, pick.choice([0, 0, 1, 2])) for a in g]
        argv.append(pick.choice(commands))
        for option in pick.sample(options, pick.choice([1, 2, 3, 4])):
            argv += option
        vectors.append(argv)
    # and well-formed ones: each bundle form, flags before and after the id
    forms = [lambda b: ["--bundle", b], lambda b: ["-b", b], lambda b: [f"-b={b}"],
             lambda b: [f"--bundle={b}"], lambda b: []]  # fmt: skip
    flags = [[], ["--pid-file", "/dev/null"], ["--no-pivot"], ["--console-socket=/s"], ["-d"]]
    for cmd, form, bundle, flag, cid in itertools.product(
        ["create", "run"], forms, [gpu, plain, ""], flags, ["c1", "marked", "--", "."]
    ):
        ids = ["--", "c1"] if cid == "--" else [cid]
        if pick.random() < 0.25:
            vectors.append(
                [pick.choice(["--root", "--log"]), state, cmd, *flag, *ids, *form(bundle)]
            )
            vectors.append([cmd, *form(bundle), *ids, *flag])
    return vectors


def test_both_fronts_decide_every_call_alike(fronts):
    """What each front runs (the low-level runtime or Python, with which arguments), its
    exit status and output, and the exec marker: the same for 300 command lines."""
    vectors = _vectors(fronts.gpu, fronts.plain, fronts.state, 300)
    vectors += [["create", "--bundle", b, cid] for b, cid in
                itertools.product([fronts.gpu, fronts.plain], ["c1", "marked"])]  # fmt: skip
    vectors += [
        ["--root", fronts.state, "exec", cid, "true"] for cid in ("c1", "marked", "labelled")
    ]
    vectors += [["delete", cid] for cid in ("c1", "marked")]
    differ = [(argv, a, b) for argv in vectors
              if (a := fronts("compiled", argv)) != (b := fronts("sh", argv))]  # fmt: skip
    assert differ == []
    # the vectors reach every way out: runtime exec'd, Python, delete's run-then-unmark
    outcomes = {fronts("compiled", v)[2][0][:2] for v in vectors}
    assert outcomes == {"rt", "py"}
    assert fronts("compiled", ["delete", "marked"])[3] is False
    assert fronts("compiled", ["--root", fronts.state, "exec", "labelled", "x"])[2][0].startswith(
        "py"
    )
    assert fronts("compiled", ["-v", "list"])[1].startswith("nvshim-runtime version ")


@pytest.mark.parametrize("how", ["cache-dir-mode", "parent-mode", "file-mode"])
def test_the_compiled_front_reads_no_cache_others_could_have_written(fronts, tmp_path, how):
    """A cache directory another user can change (or under one), or a cache file others
    may write: the compiled front reads nothing there and Python decides (which neither
    trusts nor writes such a cache); the sh front checks only owners, as before."""
    cache = tmp_path / "cache"
    target = {"cache-dir-mode": cache, "parent-mode": tmp_path,
              "file-mode": cache / "runtime-front"}[how]  # fmt: skip
    assert fronts("compiled", ["list"])[2][0].startswith("rt ")
    mode = os.stat(target).st_mode & 0o7777
    os.chmod(target, mode | 0o002)
    try:
        assert fronts("compiled", ["list"])[2][0].startswith("py ")
        assert fronts("compiled", ["state", "c1"])[2][0].startswith("py ")
    finally:
        os.chmod(target, mode)
    assert fronts("compiled", ["list"])[2][0].startswith("rt ")


def test_a_config_json_of_megabytes_is_searched_whole(fronts, tmp_path):
    """A config.json of 3 MiB, past the memory the compiled front keeps for itself (its
    own C library maps a buffer that size), is read and searched whole by both fronts:
    a request in its last bytes goes to Python, the same file without it to runc."""
    outcomes = {}
    for name, bundle in (("gpu", fronts.gpu), ("plain", fronts.plain)):
        path = os.path.join(bundle, "config.json")
        with open(path) as fh:
            spec = json.load(fh)
        padded = {"annotations": {"pad": "x" * (3 << 20)}, **spec}  # the request last
        with open(path, "w") as fh:
            json.dump(padded, fh)
        for kind in ("compiled", "sh"):
            said = fronts(kind, ["create", "--bundle", bundle, "c1"])[2][0]
            outcomes[name, kind] = said.split(" ", 1)[0]
    assert outcomes == {("gpu", "compiled"): "py", ("gpu", "sh"): "py",
                        ("plain", "compiled"): "rt", ("plain", "sh"): "rt"}  # fmt: skip


def test_an_interpreter_that_cannot_run_is_reported_as_a_shell_would(tmp_path):
    """Where the compiled front must hand a call to Python and the interpreter cannot be
    run, it says why in the C library's words and exits as a shell would: 127 for a
    missing file, 126 for one not executable or not a program."""
    text = tmp_path / "text"
    text.write_text("not a program\n")
    text.chmod(0o644)
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"\x7fELF" + b"\0" * 60)
    garbage.chmod(0o755)
    cases = [(tmp_path / "none" / "python3", 127, "No such file or directory"),
             (text, 126, "Permission denied"), (garbage, 126, "Exec format error")]  # fmt: skip
    for n, (interpreter, status, why) in enumerate(cases):
        bin_dir = tmp_path / f"bin{n}"  # no cache directory: every call goes to Python
        write_launchers(str(bin_dir), interpreter=str(interpreter),
                        cache_dir=str(tmp_path / "no-cache"), compiled=True)  # fmt: skip
        proc = subprocess.run([str(bin_dir / "nvshim-runtime"), "list"], capture_output=True,
                              text=True, env={"PATH": "/usr/bin:/bin"})  # fmt: skip
        assert (proc.returncode, proc.stderr) == (
            status, f"nvshim-runtime: error: {interpreter}: {why}\n")  # fmt: skip
