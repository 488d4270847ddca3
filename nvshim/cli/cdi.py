"""``nvshim cdi``: generate, list and validate CDI specs."""

from __future__ import annotations

import os
import sys

import click

from nvshim.cli.common import discover, root_options
from nvshim.errors import NvshimError, UsageError
from nvshim.record import asdict, record

DEFAULT_REFRESH_OUTPUT = "/var/run/cdi/nvidia.yaml"


@click.group()
def cdi() -> None:
    """Generate, list and validate CDI specs."""


def spec_options(func):
    """The options choosing a spec's content and where discovery looks: one set for
    ``generate`` and ``refresh``, so a default changed here changes both."""
    options = (
        click.option(
            "--format", "fmt", type=click.Choice(["yaml", "json"]), help="Default: from -o."
        ),
        click.option(
            "--device-name-strategy",
            "strategies",
            multiple=True,
            type=click.Choice(["index", "uuid", "type-index"]),
            help="How devices are named; repeat for several (default: index and uuid).",
        ),
        click.option("--no-all-device", is_flag=True, help="Leave out the `all` device."),
        click.option(
            "--mode",
            type=click.Choice(["nvml", "management"]),
            default="nvml",
            help="management: one `all` device with every GPU node and the control node, and"
            " the utility files only (for monitoring containers) [nvml].",
        ),
        click.option("--vendor", default=None, help="CDI vendor (default: nvidia.com)."),
        click.option("--class", "cls", default=None, help="CDI class (default: gpu)."),
        click.option(
            "--capabilities",
            default=None,
            metavar="LIST|all",
            help="Driver capabilities whose files the spec carries (default: utility,compute).",
        ),
        click.option(
            "--hook-path", default=None, help="nvshim-hook launcher the spec's hooks run."
        ),
        click.option(
            "--sharing",
            is_flag=True,
            help="The spec of the MPS-shared devices of the sharing config (class gpu.shared).",
        ),
        click.option(
            "--pairing",
            is_flag=True,
            help="Give each GPU device its paired NIC's RDMA devices ([pairing] config).",
        ),
    )
    for option in reversed(options):
        func = option(func)
    return root_options(func)


@record
class SpecRequest:
    """What ``spec_options`` resolved to (config defaults applied): the spec to make."""

    fmt: str
    vendor: str
    cls: str
    capabilities: list[str]
    hook_path: str
    strategies: list[str]
    all_device: bool
    mode: str
    sharing: bool
    pairing: bool = False

    @staticmethod
    def resolve(
        config,
        output,
        fmt,
        strategies,
        no_all_device,
        mode,
        vendor,
        cls,
        capabilities,
        hook_path,
        sharing,
        pairing=False,
    ) -> SpecRequest:
        """Apply the config's defaults to the options; UsageError on a bad name."""
        from nvshim.cdi.names import validate_class, validate_vendor
        from nvshim.cdi.writer import DEFAULT_NAME_STRATEGIES, format_for
        from nvshim.policy.capabilities import parse_capabilities

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
        return SpecRequest(
            fmt=format_for(output, fmt),
            vendor=vendor,
            cls=cls,
            capabilities=list(caps),
            hook_path=hook_path or config.get("runtime", "hook-path"),
            strategies=list(strategies or DEFAULT_NAME_STRATEGIES),
            all_device=not no_all_device,
            mode=mode,
            sharing=sharing,
            pairing=pairing,
        )

    def build(self, host, config) -> dict:
        """The spec for ``host``."""
        from nvshim.cdi.writer import build_management_spec, build_spec

        if self.sharing:
            from nvshim.mps.cdi import shared_spec

            return shared_spec(
                host,
                config,
                self.capabilities,
                self.hook_path,
                vendor=self.vendor,
                cls=self.cls,
                strategies=self.strategies,
                daemon_check_hook=True,
            )
        if self.mode == "management":
            return build_management_spec(host, self.hook_path, vendor=self.vendor, cls=self.cls)
        extra, every = {}, None
        if self.pairing:
            from nvshim.policy.pairing import cdi_pairing_edits

            extra, every, notes = cdi_pairing_edits(host, config, self.hook_path)
            for note in notes:
                click.echo(f"nvshim: warning: {note}", err=True)
        return build_spec(
            host,
            self.capabilities,
            self.hook_path,
            vendor=self.vendor,
            cls=self.cls,
            strategies=self.strategies,
            all_device=self.all_device,
            extra_device_edits=extra,
            all_edits=every,
        )


