"""``create`` with the finishing steps done by nvshim-runtime itself.

For ``create`` the steps a ``createContainer`` hook would run (symlinks, ld cache,
params) are kept out of ``config.json``: the runtime has runc create the container,
then runs them in the container's mount namespace (``nvshim.hook.steps``: the hook's
code, with the same fd-based safety) before it returns, while the container's process
waits for ``start``. One interpreter per GPU create instead of two. A failed step
deletes the container and fails the create, as a failed hook would. ``run`` keeps the
hook: it starts the process at once.
"""

from __future__ import annotations

import os

from nvshim.errors import NvshimError, one_line
from nvshim.record import replace
from nvshim.runtime import fault_point

TYPE_CHECKING = False  # typing costs ~5 ms at import, per container
if TYPE_CHECKING:
    from nvshim.edits import ContainerEdits
    from nvshim.hook.args import HookArgs
    from nvshim.runtime.args import RuncArgs
    from nvshim.runtime.create import Prepared
    from nvshim.runtime.main import LowLevel

TOOL = "nvshim-runtime"
MAX_STATE_BYTES = 1 << 20


def split_finishers(edits: ContainerEdits) -> tuple[ContainerEdits, list[HookArgs]]:
    """``edits`` without nvshim-hook's finishing-step entries, and those steps parsed."""
    from nvshim.hook import is_finisher

    ours = [h for h in edits.hooks if is_finisher(h.args)]
    if not ours:
        return edits, []
    from nvshim.hook.steps import finishing_steps

    steps, _ = finishing_steps(ours)
    rest = [h for h in edits.hooks if h not in ours]
    return replace(edits, hooks=rest), steps


def start(
    runtime: str, argv: list[str], stdout: int | None = None, stderr: int | None = None
) -> int:
    """Start the low-level runtime with ``argv`` (this process's stdio and environment,
    as the exec it replaces would have; ``stdout``/``stderr``: other fds); its pid."""
    actions = [
        (os.POSIX_SPAWN_DUP2, fd, n) for n, fd in ((1, stdout), (2, stderr)) if fd is not None
    ]
    return os.posix_spawn(runtime, [runtime, *argv], os.environ, file_actions=actions)


def wait(pid: int) -> int:
    """The exit status of child ``pid`` (128+N: killed by signal N)."""
    from nvshim.runtime import exit_status

    return exit_status(os.waitpid(pid, 0)[1])


def spawn(
    runtime: str, argv: list[str], stdout: int | None = None, stderr: int | None = None
) -> int:
    """Run the low-level runtime with ``argv`` and return its exit status."""
    return wait(start(runtime, argv, stdout, stderr))


def spawn_quiet(runtime: str, argv: list[str]) -> int:
    """Run the low-level runtime with ``argv``, its output thrown away; its exit status."""
    null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    try:
        return spawn(runtime, argv, stdout=null, stderr=null)
    finally:
        os.close(null)


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
    from nvshim.hook.steps import Context, prepare_steps, run_steps

    ctx = Context(prepared.config)
    status = 0
    try:
        early = None
        try:  # the host halves and imports while runc works: off the wall-clock path
            prepare_steps(prepared.steps, ctx)
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
        run_steps(pid, prepared.rootfs, prepared.steps, ctx, pivoted=True)
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
        ctx.close()
    return 0
