"""nvshim-runtimed's parent process: it preloads what a call may import, listens on the
socket and the slots, and runs its pool of workers until SIGTERM."""

from __future__ import annotations

import gc
import importlib
import os
import pkgutil
import select
import signal
import socket
import time

import nvshim
from nvshim import __version__
from nvshim.errors import NvshimError, one_line
from nvshim.fsutil import file_identity
from nvshim.runtime.slots import SLOTS, Slots, pidfd_getfd, slots_name
from nvshim.runtimed import say
from nvshim.runtimed.pool import Limits, Pool, decline_busy
from nvshim.runtimed.trust import check_cache_dir, remember_own
from nvshim.trusted import CACHE_DIR

# What calls through nvshim-runtime may import; the CLI, installer, doctor and exporter
# never run there.
PRELOAD_PACKAGES = (
    "runtime",
    "runtimed",
    "hook",
    "rootfs",
    "policy",
    "host",
    "mps",
    "oci",
    "cdi",
    "pairing",
)
PRELOAD_MODULES = (
    "config", "defaults", "edits", "errors", "fastjson", "filecache", "fsutil",
    "hookentries", "ldcache", "log", "record", "trusted",
)  # fmt: skip
# imported inside functions on a call's path: a configuration or inventory cache miss
# (TOML, NVML), an MPS daemon query
PRELOAD_LAZY = ("tomllib", "pynvml", "subprocess")


def preload() -> list[str]:
    """Import what a call may need; the modules that failed to import (named)."""
    failed = []
    names = [*PRELOAD_LAZY, *(f"nvshim.{m}" for m in PRELOAD_MODULES)]
    for package in PRELOAD_PACKAGES:
        module = importlib.import_module(f"nvshim.{package}")
        names += [i.name for i in pkgutil.walk_packages(module.__path__, f"nvshim.{package}.")]
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as err:  # noqa: BLE001 - an optional dependency; the call imports it
            failed.append(f"{name} ({one_line(err)})")
    return failed


def share_ldconfig_copy() -> None:
    """Make the ld-cache step's tmpfs copy of the host ldconfig before the workers are
    forked: they share it (one copy, not one a worker; a worker whose ldconfig is
    another file, or changed, makes its own)."""
    from nvshim.hook.ldconfig import ldconfig_copy, open_host_ldconfig
    from nvshim.hook.steps import real_ldconfig

    try:
        fd = open_host_ldconfig(real_ldconfig(None))
        try:
            ldconfig_copy(fd)
        finally:
            os.close(fd)
    except (NvshimError, OSError) as err:
        say(2, f"no shared copy of the host ldconfig (a worker makes its own): {one_line(err)}")


def warm() -> None:
    """Fill what a worker keeps from call to call before the workers are forked, so
    that each starts with it instead of paying for it on its first call (about 10 ms on
    a 2-core machine, once per worker: a burst forks dozens): every record class's
    ``__init__``, the configuration, the host from its inventory cache (never
    discovered here: NVML is not loaded before a fork) and its libraries' ELF headers.
    Run again before the pool grows; a worker still checks each against its file."""
    from nvshim.record import compile_inits

    compile_inits()
    try:
        _warm_host()
    except NvshimError:  # a configuration that cannot be read: said on each call
        pass
    except Exception as err:  # noqa: BLE001 - a head start only: each worker reads it anyway
        say(2, f"not read ahead for the workers: {one_line(err)}")
    gc.freeze()  # what the workers share: their collections never walk it


def _warm_host() -> None:
    from nvshim.config import load_config
    from nvshim.hook.ldconfig import remember_libraries
    from nvshim.host.inventory import load_cached

    config = load_config()
    host = load_cached(config.runtime.inventory_dir, config.host.driver_root, config.host.dev_root)
    if host is not None:
        remember_libraries([f.host_path for f in host.files if f.kind == "lib"])


def listen(path: str) -> tuple[socket.socket, tuple[int, int]]:
    """A non-blocking socket bound at ``path`` (replaced atomically), mode 0600: the
    listener and the identity of the socket file, to remove it at exit only if it is
    still ours."""
    staging = f"{path}.{os.getpid()}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        if os.path.lexists(staging):
            os.unlink(staging)
        listener.bind(staging)
        os.chmod(staging, 0o600)
        listener.listen(1024)
        listener.setblocking(False)  # workers poll, then race to accept
        identity = file_identity(staging)
        os.rename(staging, path)
    except OSError as err:
        listener.close()
        raise NvshimError(f"{path}: cannot listen: {err.strerror}") from None
    return listener, identity


