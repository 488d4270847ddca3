"""The Prometheus collector: doctor check states (re-run at most every ``interval``
seconds), MPS daemons up per device, container decisions from the log, CDI spec age."""

from __future__ import annotations

import os
import threading
import time

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from nvshim.doctor import STATUSES, Result, run_checks
from nvshim.doctor.context import Context
from nvshim.errors import NvshimError
from nvshim.exporter.logtail import LogStats


class NodeCollector:
    """Collects on every scrape; ``context_factory()`` gives a fresh doctor Context."""

    def __init__(self, context_factory, log_path: str | None, interval: float = 60.0) -> None:
        self.context_factory = context_factory
        self.interval = interval
        self.log = LogStats(log_path) if log_path else None
        self._results: list[Result] = []
        self._checked = 0.0
        self._lock = threading.Lock()

    def _doctor(self) -> tuple[Context, list[Result]]:
        ctx = self.context_factory()
        with self._lock:
            if not self._results or time.monotonic() - self._checked >= self.interval:
                self._results = run_checks(ctx)
                self._checked = time.monotonic()
            return ctx, self._results

    def collect(self):
        ctx, results = self._doctor()
        check = GaugeMetricFamily(
            "nvshim_doctor_check",
            "State of each nvshim doctor check (1 for its current status).",
            labels=["check", "status"],
        )
        for r in results:
            for status in STATUSES:
                check.add_metric([r.name, status], 1.0 if r.status == status else 0.0)
        yield check
        yield GaugeMetricFamily(
            "nvshim_doctor_healthy",
            "1 when no doctor check fails.",
            value=0.0 if any(r.status == "fail" for r in results) else 1.0,
        )
        yield from self._mps(ctx)
        yield from self._containers()
        yield from self._cdi(ctx)

    def _mps(self, ctx: Context):
        from nvshim.mps.daemon import daemon_statuses
        from nvshim.mps.service import mps_devices

        up = GaugeMetricFamily(
            "nvshim_mps_daemon_up",
            "1 when the MPS control daemon of a shared device runs and answers.",
            labels=["device", "uuid"],
        )
        try:
            host = ctx.host()
            shared = mps_devices(ctx.config, host)
        except Exception:  # noqa: BLE001 - no host or no valid config: no daemons to report
            shared = {}
        root = ctx.config.sharing.mps_root
        try:
            healthy = [s.healthy for s in daemon_statuses(host, list(shared.items()), root)]
        except NvshimError:
            healthy = [False] * len(shared)
        for (uuid, share), up_now in zip(shared.items(), healthy, strict=True):
            up.add_metric([share.name, uuid], 1.0 if up_now else 0.0)
        yield up

    def _containers(self):
        containers = CounterMetricFamily(
            "nvshim_containers",
            "Containers nvshim decided on, by tool, decision and request source (from the log).",
            labels=["tool", "decision", "source"],
        )
        refusals = CounterMetricFamily(
            "nvshim_refusals",
            "Containers refused, by tool and reason (from the log).",
            labels=["tool", "reason"],
        )
        unparsed = CounterMetricFamily(
            "nvshim_log_unparsed_lines", "Log lines the exporter could not read."
        )
        if self.log is not None:
            self.log.poll()
            for labels, n in sorted(self.log.containers.items()):
                containers.add_metric(list(labels), n)
            for labels, n in sorted(self.log.refusals.items()):
                refusals.add_metric(list(labels), n)
            unparsed.add_metric([], self.log.unparsed)
        yield containers
        yield refusals
        yield unparsed

    def _cdi(self, ctx: Context):
        from nvshim.doctor.cdi_checks import spec_files

        age = GaugeMetricFamily(
            "nvshim_cdi_spec_age_seconds",
            "Seconds since each CDI spec file in the spec dirs was written.",
            labels=["path"],
        )
        now = time.time()
        for path in spec_files(ctx):
            try:
                age.add_metric([path], max(0.0, now - os.stat(path).st_mtime))
            except OSError:
                continue
        yield age
