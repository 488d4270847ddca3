"""The hook's inputs: the OCI state on stdin and the bundle's ``config.json``.

Both are hostile: reads are size-limited and every field is type-checked, with one
NvshimError line naming the input on anything unusable.
"""

from __future__ import annotations

import os

from nvshim.errors import NvshimError
from nvshim.oci.bundle import (
    load_spec,  # noqa: F401 - re-exported for the hook
    read_json_object,
)
from nvshim.record import record

TYPE_CHECKING = False  # typing costs ~5 ms at import, per container
if TYPE_CHECKING:
    from typing import Any, BinaryIO

MAX_STATE_BYTES = 1 << 20


@record(frozen=True)
class State:
    """The fields of the OCI state the hook uses."""

    id: str
    pid: int
    bundle: str
    annotations: dict[str, str]


def read_state(stream: BinaryIO) -> State:
    """Parse the OCI state JSON a runtime writes to a hook's stdin."""
    data = read_json_object(stream, MAX_STATE_BYTES, "OCI state on stdin")
    cid = data.get("id")
    pid = data.get("pid")
    bundle = data.get("bundle")
    if not isinstance(cid, str) or not cid:
        raise NvshimError(f"OCI state on stdin: id must be a non-empty string, got {cid!r}")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        raise NvshimError(f"OCI state on stdin: pid must be a positive integer, got {pid!r}")
    if not isinstance(bundle, str) or not bundle.startswith("/") or "\0" in bundle:
        raise NvshimError(f"OCI state on stdin: bundle must be an absolute path, got {bundle!r}")
    annotations = data.get("annotations")
    if not isinstance(annotations, dict):
        annotations = {}
    annotations = {k: v for k, v in annotations.items() if isinstance(v, str)}
    return State(cid, pid, bundle, annotations)


def rootfs_path(spec: dict[str, Any], bundle: str) -> str:
    """``root.path`` of the spec as an absolute host path (relative: joined to the bundle)."""
    root = spec.get("root")
    path = root.get("path") if isinstance(root, dict) else None
    if not isinstance(path, str) or not path or "\0" in path:
        raise NvshimError(
            f"{os.path.join(bundle, 'config.json')}: root.path must be a non-empty string,"
            f" got {path!r}"
        )
    return os.path.normpath(os.path.join(bundle, path))


def annotations(spec: dict[str, Any]) -> dict[str, str]:
    """The spec's string annotations (anything else ignored)."""
    value = spec.get("annotations")
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}
