"""Every nvshim command's --help (a walk of the click tree): each shown option described,
no reStructuredText markup leaking from docstrings, and `--help` exits 0 with a usage line."""

from __future__ import annotations

import click
import pytest

from nvshim.cli import cli


def _commands(cmd: click.Command = cli, path: tuple[str, ...] = ("nvshim",)):
    yield path, cmd
    if isinstance(cmd, click.Group):
        ctx = click.Context(cmd, info_name=path[-1])
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                yield from _commands(sub, (*path, name))


COMMANDS = list(_commands())


@pytest.mark.parametrize("path, cmd", COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_help_describes_every_option(path, cmd, capsys):
    undescribed = [
        p.opts[0]
        for p in cmd.params
        if isinstance(p, click.Option) and not p.hidden and not p.help and p.name != "help"
    ]
    assert undescribed == [], f"{' '.join(path)}: options without a description"
    with pytest.raises(SystemExit) as done:
        cli.main([*path[1:], "--help"], prog_name="nvshim")
    assert done.value.code == 0
    shown = capsys.readouterr().out
    assert shown.startswith(f"Usage: {' '.join(path)} ")
    assert "``" not in shown, "reStructuredText markup in the help"


def test_the_walk_reaches_every_command():
    names = {" ".join(p) for p, _ in COMMANDS}
    for expected in ("nvshim cdi generate", "nvshim dra run", "nvshim node install",
                     "nvshim unconfigure", "nvshim mps status"):  # fmt: skip
        assert expected in names
