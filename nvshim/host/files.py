"""Find the driver's files under a driver root: libraries (through the root's own
``etc/ld.so.cache``, else the standard directories), binaries, firmware, configs, sockets."""

from __future__ import annotations

import os
import stat

from nvshim.host import driver_files as df
from nvshim.host.model import DriverFile
from nvshim.host.rootpath import host_path, resolve_in_root
from nvshim.ldcache import LdCacheEntry, LdCacheError, parse_ld_cache

TYPE_CHECKING = False  # typing and re cost ~5 ms of `nvshim cdi generate`
if TYPE_CHECKING:
    from collections.abc import Iterable

_VERSION_CHARS = frozenset("0123456789.")


def split_so(name: str) -> tuple[str, str] | None:
    """``(stem, version)`` of a library file name: ``libcuda.so.550.90.12`` gives
    ``("libcuda", "550.90.12")``, ``libcuda.so`` ``("libcuda", "")``; None for any other
    name. The stem ends at the first ``.so`` that only a version (digits and dots, a
    digit first) follows."""
    at = name.find(".so", 1)
    while at != -1:
        rest = name[at + 3 :]
        if not rest:
            return name[:at], ""
        if rest[0] == "." and rest[1:2].isdigit() and _VERSION_CHARS.issuperset(rest[1:]):
            return name[:at], rest[1:]
        at = name.find(".so", at + 1)
    return None


def read_ld_cache(driver_root: str, warnings: list[str]) -> list[LdCacheEntry]:
    """Entries of ``<driver_root>/etc/ld.so.cache``; a warning and [] when unusable."""
    path = host_path(driver_root, "/etc/ld.so.cache")
    try:
        with open(path, "rb") as fh:
            return parse_ld_cache(fh.read())
    except FileNotFoundError:
        warnings.append(f"{path}: not found; searching the standard library directories")
    except (OSError, LdCacheError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        warnings.append(
            f"{path}: unreadable ({reason}); searching the standard library directories"
        )
    return []


def _scan_dirs(driver_root: str, dirs: Iterable[str], arch: str) -> list[LdCacheEntry]:
    """A stand-in cache from directory listings (used when the ld.so.cache is unusable)."""
    out = []
    flags = 0x0303 if arch == "x86_64" else 0x0003
    for rel in dirs:
        try:
            names = sorted(os.listdir(host_path(driver_root, "/" + rel)))
        except OSError:
            continue
        out.extend(LdCacheEntry(n, f"/{rel}/{n}", flags) for n in names if ".so" in n)
    return out


def find_libraries(
    driver_root: str, driver_version: str, entries: list[LdCacheEntry], warnings: list[str]
) -> list[DriverFile]:
    """Driver libraries per capability (64-bit; 32-bit ones under ``compat32``)."""
    if not entries:
        entries = _scan_dirs(driver_root, df.LIB_DIRS, "x86_64") + _scan_dirs(
            driver_root, df.LIB32_DIRS, "32bit"
        )
    by_stem: dict[tuple[str, str], list[LdCacheEntry]] = {}
    for entry in entries:
        parts = split_so(entry.name)
        if parts and entry.arch in ("x86_64", "32bit"):
            by_stem.setdefault((parts[0], entry.arch), []).append(entry)
    out: list[DriverFile] = []
    seen: set[str] = set()
    links: dict[str, str | None] = {}  # the library directories are read once
    for capability, stems in df.LIBRARIES.items():
        for stem in stems:
            for arch, cap in (("x86_64", capability), ("32bit", "compat32")):
                lib = _pick_library(driver_root, stem, by_stem.get((stem, arch), []), links)
                if lib is None or lib.host_path in seen:
                    continue
                seen.add(lib.host_path)
                out.append(DriverFile("lib", lib.path, lib.host_path, cap, lib.soname, lib.links))
    stale = [f for f in out if not f.path.endswith(".so." + driver_version) and _versioned(f.path)]
    for f in stale:
        warnings.append(f"{f.host_path}: version differs from driver {driver_version}")
    return out


def _versioned(path: str) -> bool:
    parts = split_so(os.path.basename(path))
    return bool(parts and parts[1].count(".") >= 1)


def _pick_library(
    driver_root: str, stem: str, entries: list[LdCacheEntry], read_links: dict[str, str | None]
) -> DriverFile | None:
    """Resolve a library's entries to its real file, its SONAME link and dev link."""
    if not entries:
        return None
    # Prefer the SONAME-like name (libfoo.so.N), the first in cache order.
    entries = sorted(entries, key=lambda e: (e.name == f"{stem}.so", len(e.name)))
    for entry in entries:
        try:
            real = resolve_in_root(driver_root, entry.path, read_links)
        except OSError:
            continue
        real_host = host_path(driver_root, real)
        if not os.path.isfile(real_host):
            continue
        soname = entry.name if entry.name != f"{stem}.so" else None
        links: list[tuple[str, str]] = []
        directory = os.path.dirname(real)
        if soname and soname != os.path.basename(real):
            links.append((f"{directory}/{soname}", os.path.basename(real)))
        if stem in df.DEV_LINKS and soname:
            links.append((f"{directory}/{stem}.so", soname))
        return DriverFile("lib", real, real_host, None, soname, tuple(links))
    return None


def find_binaries(driver_root: str) -> list[DriverFile]:
    out = []
    for capability, names in df.BINARIES.items():
        for name in names:
            for rel in df.BIN_DIRS:
                path = f"/{rel}/{name}"
                hp = host_path(driver_root, path)
                if os.path.isfile(hp) and os.access(hp, os.X_OK):
                    out.append(DriverFile("bin", path, hp, capability))
                    break
    return out


def find_firmware(driver_root: str, driver_version: str) -> list[DriverFile]:
    directory = f"/{df.FIRMWARE_DIR}/{driver_version}"
    try:
        names = sorted(os.listdir(host_path(driver_root, directory)))
    except OSError:
        return []
    return [
        DriverFile("firmware", f"{directory}/{n}", host_path(driver_root, f"{directory}/{n}"))
        for n in names
        if n.startswith("gsp") and n.endswith(".bin")
    ]


def find_configs(driver_root: str) -> list[DriverFile]:
    out = []
    for capability, rels in df.CONFIG_FILES.items():
        for rel in rels:
            hp = host_path(driver_root, "/" + rel)
            if os.path.isfile(hp):
                out.append(DriverFile("config", "/" + rel, hp, capability))
    return out


def find_sockets(driver_root: str) -> list[DriverFile]:
    out = []
    for capability, rels in df.IPC_SOCKETS.items():
        for rel in rels:
            hp = host_path(driver_root, "/" + rel)
            try:
                if stat.S_ISSOCK(os.stat(hp).st_mode):
                    out.append(DriverFile("ipc", "/" + rel, hp, capability))
            except OSError:
                continue
    return out