def _make_parents(output: str) -> None:
    """Create the missing directories above ``output``, mode 0755 (as /var/run/cdi is)."""
    parent = os.path.dirname(os.path.abspath(output))
    missing = []
    while not os.path.isdir(parent):
        missing.append(parent)
        parent = os.path.dirname(parent)
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o755)
            os.chmod(directory, 0o755)  # mkdir honours the umask
        except OSError as err:
            raise UsageError(f"{output}: cannot create {directory}: {err.strerror}") from None


@cdi.command()
@click.option("-o", "--output", metavar="FILE", help="Write here (atomically) instead of stdout.")
@spec_options
def generate(output, driver_root, dev_root, config, **options) -> None:
    """Write a CDI spec for every GPU and MIG device of this host, plus ``all``.

    With --sharing, a spec whose devices are the MPS-shared ones, each carrying its MPS
    pipe directory, limits and /dev/shm (cdiVersion 0.6.0 for the dotted class; podman 4.3
    needs an undotted --class such as gpushared)."""
    from nvshim.cdi.writer import dump_spec

    request = SpecRequest.resolve(config, output, **options)
    host = discover(driver_root, dev_root)
    spec = request.build(host, config)
    text = dump_spec(spec, request.fmt)
    if not output:
        sys.stdout.write(text)
        return
    from nvshim.fsutil import atomic_write

    _make_parents(output)
    atomic_write(output, text.encode(), mode=0o644, backup=False)
    click.echo(
        f"nvshim: wrote {output}: {len(spec['devices'])} devices, cdiVersion {spec['cdiVersion']}",
        err=True,
    )


@cdi.command()
@click.option(
    "-o",
    "--output",
    metavar="FILE",
    default=DEFAULT_REFRESH_OUTPUT,
    show_default=True,
    help="The generated spec to keep current.",
)
@click.option("--force", is_flag=True, help="Rewrite even when the host looks unchanged.")
@spec_options
def refresh(output, force, driver_root, dev_root, config, **options) -> None:
    """Regenerate the spec at -o only when the host changed since it was written.

    The host key is the runtime inventory cache's (boot, driver libraries and module,
    device and MIG capability nodes) plus nvshim's version and these options; it is kept in
    FILE.nvshim-key. A failed discovery keeps the previous spec and exits 1. Run by
    nvshim-cdi-refresh.service at boot and on driver, MIG and nvshim changes."""
    from nvshim.cdi.refresh import refresh_spec
    from nvshim.cdi.writer import dump_spec

    request = SpecRequest.resolve(config, output, **options)
    _make_parents(output)

    def render(host):
        spec = request.build(host, config)
        return dump_spec(spec, request.fmt), [d["name"] for d in spec["devices"]]

    inputs = (config.get("sharing", "config"),) if request.sharing else ()
    options = {**asdict(request), "config": os.environ.get("NVSHIM_CONFIG")}
    _, line = refresh_spec(
        output, driver_root, dev_root, options, render, discover, inputs=inputs, force=force
    )
    click.echo(f"nvshim: {line}", err=True)


@cdi.command("list")
@click.option("--spec-dir", "spec_dirs", multiple=True, metavar="DIR", help="Repeatable.")
@click.option("--json", "as_json", is_flag=True, help="A JSON list of {name, kind, device}.")
def list_(spec_dirs, as_json: bool) -> None:
    """Print vendor/class=name of every device in the CDI spec directories."""
    from nvshim.cdi.registry import DEFAULT_SPEC_DIRS, list_devices

    warnings: list[str] = []
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
