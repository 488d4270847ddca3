"""Reading an OCI bundle's ``config.json`` (hostile input: size-limited, type-checked).
Standard library only: the runtime and the hook both use it."""

from __future__ import annotations

import os

from nvshim import fastjson
from nvshim.errors import NvshimError

TYPE_CHECKING = False  # typing costs ~5 ms at import, per container
if TYPE_CHECKING:
    from typing import Any

MAX_SPEC_BYTES = 16 << 20


def read_json_object(stream, limit: int, what: str) -> dict[str, Any]:
    """A JSON object read from ``stream`` (at most ``limit`` bytes); NvshimError naming
    ``what`` when it is too large, not JSON, or not an object."""
    raw = stream.read(limit + 1)
    if len(raw) > limit:
        raise NvshimError(f"{what}: larger than {limit} bytes")
    try:
        data = fastjson.loads(raw)
    except (ValueError, RecursionError) as err:  # nested deeper than Python's stack
        raise NvshimError(f"{what}: invalid JSON: {err}") from None
    if not isinstance(data, dict):
        raise NvshimError(f"{what}: not a JSON object")
    return data


def load_spec(bundle: str) -> dict[str, Any]:
    """The bundle's ``config.json`` as an object; NvshimError (one line) when unusable."""
    path = os.path.join(bundle, "config.json")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as err:
        raise NvshimError(f"{path}: cannot read: {err.strerror}") from None
    try:
        with os.fdopen(fd, "rb") as fh:
            return read_json_object(fh, MAX_SPEC_BYTES, path)
    except OSError as err:  # a directory, a file the kernel will not read
        raise NvshimError(f"{path}: cannot read: {err.strerror}") from None
