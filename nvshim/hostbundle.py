"""The self-contained host bundle: nvshim with its own interpreter, packages and C library.

A bundle is a directory tree that runs on any Linux host of its architecture, whatever
Python and glibc the host has (or lacks)::

    PREFIX/bin/python3            the interpreter; its loader and RPATH name PREFIX/lib
    PREFIX/bin/nvshim, nvshim-runtime, nvshim-hook   isolated launchers naming PREFIX
    PREFIX/lib/                   the dynamic loader, glibc and every shared library needed
    PREFIX/lib/python3.X/         the standard library (byte-compiled)
    PREFIX/site/                  nvshim and its dependencies
    PREFIX/nvshim-bundle.json     this marker: version, prefix, loader name

``packaging/bundle/build.py`` builds one; :func:`relocate` makes a copy name its new
prefix (the loader path inside ``bin/python3`` and the launchers), so a package or image
build can stage the tree anywhere while it names the host path it will run from.
"""

from __future__ import annotations

import json
import os
import struct
import sys

from nvshim.errors import NvshimError

MARKER = "nvshim-bundle.json"
INTERPRETER = "bin/python3"
SITE = "site"
PT_LOAD, PT_DYNAMIC, PT_INTERP = 1, 2, 3
DT_STRTAB, DT_RPATH = 5, 15


def tree_digest(root: str, paths: tuple[str, ...] = ("",), skip: tuple[str, ...] = ()) -> str:
    """A digest of every file's path and bytes under ``paths`` (files or directories,
    relative to ``root``; directory names in ``skip`` left out). A symlink counts by
    its target. The bundle's build id, and the tests' cache key for what goes into it."""
    import hashlib

    digest = hashlib.sha256()
    for rel in paths:
        full = os.path.join(root, rel)
        walk = [(os.path.dirname(full), [], [os.path.basename(full)])]
        if os.path.isdir(full):
            walk = os.walk(full)
        for top, dirs, files in walk:
            dirs[:] = sorted(d for d in dirs if d not in skip)
            for name in sorted(files):
                path = os.path.join(top, name)
                digest.update(os.path.relpath(path, root).encode() + b"\0")
                if os.path.islink(path):
                    digest.update(os.readlink(path).encode() + b"\0")
                    continue
                with open(path, "rb") as fh:
                    digest.update(hashlib.sha256(fh.read()).digest())
    return digest.hexdigest()


def bundle_root(prefix: str | None = None) -> str | None:
    """The bundle this interpreter runs from (or the one at ``prefix``), else None."""
    root = prefix if prefix is not None else sys.prefix
    return root if os.path.isfile(os.path.join(root, MARKER)) else None


def read_marker(root: str) -> dict:
    """The bundle's marker record (``version``, ``prefix``, ``loader``, ``python``,
    ``build``, ``rpath_slot``)."""
    with open(os.path.join(root, MARKER), encoding="utf-8") as fh:
        return json.load(fh)


def _program_headers(fh) -> list[tuple[int, int, int, int]]:
    """``(type, offset, vaddr, filesz)`` of each program header of an ELF64 LE file."""
    head = fh.read(64)
    if head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
        raise ValueError(f"{fh.name}: not an ELF64 little-endian file")
    phoff = struct.unpack_from("<Q", head, 0x20)[0]
    phentsize, phnum = struct.unpack_from("<HH", head, 0x36)
    fh.seek(phoff)
    table = fh.read(phentsize * phnum)
    headers = []
    for i in range(phnum):
        p_type, _flags, offset, vaddr, _paddr, filesz = struct.unpack_from(
            "<IIQQQQ", table, i * phentsize
        )
        headers.append((p_type, offset, vaddr, filesz))
    return headers


def interp_slot(elf_path: str) -> tuple[int, int]:
    """``(offset, size)`` of the PT_INTERP string (with its NUL) in an ELF64 executable."""
    with open(elf_path, "rb") as fh:
        for p_type, offset, _vaddr, filesz in _program_headers(fh):
            if p_type == PT_INTERP:
                return offset, filesz
    raise ValueError(f"{elf_path}: no program interpreter (PT_INTERP)")


def rpath_slot(elf_path: str) -> tuple[int, int]:
    """``(offset, size)`` of the DT_RPATH string (with its NUL) in an ELF64 executable."""
    with open(elf_path, "rb") as fh:
        headers = _program_headers(fh)
        dynamic = [(off, size) for kind, off, _v, size in headers if kind == PT_DYNAMIC]
        if not dynamic:
            raise ValueError(f"{elf_path}: not dynamically linked")
        fh.seek(dynamic[0][0])
        raw = fh.read(dynamic[0][1])
        tags = {}
        for i in range(0, len(raw) - 15, 16):
            tag, value = struct.unpack_from("<qQ", raw, i)
            if tag == 0:
                break
            tags.setdefault(tag, value)
        if DT_RPATH not in tags:
            raise ValueError(f"{elf_path}: no DT_RPATH")
        address = tags[DT_STRTAB] + tags[DT_RPATH]
        for kind, offset, vaddr, size in headers:
            if kind == PT_LOAD and vaddr <= address < vaddr + size:
                start = address - vaddr + offset
                fh.seek(start)
                text = fh.read(4096)
                return start, text.index(b"\0") + 1
    raise ValueError(f"{elf_path}: DT_RPATH outside every loaded segment")


