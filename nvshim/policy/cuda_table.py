"""CUDA toolkit release -> minimum Linux driver (CUDA release notes, tables 2 and 3).

``CUDA_MIN_DRIVER`` lists the GA release of each toolkit version, newest first.
``MINOR_COMPAT`` is minor-version compatibility: any toolkit of a major version runs
(without PTX JIT of newer code) on a driver at or above that major's floor.
"""

from __future__ import annotations

CUDA_MIN_DRIVER: tuple[tuple[str, str], ...] = (
    ("13.3", "610.43.02"),  # secondary sources only
    ("13.2", "595.45.04"),  # secondary sources only
    ("13.1", "590.44.01"),
    ("13.0", "580.65.06"),
    ("12.9", "575.51.03"),
    ("12.8", "570.26"),
    ("12.6", "560.28.03"),
    ("12.5", "555.42.02"),
    ("12.4", "550.54.14"),
    ("12.3", "545.23.06"),
    ("12.2", "535.54.03"),
    ("12.1", "530.30.02"),
    ("12.0", "525.60.13"),
    ("11.8", "520.61.05"),
    ("11.7", "515.43.04"),
    ("11.6", "510.39.01"),
    ("11.5", "495.29.05"),
    ("11.4", "470.42.01"),
    ("11.3", "465.19.01"),
    ("11.2", "460.27.03"),
    ("11.1", "455.23"),
    ("11.0", "450.36.06"),
    ("10.2", "440.33"),
    ("10.1", "418.39"),
    ("10.0", "410.48"),
    ("9.2", "396.26"),
    ("9.1", "390.46"),
    ("9.0", "384.81"),
    ("8.0", "367.48"),
    ("7.5", "352.31"),
    ("7.0", "346.46"),
)

# Major version -> the lowest driver running every toolkit of it (minor-version compat).
MINOR_COMPAT: dict[int, str] = {13: "580", 12: "525", 11: "450"}


def version_tuple(text: str) -> tuple[int, ...]:
    """``"550.54.14"`` -> ``(550, 54, 14)``; ValueError unless dotted non-negative numbers."""
    parts = text.strip().split(".")
    if not all(p.isascii() and p.isdigit() and len(p) <= 9 for p in parts):
        raise ValueError(f"not a dotted numeric version: {text!r}")
    return tuple(int(p) for p in parts)


def compare_versions(a: str, b: str) -> int:
    """-1, 0 or 1 comparing dotted versions numerically; missing parts count as 0."""
    ta, tb = version_tuple(a), version_tuple(b)
    width = max(len(ta), len(tb))
    ta += (0,) * (width - len(ta))
    tb += (0,) * (width - len(tb))
    return (ta > tb) - (ta < tb)


def _major_minor(cuda: str) -> tuple[int, int]:
    parts = version_tuple(cuda) + (0,)
    return parts[0], parts[1]


def min_driver_for_cuda(cuda: str, minor_compat: bool = False) -> str | None:
    """The minimum driver for toolkit ``cuda`` (``"12.4"``, ``"12.4.1"``); None if unknown.

    With ``minor_compat``, a major version with a compatibility floor gives that floor.
    A version between table rows (``12.7``) gets the next listed release's driver.
    """
    major, minor = _major_minor(cuda)
    if minor_compat and major in MINOR_COMPAT:
        return MINOR_COMPAT[major]
    best: str | None = None
    for version, driver in CUDA_MIN_DRIVER:
        if _major_minor(version) >= (major, minor):
            best = driver if _major_minor(version)[0] == major else best
    return best


def newest_cuda_for_driver(driver_version: str) -> str:
    """The newest CUDA toolkit whose GA release supports ``driver_version``.

    ``""`` when the driver predates every row of the table. ValueError for a
    version that is not dotted numeric.
    """
    for version, driver in CUDA_MIN_DRIVER:
        if compare_versions(driver_version, driver) >= 0:
            return version
    return ""


def driver_supports_cuda(driver_version: str, cuda: str, minor_compat: bool = False) -> bool:
    """True when ``driver_version`` runs toolkit ``cuda``, optionally by minor-version
    compatibility. Unknown toolkits newer than the table are unsupported."""
    needed = min_driver_for_cuda(cuda, minor_compat)
    return needed is not None and compare_versions(driver_version, needed) >= 0
