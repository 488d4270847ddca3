#!/usr/bin/env python3
"""Build nvshim's self-contained host bundle (see nvshim/hostbundle.py for its layout).

    python3 packaging/bundle/build.py OUT [--prefix /usr/local/nvshim] [--python PATH]

The bundle carries the interpreter (the real binary behind --python, default the one
running this script), its standard library, nvshim and its dependencies (installed with
pip from this checkout), the dynamic loader, glibc and every shared library any of those
load, so it runs on hosts with an older glibc or no Python at all. The interpreter's
PT_INTERP and DT_RPATH get long slots (patchelf) that ``nvshim.hostbundle.relocate`` fills with
the final prefix's loader and library directory. Needs: pip, patchelf, ldd, and a C
compiler with a static C library (the compiled nvshim-runtime front, nvshim/runtime/frontbin.py).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import py_compile
import re
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from nvshim import __version__  # noqa: E402
from nvshim.hostbundle import (  # noqa: E402
    INTERPRETER,
    MARKER,
    SITE,
    relocate,
    rpath_slot,
    tree_digest,
    write_unplaced_launcher,
)
from nvshim.runtime import frontbin  # noqa: E402

# Room for any prefix: relocate() writes the real loader and library paths into these.
INTERP_SLOT = "/" + "nvshim-loader-slot/" * 12 + "ld.so"
RPATH_SLOT = "/" + "nvshim-library-slot/" * 12 + "lib"
# Standard-library parts a runtime never imports.
STDLIB_SKIP = {
    "__pycache__", "test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3",
    "site-packages", "dist-packages", "pydoc_data", "EXTERNALLY-MANAGED",
    # test-only and obsolete extension modules (lib-dynload)
    "_test*", "_ctypes_test*", "_xxtestfuzz*", "xxlimited*", "ossaudiodev*",
}  # fmt: skip
# Loaded by glibc itself with dlopen (thread cancellation), so ldd never lists it.
DLOPENED = ("libgcc_s.so.1",)
LDD_LINE = re.compile(r"^\s*(\S+)\s+=>\s+(/\S+)\s+\(0x|^\s*(/\S+)\s+\(0x")


def run(*cmd: str, **kw) -> str:
    """Run ``cmd``; its stdout, or exit with its stderr on failure."""
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        sys.exit(f"build: {' '.join(cmd[:3])}... failed:\n{proc.stderr or proc.stdout}")
    return proc.stdout


def copy_stdlib(python: str, out: str) -> str:
    """Copy ``python``'s standard library into ``out/lib``; return its directory name."""
    code = "import sysconfig; print(sysconfig.get_paths()['stdlib'])"
    stdlib = run(python, "-I", "-c", code).strip()
    name = os.path.basename(stdlib)
    ignore = shutil.ignore_patterns(*STDLIB_SKIP, "config-*")
    shutil.copytree(stdlib, os.path.join(out, "lib", name), ignore=ignore, symlinks=False)
    return name


def install_packages(out: str) -> None:
    """pip-install this checkout (not editable) and its dependencies into ``out/site``."""
    site = os.path.join(out, SITE)
    run(
        sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
        "--no-compile", "--no-warn-script-location", "--target", site, REPO,
    )  # fmt: skip
    shutil.rmtree(os.path.join(site, "bin"), ignore_errors=True)


def elf_files(out: str) -> list[str]:
    """Every ELF file under ``out`` (the interpreter, extension modules, bundled libs)."""
    found = []
    for top, _dirs, files in os.walk(out):
        for name in files:
            path = os.path.join(top, name)
            if os.path.islink(path):
                continue
            with open(path, "rb") as fh:
                if fh.read(4) == b"\x7fELF":
                    found.append(path)
    return found


def library_path(name: str) -> str:
    """Where this machine's loader finds library ``name``."""
    for line in run("/sbin/ldconfig", "-p").splitlines():
        parts = line.strip().split(" => ")
        if len(parts) == 2 and parts[0].split()[0] == name and "x86-64" in parts[0]:
            return parts[1]
    sys.exit(f"build: library {name} not found by ldconfig -p")


