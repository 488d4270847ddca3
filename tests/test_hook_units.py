"""nvshim-hook's parsers and checks on their own: OCI state and config.json, the params
rewrite, cgroup lookup, ELF inspection, the ld cache reachability check, and how
prestart picks its finishing steps out of the edits' hook entries."""

from __future__ import annotations

import errno
import io
import json
import os
import pathlib
import shutil
import subprocess

import pytest

from nvshim.errors import NvshimError
from nvshim.hook import cgroup
from nvshim.hook.args import HelpRequested, parse_args
from nvshim.hook.ldconfig import (
    HOST_LDCONFIG,
    _detach_procfs,
    _proc_mounts_under,
    elf_library,
    has_glibc_loader,
    is_static_elf,
    ldconfig_copy,
    open_host_ldconfig,
    unreachable,
    update_ldcache,
)
from nvshim.hook.params import without_modification
from nvshim.hook.state import load_spec, read_state, rootfs_path
from nvshim.hook.steps import finishing_steps
from nvshim.hookentries import hook_entry
from nvshim.rootfs import kernel
from nvshim.rootfs.fsroot import RootFS
from tests.runc_util import build_stub_library, in_private_mount_ns
from tests.sim.compile import stubs as sim_stubs

GOOD_STATE = {"ociVersion": "1.0.2", "id": "c1", "pid": 42, "bundle": "/b", "status": "created"}


def test_state_is_read_strictly():
    state = read_state(io.BytesIO(json.dumps(GOOD_STATE).encode()))
    assert (state.id, state.pid, state.bundle) == ("c1", 42, "/b")
    bad = [
        (b"x" * ((1 << 20) + 1), "larger than"),
        (b"[1]", "not a JSON object"),
        (b"{", "invalid JSON"),
        (json.dumps({**GOOD_STATE, "pid": True}).encode(), "pid must be a positive integer"),
        (json.dumps({**GOOD_STATE, "pid": "42"}).encode(), "pid must be a positive integer"),
        (json.dumps({**GOOD_STATE, "bundle": "rel"}).encode(), "bundle must be an absolute"),
        (json.dumps({**GOOD_STATE, "id": 7}).encode(), "id must be a non-empty string"),
    ]
    for data, text in bad:
        with pytest.raises(NvshimError, match=text) as err:
            read_state(io.BytesIO(data))
        assert "\n" not in str(err.value)


def test_config_json_is_read_strictly(tmp_path):
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    spec_file = bundle / "config.json"
    spec_file.write_text(json.dumps({"root": {"path": "rootfs"}}))
    spec = load_spec(str(bundle))
    assert rootfs_path(spec, str(bundle)) == str(bundle / "rootfs")
    assert rootfs_path({"root": {"path": "/abs/root"}}, str(bundle)) == "/abs/root"
    for value in ({"root": {"path": 7}}, {"root": "x"}, {}):
        with pytest.raises(NvshimError, match="root.path must be a non-empty string"):
            rootfs_path(value, str(bundle))
    spec_file.write_text("[]")
    with pytest.raises(NvshimError, match="config.json: not a JSON object"):
        load_spec(str(bundle))
    spec_file.write_bytes(b" " * ((16 << 20) + 1))
    with pytest.raises(NvshimError, match="larger than"):
        load_spec(str(bundle))
    with pytest.raises(NvshimError, match="cannot read"):
        load_spec(str(tmp_path / "nowhere"))


def test_params_rewrite():
    text = "ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 1\nEnableMSI: 1\n"
    assert without_modification(text) == text.replace("Files: 1", "Files: 0")
    assert without_modification("ModifyDeviceFiles: 0\n") is None
    assert without_modification("EnableMSI: 1") == "EnableMSI: 1\nModifyDeviceFiles: 0\n"


def _proc(tmp_path, cgroup_text: str, mountinfo: str) -> str:
    proc = tmp_path / "proc"
    (proc / "42").mkdir(parents=True)
    (proc / "self").mkdir()
    (proc / "42/cgroup").write_text(cgroup_text)
    (proc / "self/mountinfo").write_text(mountinfo)
    return str(proc)


