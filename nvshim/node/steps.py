"""The installer's steps, each safe to repeat after a crash, and their undo.

Order on install: discovery and the sharing config's check (nothing written yet),
nvshim's files on the host, its config (and the sharing config), the CDI spec, the
nvshim-runtimed unit (:mod:`nvshim.node.runtimed`), then the engine (configure,
restart). Uninstall runs the other way. One installer at a time per node:
:func:`node_lock` holds the pid file locked for the installer's whole life, so a second
pod on the node waits until the first one is gone.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Callable, Iterator

from nvshim.errors import NvshimError
from nvshim.node import placed, runtimed
from nvshim.node.env import NodeSettings

Say = Callable[[str], None]


@contextlib.contextmanager
def node_lock(
    s: NodeSettings, say: Say, stop: Callable[[], bool] = lambda: False
) -> Iterator[bool]:
    """Hold the node's pid file locked (our pid in it) and remove it on release. Waits
    while another installer holds it; yields False when ``stop()`` turned true first."""
    from nvshim.engines.common import make_dirs, remove_empty_dirs

    path = s.here(s.pid_file)
    waited = False
    created: list[str] = []
    while True:
        created += [d for d in make_dirs(os.path.dirname(path)) if d not in created]
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        except FileNotFoundError:  # the holder before us just removed its directory
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno not in (errno.EAGAIN, errno.EACCES):
                os.close(fd)
                raise
            if not waited:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                say(f"another nvshim installer (pid {holder}) holds {path}; waiting for it")
                waited = True
            os.close(fd)
            if stop():
                yield False
                return
            time.sleep(0.2)
            continue
        # the holder before us may have removed the file: then lock the new one instead
        with contextlib.suppress(FileNotFoundError):
            now = os.stat(path, follow_symlinks=False)
            mine = os.fstat(fd)
            if (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):
                break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.close(fd)
        remove_empty_dirs(created)
        with contextlib.suppress(OSError):  # an earlier installer's (uninstall emptied it)
            os.rmdir(os.path.dirname(path))


def install_files(s: NodeSettings) -> list[str]:
    """Put nvshim on the host at the prefix (the running bundle as its own versioned tree,
    then the prefix link switched to it: nothing a running runtime, hook or exporter
    executes is rewritten; launchers from a plain install), and the OCI hook file in
    CRI-O hook mode: ``nvshim.install``."""
    from nvshim.install import install_host

    return install_host(s.host_root, s.prefix, hooks_dir=s.hooks_dir, versioned=True)


def remove_files(s: NodeSettings, say: Say) -> None:
    """Take nvshim's files off the host, the prefix switched to the pass-through
    (:mod:`nvshim.node.leftover`) so that containers still running through nvshim stay
    manageable while the engine restarts; :func:`settle_files` decides after it."""
    from nvshim.install import uninstall_host
    from nvshim.node import leftover

    runtime = host_side_config(s).runtime
    runtimes = [str(r) for r in runtime.runtimes]
    tree = leftover.leave(s, runtimes, container_state(runtime.inventory_dir))
    for path in uninstall_host(s.host_root, s.prefix, switch_to=tree):
        say(f"removed {path}")


def settle_files(s: NodeSettings, say: Say, wait: float = 10.0) -> None:
    """The pass-through goes unless a container still runs through it; a version tree a
    process still runs from (the exporter sidecar stopping with this pod) is waited for
    up to ``wait`` seconds, then left to the next install."""
    from nvshim.install import prune_versions, versions_dir
    from nvshim.node import leftover

    for path in leftover.settle(s, say):
        say(f"removed {path}")
    top = s.here(versions_dir(s.prefix))
    link = s.here(s.prefix)
    keep = os.path.basename(os.readlink(link)) if os.path.islink(link) else None
    deadline = time.monotonic() + wait
    while True:
        for path in prune_versions(s.host_root, s.prefix, keep=keep):
            say(f"removed {path}")
        others = sorted(set(os.listdir(top)) - {keep}) if os.path.isdir(top) else []
        if not others:
            return
        if time.monotonic() > deadline:
            say(f"warning: {top}: left {', '.join(others)}: a process still runs from it")
            return
        time.sleep(0.2)


def container_state(inventory_dir: str) -> list[str]:
    """Host paths of what running containers still need from nvshim after an uninstall
    (their exec markers, their NIC claims in ``inventory_dir``, the host config's): kept
    while they run, removed by the pass-through with the last of them."""
    from nvshim.pairing.claims import DIR as CLAIMS_DIR
    from nvshim.runtime import MARKER_DIR
    from nvshim.trusted import DEFAULT_CACHE_DIR

    return [os.path.join(DEFAULT_CACHE_DIR, MARKER_DIR), os.path.join(inventory_dir, CLAIMS_DIR)]


def clean_run_dirs(s: NodeSettings, say: Say) -> None:
    """Remove nvshim's caches on the host (the inventory directory and the cache directory,
    both ``/run/nvshim`` by default: docs/configuration.md#directories); the node lock file
    stays until the lock is released. While containers still run through nvshim their exec
    markers stay (an install coming back must still enforce on their execs); the
    pass-through removes them with itself; so do the NIC claims of those containers
    (``rdma-claims`` in the inventory directory: a new container must not take a NIC
    they still hold). The DRA driver's MPS root (``nvshim.dra.DEFAULT_MPS_ROOT``, in the
    cache directory on its DaemonSet) is its own and stays: its claims' daemons, pipes
    and logs serve running pods. A directory another user could change
    (``nvshim.trusted.open_trusted_dir`` of its path under the host root, no symlink
    followed: where nvshim writes nothing) is left as it is, with a warning."""
    from nvshim.dra import DEFAULT_MPS_ROOT
    from nvshim.fsutil import remove_tree
    from nvshim.node.leftover import users
    from nvshim.trusted import DEFAULT_CACHE_DIR, UntrustedDir, open_trusted_dir

    inventory = host_side_config(s).runtime.inventory_dir
    keep = {s.here(s.pid_file), s.here(DEFAULT_MPS_ROOT)}
    if users(s):
        keep.update(s.here(path) for path in container_state(inventory))
    for host_dir in sorted({inventory, DEFAULT_CACHE_DIR}):
        top = os.path.normpath(os.path.join(s.host_root, host_dir.lstrip("/")))
        try:
            os.close(open_trusted_dir(top))
        except FileNotFoundError:
            continue
        except (UntrustedDir, OSError) as err:
            say(f"warning: left {top} as it is: {err}: another user could change it")
            continue
        gone = 0
        for name in os.listdir(top):
            path = os.path.join(top, name)
            if path in keep:
                continue
            if os.path.isdir(path) and not os.path.islink(path):
                remove_tree(path)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            gone += 1
        if gone:
            say(f"removed {gone} cache entr{'y' if gone == 1 else 'ies'} in {top}")


def host_config_text(s: NodeSettings, sharing_host_path: str | None) -> bytes:
    """nvshim's config for the host: the mounted config (or the host's own), with the
    paths the installer knows and the policy variables set."""
    import tomlkit

    if s.node_config:
        base = _read(s.node_config)
    else:
        base = (placed.original(s.here(s.host_config)) or b"").decode()
    doc = tomlkit.parse(base)
    values = {
        ("host", "driver-root"): s.driver_root,
        ("host", "dev-root"): s.dev_root,
        ("runtime", "hook-path"): s.hook_path,
    }
    if sharing_host_path:
        values[("sharing", "config")] = sharing_host_path
    for key, value in s.policy.items():
        values[("runtime" if key == "runtimes" else "policy", key)] = value
    for (section, key), value in values.items():
        if section not in doc:
            doc[section] = tomlkit.table()
        doc[section][key] = value
    return tomlkit.dumps(doc).encode()


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except (OSError, UnicodeDecodeError) as err:
        raise NvshimError(f"{path}: cannot read: {getattr(err, 'strerror', err)}") from None


def check_inputs(s: NodeSettings) -> None:
    """Refuse bad mounted files before anything is changed."""
    from nvshim.mps.sharing import check_sharing

    config = host_side_config(s)  # parses the mounted config.toml
    if s.sharing_config:
        if not os.path.isfile(s.sharing_config):
            raise NvshimError(f"{s.sharing_config}: sharing config not found")
        check_sharing(config)


def host_configs(s: NodeSettings) -> tuple[str, str]:
    """Host paths of nvshim's config and of the sharing config it names."""
    from nvshim.config import SharingConfig, parse_config

    sharing = SharingConfig().config
    if s.node_config:
        sharing = parse_config(_read(s.node_config).encode(), s.node_config).sharing.config
    return s.host_config, sharing


