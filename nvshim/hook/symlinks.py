"""``create-symlinks``: SONAME and ``libcuda.so`` links inside the container root."""

from __future__ import annotations

from nvshim.errors import NvshimError
from nvshim.hook.fsroot import RootFS, RootPathError, normalize


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
    other files already at LINK are left alone. Returns log fields."""
    links = [parse_link(s) for s in specs]
    outcome: dict[str, list[str]] = {"created": [], "exists": [], "kept": []}
    for target, link in links:
        try:
            outcome[root.symlink(target, link)].append(link)
        except (OSError, RootPathError) as err:
            raise NvshimError(f"--link {target}::{link}: {_reason(err)}") from None
    fields = {"links_created": len(outcome["created"]), "links_existing": len(outcome["exists"])}
    if outcome["kept"]:
        fields["links_kept_other_file"] = ",".join(outcome["kept"])
    return fields


def _reason(err: Exception) -> str:
    return err.strerror if isinstance(err, OSError) and err.strerror else str(err)
