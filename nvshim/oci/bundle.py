"""Reading an OCI bundle's ``config.json`` (hostile input: size-limited, type-checked).
Standard library only: the runtime and the hook both use it."""

from __future__ import annotations

import json
import os
from typing import Any

from nvshim.errors import NvshimError

MAX_SPEC_BYTES = 16 << 20


def load_spec(bundle: str) -> dict[str, Any]:
    """The bundle's ``config.json`` as an object; NvshimError (one line) when unusable."""
    path = os.path.join(bundle, "config.json")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as err:
        raise NvshimError(f"{path}: cannot read: {err.strerror}") from None
    with os.fdopen(fd, "rb") as fh:
        raw = fh.read(MAX_SPEC_BYTES + 1)
    if len(raw) > MAX_SPEC_BYTES:
        raise NvshimError(f"{path}: larger than {MAX_SPEC_BYTES} bytes")
    try:
        spec = json.loads(raw)
    except ValueError as err:
        raise NvshimError(f"{path}: invalid JSON: {err}") from None
    if not isinstance(spec, dict):
        raise NvshimError(f"{path}: not a JSON object")
    return spec
