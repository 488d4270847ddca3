"""The ``CUDA_VISIBLE_DEVICES`` a GPU container gets.

Inside the container only the injected devices exist, renumbered from 0, so the safe
default is their UUIDs. A value the user set is kept when every entry names an injected
device: a container index, or a full or uniquely-prefixed ``GPU-``/``MIG-`` UUID (as CUDA
accepts). The empty string (hide every GPU) is kept too. Anything else is replaced.
"""

from __future__ import annotations

MAX_VALUE = 4096


def _show(text: str, limit: int = 64) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _match(entry: str, injected: list[str]) -> int | str:
    """The position of the injected device ``entry`` names, or why it names none."""
    count = len(injected)
    if entry.isascii() and entry.isdigit():
        if int(entry) < count:
            return int(entry)
        return f"index {entry} is out of range (the container has {count} device(s))"
    if entry[:4] in ("GPU-", "MIG-") and len(entry) > 4:
        wanted = entry.lower()
        lowered = [u.lower() for u in injected]
        if wanted in lowered:
            return lowered.index(wanted)
        hits = [i for i, u in enumerate(lowered) if u.startswith(wanted)]
        if len(hits) == 1:
            return hits[0]
        if hits:
            return f"{_show(entry)} is a prefix of several injected devices"
        return f"{_show(entry)} is not an injected device"
    return f"{_show(entry)} is not a device index or GPU-/MIG- UUID"


def cuda_visible_devices(
    user_value: str | None, injected_uuids: list[str]
) -> tuple[str, str | None]:
    """``(value to set, reason the user's value was replaced or None)``."""
    default = ",".join(injected_uuids)
    if user_value is None or user_value == "":
        return (default if user_value is None else ""), None
    why: str | None = None
    if len(user_value) > MAX_VALUE:
        why = f"longer than {MAX_VALUE} characters"
    elif not user_value.isprintable():
        why = "contains control characters"
    else:
        seen: set[int] = set()
        for raw in user_value.split(","):
            entry = raw.strip()
            found = _match(entry, injected_uuids) if entry else "empty entry"
            if isinstance(found, str):
                why = found
                break
            if found in seen:
                why = f"{_show(entry)} names device {found} a second time"
                break
            seen.add(found)
    if why is None:
        return user_value, None
    return default, f"CUDA_VISIBLE_DEVICES={_show(user_value)} replaced: {why}"
