"""``NVIDIA_REQUIRE_*`` constraints (FACTS §3) checked against the driver and GPUs.

Grammar of one variable: alternatives separated by blanks (OR), each a comma list of
conditions (AND), each ``<property><op><value>`` with no blanks inside; properties
``cuda``, ``driver``, ``arch`` (numeric, dotted compare, missing parts are 0) and
``brand`` (case-insensitive string, ``=`` and ``!=`` only); ops ``= != < <= > >=``.
Different variables AND together.

Each selected device is checked on its own (``arch`` and ``brand`` are that device's;
a MIG device uses its parent's), and every device must satisfy every variable. With no
device selected (``none``) the ``arch`` and ``brand`` conditions hold vacuously (there is
no GPU for them to be false about); ``cuda`` and ``driver`` are still checked.
"""

from __future__ import annotations

from nvshim.errors import NvshimError
from nvshim.policy.cuda_table import compare_versions, newest_cuda_for_driver, version_tuple
from nvshim.record import record

PROPERTIES = ("cuda", "driver", "arch", "brand")
OPERATORS = ("<=", ">=", "!=", "<", ">", "=")  # longest first
MAX_EXPRESSION = 64 * 1024
MAX_TOTAL = 256 * 1024  # characters of all the variables together


class RequirementError(NvshimError):
    """A requirement that is malformed or not met by this host."""


@record(frozen=True)
class Condition:
    """One ``<property><op><value>`` test."""

    prop: str
    op: str
    value: str

    def __str__(self) -> str:
        return f"{self.prop}{self.op}{self.value}"

    def holds(self, facts: dict[str, str | None]) -> bool:
        """Whether the condition holds. An absent ``arch``/``brand`` fact (no device)
        holds vacuously; an absent ``cuda``/``driver`` fact (unknown) fails."""
        actual = facts.get(self.prop)
        if actual is None:
            return self.prop in ("arch", "brand")
        if self.prop == "brand":
            same = actual.lower() == self.value.lower()
            return same if self.op == "=" else not same
        order = compare_versions(actual, self.value)
        return {
            "=": order == 0,
            "!=": order != 0,
            "<": order < 0,
            "<=": order <= 0,
            ">": order > 0,
            ">=": order >= 0,
        }[self.op]


@record(frozen=True)
class Requirement:
    """A parsed expression: satisfied when any alternative has all its conditions."""

    text: str
    alternatives: tuple[tuple[Condition, ...], ...]

    def holds(self, facts: dict[str, str | None]) -> bool:
        return not self.alternatives or any(
            all(c.holds(facts) for c in alt) for alt in self.alternatives
        )

    def failures(self, facts: dict[str, str | None]) -> list[Condition]:
        """The first failing condition of each alternative."""
        out = []
        for alt in self.alternatives:
            failed = next((c for c in alt if not c.holds(facts)), None)
            if failed is not None and failed not in out:
                out.append(failed)
        return out


def _show(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def parse_condition(token: str, name: str = "requirement") -> Condition:
    """Parse one ``<property><op><value>``; RequirementError naming ``name`` and the token."""
    for op in OPERATORS:
        prop, found, value = token.partition(op)
        if found:
            break
    else:
        raise RequirementError(f"{name}: no operator in condition {_show(token)}")
    prop = prop.lower()
    if prop not in PROPERTIES:
        raise RequirementError(f"{name}: unknown property in condition {_show(token)}")
    if not value or any(ch in value for ch in "<>=!"):
        raise RequirementError(f"{name}: bad value in condition {_show(token)}")
    if prop == "brand":
        if op not in ("=", "!="):
            raise RequirementError(f"{name}: brand takes only = or != in {_show(token)}")
        if not all(ch.isascii() and (ch.isalnum() or ch in "-_") for ch in value):
            raise RequirementError(f"{name}: bad brand in condition {_show(token)}")
    else:
        try:
            version_tuple(value)
        except ValueError:
            raise RequirementError(f"{name}: bad version in condition {_show(token)}") from None
    return Condition(prop, op, value)


def parse_requirement(expr: str, name: str = "requirement") -> Requirement:
    """Parse one ``NVIDIA_REQUIRE_*`` value (blank = OR, comma = AND); an empty or blank
    value is a requirement that always holds. RequirementError names ``name`` and the token."""
    if len(expr) > MAX_EXPRESSION:
        raise RequirementError(f"{name}: expression longer than {MAX_EXPRESSION} characters")
    alternatives = []
    for alt in expr.split():
        tokens = alt.split(",")
        if not all(tokens):
            raise RequirementError(f"{name}: empty condition in {_show(alt)}")
        alternatives.append(tuple(parse_condition(t, name) for t in tokens))
    return Requirement(expr, tuple(alternatives))


def check_requirements(
    requirements: dict[str, str],
    cuda_version: str,
    driver_version: str,
    devices: list[tuple[str, str]],
    disable: bool = False,
) -> None:
    """Raise RequirementError unless every requirement holds for every device.

    ``requirements`` maps variable names to expressions; ``cuda_version`` is the newest
    CUDA the host driver supports (empty: derived from the driver version); ``devices``
    holds ``(compute capability, brand)`` per selected device. ``disable`` skips it all.
    """
    if disable or not requirements:
        return
    try:
        newest = newest_cuda_for_driver(driver_version)
        if cuda_version:
            version_tuple(cuda_version)
    except ValueError:
        raise RequirementError(
            f"host versions unusable for requirements: driver {_show(driver_version)}, "
            f"CUDA {_show(cuda_version)}"
        ) from None
    total = sum(len(value) for value in requirements.values())
    if total > MAX_TOTAL:
        raise RequirementError(
            f"NVIDIA_REQUIRE_*: {len(requirements)} variables, longer than {MAX_TOTAL} "
            "characters together"
        )
    cuda = cuda_version or newest
    first: dict[tuple[str, str], int] = {}  # each device model once: its first position
    for position, device in enumerate(devices):
        first.setdefault(device, position)
    contexts: list[tuple[int, dict[str, str | None]]] = [
        (position, {"cuda": cuda or None, "driver": driver_version, "arch": a, "brand": b})
        for (a, b), position in first.items()
    ] or [(0, {"cuda": cuda or None, "driver": driver_version, "arch": None, "brand": None})]
    for name in sorted(requirements):
        requirement = parse_requirement(requirements[name], name)
        for position, facts in contexts:
            if requirement.holds(facts):
                continue
            failed = " or ".join(_describe(c, facts) for c in requirement.failures(facts))
            where = f" on device {position}" if devices else ""
            supports = f"CUDA {cuda}" if cuda else "no CUDA release nvshim knows"
            raise RequirementError(
                f"{name}: requirement not met{where}: {failed}; host driver "
                f"{driver_version} supports up to {supports}; update the driver or use an "
                "older CUDA image"
            )


def _describe(condition: Condition, facts: dict[str, str | None]) -> str:
    text = str(condition)
    text = text if len(text) <= 60 else text[:60] + "..."
    return f"{text} (host {condition.prop} {facts[condition.prop]})"