def sweep_markers(verbose: bool) -> None:
    """Remove the exec markers whose container is gone (with ``verbose``, one line for
    each: the front leaves the marker of every GPU container it deletes to this sweep)."""
    from nvshim.runtime.markers import sweep

    for name, root in sweep(CACHE_DIR, time.time()):
        if verbose:
            say(2, f"exec marker {name} removed: no container {name} in {root}")


def _stop(*_) -> None:
    raise SystemExit(0)


def _notify_ready() -> None:
    """Tell systemd (``Type=notify``) the socket is live."""
    address = os.environ.get("NOTIFY_SOCKET", "")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        try:
            sock.sendto(b"READY=1", address)
        except OSError:
            pass


def serve(path: str, verbose: bool = False, limits: Limits | None = None) -> None:
    """Listen at ``path`` and on the slots (``nvshim.runtime.slots``) and serve calls
    with a pool of workers until SIGTERM."""
    limits = limits or Limits()
    check_cache_dir(os.path.dirname(path))
    remember_own()
    failed = preload()
    for name in failed:
        say(2, f"not preloaded: {name}")
    share_ldconfig_copy()
    listener, identity = listen(path)
    slots = make_slots()
    pool = Pool(listener, verbose, limits, slots, warm)
    wake_r, wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    os.set_blocking(pool.status_r, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes poll through wake_w
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    ups = {} if slots is None else {slots.fds[k][1]: k for k in range(SLOTS)}
    sweep_markers(verbose)
    swept = time.monotonic()
    try:
        pool.tend()  # its first workers
        where = path if slots is None else f"{path} and {slots.path}"
        say(2, f"listening on {where} (nvshim {__version__})")
        _notify_ready()
        # epoll: one wake-up costs the same with 130 fds watched as with one
        poller, watched, listening = select.epoll(len(ups) + 4), set(), False
        pool.inherited.append(poller.fileno())  # a worker closes it
        for fd in (pool.status_r, wake_r):
            poller.register(fd, select.EPOLLIN)
        while True:
            if pool.flights_changed:  # a slot's K.u is watched while no call holds it
                pool.flights_changed = False
                wanted = {slots.fds[k][1] for k in pool.waiting()} if slots else set()
                for fd in watched - wanted:
                    poller.unregister(fd)
                for fd in wanted - watched:
                    poller.register(fd, select.EPOLLIN)
                watched = wanted
            busy = pool.overdue()  # then the parent declines connections no worker takes
            if busy != listening:
                if busy:
                    poller.register(listener.fileno(), select.EPOLLIN)
                else:
                    poller.unregister(listener.fileno())
                listening = busy
            for fd, _ in poller.poll(pool.wait_ms() / 1000):
                if fd == wake_r:
                    _drain(wake_r)
                elif fd == listener.fileno():
                    decline_busy(listener, len(pool.workers))
                elif fd in ups and ups[fd] not in pool.flights:
                    pool.requested(ups[fd])
            pool.read_status()
            pool.reap()
            pool.tend()
            pool.dispatch()
            pool.sweep()
            if time.monotonic() - swept >= limits.marker_sweep:
                sweep_markers(verbose)
                swept = time.monotonic()
    finally:
        if file_identity(path) == identity:
            try:
                os.unlink(path)
            except OSError:
                pass
        if slots is not None:
            slots.remove()
        pool.stop()
        listener.close()


def make_slots() -> Slots | None:
    """This daemon's slots, or None (said why) where the kernel cannot hand a caller's
    stdio over (``pidfd_getfd``, Linux 5.6): fronts then start Python."""
    try:
        pidfd = os.pidfd_open(os.getpid())
        try:
            os.close(pidfd_getfd(pidfd, 2))
        finally:
            os.close(pidfd)
    except OSError as err:
        say(2, f"no slots, every GPU create starts Python: pidfd_getfd: {err.strerror}")
        return None
    return Slots(os.path.join(CACHE_DIR, slots_name(__version__, nvshim.__file__)))


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass
