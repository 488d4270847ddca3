"""The real-GPU kit's opt-in MPS checks (``--mps``): nvshim's MPS path on the host's GPUs.

The kit writes a sharing config (docs/sharing.md) sharing every GPU outside MIG mode with
MPS, and an nvshim config naming it, with the MPS root under the kit's work dir. Then:
``nvshim mps start`` (compute mode EXCLUSIVE_PROCESS, one control daemon per shared GPU) and
``nvshim mps status --json``; the CUDA probe in two runc containers through nvshim-runtime on
the first shared GPU, each asked for the way a container asks for a shared GPU (its index,
and a replica id ``<uuid>::1``), which must see that GPU, the MPS env and the daemon's pipe
dir and shm; CUDA through the daemon (its control log shows the clients); and, whatever
happened, ``nvshim mps stop``, after which the compute and persistence modes must be as found.
"""

from __future__ import annotations

import json
import os
import re
import signal
from typing import Any

import yaml

from bench import real_gpu_host as hostview
from bench.probe_image import PROBE_PATH
from bench.real_gpu_host import Unit
from bench.real_gpu_verdict import Failed, cuda_match, nodes_match, none_of
from nvshim.mps import CONTAINER_PIPE_DIR as PIPE_DIR
from nvshim.mps import PID_FILE
from nvshim.mps.compute import EXCLUSIVE_PROCESS, mode_name
from nvshim.mps.daemon import SHM_SOURCE, is_alive, unmount_shm

REPLICAS = 2
# migStrategy mixed: nvidia.com/gpu is every GPU outside MIG mode (MPS on MIG is refused)
SHARING = {
    "version": "v1",
    "flags": {"migStrategy": "mixed"},
    "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": REPLICAS}]}},
}
# What a client container prints before the probe: its CUDA_ variables, its mount table
# and the pipe dir it was given (busybox applets of the probe image)
CLIENT = (
    "env | grep '^CUDA_'; echo '--- mounts'; cat /proc/self/mountinfo; echo '--- pipe'; "
    f"ls -A {PIPE_DIR}; echo '--- probe'; exec {{probe}}"
)
CLIENT_LOG = re.compile(r"new client", re.I)  # the control (and server) log's client lines
NEEDS = {
    "mps": "--mps (the MPS checks set the GPUs' compute mode to EXCLUSIVE_PROCESS while "
    "they run, and restore it)",
    "mps-control": "nvidia-cuda-mps-control under the driver root (nvshim info lists it)",
    "mps-gpu": "a GPU outside MIG mode (MPS is shared per whole GPU here)",
    "mps-daemons": 'the MPS daemons started (check "MPS: daemons start")',
}
SKIP = (
    "not asked for: the MPS checks change the GPUs' compute mode to EXCLUSIVE_PROCESS while "
    "they run (restored after); pass --mps on a host you may change"
)


