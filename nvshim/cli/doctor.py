"""``nvshim doctor``: is this node fit for GPU pods? One line per check, exit 1 on a fail."""

from __future__ import annotations

import json
import sys

import click

from nvshim.cli.common import root_options
from nvshim.engines import ENGINES


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.option(
    "--engine",
    type=click.Choice(ENGINES),
    help="Container engine to check [env NVSHIM_ENGINE; default: the first one found].",
)
@click.option("--engine-config", metavar="FILE", help="Engine config file (as configure).")
@click.option("--socket", metavar="PATH", help="Engine socket (as configure).")
@click.option("--runtime-name", help="Runtime (handler) name [nvshim].")
@click.option("--cdi-dir", "cdi_dirs", multiple=True, metavar="DIR", help="Repeatable.")
@click.option("--hooks-dir", "hooks_dirs", multiple=True, metavar="DIR", help="Repeatable.")
@click.option("--check", "only", multiple=True, metavar="NAME", help="Run only these checks.")
@root_options
def doctor(
    as_json, engine, engine_config, socket, runtime_name, cdi_dirs, hooks_dirs, only, **roots
) -> None:
    """Check the driver, device nodes, engine, CDI specs and sharing; exit 1 if any fails."""
    from nvshim.doctor import exit_code, load_checks, run_checks
    from nvshim.doctor.context import Context
    from nvshim.errors import UsageError

    unknown = [n for n in only if n not in load_checks()]
    if unknown:
        raise UsageError(f"--check {unknown[0]}: no such check ({', '.join(load_checks())})")
    ctx = Context(
        roots["config"],
        roots["driver_root"],
        roots["dev_root"],
        engine=engine,
        engine_options={"config": engine_config, "socket": socket, "runtime_name": runtime_name},
        cdi_dirs=cdi_dirs,
        hooks_dirs=hooks_dirs,
    )
    results = run_checks(ctx, tuple(only))
    code = exit_code(results)
    if as_json:
        doc = {"healthy": code == 0, "checks": [r.to_dict() for r in results]}
        click.echo(json.dumps(doc, indent=2))
    else:
        click.echo(render(results))
    sys.exit(code)


def render(results) -> str:
    """``STATUS  CHECK  reason`` lines, each problem followed by its fix."""
    width = max((len(r.name) for r in results), default=0)
    lines = []
    for r in results:
        lines.append(f"{r.status.upper():<4}  {r.name:<{width}}  {r.reason}")
        if r.fix and r.status in ("warn", "fail"):
            lines.append(f"{'':<4}  {'':<{width}}  fix: {r.fix}")
    return "\n".join(lines)