def bundle_libraries(out: str) -> str:
    """Copy every shared library the ELF files need into ``out/lib``; return the loader's
    file name. Run to a fixed point: copied libraries may need others."""
    libdir = os.path.join(out, "lib")
    loader = None
    extra = {name: library_path(name) for name in DLOPENED}
    done: set[str] = set()
    while True:
        todo = [f for f in elf_files(out) if f not in done]
        if not todo and not extra:
            break
        wanted = dict(extra)
        extra = {}
        for path in todo:
            done.add(path)
            for line in run("ldd", path).splitlines():
                match = LDD_LINE.match(line)
                if not match:
                    continue
                if match.group(3):
                    loader = loader or os.path.basename(match.group(3))
                    wanted[loader] = match.group(3)
                elif not os.path.realpath(match.group(2)).startswith(out + os.sep):
                    wanted[match.group(1)] = match.group(2)
        for name, src in wanted.items():
            dst = os.path.join(libdir, name)
            if not os.path.exists(dst):
                shutil.copy2(os.path.realpath(src), dst)
                os.chmod(dst, 0o755)
    if loader is None:
        sys.exit("build: the interpreter has no dynamic loader (a static build?)")
    return loader


def check_search_paths(out: str) -> None:
    """Refuse a bundle whose libraries search absolute paths outside it (an interpreter
    built into a home directory, such as pyenv's, bakes its build paths in)."""
    for path in elf_files(out):
        for entry in run("patchelf", "--print-rpath", path).strip().split(":"):
            if entry.startswith("/") and not entry.startswith(out + os.sep):
                sys.exit(
                    f"build: {os.path.relpath(path, out)} searches {entry} for libraries; "
                    "bundle a system interpreter (--python /usr/bin/python3)"
                )


def build(out: str, prefix: str, python: str) -> None:
    """Build the bundle into ``out`` (replaced whole) naming ``prefix``."""
    python = os.path.realpath(python)
    out = os.path.abspath(out)
    work = f"{out}.building"
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.join(work, "bin"))
    os.makedirs(os.path.join(work, "lib"))
    interpreter = os.path.join(work, INTERPRETER)
    shutil.copy2(python, interpreter)
    stdlib = copy_stdlib(python, work)
    install_packages(work)
    loader = bundle_libraries(work)
    check_search_paths(work)
    # the compiled nvshim-runtime front, static (no library to bundle): every install
    # from this bundle writes it (nvshim.runtime.frontbin), the sh front otherwise
    try:
        frontbin.build(os.path.join(work, SITE, "nvshim", "runtime", "_front"))
    except (RuntimeError, ValueError) as err:
        sys.exit(f"build: {err}")
    run("patchelf", "--set-interpreter", INTERP_SLOT, "--force-rpath",
        "--set-rpath", RPATH_SLOT, interpreter)  # fmt: skip
    # Hash-checked-never .pyc: the tree is read-only once installed, and mtimes change
    # in packages and copies.
    mode = py_compile.PycInvalidationMode.UNCHECKED_HASH
    for tree in (os.path.join(work, "lib", stdlib), os.path.join(work, SITE)):
        if not compileall.compile_dir(tree, quiet=2, workers=0, invalidation_mode=mode):
            sys.exit(f"build: byte-compiling {tree} failed")
    marker = {
        "version": __version__,
        "python": stdlib,
        "loader": loader,
        "prefix": prefix,
        "build": tree_digest(work)[:16],
        "rpath_slot": list(rpath_slot(interpreter)),
    }
    with open(os.path.join(work, MARKER), "w", encoding="utf-8") as fh:
        json.dump(marker, fh, indent=2, sort_keys=True)
        fh.write("\n")
    relocate(work, prefix)
    write_unplaced_launcher(work)  # bin/nvshim runs from wherever the bundle is
    shutil.rmtree(out, ignore_errors=True)
    os.rename(work, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="directory to build the bundle in (replaced)")
    parser.add_argument("--prefix", default="/usr/local/nvshim", help="final host path")
    parser.add_argument("--python", default=sys.executable, help="interpreter to bundle")
    args = parser.parse_args()
    build(args.out, args.prefix, args.python)
    print(args.out)


if __name__ == "__main__":
    main()
