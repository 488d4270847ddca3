"""``nvshim cdi``: generate, list and validate CDI specs."""

from __future__ import annotations

import os
import sys

import click

from nvshim.cli.common import discover, root_options
from nvshim.errors import NvshimError, UsageError


@click.group()
def cdi() -> None:
    """Generate, list and validate CDI specs."""


@cdi.command()
@click.option("-o", "--output", metavar="FILE", help="Write here (atomically) instead of stdout.")
@click.option("--format", "fmt", type=click.Choice(["yaml", "json"]), help="Default: from -o.")
@click.option(
    "--device-name-strategy",
    "strategies",
    multiple=True,
    type=click.Choice(["index", "uuid"]),
    help="How devices are named; repeat for several (default: index).",
)
@click.option("--vendor", default=None, help="CDI vendor (default: nvidia.com).")
@click.option("--class", "cls", default=None, help="CDI class (default: gpu).")
@click.option(
    "--capabilities",
    default=None,
    metavar="LIST|all",
    help="Driver capabilities whose files the spec carries (default: utility,compute).",
)
@click.option("--hook-path", default=None, help="nvshim-hook launcher the spec's hooks run.")
@click.option(
    "--sharing",
    is_flag=True,
    help="Write the spec of the MPS-shared devices of the sharing config (class gpu.shared).",
)
@click.option(
    "--pairing",
    is_flag=True,
    help="Give each GPU device its paired NIC's RDMA devices ([pairing] config).",
)
@root_options
def generate(
    output,
    fmt,
    strategies,
    vendor,
    cls,
    capabilities,
    hook_path,
    sharing,
    pairing,
    driver_root,
    dev_root,
    config,
) -> None:
    """Write a CDI spec for every GPU and MIG device of this host, plus ``all``.

    With --sharing, a spec whose devices are the MPS-shared ones, each carrying its MPS
    pipe directory, limits and /dev/shm (cdiVersion 0.6.0 for the dotted class; podman 4.3
    needs an undotted --class such as gpushared)."""
    from nvshim.cdi.names import validate_class, validate_vendor
    from nvshim.cdi.writer import build_spec, dump_spec, format_for
    from nvshim.policy.capabilities import parse_capabilities

    fmt = format_for(output, fmt)
    vendor = vendor or config.get("policy", "cdi-vendor")
    cls = cls or ("gpu.shared" if sharing else config.get("policy", "cdi-class"))
    try:
        validate_vendor(vendor)
        validate_class(cls)
    except ValueError as err:
        raise UsageError(str(err)) from None
    cap_warnings: list[str] = []
    caps = parse_capabilities(
        capabilities, config.get("policy", "default-capabilities"), cap_warnings
    )
    for warning in cap_warnings:
        click.echo(f"nvshim: warning: {warning}", err=True)
    host = discover(driver_root, dev_root)
    hook_path = hook_path or config.get("runtime", "hook-path")
    naming = {"vendor": vendor, "cls": cls, "strategies": strategies or ("index",)}
    if sharing:
        from nvshim.mps.cdi import shared_spec

        spec = shared_spec(host, config, caps, hook_path, **naming, daemon_check_hook=True)
    else:
        extra, every = {}, None
        if pairing:
            from nvshim.policy.pairing import cdi_pairing_edits

            extra, every, notes = cdi_pairing_edits(host, config, hook_path)
            for note in notes:
                click.echo(f"nvshim: warning: {note}", err=True)
        spec = build_spec(
            host, caps, hook_path, **naming, extra_device_edits=extra, all_edits=every
        )
    text = dump_spec(spec, fmt)
    if not output:
        sys.stdout.write(text)
        return
    from nvshim.fsutil import atomic_write

    parent = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(parent):
        raise UsageError(f"{output}: directory {parent} does not exist")
    atomic_write(output, text.encode(), mode=0o644, backup=False)
    click.echo(
        f"nvshim: wrote {output}: {len(spec['devices'])} devices, cdiVersion {spec['cdiVersion']}",
        err=True,
    )


@cdi.command("list")
@click.option("--spec-dir", "spec_dirs", multiple=True, metavar="DIR", help="Repeatable.")
def list_(spec_dirs) -> None:
    """Print vendor/class=name of every device in the CDI spec directories."""
    from nvshim.cdi.registry import DEFAULT_SPEC_DIRS, list_devices

    warnings: list[str] = []
    names = list_devices(spec_dirs or DEFAULT_SPEC_DIRS, warnings)
    for warning in warnings:
        click.echo(f"nvshim: warning: {warning}", err=True)
    for name in names:
        click.echo(name)


@cdi.command()
@click.argument("files", nargs=-1, required=True)
def validate(files) -> None:
    """Check CDI spec files as runtimes do, plus the JSON schema. Exit 1 on any problem."""
    from nvshim.cdi.validate import validate_files

    problems = validate_files(list(files))
    for problem in problems:
        click.echo(problem)
    if problems:
        raise NvshimError(f"{len(problems)} problem(s) found")
    click.echo(f"{len(files)} spec(s) valid")