def test_devices_cgroup_v1_and_v2(tmp_path):
    mountinfo = (
        "30 25 0:26 / /sys/fs/cgroup/devices rw,relatime shared:12 - cgroup cgroup rw,devices\n"
    )
    hybrid = _proc(tmp_path / "a", "5:devices:/ctr/abc\n1:cpu:/ctr/abc\n0::/ctr/abc\n", mountinfo)
    assert cgroup.devices_cgroup(42, hybrid) == "/ctr/abc"
    assert cgroup.devices_mount(hybrid) == "/sys/fs/cgroup/devices"
    pure_v2 = _proc(tmp_path / "b", "0::/ctr/abc\n", "")
    assert cgroup.devices_cgroup(42, pure_v2) is None
    with pytest.raises(NvshimError, match="nvshim-runtime or request the GPUs with CDI"):
        cgroup.allow_devices(42, ["c 195:0 rwm"], pure_v2)
    sneaky = _proc(tmp_path / "c", "5:devices:/ctr/../../etc\n", mountinfo)
    with pytest.raises(NvshimError, match="unexpected devices path"):
        cgroup.devices_cgroup(42, sneaky)
    assert cgroup.allow_rule("c", 195, 0) == "c 195:0 rwm"
    assert cgroup.allow_rule("u", 195, 255, "rw") == "c 195:255 rw"
    for kind, access in (("p", "rwm"), ("c", "rwx"), ("c", "")):
        with pytest.raises(NvshimError):
            cgroup.allow_rule(kind, 1, 1, access)


def test_allow_devices_writes_each_rule(tmp_path):
    """Against a stand-in cgroup directory (the write path; runc tests cover the kernel)."""
    base = tmp_path / "cg"
    (base / "ctr").mkdir(parents=True)
    mountinfo = f"30 25 0:26 / {base} rw - cgroup cgroup rw,devices\n"
    proc = _proc(tmp_path, "5:devices:/ctr\n", mountinfo)
    (base / "ctr/devices.allow").write_text("")
    target = cgroup.allow_devices(42, ["c 195:0 rwm", "c 195:255 rwm"], proc)
    assert target == str(base / "ctr/devices.allow")
    assert (base / "ctr/devices.allow").read_text() == "c 195:0 rwmc 195:255 rwm"


def test_elf_inspection(tmp_path):
    lib = build_stub_library(tmp_path / "libx.so.1.2", "libx.so.1")
    bare = build_stub_library(tmp_path / "libbare.so", "")
    text = tmp_path / "text.so"
    text.write_text("not an ELF file at all, but long enough to have a header......")
    wide = bytearray(pathlib.Path(lib).read_bytes())
    wide[54:56] = (0xFFFF).to_bytes(2, "little")  # e_phentsize: 512 of them would be 32 MiB
    (tmp_path / "libwide.so.1").write_bytes(bytes(wide))  # refused, not read
    wide_path = tmp_path / "libwide.so.1"
    lib32 = sim_stubs([("libcuda.so.1", 32)])[("libcuda.so.1", 32)]  # no flags: ldconfig's
    for path, found in ((lib, ("libx.so.1", 0x303)), (bare, (None, 0x303)),
                        (lib32, ("libcuda.so.1", None)),
                        (str(text), (None, None)), (wide_path, (None, None))):  # fmt: skip
        fd = os.open(path, os.O_RDONLY)
        try:
            assert elf_library(fd) == found
        finally:
            os.close(fd)
    fd = open_host_ldconfig()
    try:
        assert is_static_elf(fd)
    finally:
        os.close(fd)
    fd = os.open(shutil.which("ls"), os.O_RDONLY)
    try:
        assert not is_static_elf(fd)
    finally:
        os.close(fd)
    with pytest.raises(NvshimError, match="must be an absolute host path"):
        open_host_ldconfig("sbin/ldconfig")
    with pytest.raises(NvshimError, match="host ldconfig not found"):
        open_host_ldconfig(str(tmp_path / "missing"))


def test_glibc_loader_is_looked_up_inside_the_root(tmp_path):
    """Only an image with a glibc loader reads an ld.so cache. Links to the loader are
    followed inside the root; one that only leads to the host's loader does not count."""
    root = tmp_path / "rootfs"
    (root / "usr/lib64").mkdir(parents=True)
    with RootFS(str(root)) as fs:
        assert not has_glibc_loader(fs)
    host_loader = os.path.realpath("/lib64/ld-linux-x86-64.so.2")
    (root / "lib64").symlink_to(os.path.dirname(host_loader))  # absolute: the host's dir
    with RootFS(str(root)) as fs:
        assert not has_glibc_loader(fs)
    (root / "lib64").unlink()
    (root / "lib64").symlink_to("/usr/lib64")  # merged-/usr style, inside the root
    (root / "usr/lib64/ld-linux-x86-64.so.2").write_bytes(b"\x7fELF")
    with RootFS(str(root)) as fs:
        assert has_glibc_loader(fs)


