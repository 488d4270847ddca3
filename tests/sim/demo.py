"""The quick-start demo: build the simulated 8 x H100 host, show what nvshim discovers,
write and validate the CDI spec, and (when podman is installed) run a container that
gets GPU 0 through it; then the same request through nvshim-runtime and runc, in
nvshim-runtime's own process and served by nvshim-runtimed (through a slot: no interpreter).

Usage: ``python3 -m tests.sim.demo [--host NAME] [--dir DIR]`` (root: the host needs mknod).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys

from tests.sim.simhost import build_host

BIN = os.path.dirname(sys.executable)
# a privileged container: the default policy honours NVIDIA_VISIBLE_DEVICES only there
PRIVILEGED = ["CAP_SYS_ADMIN", "CAP_KILL", "CAP_AUDIT_WRITE"]


def step(title: str) -> None:
    print(f"\n==> {title}", flush=True)


def nvshim(*args: str) -> None:
    print("$ nvshim " + " ".join(args), flush=True)
    subprocess.run([os.path.join(BIN, "nvshim"), *args], check=True)


def served_run(work: str, bin_dir: str, config: str, rootfs: str, request: str) -> int:
    """The same container once more, with nvshim-runtimed (its own cache directory under
    ``work``) doing nvshim-runtime's work."""
    from tests.runc_util import RUNC_ENV, make_bundle, runc_run, start_daemon

    step("the same through nvshim-runtimed: nvshim-runtime's resident half does the work")
    env = {"NVSHIM_CONFIG": config, "NVSHIM_CACHE_DIR": os.path.join(work, "cache")}
    runtime = os.path.join(bin_dir, "nvshim-runtime")
    # one call through Python writes the sh front's cache; from then on the front alone
    # decides, and hands a GPU create to the daemon through a slot: no interpreter
    subprocess.run([runtime, "--version"], env={**RUNC_ENV, **env}, check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    log = os.path.join(work, "nvshim-runtimed.log")
    print(f"$ NVSHIM_CACHE_DIR={env['NVSHIM_CACHE_DIR']} nvshim-runtimed --verbose &")
    daemon = start_daemon(bin_dir, {"PATH": os.environ.get("PATH", ""), **env}, log, "--verbose")
    try:
        bundle = make_bundle(
            os.path.join(work, "runc"),
            rootfs,
            ["/bin/sh", "-c", "echo CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"],
            env={"NVIDIA_VISIBLE_DEVICES": request},
            name="served",
            capabilities=PRIVILEGED,
        )
        proc = runc_run(bundle, "nvshim-demo-served", runtime=runtime, env=env)
        print(proc.stdout + proc.stderr)
    finally:
        daemon.terminate()
        daemon.wait(timeout=60)
    with open(log) as fh:
        print("nvshim-runtimed's log:\n" + fh.read())
    with open(os.path.join(work, "nvshim.log")) as fh:
        print("decision log:\n" + "".join(ln for ln in fh if "nvshim-demo-served" in ln))
    return proc.returncode


def pick_devices(sim) -> tuple[str, str]:
    """The devices the demo's containers ask for on ``sim``: a whole GPU for podman (a
    MIG device where every GPU is in MIG mode) and, for runc, the first MIG device where
    the host has one (``GPU:SLOT``), else that GPU."""
    whole = mig = None
    for index, gpu in enumerate(sim.topology["gpus"]):
        if gpu["mig_devices"]:
            mig = mig or f"{index}:{min(m['slot'] for m in gpu['mig_devices'])}"
        else:
            whole = whole or str(index)
    return whole or mig, mig or whole


def describe(request: str) -> str:
    return f"MIG device {request}" if ":" in request else f"GPU {request}"


def summarize_spec(path: str) -> None:
    """A few lines on the spec at ``path`` (the whole spec is in the file)."""
    import yaml

    with open(path) as fh:
        spec = yaml.safe_load(fh)
    names = [d["name"] for d in spec.get("devices", [])]
    common = spec.get("containerEdits", {})
    shown = ", ".join(names[:6]) + (f", ... ({len(names)} in all)" if len(names) > 6 else "")
    print(f"kind {spec['kind']}, cdiVersion {spec['cdiVersion']}")
    print(f"devices: {shown}")
    print(
        f"common edits: {len(common.get('deviceNodes', []))} device nodes, "
        f"{len(common.get('mounts', []))} mounts, {len(common.get('hooks', []))} hooks, "
        f"env {common.get('env', [])}"
    )
    print(f"(the whole spec: {path})")


def show(command: list[str], env: dict[str, str] | None = None) -> None:
    """Print ``command`` as a person would type it."""
    prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in (env or {}).items())
    print("$ " + prefix + " ".join(shlex.quote(a) for a in command), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="h100x8-mig", help="shipped simulated host")
    parser.add_argument("--dir", default="/tmp/nvshim-demo", help="scratch directory")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("demo: run as root (the simulated host needs mknod)", file=sys.stderr)
        return 1
    args.dir = os.path.abspath(args.dir)
    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir)
    # every cache and marker nvshim writes stays in the scratch directory
    os.environ["NVSHIM_CACHE_DIR"] = os.path.join(args.dir, "cache")
    step(f"building the simulated host {args.host!r} in {args.dir}/host")
    sim = build_host(args.host, os.path.join(args.dir, "host"))
    bin_dir = os.path.join(args.dir, "bin")
    config = os.path.join(args.dir, "config.toml")
    with open(config, "w") as fh:
        fh.write(
            f'[host]\ndriver-root = "{sim.driver_root}"\ndev-root = "{sim.dev_root}"\n'
            f'[runtime]\nhook-path = "{bin_dir}/nvshim-hook"\n'
            f'log-file = "{args.dir}/nvshim.log"\ninventory-dir = "{args.dir}/state"\n'
        )
    os.environ["NVSHIM_CONFIG"] = config
    print(f"config: {config}")

    step("installing the isolated launchers")
    nvshim("install", "--bin-dir", bin_dir)

    step("the discovered host")
    nvshim("info")

    step("the CDI spec")
    cdi_dir = os.path.join(args.dir, "cdi")
    os.makedirs(cdi_dir)
    spec = os.path.join(cdi_dir, "nvidia.yaml")
    nvshim("cdi", "generate", "-o", spec)
    summarize_spec(spec)
    nvshim("cdi", "validate", spec)
    nvshim("cdi", "list", "--cdi-dir", cdi_dir)

    if shutil.which("podman"):
        from tests.podman_util import make_busybox_rootfs, podman_run

        device = f"nvidia.com/gpu={pick_devices(sim)[0]}"
        step(f"podman run --device {device} (busybox rootfs)")
        rootfs = make_busybox_rootfs(os.path.join(args.dir, "rootfs"))
        script = (
            "echo /dev:; ls /dev | grep nvidia; "
            "echo libcuda:; ls -l /usr/lib/x86_64-linux-gnu/ | grep libcuda"
        )
        podman_args = ["--device", device, "--", "/bin/sh", "-c", script]
        show(["podman", "--cdi-spec-dir", cdi_dir, "run", "--rm", "--rootfs", rootfs,
              *[a for a in podman_args if a != "--"]])  # fmt: skip
        proc = podman_run(os.path.join(args.dir, "podman"), rootfs, podman_args, cdi_dir=cdi_dir)
        print(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            return proc.returncode
    else:
        print("\n(podman not installed: skipping the container step)")

    if shutil.which("runc"):
        from tests.podman_util import make_busybox_rootfs
        from tests.runc_util import make_bundle, runc_run

        request = pick_devices(sim)[1]
        step(f"runc through nvshim-runtime, a privileged container asking for {describe(request)}")
        work = os.path.join(args.dir, "runc")
        rootfs = make_busybox_rootfs(os.path.join(work, "rootfs"))
        bundle = make_bundle(
            work,
            rootfs,
            [
                "/bin/sh",
                "-c",
                "ls /dev | grep nvidia; [ ! -d /dev/nvidia-caps ] || ls /dev/nvidia-caps; "
                "echo CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES",
            ],
            env={"NVIDIA_VISIBLE_DEVICES": request},
            capabilities=PRIVILEGED,
        )
        runtime = os.path.join(bin_dir, "nvshim-runtime")
        show([runtime, "--root", os.path.join(work, "runc-state"), "run", "--bundle", bundle,
              "nvshim-demo"])  # fmt: skip
        env = {"NVSHIM_CONFIG": config, "NVSHIM_CACHE_DIR": os.environ["NVSHIM_CACHE_DIR"]}
        proc = runc_run(bundle, "nvshim-demo", runtime=runtime, env=env)
        print(proc.stdout + proc.stderr)
        with open(os.path.join(args.dir, "nvshim.log")) as fh:
            print("decision log:\n" + "".join(line for line in fh if "nvshim-runtime" in line))
        if proc.returncode != 0:
            return proc.returncode
        code = served_run(args.dir, bin_dir, config, rootfs, pick_devices(sim)[0])
        if code != 0:
            return code
    print("\ndemo finished: everything above ran against the simulated host")
    print(f"everything it wrote is under {args.dir}; next, try:")
    env = f"NVSHIM_CONFIG={config} NVSHIM_CACHE_DIR={os.environ['NVSHIM_CACHE_DIR']}"
    for command in ("nvshim info --json", f"nvshim cdi list --cdi-dir {cdi_dir}",
                    "nvshim doctor", "nvshim --help"):  # fmt: skip
        print(f"  {env} .venv/bin/{command}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
