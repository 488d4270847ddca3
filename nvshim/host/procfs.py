"""Parsers for the kernel files discovery reads: ``/proc/devices`` and
``/proc/driver/nvidia-caps/mig-minors``."""

from __future__ import annotations

from nvshim.record import field, record


def parse_proc_devices(text: str) -> dict[str, int]:
    """Character device majors by driver name (the ``Character devices:`` section only)."""
    majors: dict[str, int] = {}
    section = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.endswith(":"):
            section = line[:-1].strip().lower()
            continue
        if section != "character devices":
            continue
        parts = line.split(None, 1)
        if len(parts) != 2 or not parts[0].isdigit():
            raise ValueError(f"bad /proc/devices line: {raw!r}")
        majors.setdefault(parts[1], int(parts[0]))
    return majors


@record
class MigMinors:
    """Capability minors: ``gi[(gpu, gi)]``, ``ci[(gpu, gi, ci)]``, plus config/monitor."""

    gi: dict[tuple[int, int], int] = field(default_factory=dict)
    ci: dict[tuple[int, int, int], int] = field(default_factory=dict)
    config: int | None = None
    monitor: int | None = None


def parse_mig_minors(text: str) -> MigMinors:
    """Parse lines like ``gpu1/gi2/access 156`` and ``gpu1/gi2/ci0/access 157``."""
    out = MigMinors()
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        try:
            name, minor_text = line.split()
            minor = int(minor_text)
        except ValueError:
            raise ValueError(f"bad mig-minors line: {raw!r}") from None
        if name == "config":
            out.config = minor
            continue
        if name == "monitor":
            out.monitor = minor
            continue
        parts = name.split("/")
        try:
            if len(parts) == 3 and parts[2] == "access":
                out.gi[(_num(parts[0], "gpu"), _num(parts[1], "gi"))] = minor
            elif len(parts) == 4 and parts[3] == "access":
                key = (_num(parts[0], "gpu"), _num(parts[1], "gi"), _num(parts[2], "ci"))
                out.ci[key] = minor
            else:
                raise ValueError
        except ValueError:
            raise ValueError(f"bad mig-minors line: {raw!r}") from None
    return out


def _num(part: str, prefix: str) -> int:
    if not part.startswith(prefix) or not part[len(prefix) :].isdigit():
        raise ValueError(part)
    return int(part[len(prefix) :])
