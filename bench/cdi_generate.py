#!/usr/bin/env python3
"""`nvshim cdi generate` against the reference, NVIDIA's `nvidia-ctk cdi generate`, side
by side on the same simulated hosts (1 and 8 H100s, with and without MIG), in one run:
each round runs both (alternating which goes first), so each pair shares the machine's
state of that moment; the ratio is the median of the per-round ratios.

nvshim runs as installed (the isolated ``#!python -IS`` launcher `nvshim install` and the
Debian package write); the venv's console script is timed too. Both write YAML to a file.

The reference binary: ``--nvidia-ctk PATH``, else one built from a checkout of
github.com/NVIDIA/nvidia-container-toolkit given as ``--reference-src DIR`` (or
``NVSHIM_BENCH_REFERENCE_SRC``) with the ``go`` on PATH (it vendors its modules: built
offline with ``-mod=vendor``) into ``$XDG_CACHE_HOME/nvshim-bench`` (default
``~/.cache/nvshim-bench``), rebuilt when the checkout's commit changes. Without either,
only nvshim's figures are printed.

The reference reads the MIG minors from the machine's own
``/proc/driver/nvidia-caps/mig-minors``, so the benchmark runs in a private mount
namespace with a tmpfs on ``/proc/driver`` holding the simulated host's file. Specs are
written to a tmpfs, as ``/var/run/cdi`` is one.

Run as root: `.venv/bin/python3 bench/cdi_generate.py [--rounds N] [--nvidia-ctk PATH]`.
Target: nvshim at or below the reference's time for 8 GPUs, MIG and not.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.paired import median_ratio  # noqa: E402
from nvshim.launch import real_interpreter, write_launchers  # noqa: E402
from tests.sim.simhost import build_host  # noqa: E402
from tests.sim.topology import generate_topology  # noqa: E402

IN_NAMESPACE = "NVSHIM_BENCH_PRIVATE_NS"
MIG_MINORS = "/proc/driver/nvidia-caps/mig-minors"


def cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(base, "nvshim-bench")


def build_reference(src: str) -> str | None:
    """nvidia-ctk built from the checkout ``src`` (cached by commit); None without go."""
    go = shutil.which("go")
    if go is None:
        print(f"reference: no `go` on PATH to build {src}", file=sys.stderr)
        return None
    commit = subprocess.run(
        ["git", "-C", src, "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    out = os.path.join(cache_dir(), f"nvidia-ctk-{commit or 'unknown'}")
    if os.path.exists(out):
        return out
    os.makedirs(cache_dir(), exist_ok=True)
    env = {
        **os.environ,
        "GOFLAGS": "-mod=vendor",
        "GOPROXY": "off",
        "GOTOOLCHAIN": "local",
        "GOCACHE": os.path.join(cache_dir(), "gocache"),
        "GOPATH": os.path.join(cache_dir(), "gopath"),
    }
    print(f"reference: building nvidia-ctk from {src} (minutes)...", file=sys.stderr)
    proc = subprocess.run(
        [go, "build", "-o", out + ".tmp", "./cmd/nvidia-ctk"],
        cwd=src,
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        print(f"reference: build failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
        return None
    os.rename(out + ".tmp", out)
    return out


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU (user + system, all threads) seconds of one run of ``argv``."""
    null = os.open(os.devnull, os.O_WRONLY)
    actions = [(os.POSIX_SPAWN_DUP2, null, 1), (os.POSIX_SPAWN_DUP2, null, 2)]
    start = time.perf_counter()
    pid = os.posix_spawn(argv[0], argv, env, file_actions=actions)
    _, status, usage = os.wait4(pid, 0)
    elapsed = time.perf_counter() - start
    os.close(null)
    if os.waitstatus_to_exitcode(status) != 0:
        proc = subprocess.run(argv, env=env, capture_output=True, text=True)
        raise SystemExit(f"{argv[0]} failed: {proc.stderr[-1000:]}")
    return elapsed, usage.ru_utime + usage.ru_stime


def device_names(path: str) -> list[str]:
    import yaml

    with open(path) as fh:
        return sorted(d["name"] for d in yaml.safe_load(fh)["devices"])


