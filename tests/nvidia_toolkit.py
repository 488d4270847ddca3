"""NVIDIA's real Container Toolkit binaries (``../shared/nvidia``, built from source):
unpacked once into the test cache, checked against the archive's SHA256SUMS."""

from __future__ import annotations

import hashlib
import os
import subprocess

from tests.debroot import REPO, cached

SHARED = os.path.normpath(os.path.join(REPO, "..", "shared", "nvidia"))
TOOLKIT = "nvidia-container-toolkit-d34b3046-linux-amd64.tar.xz"


def _sums() -> dict[str, str]:
    with open(os.path.join(SHARED, "SHA256SUMS"), encoding="utf-8") as fh:
        return {name: digest for digest, name in (line.split() for line in fh if line.strip())}


def _sha256(path: str) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def toolkit_binary(name: str) -> str:
    """The path of NVIDIA's ``name`` (``nvidia-cdi-hook``, ``nvidia-ctk``, ...)."""
    sums = _sums()
    archive = os.path.join(SHARED, TOOLKIT)

    def build(path: str) -> None:
        if _sha256(archive) != sums[TOOLKIT]:
            raise RuntimeError(f"{archive}: checksum differs from SHA256SUMS")
        os.makedirs(path)
        subprocess.run(["tar", "-C", path, "-xJf", archive], check=True)

    binary = os.path.join(cached("nvidia-toolkit", [TOOLKIT, sums[TOOLKIT]], build), name)
    if _sha256(binary) != sums[name]:
        raise RuntimeError(f"{binary}: checksum differs from SHA256SUMS")
    return binary
