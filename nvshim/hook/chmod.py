"""``chmod``: set the mode of paths in the container root (NVIDIA's ``chmod`` hook, for
folders such as ``/dev/dri`` that a spec wants readable).

As NVIDIA's hook: the mode is octal, paths that do not exist are skipped, a path that
already has the mode is left alone, and EPERM (a path on a read-only bind mount of the
host) is ignored. Unlike it, a path is resolved inside the root (a symlink never leads
out of it) and changed through the one descriptor that was checked.
"""

from __future__ import annotations

import errno
import os
import stat

from nvshim.errors import NvshimError
from nvshim.rootfs import kernel
from nvshim.rootfs.fsroot import RootFS, RootPathError, normalize

MODE_BITS = 0o7777


def parse_mode(text: str | None) -> int:
    """``--mode`` as an integer; NvshimError unless it is a non-empty octal mode."""
    text = (text or "").strip()
    if not text:
        raise NvshimError("chmod: a non-empty --mode must be specified")
    try:
        mode = int(text, 8)
    except ValueError:
        raise NvshimError(f"chmod: --mode {text!r} is not an octal mode") from None
    if not 0 <= mode <= MODE_BITS:
        raise NvshimError(f"chmod: --mode {text!r} is out of range")
    return mode


def check_paths(paths: list[str]) -> list[str]:
    """Validated container paths (NvshimError naming the first bad one)."""
    out = []
    for path in paths:
        if not path.strip():
            raise NvshimError("chmod: --path must not be empty")
        try:
            out.append(normalize(path if path.startswith("/") else "/" + path))
        except RootPathError as err:
            raise NvshimError(f"chmod: --path {path!r}: {err}") from None
    return out


def chmod_paths(root: RootFS, paths: list[str], mode: int) -> dict[str, object]:
    """Set ``mode`` on each path inside ``root``. Returns log fields."""
    changed, missing, denied = [], [], []
    proc = kernel.host_proc()
    for path in check_paths(paths):
        try:
            fd = root.open(path, os.O_PATH)
        except (FileNotFoundError, NotADirectoryError):
            missing.append(path)
            continue
        except OSError as err:
            raise NvshimError(f"chmod: {path} in the container root: {err.strerror}") from None
        try:
            if stat.S_IMODE(os.fstat(fd).st_mode) == mode:
                continue
            try:  # the magic link names the inode of this very fd (O_PATH has no fchmod)
                os.chmod(f"self/fd/{fd}", mode, dir_fd=proc)
            except OSError as err:
                if err.errno != errno.EPERM:
                    where = f"chmod: {path} in the container root"
                    raise NvshimError(f"{where}: {err.strerror}") from None
                denied.append(path)
                continue
            changed.append(path)
        finally:
            os.close(fd)
    fields: dict[str, object] = {"chmod": f"{mode:o}", "chmod_changed": len(changed)}
    if missing:
        fields["chmod_missing"] = ",".join(missing)
    if denied:
        fields["chmod_denied"] = ",".join(denied)
    return fields
