"""``nvshim cdi generate``: the spec a request names, for the discovered host, written
atomically or to stdout. Free of click, so ``nvshim.entry`` can run it without loading the
command line (``nvshim.cli.cdi`` is the click front of the same code)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

from nvshim.console import discover, warn
from nvshim.errors import NvshimError, UsageError, empty_path
from nvshim.record import record


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
        from nvshim.defaults import CAPABILITIES
        from nvshim.policy.capabilities import parse_capabilities

        try:  # the options' values: the config's were checked when it was read
            if vendor is not None:
                validate_vendor(vendor, "--vendor")
            if cls is not None:
                validate_class(cls, "--class")
        except ValueError as err:
            raise UsageError(str(err)) from None
        if hook_path is not None and not hook_path:
            raise empty_path("'--hook-path'")
        if hook_path is not None and not os.path.isabs(hook_path):  # runtimes refuse the spec
            raise UsageError(f"--hook-path {hook_path!r}: must be an absolute path")
        if capabilities is not None and not capabilities.strip():
            raise UsageError("--capabilities: empty; name capabilities or all")
        vendor = vendor or config.policy.cdi_vendor
        cls = cls or ("gpu.shared" if sharing else config.policy.cdi_class)
        cap_warnings: list[str] = []
        caps = parse_capabilities(
            capabilities,
            config.policy.default_capabilities,
            cap_warnings,
            source="--capabilities",
        )
        flagged = [w for w in cap_warnings if w.startswith("--capabilities: ")]
        if flagged:  # a typo in a flag is the caller's to fix, not a warning
            known = ", ".join(("all",) + CAPABILITIES)
            raise UsageError(f"{flagged[0].removesuffix(' ignored')}; known: {known}")
        for warning in cap_warnings:
            warn(warning)
        return SpecRequest(
            fmt=format_for(output, fmt),
            vendor=vendor,
            cls=cls,
            capabilities=list(caps),
            hook_path=hook_path or config.runtime.hook_path,
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
                warn(note)
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


@contextlib.contextmanager
def parents_made(output: str) -> Iterator[None]:
    """Create the missing directories above ``output``, mode 0755 (as /var/run/cdi is),
    for the block that writes it; a block that fails takes back those made (innermost
    first, where empty)."""
    parent = os.path.dirname(os.path.abspath(output))
    missing = []
    while not os.path.isdir(parent):
        missing.append(parent)
        parent = os.path.dirname(parent)
    made: list[str] = []
    try:
        for directory in reversed(missing):
            try:
                os.mkdir(directory, 0o755)
                made.append(directory)
                os.chmod(directory, 0o755)  # mkdir honours the umask
            except OSError as err:
                raise NvshimError(f"{output}: cannot create {directory}: {err.strerror}") from None
        yield
    except BaseException:
        _remove_made(made)
        raise


def _remove_made(made: list[str]) -> None:
    """Remove the directories ``made``, innermost first, where empty."""
    for directory in reversed(made):
        try:
            os.rmdir(directory)
        except OSError:
            return


def check_output(output: str | None) -> None:
    """``-o ""`` is a mistake, not stdout (leaving ``-o`` out is)."""
    if output is not None and not output:
        raise empty_path("'-o' / '--output'")


def generate(output, driver_root, dev_root, config, **options) -> None:
    """Write the spec ``options`` (``SpecRequest.resolve``'s) name to ``output`` (atomically,
    mode 0644, missing directories made) or to stdout when ``output`` is None."""
    from nvshim.cdi.writer import dump_spec

    check_output(output)
    request = SpecRequest.resolve(config, output, **options)
    host = discover(driver_root, dev_root)
    spec = request.build(host, config)
    text = dump_spec(spec, request.fmt)
    if output is None:
        sys.stdout.write(text)
        return
    from nvshim.fsutil import atomic_write

    with parents_made(output):
        atomic_write(output, text.encode(), mode=0o644)
    sys.stderr.write(
        f"nvshim: wrote {output}: {len(spec['devices'])} devices, cdiVersion {spec['cdiVersion']}\n"
    )