def test_no_glibc_loader_no_ldconfig(tmp_path):
    """A static or musl image never reads ld.so.cache: nothing is written or run."""
    root = tmp_path / "rootfs"
    build_stub_library(root / "usr/lib/x86_64-linux-gnu/libcuda.so.550.90.12", "libcuda.so.1")
    (root / "etc").mkdir()

    def work():
        with RootFS(str(root)) as fs:
            return update_ldcache(fs, ["/usr/lib/x86_64-linux-gnu"], -1)["ldcache"]

    assert in_private_mount_ns(work).get("ok") == "skipped-no-glibc-loader"
    assert os.listdir(root / "etc") == []


def test_reachability_counts_every_library_ldconfig_caches(tmp_path):
    """After one update everything is reachable; a new library counts, with a SONAME or
    without one (ldconfig caches that under its file name); a file that is not ELF
    does not."""
    root = tmp_path / "rootfs"
    lib = root / "usr/lib/x86_64-linux-gnu"
    build_stub_library(lib / "libcuda.so.550.90.12", "libcuda.so.1")
    (root / "etc").mkdir()
    (root / "lib64").mkdir()
    (root / "lib64/ld-linux-x86-64.so.2").write_bytes(b"\x7fELF loader")
    folder = "/usr/lib/x86_64-linux-gnu"

    def work():
        fd = open_host_ldconfig()
        with RootFS(str(root)) as fs:
            first = update_ldcache(fs, [folder], fd)
            (lib / "libnotes.so.txt").write_text("not a library")
            after_text = unreachable(fs, [folder])
            build_stub_library(lib / "libplugin.so", "")
            after_plugin = unreachable(fs, [folder])
            build_stub_library(lib / "libnew.so.2.0", "libnew.so.2")
            after_new = unreachable(fs, [folder])
        return [first["ldcache"], after_text, after_plugin, after_new]

    result = in_private_mount_ns(work)
    plugin = f"{folder}/libplugin.so"
    assert result.get("ok") == ["updated", [], [plugin], [f"{folder}/libnew.so.2.0", plugin]]
    assert (root / "etc/ld.so.conf").read_text() == "include /etc/ld.so.conf.d/*.conf\n"
    assert folder in (root / "etc/ld.so.conf.d/00-nvshim.conf").read_text().splitlines()


def test_ldconfig_copy_is_kept_while_the_host_ldconfig_is_the_same(tmp_path):
    """One read-only tmpfs copy a process while the host ldconfig is the same file,
    unchanged; another (the old one closed) for another file or a changed one."""
    host = next(p for p in HOST_LDCONFIG if os.path.exists(p))
    first, second = tmp_path / "ldconfig-a", tmp_path / "ldconfig-b"
    shutil.copy(host, first)
    shutil.copy(host, second)

    def copies():
        seen = []  # each call's copy: its tmpfs and file (st_dev, st_ctime_ns), size, writable
        for n, path in enumerate((first, first, second, second, first)):
            if n == 4:
                os.utime(first)  # changed since its copy was made (mtime, ctime)
            fd = open_host_ldconfig(str(path))
            try:
                copy = ldconfig_copy(fd)
            finally:
                os.close(fd)
            st = os.stat("ldconfig", dir_fd=copy)
            writable = os.access(f"/proc/self/fd/{copy}", os.W_OK)
            seen.append([f"{st.st_dev}:{st.st_ctime_ns}", st.st_size, writable])
        held = []  # the fds on any copy's tmpfs still open (a closed one's number is reused)
        for name in os.listdir("/proc/self/fd"):
            try:
                dev = os.stat(f"/proc/self/fd/{name}").st_dev
            except OSError:
                continue
            held += [name] if any(c.startswith(f"{dev}:") for c, _, _ in seen) else []
        return seen, held

    seen, held = in_private_mount_ns(copies)["ok"]
    ids = [copy for copy, _, _ in seen]
    assert ids[0] == ids[1] and ids[2] == ids[3]  # the same file: the same copy
    assert len(set(ids)) == 3  # another file, a changed file: a new copy each
    assert len(held) == 1  # one fd kept; the older copies were closed
    assert [size for _, size, _ in seen] == [os.path.getsize(host)] * 5
    assert not any(writable for _, _, writable in seen)  # read-only mounts