class MpsChecks:
    """The MPS checks of one kit run (``kit``: bench.real_gpu.Kit, after its set-up)."""

    def __init__(self, kit) -> None:
        self.kit = kit
        self.root = os.path.join(kit.work, "mps")
        self.config = ""
        self.shared: list[Unit] = [u for u in kit.units if not u.uuid.startswith("MIG-")]
        self.before: dict[str, Any] = {}  # uuid -> compute and persistence mode, as found
        self.daemons: dict[str, dict] = {}  # uuid -> nvshim mps status --json entry
        self.probes: list[dict] = []
        self.log_mark = 0  # lines of the control log before the clients ran

    def note_missing(self) -> None:
        """What the MPS checks lack on this host, into the kit's ``missing``."""
        missing = self.kit.missing
        if not self.kit.opts.mps:
            missing["mps"] = SKIP
        files = self.kit.info.get("files", [])
        if not any(
            f.get("kind") == "bin" and f["path"].endswith("/nvidia-cuda-mps-control") for f in files
        ):
            missing["mps-control"] = "nvshim found no nvidia-cuda-mps-control under the driver root"
        if not self.shared:
            missing["mps-gpu"] = "every GPU is in MIG mode (or nvshim found none)"

    def run(self) -> None:
        """The checks; the daemons are stopped and the modes compared whatever happened."""
        check = self.kit.check
        base = ("root", "info", "gpu", "mps", "mps-control", "mps-gpu")
        clients = (*base, "runc", "image", "mps-daemons")
        try:
            check("MPS: daemons start", base, self.check_start)
            check("MPS: probe x2: device nodes, MPS env, pipe dir, shm", clients,
                  self.check_clients)  # fmt: skip
            check("MPS: probe x2: CUDA through the MPS daemon", (*clients, "driver"),
                  self.check_cuda)  # fmt: skip
        finally:
            check("MPS: stop restores compute mode", base, self.check_stop)

    # --- the checks ---------------------------------------------------------------------

    def _modes(self) -> dict[str, Any]:
        """Each GPU's compute and persistence mode now (NVML)."""
        state = hostview.nvml_state(self.kit.opts.driver_root, self.kit.opts.dev_root)
        return {u: (s["compute_mode"], s["persistence_mode"]) for u, s in state.items()}

    def _mps(self, verb: str) -> tuple[Any, dict]:
        """``nvshim mps VERB --json`` with the MPS config: (process, its JSON or {})."""
        proc = self.kit.nvshim("mps", verb, "--json", config=self.config)
        try:
            data = json.loads(proc.stdout)
        except ValueError:
            data = {}
        return proc, data

    def check_start(self) -> str:
        kit = self.kit
        kit.missing["mps-daemons"] = 'check "MPS: daemons start" did not pass'
        self.before = self._modes()
        path = os.path.join(kit.work, "sharing.yaml")
        with open(path, "w", encoding="utf-8") as fh:
            yaml.safe_dump(SHARING, fh, sort_keys=False)
        self.config = kit.write_config(
            "mps", True, ["[sharing]", f'config = "{path}"', f'mps-root = "{self.root}"']
        )
        proc, started = self._mps("start")
        if proc.returncode != 0:
            raise Failed(f"nvshim mps start: exit {proc.returncode}: {_last(proc.stderr)}")
        proc, status = self._mps("status")
        self.daemons = {d["uuid"]: d for d in status.get("daemons", [])}
        if proc.returncode != 0:
            raise Failed(f"nvshim mps status: exit {proc.returncode}: {_last(proc.stderr)}")
        want = {u.uuid for u in self.shared}
        if set(self.daemons) != want:
            raise Failed(f"daemons of {sorted(self.daemons)}, expected {sorted(want)}")
        now = self._modes()
        problems = []
        for uuid, d in self.daemons.items():
            share = 100 // REPLICAS
            if not d["healthy"] or d["thread_percentage"] != share:
                problems.append(f"{uuid}: healthy {d['healthy']}, {d['thread_percentage']}% "
                                f"(expected {share}%): {d['problem']}")  # fmt: skip
            if now[uuid][0] != EXCLUSIVE_PROCESS or d["compute_mode"] != "Exclusive_Process":
                problems.append(f"{uuid}: compute mode {_mode(now[uuid][0])} (NVML), "
                                f"{d['compute_mode']} (nvshim status), expected "
                                "Exclusive_Process")  # fmt: skip
        none_of(problems)
        del kit.missing["mps-daemons"]
        actions = {d["uuid"]: d["action"] for d in started.get("daemons", [])}
        return "; ".join(
            f"GPU {d['name']} {uuid}: {actions.get(uuid)}, pid {d['pid']}, "
            f"{d['thread_percentage']}% threads, {d['memory_limit_mib']}M pinned, compute mode "
            f"{_mode(self.before[uuid][0])} -> {d['compute_mode']}, healthy"
            for uuid, d in self.daemons.items()
        )

    def check_clients(self) -> str:
        unit = self.shared[0]
        daemon = self.daemons[unit.uuid]
        dirs = os.path.join(self.root, unit.uuid)
        self.log_mark = len(_lines(os.path.join(dirs, "log", "control.log")))
        env = {
            "CUDA_MPS_PIPE_DIRECTORY": PIPE_DIR,
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(daemon["thread_percentage"]),
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"{unit.uuid}={daemon['memory_limit_mib']}M",
        }
        seen = []
        for request in (unit.name, f"{unit.uuid}::1"):
            argv = ["/bin/sh", "-c", CLIENT.format(probe=PROBE_PATH)]
            proc, probe = self.kit.run_runc({"NVIDIA_VISIBLE_DEVICES": request}, self.config,
                                            args=argv)  # fmt: skip
            where = f"NVIDIA_VISIBLE_DEVICES={request}"
            if probe is None:
                raise Failed(f"{where}: exit {proc.returncode}, no probe line: "
                              f"{proc.stderr[-300:]}")  # fmt: skip
            nodes = nodes_match(probe, [unit])
            out = _sections(proc.stdout)
            got = dict(line.split("=", 1) for line in out[""] if "=" in line)
            problems = [
                f"{k}={got.get(k)!r}, expected {v!r}" for k, v in env.items() if got.get(k) != v
            ]
            mounts = _mounts(out["mounts"])
            pipe = mounts.get(PIPE_DIR)
            if pipe is None or not pipe[0].endswith(f"/{unit.uuid}/pipe"):
                problems.append(f"{PIPE_DIR} is {pipe}, not the daemon's pipe dir")
            if PID_FILE not in out["pipe"]:
                problems.append(f"{PIPE_DIR} holds {out['pipe']}, not the daemon's {PID_FILE}")
            shm = mounts.get("/dev/shm")
            if shm is None or shm[1:] != ("tmpfs", SHM_SOURCE):
                problems.append(f"/dev/shm is {shm}, not the daemon's shm tmpfs")
            none_of([f"{where}: {p}" for p in problems])
            self.probes.append(probe)
            seen.append(f"{where}: {nodes}")
        return (
            f"{'; '.join(seen)}; each with {', '.join(f'{k}={v}' for k, v in env.items())}, "
            f"{PIPE_DIR} bound from {dirs}/pipe (holding {PID_FILE}), /dev/shm the daemon's tmpfs"
        )

    def check_cuda(self) -> str:
        unit = self.shared[0]
        if len(self.probes) < 2:
            raise Failed("the containers printed no probe line (see the check above)")
        log_dir = os.path.join(self.root, unit.uuid, "log")
        control = _lines(os.path.join(log_dir, "control.log"))
        clients = [line for line in control[self.log_mark :] if CLIENT_LOG.search(line)]
        servers = _server_logs(log_dir)
        served = [ln for path in servers for ln in _lines(path) if CLIENT_LOG.search(ln)]
        evidence = (
            f"control.log: {len(clients)} client line(s) since the containers started "
            f"({' | '.join(' '.join(c.split()) for c in clients[-2:])[:300]}); server.log: "
            f"{len(served)} client line(s); get_server_list: "
            f"{self._server_list(unit.uuid) or 'none'}"
        )
        tails = "; ".join(
            f"{os.path.relpath(path, log_dir)} ends: {_tail(_lines(path))}"
            for path in [os.path.join(log_dir, "control.log"), *servers]
        )
        try:
            seen = [cuda_match(probe, [unit]) for probe in self.probes]
        except Failed as err:
            raise Failed(f"{err}; {evidence}; {tails}") from None
        if len(clients) < len(self.probes):
            raise Failed(f"CUDA ran, but not through the daemon: {evidence}; {tails}")
        return f"{' / '.join(seen)}; {evidence}"

    def _server_list(self, uuid: str) -> str:
        """The daemon's ``get_server_list`` answer (its servers' pids), or why there is none."""
        from nvshim.errors import NvshimError
        from nvshim.host.discover import discover_host
        from nvshim.mps.daemon import control_binary, daemon_dirs, daemon_env, run_control

        try:
            host = discover_host(self.kit.opts.driver_root, self.kit.opts.dev_root)
            env = daemon_env(host, daemon_dirs(self.root, uuid), uuid)
            return " ".join(run_control(control_binary(host), env, ["get_server_list"]).split())
        except NvshimError as err:
            return f"unanswered ({err})"

    def check_stop(self) -> str:
        proc, stopped = self._mps("stop") if self.config else (None, {})
        problems = []
        if proc is not None and proc.returncode != 0:
            problems.append(f"nvshim mps stop: exit {proc.returncode}: {_last(proc.stderr)}")
        for uuid, d in self.daemons.items():
            if d["pid"] and is_alive(d["pid"]):
                problems.append(f"{uuid}: daemon {d['pid']} still ran: {self._end(uuid)}")
            shm = os.path.join(self.root, uuid, "shm")
            if os.path.ismount(shm):
                problems.append(f"{shm}: still mounted (the kit detached it)")
                unmount_shm(shm)
        now = self._modes()
        changed = {u: m for u, m in self.before.items() if now.get(u) != m}
        if changed:
            problems += [f"{u}: {_modes_text(now.get(u))}, found {_modes_text(m)}"
                         for u, m in changed.items()]  # fmt: skip
            problems.append(f"the kit set the compute mode back itself: {self._restore(changed)}")
        none_of(problems)
        actions = {d["uuid"]: d["action"] for d in stopped.get("daemons", [])}
        modes = "; ".join(f"{u} {_modes_text(m)}" for u, m in now.items())
        daemons = ", ".join(f"{u} {a}" for u, a in actions.items()) or "none"
        return f"daemons: {daemons}; modes as found: {modes}"

    def _end(self, uuid: str) -> str:
        """SIGTERM to the kit's own daemon of ``uuid``, held by a pidfd (never a pid
        looked up twice); what happened."""
        from nvshim.mps.daemon import daemon_dirs, pin_daemon

        pinned = pin_daemon(daemon_dirs(self.root, uuid).pipe)
        if pinned is None:
            return "it has exited since"
        fd, pid, _ = pinned
        try:
            signal.pidfd_send_signal(fd, signal.SIGTERM)
        finally:
            os.close(fd)
        return f"the kit sent {pid} SIGTERM"

    def _restore(self, changed: dict[str, Any]) -> str:
        """Set the compute modes in ``changed`` back through NVML; what happened."""
        from nvshim.errors import NvshimError
        from nvshim.host.discover import discover_host
        from nvshim.mps.compute import nvml_session, set_compute_mode

        try:
            host = discover_host(self.kit.opts.driver_root, self.kit.opts.dev_root)
            with nvml_session(host) as pynvml:
                for uuid, (mode, _) in changed.items():
                    set_compute_mode(pynvml, uuid, mode)
        except NvshimError as err:
            return f"failed: {err}"
        return "done"


