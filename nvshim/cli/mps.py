"""``nvshim mps``: start, stop and inspect the per-device MPS control daemons."""

from __future__ import annotations

import json

import click

from nvshim.cli.common import discover, option, root_options
from nvshim.errors import NvshimError


def _device_options(func):
    func = option("--json", "as_json", is_flag=True, help="Print JSON.")(func)
    return option(
        "--gpu",
        "ids",
        multiple=True,
        metavar="ID",
        shown_default="every shared device",
        help="Index, <gpu>:<mig> or UUID of a shared device; repeatable.",
    )(func)


def _show(outcome, as_json: bool) -> None:
    from nvshim.mps.service import render

    if as_json:
        data = {"daemons": [d.to_dict() for d in outcome.daemons], "errors": outcome.errors}
        click.echo(json.dumps(data, indent=2))
    elif outcome.daemons:
        click.echo(render(outcome.daemons))


@click.group()
def mps() -> None:
    """Run and inspect the per-GPU MPS control daemons of the sharing config."""


@mps.command()
@_device_options
@root_options
def start(ids, as_json, driver_root, dev_root, config) -> None:
    """Start a control daemon for each MPS-shared device (idempotent)."""
    from nvshim.mps.service import start_all

    outcome = start_all(config, discover(driver_root, dev_root, quiet=as_json), ids)
    if not outcome.daemons and not outcome.errors:
        click.echo(f"nvshim: no MPS-shared device in {config.sharing.config}", err=True)
    _show(outcome, as_json)
    outcome.raise_for_errors("start")


@mps.command()
@_device_options
@root_options
def stop(ids, as_json, driver_root, dev_root, config) -> None:
    """Send quit to each daemon and restore the compute mode it changed."""
    from nvshim.mps.service import stop_all

    outcome = stop_all(config, discover(driver_root, dev_root, quiet=as_json), ids)
    _show(outcome, as_json)
    outcome.raise_for_errors("stop")


@mps.command()
@_device_options
@root_options
def status(ids, as_json, driver_root, dev_root, config) -> None:
    """Show each daemon, its limits and its health; exit 1 when one is down or unhealthy."""
    from nvshim.mps.service import status_all

    outcome = status_all(config, discover(driver_root, dev_root, quiet=as_json), ids)
    _show(outcome, as_json)
    bad = [d for d in outcome.daemons if d.in_config and not d.healthy]
    if bad:
        raise NvshimError(
            f"{len(bad)} of {len(outcome.daemons)} MPS daemon(s) not running or unhealthy: "
            + ", ".join(d.name for d in bad)
        )
