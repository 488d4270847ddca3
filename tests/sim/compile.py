"""Compile the fake NVML and the driver-library stubs once, into a cache shared by builds.

Cache directory: ``$NVSHIM_SIM_CACHE``, else ``$XDG_CACHE_HOME/nvshim-sim``, else
``/tmp/nvshim-sim-cache``; entries live under a hash of the gcc version, the source and
the flags, so a new compiler or source never reuses a stale object. Entries are written
to a temporary name and renamed, so concurrent builders never see half a file.

A machine without gcc builds simulated hosts from a cache filled elsewhere: ``prebuild``
records the compiler's identity in it (``COMPILER_FILE``), which then stands for gcc's
(bench/real_gpu_carry.py carries such a cache).
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass

from nvshim.errors import NvshimError

FAKE_NVML_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fakenvml.c")
FAKE_NVML_FLAGS = (
    "-O2",
    "-Wall",
    "-shared",
    "-fPIC",
    "-fvisibility=hidden",
    "-pthread",
    "-Wl,-soname,libnvidia-ml.so.1",
)
COMPILER_FILE = "compiler"  # in a cache filled elsewhere: the identity of the gcc that did
STUB_SOURCE = (
    "/* nvshim simulated driver library: an empty shared object with a SONAME. */\n"
    '__attribute__((visibility("default"))) const char nvshim_sim_stub_soname[] = SONAME;\n'
)


def cache_root() -> str:
    """The directory holding compiled objects."""
    if os.environ.get("NVSHIM_SIM_CACHE"):
        return os.environ["NVSHIM_SIM_CACHE"]
    if os.environ.get("XDG_CACHE_HOME"):
        return os.path.join(os.environ["XDG_CACHE_HOME"], "nvshim-sim")
    return "/tmp/nvshim-sim-cache"


@functools.cache
def _gcc() -> tuple[str, str]:
    """The gcc binary and a string identifying its version and target; without gcc,
    ("", the identity recorded in a cache filled elsewhere)."""
    gcc = shutil.which("gcc")
    if not gcc:
        try:
            with open(os.path.join(cache_root(), COMPILER_FILE)) as fh:
                return "", fh.read().strip()
        except FileNotFoundError:
            raise NvshimError(
                "simulated host: gcc not found on PATH (run tests/setup.sh)"
            ) from None
    out = subprocess.run(
        [gcc, "-dumpfullversion", "-dumpmachine"], capture_output=True, text=True, check=False
    )
    return gcc, " ".join(out.stdout.split()) + " " + os.path.realpath(gcc)


def _entry_dir(*parts: str) -> str:
    digest = hashlib.sha256("\0".join((_gcc()[1], *parts)).encode()).hexdigest()[:16]
    return os.path.join(cache_root(), digest)


@dataclass
class _Job:
    """A running gcc writing ``tmp``, renamed to ``dest`` when it succeeds."""

    proc: subprocess.Popen
    tmp: str
    dest: str
    error: str = ""

    def finish(self) -> bool:
        """Wait for gcc; move the output into place on success. Returns success."""
        _, err = self.proc.communicate()
        if self.proc.returncode != 0:
            os.unlink(self.tmp)
            self.error = " ".join(err.split())[:300]
            return False
        os.chmod(self.tmp, 0o755)
        os.replace(self.tmp, self.dest)
        return True


def _compile(source: str, flags: list[str], dest: str) -> _Job:
    """Start gcc compiling ``source`` into ``dest`` (through a temporary file)."""
    if not _gcc()[0]:
        raise NvshimError(f"simulated host: gcc not found on PATH and {dest} not prebuilt")
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=os.path.dirname(dest))
    os.close(fd)
    proc = subprocess.Popen(
        [_gcc()[0], *flags, "-o", tmp, source],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    return _Job(proc, tmp, dest)


def fake_nvml() -> str:
    """Path of the compiled fake ``libnvidia-ml.so.1`` (compiled on first use)."""
    with open(FAKE_NVML_SOURCE, "rb") as fh:
        source = fh.read()
    dest = os.path.join(
        _entry_dir("fakenvml", source.decode(), *FAKE_NVML_FLAGS), "libnvidia-ml.so"
    )
    if not os.path.exists(dest):
        job = _compile(FAKE_NVML_SOURCE, list(FAKE_NVML_FLAGS), dest)
        if not job.finish():
            raise NvshimError(f"{FAKE_NVML_SOURCE}: gcc failed: {job.error}")
    return dest


def _stub_flags(soname: str, bits: int, libc: str | None = None) -> list[str]:
    flags = [
        f"-m{bits}",
        "-shared",
        "-fPIC",
        "-nostdlib",
        f'-DSONAME="{soname}"',
        f"-Wl,-soname,{soname}",
    ]
    # A DT_NEEDED on libc.so.6 makes ldconfig file a 32-bit library as "libc6" like a real
    # one; the 32-bit libc itself may be missing here, so link against a stand-in.
    return flags + (["-Wl,--no-as-needed", libc] if libc else [])


def _libc32(base: str, src: str) -> str | None:
    """A 32-bit stand-in ``libc.so.6`` to link 32-bit stubs against; None without multilib."""
    dest = os.path.join(base, "libc32", "libc.so.6")
    if not os.path.exists(dest):
        job = _compile(src, _stub_flags("libc.so.6", 32), dest)
        if not job.finish():
            return None
    return dest


def stubs(wanted: Iterable[tuple[str, int]]) -> dict[tuple[str, int], str]:
    """Paths of stub libraries for ``(soname, bits)`` pairs, compiling missing ones in parallel.

    32-bit stubs are left out of the result when gcc cannot build them (no multilib).
    """
    base = _entry_dir("stub-v2", STUB_SOURCE)
    src = os.path.join(base, "stub.c")
    if not os.path.exists(src):
        os.makedirs(base, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=base)
        with os.fdopen(fd, "w") as fh:
            fh.write(STUB_SOURCE)
        os.replace(tmp, src)
    unsupported32 = os.path.join(base, "no-32-bit")
    result: dict[tuple[str, int], str] = {}
    missing: list[tuple[tuple[str, int], str]] = []
    for soname, bits in dict.fromkeys(wanted):
        dest = os.path.join(base, str(bits), soname)
        if os.path.exists(dest):
            result[(soname, bits)] = dest
        elif bits == 64 or not os.path.exists(unsupported32):
            missing.append(((soname, bits), dest))
    libc32 = None
    if any(bits == 32 for (_, bits), _ in missing):
        libc32 = _libc32(base, src)
        if libc32 is None:
            open(unsupported32, "w").close()
            missing = [(key, dest) for key, dest in missing if key[1] == 64]
    width = max(2, (os.cpu_count() or 1) * 2)
    for start in range(0, len(missing), width):
        batch = [
            (key, _compile(src, _stub_flags(*key, libc32 if key[1] == 32 else None), dest))
            for key, dest in missing[start : start + width]
        ]
        for (soname, bits), job in batch:
            if not job.finish():
                raise NvshimError(f"gcc cannot build the {bits}-bit stub {soname}: {job.error}")
            result[(soname, bits)] = job.dest
    return result


def prebuild(wanted: Iterable[tuple[str, int]]) -> str:
    """Compile the fake NVML and the stubs ``wanted`` (see ``stubs``) into the cache and
    record this gcc's identity there, for machines without gcc; returns the cache root."""
    fake_nvml()
    stubs(wanted)
    path = os.path.join(cache_root(), COMPILER_FILE)
    with open(path + ".tmp", "w") as fh:
        fh.write(_gcc()[1] + "\n")
    os.replace(path + ".tmp", path)
    return cache_root()