def _mode(mode: object) -> str:
    return mode_name(mode) if isinstance(mode, int) else str(mode)


def _modes_text(modes: tuple | None) -> str:
    """``(compute mode, persistence mode)`` as words."""
    if modes is None:
        return "gone"
    return f"compute mode {_mode(modes[0])}, persistence mode {modes[1]}"


def _last(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1][:300] if lines else "no message"


def _tail(lines: list[str]) -> str:
    """The last lines of a log, on one line."""
    return " | ".join(" ".join(line.split()) for line in lines[-6:])[-400:] or "(empty)"


def _lines(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read().splitlines()
    except OSError:
        return []


def _server_logs(log_dir: str) -> list[str]:
    """The MPS servers' ``server.log`` files: in the log dir, or (newer drivers) in a
    directory per server below it."""
    return sorted(
        os.path.join(top, name)
        for top, _dirs, names in os.walk(log_dir)
        for name in names
        if name == "server.log"
    )


def _sections(stdout: str) -> dict[str, list[str]]:
    """A client's output by its ``--- name`` headers (``""``: before the first)."""
    out: dict[str, list[str]] = {"": [], "mounts": [], "pipe": [], "probe": []}
    name = ""
    for line in stdout.splitlines():
        if line.startswith("--- ") and line[4:] in out:
            name = line[4:]
        else:
            out[name].append(line)
    return out


def _mounts(mountinfo: list[str]) -> dict[str, tuple[str, str, str]]:
    """``/proc/self/mountinfo`` lines: mount point -> (root, fs type, source), the last
    mount on each point (the one a path resolves to)."""
    out = {}
    for line in mountinfo:
        fields = line.split()
        if "-" not in fields[6:]:
            continue
        after = fields[fields.index("-", 6) + 1 :]
        out[fields[4]] = (fields[3], after[0], after[1] if len(after) > 1 else "")
    return out
