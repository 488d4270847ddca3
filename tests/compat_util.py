"""CUDA forward-compatibility libraries for test images: real ELF shared objects named
``libcuda.so.<version>`` (SONAME ``libcuda.so.1``), with or without the
``.note.cuda.fwd_compatibility`` note NVIDIA's compat libraries carry."""

from __future__ import annotations

import json
import os

from tests.runc_util import build_stub_library

COMPAT_DIR = "usr/local/cuda/compat"


def note_source(cuda: str, drivers: list[int]) -> str:
    """C source placing the note (owner ``NVIDIA Corporation``, JSON description) in a
    SHT_NOTE section, as ``readelf -n`` shows it in NVIDIA's libraries."""
    desc = json.dumps({"Format": 1, "CUDA Version": cuda, "Driver": drivers, "Device": []})
    asm = "\n".join(
        [
            '.pushsection .note.cuda.fwd_compatibility,"a",@note',
            ".balign 4",
            ".long 2f - 1f",
            ".long 4f - 3f",
            ".long 1",
            '1: .asciz "NVIDIA Corporation"',
            "2: .balign 4",
            '3: .ascii "' + desc.replace("\\", "\\\\").replace('"', '\\"') + '"',
            "4: .balign 4",
            ".popsection",
            "",
        ]
    )
    return "__asm__(" + json.dumps(asm) + ");\n"  # a JSON string is a valid C literal here


def build_compat_library(
    root: str | os.PathLike,
    version: str,
    cuda: str | None = None,
    drivers: list[int] | None = None,
    folder: str = COMPAT_DIR,
) -> str:
    """``<root>/<folder>/libcuda.so.<version>``; with ``cuda`` it carries the note
    (``drivers``: the driver majors it runs on). Returns its path."""
    path = os.path.join(os.fspath(root), folder, f"libcuda.so.{version}")
    body = note_source(cuda, drivers or []) if cuda is not None else ""
    return build_stub_library(path, "libcuda.so.1", "int cuInit(unsigned f) { return 0; }\n" + body)
