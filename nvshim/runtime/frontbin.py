"""The compiled ``nvshim-runtime`` front (``front.c``): built once per architecture where
nvshim is packaged, filled in at install.

The sh front (``nvshim.runtime.front``) costs a shell and, on a GPU create, a ``grep``, an
``ls`` and a ``sleep``: together more than runc's own work for the GPU. ``front.c`` makes
the same decisions with none of them (``docs/architecture.md``). It is a static binary
with no paths of its own: ``fill`` writes the fields of ``front.front_fields`` into its
payload area, so one build serves every install.

Where it is built (``build``): by ``tests/setup.sh`` into this package's ``_front``
directory, by the host bundle's build (``packaging/bundle/build.py``) into the bundle,
so the Debian package and the node image carry it. Nothing is compiled on a node: an
nvshim without a build for its machine writes the sh front, which decides the same.

    python3 -m nvshim.runtime.frontbin build [DIR]
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "front.c")
# x86_64: front.c linked with its own C library (frontrt.c: start-up, system calls, strings)
# instead of glibc, whose static start-up costs ~0.2 ms of CPU a call on a VM
RUNTIME = os.path.join(os.path.dirname(SOURCE), "frontrt.c")
BUILD_DIR = os.path.join(os.path.dirname(SOURCE), "_front")
# hardened as Debian builds its binaries (static-pie: still randomized), warnings fatal
CFLAGS = (
    "-O2", "-static-pie", "-fPIE", "-D_FORTIFY_SOURCE=2", "-fstack-protector-strong",
    "-Wl,-z,relro,-z,now", "-Wall", "-Wextra", "-Werror", "-fno-strict-aliasing",
)  # fmt: skip
# with frontrt.c: no C library, and no call the compiler would make to one in its place
# (a loop in memset turned into a call to memset, malloc and memset into calloc)
OWN_LIBC_FLAGS = ("-nostdlib", "-fno-builtin", "-fno-tree-loop-distribute-patterns")
OWN_LIBC_MACHINES = ("x86_64",)
PAYLOAD_SIZE = 65536
UNSET = b"nvshim-front-payload:unset"
HEAD = b"nvshim-front-payload:1"


def _command() -> tuple[list[str], list[str], list[str]]:
    """The compiler's flags, the sources and the libraries (after the sources) for this
    machine."""
    if platform.machine() in OWN_LIBC_MACHINES:
        return [*CFLAGS, *OWN_LIBC_FLAGS], [SOURCE, RUNTIME], ["-lgcc"]
    return list(CFLAGS), [SOURCE], []


def _digest() -> str:
    flags, sources, libraries = _command()
    digest = hashlib.sha256("\0".join([*flags, *libraries]).encode())
    for source in sources:
        with open(source, "rb") as fh:
            digest.update(b"\0" + fh.read())
    return digest.hexdigest()[:16]


def binary_name() -> str:
    """The build's file name: this source, these flags, this machine."""
    return f"front-{_digest()}-{platform.machine()}"


def built(build_dir: str = BUILD_DIR) -> str | None:
    """The build for this source and machine, if there is one."""
    path = os.path.join(build_dir, binary_name())
    return path if os.path.isfile(path) else None


def build(build_dir: str = BUILD_DIR, compiler: str | None = None) -> str:
    """Compile ``front.c`` into ``build_dir`` (kept when already there); its path.
    Raises RuntimeError when no C compiler or static C library is at hand."""
    out = os.path.join(build_dir, binary_name())
    if os.path.isfile(out):
        return out
    cc = compiler or os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise RuntimeError("no C compiler (cc) to build the nvshim-runtime front")
    os.makedirs(build_dir, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=build_dir, prefix=".build-")
    os.close(fd)
    try:
        flags, sources, libraries = _command()
        argv = [cc, *flags, "-o", tmp, *sources, *libraries]
        proc = subprocess.run(argv, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{cc} could not build {SOURCE}: {proc.stderr.strip()}")
        check_payload_area(_read(tmp))
        os.chmod(tmp, 0o755)
        os.rename(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    for name in os.listdir(build_dir):  # builds of an earlier source for this machine
        if (
            name.startswith("front-")
            and name.endswith(f"-{platform.machine()}")
            and name != os.path.basename(out)
        ):
            os.unlink(os.path.join(build_dir, name))
    return out


def _read(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def check_payload_area(binary: bytes) -> int:
    """The offset of the (unfilled) payload area; ValueError unless there is exactly one."""
    at = binary.find(UNSET)
    if at < 0 or binary.find(UNSET, at + 1) >= 0:
        raise ValueError("the front has not exactly one payload area")
    area = binary[at : at + PAYLOAD_SIZE]
    if len(area) != PAYLOAD_SIZE or area[len(UNSET) :].strip(b"\0"):
        raise ValueError("the front's payload area is not empty")
    return at


def payload(fields: dict[str, str]) -> bytes:
    """The payload area's bytes for ``fields`` (the head, ``key=value`` strings, NULs)."""
    parts = [HEAD]
    for key, value in fields.items():
        item = f"{key}={value}".encode(errors="surrogateescape")
        if b"\0" in item or "=" in key:
            raise ValueError(f"front field {key!r} cannot be written")
        parts.append(item)
    data = b"\0".join(parts) + b"\0\0"
    if len(data) > PAYLOAD_SIZE:
        raise ValueError(f"the front's fields take {len(data)} bytes, more than {PAYLOAD_SIZE}")
    return data.ljust(PAYLOAD_SIZE, b"\0")


def fill(binary: bytes, fields: dict[str, str]) -> bytes:
    """``binary`` (a build) with ``fields`` in its payload area."""
    at = check_payload_area(binary)
    return binary[:at] + payload(fields) + binary[at + PAYLOAD_SIZE :]


def fields_of(data: bytes) -> dict[str, str] | None:
    """The fields of an installed compiled front (``data``: the file's bytes); None for
    any other file (the sh front, a build never filled)."""
    if data[:4] != b"\x7fELF":
        return None
    at = data.find(HEAD + b"\0")
    while at >= 0:  # the C code's own copy of the head is followed by no fields
        area = data[at : at + PAYLOAD_SIZE]
        items = area[len(HEAD) + 1 : area.find(b"\0\0", len(HEAD))].split(b"\0")
        if items and all(b"=" in item for item in items):
            text = [item.decode(errors="surrogateescape") for item in items]
            return dict(item.split("=", 1) for item in text)
        at = data.find(HEAD + b"\0", at + 1)
    return None


def compiled_front(fields: dict[str, str], build_dir: str = BUILD_DIR) -> bytes | None:
    """The compiled front for ``fields``, or None when this machine has no build."""
    path = built(build_dir)
    return fill(_read(path), fields) if path else None


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "build" or len(argv) > 2:
        print("usage: python3 -m nvshim.runtime.frontbin build [DIR]", file=sys.stderr)
        return 2
    try:
        print(build(argv[1] if len(argv) > 1 else BUILD_DIR))
    except (RuntimeError, ValueError, OSError) as err:
        print(f"nvshim: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
