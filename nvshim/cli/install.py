"""``nvshim install``: put nvshim on a host (or a staging root) naming its final paths."""

from __future__ import annotations

import click

from nvshim.cli.common import option


@click.command()
@option(
    "--root",
    "dest_root",
    default="/",
    show_default=True,
    metavar="DIR",
    help="Destination root: write below DIR (a package or image staging dir); "
    "everything written still names the final paths.",
)
@option(
    "--prefix",
    default=None,
    metavar="DIR",
    shown_default="where the running bundle is; from a virtualenv, none: the launchers go"
    " straight into --bin-dir",
    help="Final path of the self-contained bundle.",
)
@option(
    "--bin-dir",
    default="/usr/bin",
    show_default=True,
    metavar="DIR",
    empty_ok=True,
    help='Where the commands go ("": nowhere, they stay in the --prefix bundle).',
)
@option("--hooks-dir", default=None, metavar="DIR", help="Also write the OCI hook JSON here.")
def install(dest_root: str, prefix: str | None, bin_dir: str, hooks_dir: str | None) -> None:
    """Install nvshim-runtime, nvshim-hook (isolated: python -I -S) and the OCI hook file.

    \b
    nvshim install --bin-dir /usr/bin --hooks-dir /usr/share/containers/oci/hooks.d
    nvshim install --root /tmp/stage --prefix /usr/lib/nvshim --bin-dir /usr/bin
    """
    from nvshim.install import install_host

    for path in install_host(dest_root, prefix, bin_dir or None, hooks_dir):
        click.echo(f"installed {path}")