def write_configs(s: NodeSettings, say: Say) -> None:
    config_path, sharing_path = host_configs(s)
    if s.sharing_config:
        with open(s.sharing_config, "rb") as fh:
            say(placed.place(s.here(sharing_path), fh.read()))
    text = host_config_text(s, sharing_path if s.sharing_config else None)
    say(placed.place(s.here(config_path), text))


def discover(s: NodeSettings):
    """The host through the installer's paths (for NVML, MPS binaries)."""
    from nvshim.host.discover import discover_host

    return discover_host(s.driver_root_ctr, s.dev_root_ctr)


def host_side_config(s: NodeSettings):
    """nvshim's config as the host will read it (the mounted one, or defaults), with the
    mounted sharing config to read here."""
    from nvshim.config import Config, amended, parse_config

    config = Config()
    if s.node_config:
        config = parse_config(_read(s.node_config).encode(), s.node_config)
    return amended(config, "sharing", config=s.sharing_config or "")


def create_device_nodes(s: NodeSettings, say: Say) -> None:
    """CREATE_DEVICE_NODES=control: the GPUs' and control device nodes the host lacks
    (``nvshim system create-device-nodes --control-devices``'s code). They stay on the
    host after uninstall, as device nodes the driver would make."""
    from nvshim.host.mknodes import create_missing

    for line in create_missing(s.driver_root_ctr, s.dev_root_ctr, True):
        say(line)


