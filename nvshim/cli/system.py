"""``nvshim system``: host setup (nvidia-ctk's ``system create-device-nodes``)."""

from __future__ import annotations

import click

from nvshim.cli.common import option, root_options


@click.group()
def system() -> None:
    """Host setup."""


@system.command("create-device-nodes")
@option(
    "--control-devices",
    is_flag=True,
    help="Also /dev/nvidiactl, /dev/nvidia-modeset, /dev/nvidia-uvm, /dev/nvidia-uvm-tools.",
)
@option("--dry-run", is_flag=True, help="Say what would be created; create nothing.")
@root_options
def create_device_nodes(
    control_devices: bool, dry_run: bool, driver_root: str, dev_root: str, config
) -> None:
    """Create the missing /dev/nvidia<N> nodes of the GPUs NVML reports (and, with
    --control-devices, the control nodes), majors from /proc/devices."""
    from nvshim.host.mknodes import create_missing

    for line in create_missing(driver_root, dev_root, control_devices, dry_run):
        click.echo(line)
