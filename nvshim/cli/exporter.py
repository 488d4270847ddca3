"""``nvshim exporter``: serve the node's Prometheus metrics until stopped."""

from __future__ import annotations

import signal
import threading

import click

from nvshim.cli.common import option
from nvshim.cli.doctor import context_options
from nvshim.errors import NvshimError, UsageError
from nvshim.options import zero_or_more


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[V6]:PORT`` or ``:PORT`` (all addresses) -> (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"--listen {text!r}: expected HOST:PORT, [ADDR]:PORT or :PORT")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    return host or "0.0.0.0", int(port)


@click.command()
@option(
    "--listen", default=":9400", show_default=True, metavar="ADDR", help="HOST:PORT to serve on."
)
@option(
    "--log-file",
    metavar="FILE",
    shown_default="the config's runtime.log-file when runtime.log-target is file",
    help="Decision log to count.",
)
@option(
    "--doctor-interval",
    type=float,
    default=60.0,
    show_default=True,
    metavar="SECONDS",
    callback=zero_or_more,
    help="Re-run the doctor's checks at most this often.",
)
@context_options
def exporter(listen, log_file, doctor_interval, make_context) -> None:
    """Serve Prometheus metrics: doctor checks, MPS daemons, container decisions, CDI age."""
    from prometheus_client import CollectorRegistry, start_http_server

    from nvshim.exporter.collector import NodeCollector

    host, port = parse_listen(listen)
    config = make_context().config
    log_path = log_file or (
        config.runtime.log_file if config.runtime.log_target == "file" else None
    )
    registry = CollectorRegistry()
    registry.register(NodeCollector(make_context, log_path, doctor_interval))
    try:
        server, _thread = start_http_server(port, host, registry=registry)
    except OSError as err:  # in use, or not this host's: the work failed (exit 1)
        raise NvshimError(f"--listen {listen}: {err.strerror or err}") from None
    click.echo(f"nvshim exporter: serving http://{listen}/metrics", err=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(1.0):
        pass
    server.shutdown()