def write_cdi(s: NodeSettings, say: Say, host) -> None:
    """The CDI spec (devices by index and by UUID, plus ``all``) naming host paths, and
    with an MPS sharing config the shared devices' spec (class ``gpu.shared``)."""
    from nvshim.cdi.writer import build_spec, dump_spec
    from nvshim.mps.sharing import sharing_for
    from nvshim.node.hostview import rebase_host
    from nvshim.policy.capabilities import parse_capabilities

    view = rebase_host(host, (s.driver_root_ctr, s.driver_root), (s.dev_root_ctr, s.dev_root))
    config = host_side_config(s)
    caps = parse_capabilities(None, config.policy.default_capabilities, [])
    strategies = ("index", "uuid")
    spec = build_spec(
        view, caps, s.hook_path, vendor=s.cdi_vendor, cls=s.cdi_class, strategies=strategies
    )
    say(placed.place(s.here(s.cdi_spec), dump_spec(spec, "yaml").encode()))
    if s.sharing_config and sharing_for(config, view):
        from nvshim.mps.cdi import shared_spec

        shared = shared_spec(
            view,
            config,
            caps,
            s.hook_path,
            vendor=s.cdi_vendor,
            strategies=strategies,
            daemon_check_hook=True,
        )
        say(placed.place(s.here(s.cdi_shared_spec), dump_spec(shared, "yaml").encode()))


def configure_engine(s: NodeSettings, say: Say) -> None:
    """Register the runtime (``nvshim configure``'s code) and make the engine reload; a
    rerun after a crash that wrote the config but never restarted restarts now."""
    from nvshim.engines.apply import configure
    from nvshim.engines.restart import restart

    if s.engine is None:
        say("engine configuration skipped (NO_RUNTIME_CONFIG or CRI-O hook mode)")
        return
    report = configure(s.engine)
    for line in report.lines:
        say(line)
    if not report.changed:
        say(restart(s.engine))


def unconfigure_engine(s: NodeSettings, say: Say) -> bool:
    """Take the runtime out of the engine config; whether the engine needs a restart
    (left to the caller: the last step, so every line before it reaches the pod log)."""
    from nvshim.engines.apply import unconfigure

    if s.engine is None:
        return False
    report = unconfigure(s.engine, restart_now=False)
    for line in report.lines:
        say(line)
    return report.changed


LOG_DRAIN = 0.5  # seconds for the engine to copy the lines above into the pod log


def restart_engine(s: NodeSettings, say: Say) -> None:
    """The uninstall's engine restart. containerd copies a pod's output into its log
    itself, so lines written just before it goes down are lost: the restart waits a
    moment after saying it comes."""
    from nvshim.engines.restart import restart
    from nvshim.node.leftover import crio_users

    if s.engine_name == "crio" and crio_users(s):
        say(
            f"not restarting crio: {len(crio_users(s))} container(s) of handler"
            f" {s.engine.runtime_name!r} still exist, and CRI-O cannot exec, stop or delete a"
            " container whose handler is gone from its config ('failed to find runtime"
            " handler'); the running CRI-O keeps the handler (a SIGHUP does not drop it) and"
            " calls the pass-through; it leaves CRI-O at its next restart"
        )
        return
    say(f"restarting {s.engine_name} ({s.engine.restart}) to drop the runtime")
    if s.engine.restart != "none":
        time.sleep(LOG_DRAIN)
    say(restart(s.engine))


