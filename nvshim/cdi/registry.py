"""Find the CDI devices that runtimes would see in the spec directories.

Follows the CDI reference cache that runtimes embed: the directories are read in order
(later ones have higher priority), sub-directories are skipped, only ``.json`` and
``.yaml`` files load (a ``.yml`` file is ignored by runtimes: reported here), a spec that
fails to load or validate is skipped as a whole, a device defined in a higher-priority
directory replaces the earlier one, and a device defined twice in one directory is
refused altogether (runtimes drop it even if another directory defines it too).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from nvshim.cdi.validate import load_spec_file, validate_spec
from nvshim.errors import NvshimError
from nvshim.record import field, record

DEFAULT_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
LOADED_SUFFIXES = (".json", ".yaml")

SpecDevice = tuple[str, dict[str, Any], dict[str, Any]]  # (spec path, device, whole spec)


@record
class SpecScan:
    """What a scan of the spec directories found."""

    devices: dict[str, SpecDevice] = field(default_factory=dict)  # "vendor/class=name" -> ...
    specs: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # valid specs loaded
    warnings: list[str] = field(default_factory=list)


def _spec_files(directory: str, warnings: list[str]) -> list[str]:
    """Spec file paths of one directory in name order; a missing directory has none."""
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except FileNotFoundError:
        return []
    except OSError as err:
        warnings.append(f"{directory}: cannot read CDI spec directory: {err.strerror or err}")
        return []
    paths = []
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                continue
        except OSError:
            continue
        path = os.path.join(directory, entry.name)
        suffix = os.path.splitext(entry.name)[1]
        if suffix == ".yml":
            warnings.append(f"{path}: ignored: runtimes load only .json and .yaml spec files")
        elif suffix in LOADED_SUFFIXES:
            paths.append(path)
    return paths


def scan_spec_dirs(dirs: Sequence[str] = DEFAULT_SPEC_DIRS) -> SpecScan:
    """Load every valid spec in ``dirs`` and resolve device names as runtimes do."""
    scan = SpecScan()
    priority_of: dict[str, int] = {}
    conflicts: set[str] = set()
    for priority, directory in enumerate(dirs):
        for path in _spec_files(directory, scan.warnings):
            try:
                spec = load_spec_file(path)
            except NvshimError as err:
                scan.warnings.append(str(err))
                continue
            problems = validate_spec(spec, path, schema=False)
            if problems:
                scan.warnings.extend(problems)
                continue
            scan.specs.append((path, spec))
            for device in spec["devices"]:
                name = f"{spec['kind']}={device['name']}"
                if name in scan.devices:
                    if priority == priority_of[name]:
                        other = scan.devices[name][0]
                        scan.warnings.append(
                            f"{path}: device {name} is also defined in {other}; runtimes refuse it"
                        )
                        conflicts.add(name)
                        continue
                    # a later directory overrides an earlier one
                scan.devices[name] = (path, device, spec)
                priority_of[name] = priority
    for name in conflicts:
        scan.devices.pop(name, None)
    return scan


def find_spec_devices(
    dirs: Sequence[str] = DEFAULT_SPEC_DIRS, warnings: list[str] | None = None
) -> dict[str, SpecDevice]:
    """``{"vendor/class=name": (spec path, device mapping, spec mapping)}`` for ``dirs``.

    Problems with individual files are appended to ``warnings`` when given, never raised.
    """
    scan = scan_spec_dirs(dirs)
    if warnings is not None:
        warnings.extend(scan.warnings)
    return scan.devices


def list_devices(
    dirs: Sequence[str] = DEFAULT_SPEC_DIRS, warnings: list[str] | None = None
) -> list[str]:
    """Sorted fully qualified names (``vendor/class=name``) of every device found in ``dirs``.

    Problems with individual files are appended to ``warnings`` when given, never raised.
    """
    return sorted(find_spec_devices(dirs, warnings))
