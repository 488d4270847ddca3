"""``create`` with the finishing steps done by nvshim-runtime itself.

For ``create`` the steps a ``createContainer`` hook would run (symlinks, ld cache,
params) are kept out of ``config.json``: the runtime has runc create the container,
then runs them in the container's mount namespace (``nvshim.hook.steps``: the hook's
code, with the same fd-based safety) before it returns, while the container's process
waits for ``start``; a read-only root is made writable for them and read-only again
before the create returns (``nvshim.rootfs.rwroot``). One interpreter per GPU create
instead of two. The driver's binds go the same way (``nvshim.runtime.create.split_mounts``):
cloned on the host while runc works, attached before the steps run, with the attributes
runc would have given them; runc's own handling of a bind costs three times as much.
A failed step or bind deletes the container and fails the create, as a failed hook
would. ``run`` keeps the hook and the binds in the spec: it starts the process at once.
"""

from __future__ import annotations

import os

from nvshim.defaults import fault_point
from nvshim.errors import NvshimError, one_line
from nvshim.runtime.lowlevel import spawn, spawn_quiet

TYPE_CHECKING = False  # typing costs ~5 ms at import, per container
if TYPE_CHECKING:
    from nvshim.runtime.args import RuncArgs
    from nvshim.runtime.create import Prepared
    from nvshim.runtime.lowlevel import LowLevel

TOOL = "nvshim-runtime"
MAX_STATE_BYTES = 1 << 20


def container_pid(runtime: str, args: RuncArgs, argv: list[str]) -> int:
    """The created container's init pid: from ``--pid-file`` (every engine passes one,
    runc has written it), else from ``runc state``."""
    pid_file = args.value("pid-file")
    if pid_file:
        try:
            with open(pid_file, "rb") as fh:
                text = fh.read(64).decode("ascii", "replace").strip()
        except OSError as err:
            raise NvshimError(f"{pid_file}: cannot read the pid file: {err.strerror}") from None
        what = pid_file
    else:
        read_end, write_end = os.pipe()
        try:
            status = spawn(
                runtime, [*argv[: args.command_index], "state", args.container_id], stdout=write_end
            )
        finally:
            os.close(write_end)
        with os.fdopen(read_end, "rb") as fh:
            raw = fh.read(MAX_STATE_BYTES)
        if status != 0:
            raise NvshimError(f"{runtime} state {args.container_id}: exit status {status}")
        from nvshim import fastjson

        try:
            state = fastjson.loads(raw)
        except ValueError:
            state = None
        text = str(state.get("pid")) if isinstance(state, dict) else ""
        what = f"{runtime} state"
    if not text.isdigit() or int(text) <= 0:
        raise NvshimError(f"{what}: not a container pid: {text[:20]!r}")
    return int(text)


def delete_argv(argv: list[str], args: RuncArgs) -> list[str]:
    """The low-level runtime's argv that deletes the container ``argv`` creates."""
    return [*argv[: args.command_index], "delete", "--force", args.container_id]


def create_and_finish(
    runtime: str, argv: list[str], args: RuncArgs, prepared: Prepared, lowlevel: LowLevel
) -> int:
    """``runtime create`` through ``lowlevel``, then the deferred finishing steps; returns
    the exit status. A failed step deletes the container and raises NvshimError (logged)."""
    delete = delete_argv(argv, args)
    lowlevel.start(runtime, argv, delete)
    from nvshim.hook.apply import attach_mounts, close_mounts, plan_mounts
    from nvshim.hook.steps import Context, prepare_steps, run_steps
    from nvshim.rootfs.bind import runc_attrs

    ctx = Context(prepared.config)
    status, planned = 0, []
    try:
        early = None
        try:  # the host halves, clones and imports while runc works: off the wall clock
            prepare_steps(prepared.steps, ctx)
            planned = plan_mounts(prepared.mounts, runc_attrs)
        except Exception as err:  # noqa: BLE001 - raised once runc is done
            early = err
        status = lowlevel.wait()
        if status > 128:  # killed: it said nothing, and may have created the container
            raise NvshimError(f"{runtime} was killed by signal {status - 128}")
        if status != 0:
            return status  # runc said why; nothing was created
        if early is not None:
            raise early
        pid = container_pid(runtime, args, argv)
        fault_point("finish")

        def attach(root) -> dict:  # the binds first: the steps link and cache their files
            return {"mounts": attach_mounts(root, planned)}

        run_steps(pid, prepared.rootfs, prepared.steps, ctx, attach, pivoted=True)
    except Exception as err:  # noqa: BLE001 - one logged line, then the create fails
        from nvshim.log import log_decision

        message = one_line(err)
        spawn_quiet(runtime, delete)
        if status > 128:
            error = NvshimError(f"{message}, container deleted")
        else:
            error = NvshimError(f"finishing steps failed, container deleted: {message}")
        log_decision(
            prepared.config,
            TOOL,
            args.container_id,
            error=error,
            echo=False,
            annotations=prepared.annotations,
            step="finish" if status <= 128 else "create",
        )
        raise error from None
    finally:
        close_mounts(planned)
        ctx.close()
    return 0
