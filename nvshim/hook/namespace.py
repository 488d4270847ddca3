"""Running work inside a container's mount namespace.

A ``createContainer`` hook already runs there (runc runs it inside the container's
namespaces before ``pivot_root``, so the rootfs sits at its host path with the
container's mounts on it, and ``/proc`` is still the host's); a ``prestart`` hook runs
in the host's. ``in_mount_ns``
runs a function in the container's namespace either way: directly, or in a forked child
that calls ``setns`` first and sends its JSON result back through a pipe.
"""

from __future__ import annotations

import os
import sys

from nvshim import fastjson
from nvshim.errors import NvshimError
from nvshim.hook import kernel

TYPE_CHECKING = False  # typing costs ~5 ms at import, per container
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

_MAX_REPLY = 1 << 20


def _ns_path(pid: int) -> str:
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        raise NvshimError(f"OCI state: pid must be a positive integer, got {pid!r}")
    return f"/proc/{pid}/ns/mnt"


def same_mount_ns(pid: int) -> bool:
    """True when this process already shares ``pid``'s mount namespace.

    A ``createContainer`` hook is a child of the container's init and gets the state
    ``pid`` as seen in the container's pid namespace (``1``): its parent is then that
    process, whose mount namespace it shares. Otherwise the namespaces are compared.
    """
    _ns_path(pid)
    if os.getppid() == pid:
        return True
    try:
        theirs = os.stat(_ns_path(pid))
    except OSError as err:
        raise NvshimError(f"/proc/{pid}/ns/mnt: cannot read: {err.strerror}") from None
    mine = os.stat("/proc/self/ns/mnt")
    return (theirs.st_dev, theirs.st_ino) == (mine.st_dev, mine.st_ino)


def in_mount_ns(pid: int, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` run in ``pid``'s mount namespace; its result must be JSON data.

    NvshimError raised by ``fn`` comes back as NvshimError with the same message; any
    other failure becomes one NvshimError line naming the exception.
    """
    if same_mount_ns(pid):
        return fn(*args)
    ns_fd = os.open(_ns_path(pid), os.O_RDONLY | os.O_CLOEXEC)
    kernel.host_proc()  # opened now: inside, /proc is the container's
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child, checked through its reply
        code = 1
        try:
            os.close(read_end)
            try:
                kernel.setns(ns_fd, kernel.CLONE_NEWNS)
                os.chdir("/")
                payload = fastjson.dumps({"result": fn(*args)})
            except NvshimError as err:
                payload = fastjson.dumps({"error": str(err)})
            except BaseException as err:  # noqa: BLE001 - one line for the parent
                payload = fastjson.dumps({"error": f"{type(err).__name__}: {err}"})
            os.write(write_end, payload.encode()[:_MAX_REPLY])
            code = 0
        finally:
            os._exit(code)  # never return into the caller's code in the child
    os.close(ns_fd)
    os.close(write_end)
    chunks = []
    try:
        while chunk := os.read(read_end, 65536):
            chunks.append(chunk)
    finally:
        os.close(read_end)
        _, status = os.waitpid(child, 0)
    try:
        reply = fastjson.loads(b"".join(chunks) or b"null")
    except ValueError:
        reply = None
    if not isinstance(reply, dict):
        raise NvshimError(f"worker in the container's mount namespace failed (status {status})")
    if "error" in reply:
        raise NvshimError(str(reply["error"]))
    return reply.get("result")
