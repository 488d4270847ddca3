"""``nvshim cdi``: generate, list and validate CDI specs."""

from __future__ import annotations

import os

import click

from nvshim.cli.common import discover, option, root_options
from nvshim.errors import NvshimError
from nvshim.record import asdict

DEFAULT_REFRESH_OUTPUT = "/var/run/cdi/nvidia.yaml"


@click.group()
def cdi() -> None:
    """Generate, list and validate CDI specs."""


def spec_options(func):
    """The options choosing a spec's content and where discovery looks: one set for
    ``generate`` and ``refresh``, so a default changed here changes both."""
    options = (
        option(
            "--format",
            "fmt",
            type=click.Choice(["yaml", "json"]),
            shown_default="from -o's suffix, else yaml",
            help="The spec's format.",
        ),
        option(
            "--device-name-strategy",
            "strategies",
            multiple=True,
            type=click.Choice(["index", "uuid", "type-index"]),
            shown_default="index, uuid",
            help="How devices are named; repeat for several.",
        ),
        option("--no-all-device", is_flag=True, help="Leave out the `all` device."),
        option(
            "--mode",
            type=click.Choice(["nvml", "management"]),
            default="nvml",
            show_default=True,
            help="management: one `all` device with every GPU node and the control node, and"
            " the utility files only (for monitoring containers).",
        ),
        option("--vendor", default=None, shown_default="nvidia.com", help="CDI vendor."),
        option("--class", "cls", default=None, shown_default="gpu", help="CDI class."),
        option(
            "--capabilities",
            default=None,
            metavar="LIST|all",
            shown_default="utility,compute",
            help="Driver capabilities whose files the spec carries.",
        ),
        option(
            "--hook-path",
            default=None,
            metavar="FILE",
            shown_default="the config's runtime.hook-path",
            help="nvshim-hook launcher the spec's hooks run.",
        ),
        option(
            "--sharing",
            is_flag=True,
            help="The spec of the MPS-shared devices of the sharing config (class gpu.shared).",
        ),
        option(
            "--pairing",
            is_flag=True,
            help="Give each GPU device its paired NIC's RDMA devices (the config's pairing table).",
        ),
    )
    for one in reversed(options):
        func = one(func)
    return root_options(func)


@cdi.command()
@option("-o", "--output", metavar="FILE", help="Write here (atomically) instead of stdout.")
@spec_options
def generate(output, driver_root, dev_root, config, **options) -> None:
    """Write a CDI spec for every GPU and MIG device of this host, plus "all".

    With --sharing, a spec whose devices are the MPS-shared ones, each carrying its MPS
    pipe directory, limits and /dev/shm (cdiVersion 0.6.0 for the dotted class; podman 4.3
    needs an undotted --class such as gpushared)."""
    from nvshim.cdi.generate import generate as run

    run(output, driver_root, dev_root, config, **options)


@cdi.command()
@option(
    "-o",
    "--output",
    metavar="FILE",
    default=DEFAULT_REFRESH_OUTPUT,
    show_default=True,
    help="The generated spec to keep current.",
)
@option("--force", is_flag=True, help="Rewrite even when the host looks unchanged.")
@spec_options
def refresh(output, force, driver_root, dev_root, config, **options) -> None:
    """Regenerate the spec at -o only when the host changed since it was written.

    The host key is the runtime inventory cache's (boot, driver libraries and module,
    device and MIG capability nodes) plus nvshim's version and these options; it is kept in
    FILE.nvshim-key. A failed discovery keeps the previous spec and exits 1. Run by
    nvshim-cdi-refresh.service at boot and on driver, MIG and nvshim changes."""
    from nvshim.cdi.generate import SpecRequest, check_output, parents_made
    from nvshim.cdi.refresh import refresh_spec
    from nvshim.cdi.writer import dump_spec

    check_output(output)
    request = SpecRequest.resolve(config, output, **options)

    def render(host):
        spec = request.build(host, config)
        return dump_spec(spec, request.fmt), [d["name"] for d in spec["devices"]]

    inputs = (config.sharing.config,) if request.sharing else ()
    options = {**asdict(request), "config": os.environ.get("NVSHIM_CONFIG")}
    with parents_made(output):
        _, line = refresh_spec(
            output, driver_root, dev_root, options, render, discover, inputs=inputs, force=force
        )
    click.echo(f"nvshim: {line}", err=True)


@cdi.command("list")
@option(
    "--cdi-dir",
    "--spec-dir",  # nvidia-ctk's name
    "spec_dirs",
    multiple=True,
    metavar="DIR",
    hidden_opts=("--spec-dir",),
    shown_default="/etc/cdi, /var/run/cdi",
    help="A CDI spec directory to read; repeatable.",
)
@option("--json", "as_json", is_flag=True, help="A JSON list of {name, kind, device}.")
def list_(spec_dirs, as_json: bool) -> None:
    """Print vendor/class=name of every device in the CDI spec directories."""
    from nvshim.cdi.registry import DEFAULT_SPEC_DIRS, list_devices

    warnings = [f"--cdi-dir {d}: no such directory" for d in spec_dirs if not os.path.lexists(d)]
    names = list_devices(spec_dirs or DEFAULT_SPEC_DIRS, warnings)
    for warning in warnings:
        click.echo(f"nvshim: warning: {warning}", err=True)
    if as_json:
        import json

        from nvshim.cdi.names import parse_qualified_name

        rows = []
        for name in names:
            vendor, cls, device = parse_qualified_name(name)
            rows.append({"name": name, "kind": f"{vendor}/{cls}", "device": device})
        click.echo(json.dumps(rows, indent=2))
        return
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
