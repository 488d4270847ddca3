"""``nvshim doctor``: can GPU pods run on this node? A registry of small checks.

A check is a function ``(ctx: Context) -> Result`` registered with :func:`check`; it
raises :class:`Skip` when what it needs is absent. Checks live in the modules listed in
``CHECK_MODULES`` (imported on first use, in order); a new module adds its own checks
there and appends its name to that tuple. :func:`run_checks` runs them all, turning an
unexpected exception into a ``fail`` of that check alone.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from nvshim.record import asdict, record

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
STATUSES = (OK, WARN, FAIL, SKIP)

# Modules whose import registers checks, in report order.
CHECK_MODULES: tuple[str, ...] = (
    "nvshim.doctor.host_checks",
    "nvshim.doctor.engine_checks",
    "nvshim.doctor.cdi_checks",
    "nvshim.doctor.sharing_checks",
    "nvshim.doctor.pairing_checks",
)


@record
class Result:
    """One check's outcome: a status, a one-line reason, and how to fix it (not ok)."""

    name: str
    status: str
    reason: str
    fix: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Skip(Exception):
    """Raised by a check whose subject is absent; the message says why."""


CheckFunc = Callable[[Any], Result]
CHECKS: dict[str, tuple[str, CheckFunc]] = {}  # name -> (one-line title, function)


def check(name: str, title: str) -> Callable[[CheckFunc], CheckFunc]:
    """Register ``func`` as check ``name`` (``title``: what it verifies, for --list)."""

    def register(func: CheckFunc) -> CheckFunc:
        if name in CHECKS and CHECKS[name][1] is not func:
            raise ValueError(f"doctor check {name!r} registered twice")
        CHECKS[name] = (title, func)
        return func

    return register


def load_checks() -> dict[str, tuple[str, CheckFunc]]:
    """Import every check module once; the registry in report order."""
    for module in CHECK_MODULES:
        importlib.import_module(module)
    return CHECKS


def ok(name: str, reason: str) -> Result:
    return Result(name, OK, reason)


def warn(name: str, reason: str, fix: str) -> Result:
    return Result(name, WARN, reason, fix)


def fail(name: str, reason: str, fix: str) -> Result:
    return Result(name, FAIL, reason, fix)


def run_checks(ctx, names: tuple[str, ...] = ()) -> list[Result]:
    """Run the registered checks (only ``names`` when given) against ``ctx``."""
    from nvshim.errors import NvshimError

    results = []
    for name, (_title, func) in load_checks().items():
        if names and name not in names:
            continue
        try:
            result = func(ctx)
        except Skip as why:
            result = Result(name, SKIP, str(why))
        except NvshimError as err:
            result = Result(name, FAIL, str(err), "see the message")
        except Exception as err:  # noqa: BLE001 - one broken check must not hide the others
            result = Result(name, FAIL, f"check crashed: {type(err).__name__}: {err}", "report it")
        results.append(result)
    return results


def exit_code(results: list[Result]) -> int:
    """0 when nothing failed, 1 otherwise."""
    return 1 if any(r.status == FAIL for r in results) else 0
