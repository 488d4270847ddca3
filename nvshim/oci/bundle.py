"""Reading an OCI bundle's ``config.json`` (hostile input: size-limited, type-checked).
Standard library only: the runtime and the hook both use it."""

from __future__ import annotations

import os

from nvshim import fastjson
from nvshim.edits import HOOK_NAMES
from nvshim.errors import NvshimError

TYPE_CHECKING = False  # typing costs ~5 ms at import, per container
if TYPE_CHECKING:
    from typing import Any

MAX_SPEC_BYTES = 16 << 20

# the objects of config.json nvshim edits (dotted path from the top; "" the top itself)
# and their fields: one spelt in another case is what runc reads instead
EDITED_FIELDS: dict[str, tuple[str, ...]] = {
    "": ("process", "linux", "mounts", "hooks", "annotations"),
    "process": ("env", "user"),
    "process.user": ("additionalGids",),
    "linux": ("devices", "resources"),
    "linux.resources": ("devices",),
    "hooks": HOOK_NAMES,
}


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


def check_field_case(obj: dict[str, Any], fields: tuple[str, ...], what: str, where: str) -> None:
    """NvshimError naming ``what`` when ``obj`` (the object at dotted path ``where``)
    holds one of ``fields`` spelt otherwise (``Env``, ``PROCESS``). Go's decoder, runc's,
    matches field names case-insensitively and the last one wins: runc would read that
    one and not the field nvshim edits (casefold covers Go's K and ſ folds too)."""
    wanted = {name.casefold(): name for name in fields}
    for key in obj:
        name = wanted.get(key.casefold())
        if name is not None and key != name:
            field = f"{where}.{name}" if where else name
            raise NvshimError(f"{what}: {key!r} is the {field} field spelt in another case")


def check_edited_fields(spec: dict[str, Any], what: str) -> None:
    """:func:`check_field_case` on each object of ``spec`` that nvshim edits."""
    for where, fields in EDITED_FIELDS.items():
        obj: Any = spec
        for part in where.split(".") if where else ():
            obj = obj.get(part) if isinstance(obj, dict) else None
        if isinstance(obj, dict):
            check_field_case(obj, fields, what, where)


def load_spec(bundle: str) -> dict[str, Any]:
    """The bundle's ``config.json`` as an object; NvshimError (one line) when unusable,
    or when a field nvshim edits is spelt in another case (:func:`check_edited_fields`)."""
    path = os.path.join(bundle, "config.json")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as err:
        raise NvshimError(f"{path}: cannot read: {err.strerror}") from None
    try:
        with os.fdopen(fd, "rb") as fh:
            spec = read_json_object(fh, MAX_SPEC_BYTES, path)
    except OSError as err:  # a directory, a file the kernel will not read
        raise NvshimError(f"{path}: cannot read: {err.strerror}") from None
    check_edited_fields(spec, path)
    return spec