def preflight(s: NodeSettings) -> None:
    """Refuse bad mounted files, and a restart that cannot happen, before any change."""
    from nvshim.engines.restart import find_systemctl, socket_owner

    check_inputs(s)
    runtimed.preflight(s)
    if s.engine is not None and s.engine.restart == "signal":
        socket_owner(s.engine.socket)
    elif s.engine is not None and s.engine.restart == "systemd":
        find_systemctl(s.engine.host_root)


def install(s: NodeSettings, say: Say) -> object:
    """Every install step (after :func:`preflight`); returns the discovered host
    (installer view) or None. A failure takes back what this run wrote when nothing was
    installed before it; an upgrade that fails switches the prefix back to the tree it
    named, so the earlier install keeps working (its other files are as it left them or
    already this run's, each complete)."""
    from nvshim.engines.common import state_path

    link = s.here(s.prefix)
    first = not os.path.lexists(link) and not os.path.exists(state_path(s.here(s.host_config)))
    previous = os.readlink(link) if os.path.islink(link) else None
    try:
        return _install(s, say)
    except Exception as err:
        say(f"error: install failed: {err}")
        if first:
            say("taking back what this install wrote")
            uninstall(s, say)
        elif previous is not None and os.path.isdir(os.path.join(os.path.dirname(link), previous)):
            from nvshim.install import prune_versions, replace_link

            if not os.path.islink(link) or os.readlink(link) != previous:
                replace_link(link, previous)
                say(f"{link}: switched back to {previous}; the earlier install stays")
                prune_versions(s.host_root, s.prefix, keep=os.path.basename(previous))
        raise


def _install(s: NodeSettings, say: Say) -> object:
    """The install steps. Discovery and the sharing config's check against the host
    come first: a failure there changes nothing."""
    if s.create_device_nodes:
        create_device_nodes(s, say)
    host = None
    if s.cdi_enabled or s.sharing_config:
        host = discover(s)
        for warning in host.warnings:
            say(f"warning: {warning}")
    if s.sharing_config:
        from nvshim.mps.sharing import check_sharing

        for warning in check_sharing(host_side_config(s), host):
            say(f"warning: {warning}")
    for path in install_files(s):
        say(f"installed {path}")
    write_configs(s, say)
    if s.cdi_enabled:
        write_cdi(s, say, host)
    runtimed.install(s, say)
    configure_engine(s, say)
    prune_files(s, say)
    return host


def prune_files(s: NodeSettings, say: Say) -> None:
    """Remove the bundle trees of earlier installs (and an uninstall's pass-through) that
    no process runs from, now that the engine names this one."""
    from nvshim.install import prune_versions

    link = s.here(s.prefix)
    keep = os.path.basename(os.readlink(link)) if os.path.islink(link) else None
    for path in prune_versions(s.host_root, s.prefix, keep=keep):
        say(f"removed {path}")


def uninstall(s: NodeSettings, say: Say) -> list[str]:
    """Undo :func:`install`; every step runs even when one before failed. The engine is
    restarted last (a signalled containerd cuts the pod log while it is down), with the
    pass-through in place; then the pass-through goes unless containers still use it.
    Returns the failures (one line each)."""
    failures: list[str] = []

    def step(action: Callable[[], object]) -> object:
        try:
            return action()
        except (NvshimError, OSError) as err:
            failures.append(str(err))
            say(f"error: {err}")
            return None

    def take_back(path: str) -> None:
        line = placed.take_back(s.here(path))
        if line:
            say(line)

    restart = step(lambda: unconfigure_engine(s, say))
    if not s.keep:
        step(lambda: runtimed.remove(s, say))
        step(lambda: take_back(s.cdi_spec))
        step(lambda: take_back(s.cdi_shared_spec))
    config_path, sharing_path = host_configs(s)
    if not s.keep:
        step(lambda: remove_files(s, say))
        step(lambda: clean_run_dirs(s, say))
    step(lambda: take_back(config_path))
    step(lambda: take_back(sharing_path))
    if restart:
        step(lambda: restart_engine(s, say))
    if not s.keep:
        step(lambda: settle_files(s, say))
    return failures
