"""``nvshim mps start|stop|status`` over every MPS-shared device (or the ones named), and
their table rendering. Each device is handled on its own: one failure does not stop the rest."""

from __future__ import annotations

from nvshim.errors import NvshimError, UsageError
from nvshim.host.model import Host
from nvshim.mps import daemon
from nvshim.mps.daemon import DaemonStatus
from nvshim.mps.sharing import SharedDevice, sharing_for
from nvshim.record import field, record


@record
class Outcome:
    """Per-device results, and one line per device that failed."""

    daemons: list[DaemonStatus] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def raise_for_errors(self, verb: str) -> None:
        """One NvshimError line summarising the failures, if any."""
        if self.errors:
            total = len(self.daemons) + len(self.errors)
            raise NvshimError(
                f"{len(self.errors)} of {total} MPS daemon(s) failed to {verb}: {self.errors[0]}"
            )


def _names(host: Host) -> dict[str, str]:
    out = {g.uuid: str(g.index) for g in host.gpus}
    out.update({m.uuid: m.name_index for m in host.mig_devices()})
    return out


def _matches(wanted: str, uuid: str, name: str) -> bool:
    return wanted.strip().lower() in (uuid.lower(), name)


def mps_devices(config, host: Host) -> dict[str, SharedDevice]:
    """The MPS-shared devices (time-sliced ones need no daemon), by UUID."""
    return {u: s for u, s in sharing_for(config, host).items() if s.mode == "mps"}


def _pick(ids: tuple[str, ...], known: dict[str, str], what: str) -> list[str]:
    """UUIDs among ``known`` (uuid -> name) matching ``ids`` (all of them when none given)."""
    if not ids:
        return list(known)
    picked: list[str] = []
    for wanted in ids:
        found = [u for u, n in known.items() if _matches(wanted, u, n)]
        if not found:
            listed = ", ".join(known.values()) or "none"
            raise UsageError(f"--gpu {wanted}: not {what} (those are: {listed})")
        picked += [u for u in found if u not in picked]
    return picked


def start_all(config, host: Host, ids: tuple[str, ...] = ()) -> Outcome:
    """Start the daemon of every MPS-shared device (or of those named by ``ids``)."""
    shared = mps_devices(config, host)
    root = config.sharing.mps_root
    outcome = Outcome()
    for uuid in _pick(ids, {u: s.name for u, s in shared.items()}, "an MPS-shared device"):
        share = shared[uuid]
        try:
            outcome.daemons.append(daemon.start_daemon(host, share, root))
        except NvshimError as err:
            outcome.errors.append(f"device {share.name} ({uuid}): {err}")
    return outcome


def _daemon_targets(
    config, host: Host, ids: tuple[str, ...]
) -> tuple[dict[str, SharedDevice], dict[str, str], list[str]]:
    """The MPS-shared devices, the names of every device with a daemon to speak of
    (shared, or with a directory under the MPS root), and the UUIDs ``ids`` pick."""
    shared = mps_devices(config, host)
    names = _names(host)
    known = {u: s.name for u, s in shared.items()}
    for uuid in daemon.daemon_uuids(config.sharing.mps_root):
        known.setdefault(uuid, names.get(uuid, uuid))
    picked = _pick(ids, known, "an MPS-shared device or a device with a daemon")
    return shared, known, picked


def stop_all(config, host: Host, ids: tuple[str, ...] = ()) -> Outcome:
    """Stop the daemons of the named devices, or every daemon under the MPS root."""
    root = config.sharing.mps_root
    shared, known, picked = _daemon_targets(config, host, ids)
    outcome = Outcome()
    for uuid in picked:
        try:
            result = daemon.stop_daemon(host, uuid, root, shared.get(uuid))
            result.name = known[uuid]
        except NvshimError as err:
            outcome.errors.append(f"device {known[uuid]} ({uuid}): {err}")
            continue
        if result.problem:
            outcome.errors.append(f"device {known[uuid]} ({uuid}): {result.problem}")
        outcome.daemons.append(result)
    return outcome


def status_all(config, host: Host, ids: tuple[str, ...] = ()) -> Outcome:
    """The status of every MPS-shared device's daemon (and of leftovers not in the config)."""
    root = config.sharing.mps_root
    shared, known, picked = _daemon_targets(config, host, ids)
    outcome = Outcome()
    devices = [(uuid, shared.get(uuid)) for uuid in picked]
    for result, uuid in zip(daemon.daemon_statuses(host, devices, root), picked, strict=True):
        result.name = known[uuid]
        outcome.daemons.append(result)
    return outcome


def render(daemons: list[DaemonStatus]) -> str:
    """A table: device, UUID, state, pid, per-client limits, compute mode, health."""
    rows = [("DEVICE", "UUID", "STATE", "PID", "THREADS", "MEMORY", "COMPUTE-MODE", "HEALTH")]
    notes = []
    for d in daemons:
        state = d.action or ("running" if d.running else "stopped")
        reported = (
            ""
            if d.reported_thread_percentage is None
            else f" (daemon {d.reported_thread_percentage:g}%)"
        )
        rows.append(
            (
                d.name,
                d.uuid,
                state if d.in_config else f"{state}, not in sharing config",
                str(d.pid) if d.pid else "-",
                f"{d.thread_percentage}%{reported}" if d.thread_percentage else "-",
                f"{d.memory_limit_mib}M" if d.memory_limit_mib else "-",
                d.compute_mode or "-",
                "ok" if d.healthy else ("-" if not d.running else "unhealthy"),
            )
        )
        if d.problem:
            notes.append(f"{d.name}: {d.problem}")
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines + notes)
