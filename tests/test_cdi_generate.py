"""`nvshim cdi generate` on each simulated host: content, validity (nvshim's validator and
the reference JSON schema), formats, atomic output, and a real consumer (podman)."""

from __future__ import annotations

import json
import os
import stat

import pytest
import yaml

from tests.conftest import HOSTS, REPO, run_nvshim
from tests.podman_util import make_busybox_rootfs, podman_run

SHARED_SCHEMA = os.path.join(REPO, "..", "shared", "reference", "cdi-schema")
PACKAGED_SCHEMA = os.path.join(REPO, "nvshim", "cdi", "schema")


def generate(sim, *args: str, hook_path: str = "/usr/local/bin/nvshim-hook", env=None):
    proc = run_nvshim(
        "cdi",
        "generate",
        "--driver-root",
        sim.driver_root,
        "--dev-root",
        sim.dev_root,
        "--hook-path",
        hook_path,
        *args,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    return proc


def schema_validator():
    import jsonschema
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT7

    directory = SHARED_SCHEMA if os.path.isdir(SHARED_SCHEMA) else PACKAGED_SCHEMA
    docs = {}
    for name in ("schema.json", "defs.json"):
        with open(os.path.join(directory, name)) as fh:
            docs[name] = json.load(fh)
    base = "https://nvshim.invalid/cdi/"
    registry = Registry().with_resources(
        (base + name, Resource.from_contents(doc, default_specification=DRAFT7))
        for name, doc in docs.items()
    )
    root = {**docs["schema.json"], "$id": base + "schema.json"}
    return jsonschema.Draft7Validator(root, registry=registry)


def test_packaged_schema_is_the_reference_schema():
    if not os.path.isdir(SHARED_SCHEMA):
        pytest.skip("no ../shared checkout beside the repo")
    for name in ("schema.json", "defs.json"):
        with (
            open(os.path.join(SHARED_SCHEMA, name), "rb") as a,
            open(os.path.join(PACKAGED_SCHEMA, name), "rb") as b,
        ):
            assert a.read() == b.read()


@pytest.mark.parametrize("name", HOSTS)
@pytest.mark.parametrize("strategies", [("index",), ("uuid",), ("index", "uuid")])
def test_generated_spec_is_valid_and_complete(sim_hosts, tmp_path, name, strategies):
    sim = sim_hosts(name)
    out = tmp_path / "nvidia.yaml"
    args = [a for s in strategies for a in ("--device-name-strategy", s)]
    generate(sim, "-o", str(out), *args)
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o644
    proc = run_nvshim("cdi", "validate", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    spec = yaml.safe_load(out.read_text())
    assert list(schema_validator().iter_errors(spec)) == []

    whole = [g for g in sim.topology["gpus"] if g["mig_mode"] != "enabled"]
    migs = [
        (g, m)
        for g in sim.topology["gpus"]
        for m in sorted(g["mig_devices"], key=lambda m: m["slot"])
    ]
    expected_names = []
    for g in whole:
        expected_names += [str(g["index"]) if s == "index" else g["uuid"] for s in strategies]
    for g, m in migs:
        expected_names += [
            f"{g['index']}:{m['slot']}" if s == "index" else m["uuid"] for s in strategies
        ]
    names = [d["name"] for d in spec["devices"]]
    assert names == expected_names + ["all"]
    # the minimum version: digit-first names or hostPath (dev root is not /) need 0.5.0
    assert spec["cdiVersion"] == "0.5.0"

    devices = {d["name"]: d["containerEdits"] for d in spec["devices"]}
    for g in whole:
        nodes = devices[g["uuid"] if "uuid" in strategies else str(g["index"])]["deviceNodes"]
        assert [(n["path"], n["major"], n["minor"]) for n in nodes] == [
            (f"/dev/nvidia{g['minor']}", 195, g["minor"])
        ]
        assert nodes[0]["hostPath"] == os.path.join(sim.dev_root, f"dev/nvidia{g['minor']}")
    for g, m in migs:
        key = m["uuid"] if "uuid" in strategies else f"{g['index']}:{m['slot']}"
        paths = [n["path"] for n in devices[key]["deviceNodes"]]
        assert paths == [
            f"/dev/nvidia{g['minor']}",
            *(f"/dev/nvidia-caps/{name}" for name in sim.mig_cap_names(m["uuid"])),
        ]
    all_paths = {n["path"] for n in devices["all"]["deviceNodes"]}
    assert all_paths == {
        n["path"] for d in spec["devices"][:-1] for n in d["containerEdits"]["deviceNodes"]
    }

    common = spec["containerEdits"]
    assert {n["path"] for n in common["deviceNodes"]} == {
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    }  # modeset is the display capability, not in the default utility,compute
    mounts = {m["containerPath"]: m for m in common["mounts"]}
    ver = sim.driver_version
    cuda = mounts[f"/usr/lib/x86_64-linux-gnu/libcuda.so.{ver}"]
    assert cuda["hostPath"] == os.path.join(
        sim.driver_root, f"usr/lib/x86_64-linux-gnu/libcuda.so.{ver}"
    )
    assert cuda["options"] == ["ro", "nosuid", "nodev", "bind"]
    assert "/usr/bin/nvidia-smi" in mounts
    assert mounts["/run/nvidia-persistenced/socket"]["options"] == [
        "nosuid",
        "nodev",
        "noexec",
        "bind",
    ]
    assert f"/lib/firmware/nvidia/{ver}/gsp_ga10x.bin" in mounts
    assert not any("libnvidia-encode" in p or "GLX" in p for p in mounts)  # video/graphics
    hooks = {h["args"][1]: h for h in common["hooks"]}
    assert list(hooks) == [
        "create-symlinks",
        "enable-cuda-compat",  # before update-ldcache, which puts its folder first
        "update-ldcache",
        "disable-device-node-modification",
    ]
    assert hooks["enable-cuda-compat"]["args"][2:] == [f"--host-driver-version={ver}"]
    for hook in hooks.values():
        assert hook["hookName"] == "createContainer"
        assert hook["path"] == "/usr/local/bin/nvshim-hook"
        assert hook["env"] and all(not e.startswith(("LD_", "PYTHON")) for e in hook["env"])
    assert (
        f"libcuda.so.{ver}::/usr/lib/x86_64-linux-gnu/libcuda.so.1"
        in hooks["create-symlinks"]["args"]
    )


def test_capabilities_all_and_json_format(sim_hosts):
    sim = sim_hosts("single")
    spec = json.loads(generate(sim, "--format", "json", "--capabilities", "all").stdout)
    mounts = {m["containerPath"] for m in spec["containerEdits"]["mounts"]}
    ver = sim.driver_version
    assert f"/usr/lib/x86_64-linux-gnu/libnvidia-encode.so.{ver}" in mounts
    assert f"/usr/lib/x86_64-linux-gnu/libGLX_nvidia.so.{ver}" in mounts
    assert "/usr/share/vulkan/icd.d/nvidia_icd.json" in mounts
    assert any("/i386-linux-gnu/" in m for m in mounts)  # compat32
    assert "/dev/nvidia-modeset" in {n["path"] for n in spec["containerEdits"]["deviceNodes"]}


def test_vendor_class_and_uuid_only_give_lowest_version(tmp_path, sim_hosts):
    sim = sim_hosts("single")
    # dev root "/" style paths are impossible here, but uuid names keep 0.5.0 only for hostPath
    spec = yaml.safe_load(
        generate(
            sim, "--vendor", "example.com", "--class", "accel", "--device-name-strategy", "uuid"
        ).stdout
    )
    assert spec["kind"] == "example.com/accel"
    assert spec["cdiVersion"] == "0.5.0"  # hostPath on the nodes


@pytest.mark.parametrize(
    "args, needle",
    [
        (["-o", "/dev/null/cdi/spec.yaml"], "cannot create /dev/null"),
        (["-o", "spec.txt"], "spec.txt"),
        (["--capabilities", "compute,foo"], "--capabilities: unknown capability 'foo'; known"),
    ],
)
def test_bad_arguments_one_line(sim_hosts, args, needle):
    sim = sim_hosts("single")
    proc = run_nvshim(
        "cdi", "generate", "--driver-root", sim.driver_root, "--dev-root", sim.dev_root, *args
    )
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert needle in proc.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "flag, value, why",
    [
        ("--vendor", "-bad", "must start with a letter"),
        ("--vendor", "x y", 'character " " is not allowed'),
        ("--vendor", "", "must not be empty"),  # not the default in disguise
        ("--class", "a/b", 'character "/" is not allowed'),
        ("--class", "gpu.", "must end with a letter or digit"),
    ],
)
def test_a_bad_cdi_name_option_is_named_and_nothing_is_written(
    sim_hosts, tmp_path, flag, value, why
):
    """The error names the option and its value (as the other options' errors do); exit
    2 (a usage error) and the spec already at -o left as it was."""
    sim = sim_hosts("single")
    out = tmp_path / "spec.yaml"
    out.write_text("old\n")
    proc = run_nvshim(
        "cdi", "generate", "--driver-root", sim.driver_root, "--dev-root", sim.dev_root,
        "-o", str(out), flag, value,
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (
        f"nvshim: error: {flag} \"{value}\": {why}; try 'nvshim cdi generate --help'\n"
    )
    assert out.read_text() == "old\n" and os.listdir(tmp_path) == ["spec.yaml"]


@pytest.mark.parametrize(
    "args, line",
    [
        (["-o", ""], "invalid value for '-o' / '--output': empty path"),  # not stdout
        (["--driver-root", ""], "invalid value for '--driver-root': empty path"),  # nor config's
        (["--dev-root", ""], "invalid value for '--dev-root': empty path"),
        (["--capabilities", ""], "--capabilities: empty; name capabilities or all"),
        (["--hook-path", ""], "invalid value for '--hook-path': empty path"),
        # a spec naming it is refused by every runtime (cdi validate says so)
        (["--hook-path", "bin/hook"], "--hook-path 'bin/hook': must be an absolute path"),
    ],
)
def test_an_empty_or_relative_option_value_is_a_usage_error(sim_hosts, tmp_path, args, line):
    sim = sim_hosts("single")
    roots = {"--driver-root": sim.driver_root, "--dev-root": sim.dev_root}
    roots.update([args])  # one option each: it replaces a root or comes last
    proc = run_nvshim("cdi", "generate", *[w for kv in roots.items() for w in kv])
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == f"nvshim: error: {line}; try 'nvshim cdi generate --help'\n"


# -o's target, made in a private mount namespace (OUT: the output; a read-only bind
# mount of an empty directory, or a full 16 KiB tmpfs, at MNT)
UNWRITABLE = {
    "a directory": ("", "spec.yaml", "Is a directory"),
    "a read-only file system": (
        "mount --bind -o ro $EMPTY $MNT",
        "spec.yaml",
        "Read-only file system",
    ),
    "a full file system": (
        "mount -t tmpfs -o size=16k tmpfs $MNT && dd if=/dev/zero of=$MNT/fill bs=4k count=4",
        "new/dir/spec.yaml",
        "No space left on device",
    ),
}


@pytest.mark.parametrize("case", UNWRITABLE)
def test_an_output_that_cannot_be_written_is_named(sim_hosts, tmp_path, case):
    """The line names -o's path (not the temporary file beside it); no temporary file or
    directory made for it is left."""
    from tests.conftest import NVSHIM, sh_in_private_mounts

    setup, name, why = UNWRITABLE[case]
    sim = sim_hosts("single")
    mnt, empty = tmp_path / "mnt", tmp_path / "empty"
    mnt.mkdir()
    empty.mkdir()
    out = mnt / name
    if case == "a directory":
        out.mkdir()
    script = (
        f"{setup or 'true'} 2>/dev/null && {NVSHIM} cdi generate --driver-root {sim.driver_root}"
        f" --dev-root {sim.dev_root} -o {out}; echo rc=$?; ls -A $MNT"
    )
    proc = sh_in_private_mounts(script, MNT=str(mnt), EMPTY=str(empty))
    assert proc.stderr == f"nvshim: error: {out}: {why}\n"
    left = {"a directory": ["spec.yaml"], "a full file system": ["fill"]}.get(case, [])
    assert proc.stdout.split() == ["rc=1", *left]


def test_output_replaced_atomically(sim_hosts, tmp_path):
    sim = sim_hosts("single")
    out = tmp_path / "spec.json"
    out.write_text("old")
    os.chmod(out, 0o600)
    generate(sim, "-o", str(out))
    assert json.loads(out.read_text())["kind"] == "nvidia.com/gpu"
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o644
    assert os.listdir(tmp_path) == ["spec.json"]  # no temp file left behind


def test_cdi_list(sim_hosts, tmp_path):
    sim = sim_hosts("a100-mig-1g5gb")
    d = tmp_path / "cdi"
    d.mkdir()
    generate(sim, "-o", str(d / "nvidia.yaml"))
    proc = run_nvshim("cdi", "list", "--spec-dir", str(d))
    by_index_and_uuid = [  # the default names: index and UUID, as the device plugin asks
        name for i, uuid in enumerate(sim.mig_uuids()) for name in (f"0:{i}", uuid)
    ]
    assert proc.stdout.split() == [f"nvidia.com/gpu={n}" for n in sorted(by_index_and_uuid)] + [
        "nvidia.com/gpu=all"
    ]


def test_cdi_list_names_a_cdi_dir_that_does_not_exist(sim_hosts, tmp_path):
    """A mistyped --cdi-dir was an empty list and exit 0, nothing said: now a warning
    naming it (still exit 0: the directories that exist are listed)."""
    sim = sim_hosts("single")
    (tmp_path / "cdi").mkdir()
    generate(sim, "-o", str(tmp_path / "cdi" / "nvidia.yaml"))
    missing = tmp_path / "cid"
    proc = run_nvshim("cdi", "list", "--cdi-dir", str(missing), "--cdi-dir", str(tmp_path / "cdi"))
    assert proc.returncode == 0 and "nvidia.com/gpu=all" in proc.stdout.split()
    assert proc.stderr == f"nvshim: warning: --cdi-dir {missing}: no such directory\n"


def generate_for_podman(sim, spec, launchers: str, tmp_path) -> None:
    """Write the CDI spec ``spec`` whose hook entries name a config of ``tmp_path``'s own,
    so the hooks podman runs log and keep state under ``tmp_path``."""
    config = tmp_path / "nvshim.toml"
    config.write_text(
        f'[runtime]\nlog-file = "{tmp_path}/nvshim.log"\ninventory-dir = "{tmp_path}/state"\n'
    )
    generate(
        sim,
        "-o",
        str(spec),
        hook_path=f"{launchers}/nvshim-hook",
        env={"NVSHIM_CONFIG": str(config)},
    )


def test_podman_consumes_the_spec(sim_hosts, launchers, tmp_path):
    """A real consumer: podman runs a busybox container with --device nvidia.com/gpu=N."""
    sim = sim_hosts("h100x8-mig")
    cdi_dir = tmp_path / "cdi"
    cdi_dir.mkdir()
    generate_for_podman(sim, cdi_dir / "nvidia.yaml", launchers, tmp_path)
    rootfs = make_busybox_rootfs(tmp_path / "rootfs")
    ver = sim.driver_version
    script = (
        "ls /dev; ls /dev/nvidia-caps 2>/dev/null; "
        f"test -f /usr/lib/x86_64-linux-gnu/libcuda.so.{ver} && echo LIB-OK; "
        "readlink /usr/lib/x86_64-linux-gnu/libcuda.so.1; "
        "test -x /usr/bin/nvidia-smi && echo BIN-OK"
    )
    proc = podman_run(
        tmp_path,
        rootfs,
        ["--device", "nvidia.com/gpu=1", "--", "/bin/sh", "-c", script],
        cdi_dir=str(cdi_dir),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    listed = proc.stdout.split()
    assert "nvidia1" in listed and "nvidiactl" in listed and "nvidia-uvm" in listed
    assert not {f"nvidia{i}" for i in (0, 2, 3, 4, 5, 6, 7)} & set(listed)
    assert "LIB-OK" in listed and "BIN-OK" in listed
    assert f"libcuda.so.{ver}" in listed
    assert "create-symlinks" in (tmp_path / "nvshim.log").read_text()  # its own log

    # a MIG device: its parent's node and its two capability nodes, nothing else
    gpu6 = sim.topology["gpus"][6]
    mig = sorted(gpu6["mig_devices"], key=lambda m: m["slot"])[0]
    proc = podman_run(
        tmp_path / "mig",
        rootfs,
        ["--device", "nvidia.com/gpu=6:0", "--", "/bin/sh", "-c", "ls /dev /dev/nvidia-caps"],
        cdi_dir=str(cdi_dir),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    listed = set(proc.stdout.split())
    caps = set(sim.mig_cap_names(mig["uuid"]))
    assert caps <= listed
    assert f"nvidia{gpu6['minor']}" in listed
    assert {x for x in listed if x.startswith("nvidia-cap") and x != "nvidia-caps"} == caps


def test_unseen_host_other_topology_and_driver(tmp_path):
    """A host nvshim has never seen: 3 GPUs, MIG everywhere, another driver version."""
    from tests.sim.simhost import build_host
    from tests.sim.topology import generate_topology

    sim = build_host(generate_topology(3, True, driver_version="570.86.10"), str(tmp_path / "h"))
    out = tmp_path / "spec.json"
    generate(sim, "-o", str(out), "--device-name-strategy", "uuid")
    assert run_nvshim("cdi", "validate", str(out)).returncode == 0
    spec = json.loads(out.read_text())
    assert [d["name"] for d in spec["devices"]] == sim.mig_uuids() + ["all"]
    mounts = {m["containerPath"] for m in spec["containerEdits"]["mounts"]}
    assert "/usr/lib/x86_64-linux-gnu/libcuda.so.570.86.10" in mounts
    assert not any("550.90.12" in m for m in mounts)
    assert "/lib/firmware/nvidia/570.86.10/gsp_ga10x.bin" in mounts
