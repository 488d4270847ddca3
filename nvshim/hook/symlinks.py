"""``create-symlinks``: SONAME and ``libcuda.so`` links inside the container root.

As NVIDIA's hook: an identical link is left as it is, anything else at LINK (another
link, a file) is replaced atomically (a new link under a temporary name, renamed over
it in the parent's fd); a directory there is an error.
"""

from __future__ import annotations

from nvshim.errors import NvshimError
from nvshim.rootfs.fsroot import RootFS, RootPathError, normalize


def parse_link(spec: str) -> tuple[str, str]:
    """``TARGET::LINK`` as (target, normalized link path)."""
    target, sep, link = spec.partition("::")
    if not sep or not target or "\0" in target or len(target) > 4096:
        raise NvshimError(f"--link {spec!r}: expected TARGET::LINK")
    try:
        return target, normalize(link)
    except RootPathError as err:
        raise NvshimError(f"--link {spec!r}: {err}") from None


def create_symlinks(root: RootFS, specs: list[str]) -> dict[str, str]:
    """Create each ``TARGET::LINK`` (missing parents made); identical links are fine and
    other files already at LINK are replaced. Returns log fields."""
    links = [parse_link(s) for s in specs]
    outcome: dict[str, list[str]] = {"created": [], "exists": [], "replaced": []}
    opened: dict[str, int] = {}  # the links' directories, each opened once
    try:
        for target, link in links:
            try:
                kind = root.symlink(target, link, opened)
                if kind == "kept":
                    root.replace_symlink(target, link)
                    kind = "replaced"
                outcome[kind].append(link)
            except (OSError, RootPathError) as err:
                raise NvshimError(f"--link {target}::{link}: {_reason(err)}") from None
    finally:
        root.close_opened(opened)
    fields = {"links_created": len(outcome["created"]), "links_existing": len(outcome["exists"])}
    if outcome["replaced"]:
        fields["links_replaced"] = ",".join(outcome["replaced"])
    return fields


def _reason(err: Exception) -> str:
    return err.strerror if isinstance(err, OSError) and err.strerror else str(err)