@pytest.mark.parametrize("kernel_has", ["close_range", "no close_range"])
def test_ldconfig_runs_sealed_from_a_tmpfs_holding_only_itself(tmp_path, monkeypatch, kernel_has):
    """The ld-cache step's sandbox, seen from inside by a static stand-in for ldconfig:
    no fd above 2 (closed on exec in the spawning thread's own fd table, or, on a kernel
    without ``CLOSE_RANGE_CLOEXEC``, by the fd scan), ``-r .`` and ``LC_ALL=C`` only, a
    root holding nothing but its own copy, and after its chroot the container root,
    whose procfs (mounted here as runc does) is detached. The caller is left with the
    fds it had."""
    if kernel_has == "no close_range":

        def old_kernel(first, last, flags=0):
            raise OSError(errno.EINVAL, "close_range: Invalid argument")

        monkeypatch.setattr(kernel, "close_range", old_kernel)
    probe = tmp_path / "ldconfig"
    source = os.path.join(os.path.dirname(__file__), "sim", "ldconfig_probe.c")
    subprocess.run(["gcc", "-static", "-O2", "-o", str(probe), source], check=True)
    root = tmp_path / "rootfs"
    build_stub_library(root / "usr/lib/x86_64-linux-gnu/libcuda.so.550.90.12", "libcuda.so.1")
    for folder in ("etc", "lib64", "proc"):
        (root / folder).mkdir(exist_ok=True)
    (root / "lib64/ld-linux-x86-64.so.2").write_bytes(b"\x7fELF loader")
    leak = os.open(str(tmp_path), os.O_RDONLY)
    os.set_inheritable(leak, True)  # an fd a caller left open must not reach ldconfig

    def work():
        subprocess.run(["mount", "-t", "proc", "proc", str(root / "proc")], check=True)
        fd = open_host_ldconfig(str(probe))
        with RootFS(str(root)) as fs:
            kernel.host_proc()  # opened once, kept
            ldconfig_copy(fd)  # made once, kept: the step reuses it
            before = sorted(os.listdir("/proc/self/fd"))
            try:
                update_ldcache(fs, ["/usr/lib/x86_64-linux-gnu"], fd)
            finally:
                assert sorted(os.listdir("/proc/self/fd")) == before

    try:
        result = in_private_mount_ns(work)
    finally:
        os.close(leak)
    line = result.get("error", "").split("failed: ", 1)[-1]
    seen = dict(field.split("=", 1) for field in line.removeprefix("probe ").split(" "))
    assert seen["fds"] == "", line  # nothing inherited past stdio
    assert seen["args"] == "-r,.,/usr/lib/x86_64-linux-gnu" and seen["env"] == "LC_ALL=C;"
    assert seen["top"] == "ldconfig", line  # its own root: the tmpfs, nothing of the image
    assert sorted(seen["root"].split(",")) == sorted(os.listdir(root)), line
    assert seen["proc"] == "", line  # the procfs under the root is detached


def test_every_procfs_under_the_root_is_detached_stacked_ones_too(tmp_path):
    """The ld-cache sandbox hides every procfs at or under the root (a magic link such
    as ``/proc/1/root`` leads out): two stacked on one point, one deep in a library
    directory; one outside the root stays. Real mounts in a private mount namespace."""
    root, outside = tmp_path / "rootfs", tmp_path / "outside"
    for folder in (root / "proc", root / "usr/lib/deep/proc", outside):
        folder.mkdir(parents=True)

    def work():
        for point in (root / "proc", root / "proc", root / "usr/lib/deep/proc", outside):
            kernel.mount("proc", str(point), "proc", 0)
        before = _proc_mounts_under(str(root))
        _detach_procfs(str(root))
        return len(before), _proc_mounts_under(str(root)), _proc_mounts_under(str(outside))

    assert in_private_mount_ns(work) == {"ok": [3, [], [str(outside)]]}


def test_prestart_runs_only_our_finishing_steps():
    hooks = [
        hook_entry(
            "/usr/local/bin/nvshim-hook", "createContainer", "create-symlinks", "--link", "a::/b"
        ),
        hook_entry(
            "/usr/local/bin/nvshim-hook",
            "createContainer",
            "update-ldcache",
            "--folder",
            "/usr/lib",
        ),
        hook_entry("/x/nvshim-hook", "createContainer", "prestart"),
        hook_entry("/usr/bin/other-hook", "createContainer", "whatever"),
    ]
    steps, others = finishing_steps(hooks)
    assert [s.command for s in steps] == ["create-symlinks", "update-ldcache"]
    assert steps[0].link == ["a::/b"] and steps[1].folder == ["/usr/lib"]
    assert others == ["nvshim-hook prestart", "nvshim-hook whatever"]


def test_config_option_goes_before_or_after_the_step():
    assert parse_args(["--config", "/c", "prestart"]).config == "/c"
    assert parse_args(["prestart", "--config", "/c"]).config == "/c"
    assert parse_args(["--config=/a", "prestart", "--config=/b"]).config == "/b"
    assert parse_args(["prestart"]).config is None


