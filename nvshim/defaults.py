"""Defaults the config and the runtime share, and the tests' fault points
(``fault_point``) of nvshim-runtime, nvshim-runtimed and the finishing steps.

Free of imports, and low: ``nvshim.config`` reads the defaults without loading the
runtime, and the in-container toolkit (``nvshim.rootfs``) calls ``fault_point`` without
it. One module, not two: every process that loads the config loads it (a GPU create
and the hook pay for one file, as they did when this lived in ``nvshim.runtime``).
"""

DEFAULT_RUNTIMES = ("runc", "crun")
DEFAULT_CONFIG = "/etc/nvshim/config.toml"  # $NVSHIM_CONFIG names another
# PCIe affinity levels (``nvidia-smi topo -m``), best first: nvshim.host.pcie ranks by
# them, ``[pairing] worst-affinity`` names one
PCIE_LEVELS = ("PIX", "PXB", "PHB", "NODE", "SYS")
# Driver capabilities (NVIDIA_DRIVER_CAPABILITIES values) in canonical order: nvshim.policy
# .capabilities reads the variable by them, ``[policy] default-capabilities`` names some
CAPABILITIES = ("compute", "utility", "video", "graphics", "display", "ngx", "compat32")
DEFAULT_CAPABILITIES = ("utility", "compute")

# Tests' fault injection (tests/test_runtime_faults.py): read once, from the environment
# nvshim-runtime or nvshim-runtimed started with (an engine's, the unit's), never from a
# call's (a worker takes a call's environment on later) nor from a container's; never in
# nvshim-hook (its module is loading when this one is: a hook entry someone wrote without
# an env would hand it the container's environment).
_PAUSE = __import__("posix").environ.get(b"NVSHIM_TEST_PAUSE", b"").decode(errors="replace")
_PAUSE_DIR = -1  # its directory, opened here on the host: a step may run in a container's


def _open_pause_dir() -> int:
    import posix

    try:
        flags = posix.O_PATH | posix.O_DIRECTORY | posix.O_CLOEXEC
        return posix.open(_PAUSE.rpartition(":")[0], flags)
    except OSError:
        return -1


if _PAUSE and "nvshim.hook.main" not in __import__("sys").modules:
    _PAUSE_DIR = _open_pause_dir()


def fault_point(step: str) -> None:
    """Stop this process (SIGSTOP) at ``step`` when ``NVSHIM_TEST_PAUSE`` is
    ``DIR:STEP[,STEP...]`` and ``DIR/STEP`` does not exist yet: it then holds this pid
    (the test kills a process or sends SIGCONT). Does nothing otherwise. Imports
    nothing: it may run in a container's mount namespace."""
    if _PAUSE_DIR < 0 or step not in _PAUSE.rpartition(":")[2].split(","):
        return
    posix = __import__("sys").modules["posix"]  # loaded at start: no file is read
    try:  # once: the test removes the file to stop here again
        flags = posix.O_WRONLY | posix.O_CREAT | posix.O_EXCL
        fd = posix.open(step, flags, 0o600, dir_fd=_PAUSE_DIR)
    except FileExistsError:
        return
    posix.write(fd, f"{posix.getpid()}\n".encode())
    posix.close(fd)
    posix.kill(posix.getpid(), 19)  # SIGSTOP (the signal module costs an import)
