"""``nvshim system``: host setup (nvidia-ctk's ``system create-device-nodes``)."""

from __future__ import annotations

import click

from nvshim.cli.common import root_options


@click.group()
def system() -> None:
    """Host setup."""


@system.command("create-device-nodes")
@click.option(
    "--control-devices",
    is_flag=True,
    help="Also /dev/nvidiactl, /dev/nvidia-modeset, /dev/nvidia-uvm, /dev/nvidia-uvm-tools.",
)
@click.option("--dry-run", is_flag=True, help="Say what would be created; create nothing.")
@root_options
def create_device_nodes(
    control_devices: bool, dry_run: bool, driver_root: str, dev_root: str, config
) -> None:
    """Create the missing /dev/nvidia<N> nodes of the GPUs NVML reports (and, with
    --control-devices, the control nodes), majors from /proc/devices."""
    from nvshim.host import files, nvml
    from nvshim.host.mknodes import create_nodes, wanted_nodes

    library = nvml.find_library(driver_root, files.read_ld_cache(driver_root, []))
    minors = [g.minor for g in nvml.query(library).gpus]
    for line in create_nodes(dev_root, wanted_nodes(dev_root, minors, control_devices), dry_run):
        click.echo(line)
