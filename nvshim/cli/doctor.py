"""``nvshim doctor``: is this node fit for GPU pods? One line per check, exit 1 on a fail."""

from __future__ import annotations

import functools
import json
import sys

import click

from nvshim.cdi.registry import DEFAULT_SPEC_DIRS
from nvshim.cli.common import engine_options, option, root_options
from nvshim.doctor.context import DEFAULT_HOOKS_DIRS


def _dirs(name: str, defaults: tuple[str, ...], text: str):
    """A repeatable directory option (``--cdi-dir`` into ``cdi_dirs``)."""
    dest = name[2:].replace("-", "_") + "s"
    return option(name, dest, multiple=True, metavar="DIR", shown_default=", ".join(defaults),
                  help=text)  # fmt: skip


def context_options(func):
    """The options that say what to check (engine, spec and hook dirs, roots); the command
    gets ``make_context``, a function returning a fresh doctor Context."""
    options = [
        *engine_options(
            "Container engine to check.", config_dest="engine_config", engine="the first found"
        ),  # fmt: skip
        _dirs("--cdi-dir", DEFAULT_SPEC_DIRS, "A CDI spec directory to check; repeatable."),
        _dirs("--hooks-dir", DEFAULT_HOOKS_DIRS, "An OCI hooks directory to check; repeatable."),
    ]

    @functools.wraps(func)
    def wrapper(*args, engine, engine_config, socket, runtime_name, cdi_dirs, hooks_dirs, **kw):
        from nvshim.doctor.context import Context

        config, driver_root, dev_root = kw.pop("config"), kw.pop("driver_root"), kw.pop("dev_root")
        engine_options = {"config": engine_config, "socket": socket, "runtime_name": runtime_name}

        def make_context() -> Context:
            return Context(
                config,
                driver_root,
                dev_root,
                engine=engine,
                engine_options=engine_options,
                cdi_dirs=cdi_dirs,
                hooks_dirs=hooks_dirs,
            )

        return func(*args, make_context=make_context, **kw)

    wrapper = root_options(wrapper)
    for one in reversed(options):
        wrapper = one(wrapper)
    return wrapper


@click.command()
@option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@option(
    "--only",
    "--check",  # its earlier name (configure's --check is its drift check)
    "only",
    multiple=True,
    metavar="NAME",
    hidden_opts=("--check",),
    help="Run only this check; repeatable.",
)
@context_options
def doctor(as_json, only, make_context) -> None:
    """Check the driver, device nodes, engine, CDI specs and sharing; exit 1 if any fails."""
    from nvshim.doctor import exit_code, load_checks, run_checks
    from nvshim.errors import UsageError, did_you_mean

    checks = load_checks()
    unknown = [n for n in only if n not in checks]
    if unknown:
        hint = did_you_mean(unknown[0], checks)
        raise UsageError(f"--only {unknown[0]}: no such check{hint}; known: {', '.join(checks)}")
    results = run_checks(make_context(), tuple(only))
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