def _check_fits(elf_path: str, slot: tuple[int, int], value: str, what: str) -> bytes:
    data = value.encode()
    if b"\0" in data or len(data) + 1 > slot[1]:
        raise NvshimError(
            f"{value}: {what} longer than the {slot[1] - 1} bytes {elf_path} reserves"
        )
    return data


def _fill(elf_path: str, slot: tuple[int, int], value: str, what: str) -> None:
    """Write ``value`` NUL-padded into ``slot`` of ``elf_path``, in place."""
    offset, size = slot
    data = _check_fits(elf_path, slot, value, what)
    fd = os.open(elf_path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.pwrite(fd, data.ljust(size, b"\0"), offset)
        os.fsync(fd)
    finally:
        os.close(fd)


def set_paths(elf_path: str, rpath: tuple[int, int], interpreter: str, libdir: str) -> None:
    """Point ``elf_path``'s loader (PT_INTERP) and library path (DT_RPATH, whose slot
    the builder measured: a shorter path written once hides the slot's true size) at
    absolute paths, in place. The builder reserves long slots, so any prefix up to their
    size fits; absolute paths need no ``/proc`` (``$ORIGIN`` does), so chroots work too."""
    _fill(elf_path, interp_slot(elf_path), interpreter, "loader path")
    _fill(elf_path, rpath, libdir, "library path")


def _final_paths(root: str, prefix: str) -> tuple[str, tuple[int, int], str, str]:
    """``(interpreter file, rpath slot, loader path, library dir)`` for ``prefix``,
    checked to fit the interpreter's slots (an error names the prefix)."""
    if not os.path.isabs(prefix):
        raise NvshimError(f"{prefix}: the bundle prefix must be an absolute path")
    prefix = os.path.normpath(prefix)
    marker = read_marker(root)
    elf = os.path.join(root, INTERPRETER)
    libdir = os.path.join(prefix, "lib")
    loader = os.path.join(libdir, marker["loader"])
    rpath = (marker["rpath_slot"][0], marker["rpath_slot"][1])
    _check_fits(elf, interp_slot(elf), loader, "loader path")
    _check_fits(elf, rpath, libdir, "library path")
    return elf, rpath, loader, libdir


def check_prefix(root: str, prefix: str) -> None:
    """Raise NvshimError unless the bundle at ``root`` can be relocated to ``prefix``."""
    _final_paths(root, prefix)


def write_unplaced_launcher(root: str) -> str:
    """Make ``root/bin/nvshim`` an sh launcher that finds the bundle from its own path and
    starts the interpreter through the bundle's own loader, so a bundle that is not
    installed yet runs from wherever it was built or unpacked (``nvshim install`` then
    writes launchers naming the final prefix). Isolated (``-I -S``) as every launcher."""
    import shlex

    from nvshim.fsutil import atomic_write
    from nvshim.launch import CLI_LAUNCHER, python_code

    (module,) = CLI_LAUNCHER.values()
    code = python_code(module, [SITE], argv0=True, under_prefix=True)
    loader = read_marker(root)["loader"]
    text = (
        "#!/bin/sh\n"
        "# nvshim's host bundle, not installed yet: runs from wherever it is; `nvshim install`\n"
        "# places it and writes launchers that name the final prefix.\n"
        'self=$(readlink -f -- "$0") || exit 127\n'
        "root=${self%/bin/*}\n"
        f'exec "$root/lib/{loader}" --library-path "$root/lib" "$root/{INTERPRETER}" -I -S \\\n'
        f'    -c {shlex.quote(code)} "$0" "$@"\n'
    )
    path = os.path.join(root, "bin", "nvshim")
    atomic_write(path, text.encode(), mode=0o755)
    return path


def relocate(root: str, prefix: str) -> list[str]:
    """Make the bundle tree at ``root`` run from ``prefix`` (its final host path).

    Rewrites the interpreter's loader path, the launchers and the marker; ``root`` may be
    a staging directory (``DESTDIR/prefix``) that never exists on the host. Returns the
    launcher paths written.
    """
    from nvshim.fsutil import atomic_write
    from nvshim.launch import write_launchers

    if not os.path.isabs(prefix):
        raise ValueError(f"{prefix}: the bundle prefix must be an absolute path")
    prefix = os.path.normpath(prefix)
    marker = read_marker(root)
    libdir = os.path.join(prefix, "lib")
    rpath = tuple(marker["rpath_slot"])
    set_paths(
        os.path.join(root, INTERPRETER), rpath, os.path.join(libdir, marker["loader"]), libdir
    )
    launchers = write_launchers(
        os.path.join(root, "bin"),
        interpreter=os.path.join(prefix, INTERPRETER),
        roots=[os.path.join(prefix, SITE)],
        cli=True,
    )
    marker["prefix"] = prefix
    text = json.dumps(marker, indent=2, sort_keys=True) + "\n"
    atomic_write(os.path.join(root, MARKER), text.encode(), mode=0o644)
    return launchers
