"""``nvshim install``: put the isolated launchers (and optionally the OCI hook file) in place."""

from __future__ import annotations

import json
import os

import click

from nvshim.hook.entries import HOOK_ENV
from nvshim.launch import write_launchers


def hook_file_text(hook_path: str) -> str:
    """The podman/CRI-O hooks.d entry running ``nvshim-hook prestart``."""
    entry = {
        "version": "1.0.0",
        "hook": {"path": hook_path, "args": ["nvshim-hook", "prestart"], "env": list(HOOK_ENV)},
        "when": {"always": True},
        "stages": ["prestart"],
    }
    return json.dumps(entry, indent=2) + "\n"


@click.command()
@click.option("--bin-dir", default="/usr/bin", show_default=True, help="Where to write.")
@click.option("--hooks-dir", default=None, metavar="DIR", help="Also write the OCI hook JSON here.")
def install(bin_dir: str, hooks_dir: str | None) -> None:
    """Write nvshim-runtime and nvshim-hook (isolated: python -I -S) into --bin-dir."""
    from nvshim.fsutil import atomic_write

    for path in write_launchers(bin_dir):
        click.echo(f"installed {path}")
    if hooks_dir:
        os.makedirs(hooks_dir, exist_ok=True)
        target = os.path.join(hooks_dir, "oci-nvshim-hook.json")
        text = hook_file_text(os.path.join(os.path.abspath(bin_dir), "nvshim-hook"))
        atomic_write(target, text.encode(), mode=0o644, backup=False)
        click.echo(f"installed {target}")