def measure(host, commands, spec_dir: str, env: dict, rounds: int) -> tuple[int, dict, dict]:
    """Device count, and wall and CPU seconds per command over ``rounds`` paired rounds."""
    argvs = {}
    for name, command in commands.items():
        out = os.path.join(spec_dir, f"{name.split()[0]}.yaml")
        if name == "nvidia-ctk":
            argv = [*command, "--quiet", "cdi", "generate", "--mode", "nvml"]
            argv += ["--nvidia-cdi-hook-path", "/usr/bin/nvidia-cdi-hook", "--output", out]
        else:
            argv = [*command, "cdi", "generate", "-o", out]
        argvs[name] = [*argv, "--driver-root", host.driver_root, "--dev-root", host.dev_root]
        timed(argvs[name], env)  # warm-up (page cache, nvshim's config cache)
    names = device_names(os.path.join(spec_dir, "nvshim.yaml"))
    if "nvidia-ctk" in commands:  # the same devices by the same names
        assert names == device_names(os.path.join(spec_dir, "nvidia-ctk.yaml"))
    wall: dict[str, list[float]] = {name: [] for name in commands}
    cpu: dict[str, list[float]] = {name: [] for name in commands}
    order = list(commands)
    for _ in range(rounds):
        for name in order:
            seconds, used = timed(argvs[name], env)
            wall[name].append(seconds)
            cpu[name].append(used)
        order.reverse()
    return len(names), wall, cpu


def row(label: str, devices: int, wall: dict, cpu: dict) -> str:
    """One table row: medians, and against the reference the paired ratios."""
    text = f"{label:<14}{devices:>8}"
    for samples in wall.values():
        text += f"{statistics.median(samples) * 1000:>19.1f} ms"
    if "nvidia-ctk" in wall:
        ours, ref = wall["nvshim"], wall["nvidia-ctk"]
        ratios = sorted(o / r for o, r in zip(ours, ref, strict=True))
        low, high = ratios[len(ratios) // 4], ratios[-1 - len(ratios) // 4]
        text += f"{median_ratio(ours, ref):>11.2f}x  {low:.2f}x to {high:.2f}x"
        text += f"  cpu {statistics.median(cpu['nvshim']) * 1000:.0f} ms"
        text += f" vs {statistics.median(cpu['nvidia-ctk']) * 1000:.0f} ms"
        text += f" ({median_ratio(cpu['nvshim'], cpu['nvidia-ctk']):.2f}x)"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--nvidia-ctk", help="the reference binary")
    parser.add_argument(
        "--reference-src", default=os.environ.get("NVSHIM_BENCH_REFERENCE_SRC"), metavar="DIR"
    )
    args = parser.parse_args()
    if os.environ.get(IN_NAMESPACE) != "1":
        env = {**os.environ, IN_NAMESPACE: "1"}
        unshare = ["unshare", "--mount", "--propagation", "private"]
        os.execvpe("unshare", [*unshare, sys.executable, *sys.argv], env)
    subprocess.run(["mount", "-t", "tmpfs", "bench-proc-driver", "/proc/driver"], check=True)
    os.makedirs(os.path.dirname(MIG_MINORS))

    reference = args.nvidia_ctk
    if reference is None and args.reference_src:
        reference = build_reference(args.reference_src)
    python = real_interpreter()
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "NVSHIM_CONFIG": os.devnull, "NVSHIM_CACHE_DIR": tmp + "/cache"}
        spec_dir = os.path.join(tmp, "cdi")
        os.mkdir(spec_dir)
        subprocess.run(["mount", "-t", "tmpfs", "bench-cdi", spec_dir], check=True)
        try:
            bin_dir = os.path.join(tmp, "bin")
            write_launchers(bin_dir, cli=True)
            commands = {
                "nvshim": [os.path.join(bin_dir, "nvshim")],
                "nvshim (venv script)": [os.path.join(os.path.dirname(sys.executable), "nvshim")],
            }
            if reference:
                commands["nvidia-ctk"] = [reference]
            yard = [timed([python, "-IS", "-c", "pass"], env)[0] for _ in range(args.rounds)]
            header = f"{'host':<14}{'devices':>8}" + "".join(f"{name:>22}" for name in commands)
            print(header + (f"{'nvshim/ref':>12}  per-round range, CPU" if reference else ""))
            for gpus in (1, 8):
                for mig in (False, True):
                    root = os.path.join(tmp, f"h{gpus}{'m' if mig else ''}")
                    host = build_host(generate_topology(gpus, mig), root)
                    if mig:
                        shutil.copy(os.path.join(host.dev_root, MIG_MINORS[1:]), MIG_MINORS)
                    elif os.path.exists(MIG_MINORS):
                        os.unlink(MIG_MINORS)
                    devices, wall, cpu = measure(host, commands, spec_dir, env, args.rounds)
                    label = f"{gpus} GPU{'s' if gpus > 1 else ''}{' MIG' if mig else ''}"
                    print(row(label, devices, wall, cpu), flush=True)
            print(
                f"yardstick python3 -IS -c pass: {statistics.median(yard) * 1000:.1f} ms; "
                f"{args.rounds} rounds, medians; range: middle half of the per-round ratios; "
                "cpu: user + system of all threads"
            )
            if not reference:
                print("reference not measured: give --nvidia-ctk or --reference-src")
        finally:
            subprocess.run(["umount", spec_dir], check=True)


if __name__ == "__main__":
    main()