def test_step_options_repeat_and_take_equals_form():
    args = parse_args(
        ["update-ldcache", "--folder", "/a", "--folder=/b", "--ldconfig=/x", "--ldconfig", "/y"]
    )
    assert (args.command, args.folder, args.ldconfig) == ("update-ldcache", ["/a", "/b"], "/y")
    args = parse_args(["create-symlinks", "--link", "t::/l", "--link=u::/m"])
    assert args.link == ["t::/l", "u::/m"]
    assert parse_args(["mps-check", "GPU-1"]).uuid == "GPU-1"
    assert parse_args(["finish", "create-symlinks", "--link", "a::/b", "+", "x"]).steps == [
        "create-symlinks",
        "--link",
        "a::/b",
        "+",
        "x",
    ]


@pytest.mark.parametrize(
    "argv, message",
    [
        ([], "missing argument 'STEP'"),
        (["no-such-step"], "no such step 'no-such-step'"),
        (["prestat"], r"no such step 'prestat' \(did you mean 'prestart'\?\)"),
        (["prestart", "--link", "a::/b"], "no such option '--link'"),
        (["create-symlinks", "--link"], "option '--link' requires an argument"),
        (["--config"], "option '--config' requires an argument"),
        (["mps-check"], "missing argument 'UUID'"),
        (["mps-check", "a", "b"], r"got unexpected extra argument \(b\)"),
        (["--bogus", "prestart"], "no such option '--bogus'"),
        (["--log-format", "xml", "prestart"], "invalid value for '--log-format': 'xml'"),
    ],
)
def test_command_line_errors_name_the_problem(argv, message):
    from nvshim.errors import NvshimError

    with pytest.raises(NvshimError, match=message) as caught:
        parse_args(argv)
    assert caught.value.exit_code == 2 and "\n" not in str(caught.value)


def test_help_lists_every_step_and_a_steps_options():
    with pytest.raises(HelpRequested) as whole:
        parse_args(["--help"])
    for step in ("create-symlinks", "update-ldcache", "prestart", "mps-check", "finish"):
        assert step in whole.value.text
    with pytest.raises(HelpRequested) as one:
        parse_args(["update-ldcache", "-h"])
    assert "--folder DIR" in one.value.text and "--ldconfig FILE" in one.value.text


def test_prestart_refuses_mps_env_it_cannot_set():
    from nvshim.errors import NvshimError
    from nvshim.hook.main import check_mps_env

    need = [
        "CUDA_VISIBLE_DEVICES=GPU-a",
        "CUDA_MPS_PIPE_DIRECTORY=/run/nvidia-mps",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25",
    ]
    check_mps_env(
        {"CUDA_MPS_PIPE_DIRECTORY": "/run/nvidia-mps", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"},
        need,
    )
    with pytest.raises(NvshimError, match="CUDA_MPS_ACTIVE_THREAD_PERCENTAGE='50'"):
        check_mps_env(
            {
                "CUDA_MPS_PIPE_DIRECTORY": "/run/nvidia-mps",
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50",
            },
            need,
        )
    with pytest.raises(NvshimError, match="CUDA_MPS_PIPE_DIRECTORY=''"):
        check_mps_env({}, need)
    # a GPU that is not shared: the policy clears MPS variables; unset is fine, a value is not
    check_mps_env({}, ["CUDA_MPS_PIPE_DIRECTORY="])
    with pytest.raises(NvshimError, match="CUDA_MPS_PIPE_DIRECTORY='/tmp/nvidia-mps'"):
        check_mps_env({"CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps"}, ["CUDA_MPS_PIPE_DIRECTORY="])


@pytest.mark.parametrize("on_down, code", [("fail", 1), ("warn", 0)])
def test_mps_check_refuses_when_the_daemon_is_down(tmp_path, launchers, on_down, code):
    """The CDI sharing spec's createRuntime hook: no live daemon in the device's pipe dir."""
    import json
    import subprocess

    config = tmp_path / "config.toml"
    log = tmp_path / "log"
    config.write_text(
        f'[runtime]\nlog-file = "{log}"\n'
        f'[sharing]\nmps-root = "{tmp_path / "mps"}"\non-daemon-down = "{on_down}"\n'
    )
    state = json.dumps({"ociVersion": "1.0.2", "id": "c1", "pid": 1, "bundle": str(tmp_path)})
    proc = subprocess.run(
        [f"{launchers}/nvshim-hook", "--config", str(config), "mps-check", "GPU-abc"],
        input=state,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == code, proc.stderr
    text = log.read_text()
    assert "GPU-abc" in text and "MPS control daemon is not running" in text
    if code:
        assert proc.stderr.count("\n") == 1 and "nvshim mps start" in proc.stderr
