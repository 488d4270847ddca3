"""The finishing steps (symlinks, ld cache, params) run on a container's root inside its
mount namespace, by the ``createContainer`` hook or, for ``create``, by nvshim-runtime
itself once runc has created the container.

Each step has a host half, run first in the caller's namespace (open the host's
ldconfig, read the host's params file and make its private copy), and a container half
run on the container root. Nothing in a container half reads a host path: after
``pivot_root`` the host's files and its ``/proc`` are out of reach. A read-only root
(runc remounts it so at the end of ``create``) is writable only while the container
halves run (``nvshim.rootfs.rwroot``).
"""

from __future__ import annotations

import os

from nvshim.config import Config
from nvshim.errors import NvshimError
from nvshim.hook.args import HookArgs, parse_finish, parse_step
from nvshim.hookentries import FINISHERS
from nvshim.record import field, record

TYPE_CHECKING = False  # typing costs ~5 ms at import, per container
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

TOOL = "nvshim-hook"


@record
class Context:
    """What the steps share: the configuration and what their host halves opened
    (closed by ``close``)."""

    config: Config
    ldconfig_fd: int | None = None
    params: tuple[str | None, int | None] | None = None  # (log value, tree fd)
    closers: list = field(default_factory=list)

    def close(self) -> None:
        """Release what the host halves opened (the private params copy last)."""
        while self.closers:
            self.closers.pop()()
        if self.ldconfig_fd is not None:
            os.close(self.ldconfig_fd)
            self.ldconfig_fd = None


def _host_ldcache(args: HookArgs, ctx: Context) -> None:
    import nvshim.hook.cudacompat  # noqa: F401 - the container half reads its drop-in

    if ctx.ldconfig_fd is None:
        from nvshim.hook.ldconfig import open_host_ldconfig

        ctx.ldconfig_fd = open_host_ldconfig(real_ldconfig(args.ldconfig))


def real_ldconfig(path: str | None) -> str | None:
    """NVIDIA's rule for the host's ldconfig: ``PATH.real`` when it exists (hosts such as
    Ubuntu, where ``/sbin/ldconfig`` is a wrapper script around it). Without ``path``: the
    first default with a ``.real`` beside it, else None (the defaults, in order)."""
    if not path:
        from nvshim.hook.ldconfig import HOST_LDCONFIG

        real = (c + ".real" for c in HOST_LDCONFIG if os.path.exists(c + ".real"))
        return next(real, None)
    base = path.removesuffix(".real")
    return base + ".real" if os.path.exists(base + ".real") else base


def _host_params(args: HookArgs, ctx: Context) -> None:
    if ctx.params is not None:
        return
    from nvshim.hook.params import host_params
    from nvshim.rootfs.bind import private_file_tree

    shown, data = host_params(ctx.config.host.dev_root)
    if data is None:
        ctx.params = (shown, None)
        return
    tree = private_file_tree(data, ctx.config.runtime.inventory_dir, "params")
    fd = tree.__enter__()
    ctx.closers.append(lambda: tree.__exit__(None, None, None))
    ctx.params = (None, fd)


def _step_symlinks(root, args, ctx: Context) -> dict:
    from nvshim.hook.symlinks import create_symlinks

    return create_symlinks(root, args.link)


def _step_ldcache(root, args, ctx: Context) -> dict:
    from nvshim.hook.cudacompat import enabled_folders
    from nvshim.hook.ldconfig import update_ldcache

    if ctx.ldconfig_fd is None:
        raise NvshimError("update-ldcache: the host ldconfig was not opened")
    # an enabled compat folder goes first: its libcuda.so.1 wins in the new cache
    return update_ldcache(root, [*enabled_folders(root), *args.folder], ctx.ldconfig_fd)


def _host_proc(args: HookArgs, ctx: Context) -> None:
    from nvshim.rootfs import kernel

    kernel.host_proc()  # opened while this is still the host's /proc


def _host_chmod(args: HookArgs, ctx: Context) -> None:
    from nvshim.hook.chmod import check_paths, parse_mode

    parse_mode(args.mode)
    check_paths(args.path)
    _host_proc(args, ctx)


def _step_chmod(root, args, ctx: Context) -> dict:
    from nvshim.hook.chmod import chmod_paths, parse_mode

    return chmod_paths(root, args.path, parse_mode(args.mode))


def _step_compat(root, args, ctx: Context) -> dict:
    from nvshim.hook.cudacompat import enable_cuda_compat

    return enable_cuda_compat(
        root,
        args.host_driver_version or "",
        args.host_cuda_version or "",
        args.cuda_compat_container_root,
    )


def _step_profile(root, args, ctx: Context) -> dict:
    from nvshim.hook.appprofile import update_application_profile

    return update_application_profile(root)


def _step_params(root, args, ctx: Context) -> dict:
    from nvshim.hook.params import mount_params

    if ctx.params is None:
        raise NvshimError("disable-device-node-modification: the host params were not read")
    shown, tree = ctx.params
    return {"params": shown} if tree is None else mount_params(root, tree)


# step -> (the module its container half runs, host half or None, container half). The
# module is imported on the host: from inside, nvshim's own files may be out of reach.
STEPS: dict[str, tuple[str, Callable[[HookArgs, Context], None] | None, Callable[..., dict]]] = {
    "create-symlinks": ("nvshim.hook.symlinks", None, _step_symlinks),
    "update-ldcache": ("nvshim.hook.ldconfig", _host_ldcache, _step_ldcache),
    "disable-device-node-modification": ("nvshim.hook.params", _host_params, _step_params),
    "chmod": ("nvshim.hook.chmod", _host_chmod, _step_chmod),
    "enable-cuda-compat": ("nvshim.hook.cudacompat", _host_proc, _step_compat),
    "update-application-profile": ("nvshim.hook.appprofile", None, _step_profile),
}


def prepare_steps(steps: list[HookArgs], ctx: Context) -> None:
    """The host halves of ``steps`` and the imports their container halves need (nvshim
    may be out of reach inside). Idempotent: ``run_steps`` calls it too; nvshim-runtime
    calls it early, while runc creates the container."""
    import nvshim.rootfs.fsroot
    import nvshim.rootfs.namespace
    import nvshim.rootfs.rwroot  # noqa: F401 - imported here, used by run_steps

    for step in steps:
        module, host_half, _ = STEPS[step.command]
        __import__(module)
        if host_half is not None:
            host_half(step, ctx)


def run_steps(
    pid: int,
    rootfs: str,
    steps: list[HookArgs],
    ctx: Context,
    before: Callable[[Any], dict] | None = None,
    pivoted: bool = False,
) -> dict:
    """Run each step's host half here, then ``before`` and each container half on the
    container root in ``pid``'s mount namespace. Returns the steps' log fields.

    ``pivoted``: the container has already switched to its root (after ``runc
    create``), so the root is that namespace's ``/``, checked to be ``pid``'s root and
    the directory ``rootfs`` names here. Otherwise (hooks) the root is ``rootfs``.
    """
    from nvshim.rootfs.fsroot import RootFS
    from nvshim.rootfs.namespace import in_mount_ns, same_mount_ns
    from nvshim.rootfs.rwroot import while_writable

    prepare_steps(steps, ctx)
    expected = None
    if pivoted:
        if same_mount_ns(pid):
            raise NvshimError(
                f"{rootfs}: the container shares nvshim-runtime's mount namespace; "
                "GPU containers need their own"
            )
        expected = _identity(f"/proc/{pid}/root")
        if expected != _identity(rootfs):  # runc bind-mounts the rootfs as the root
            raise NvshimError(f"{rootfs}: not the root of container process {pid}")

    def work() -> dict:
        try:
            root = RootFS("/" if pivoted else rootfs)
        except OSError as err:
            raise NvshimError(f"{rootfs}: cannot open the container root: {err.strerror}") from None
        with root:
            if expected is not None:
                st = os.fstat(root.fd)
                if (st.st_dev, st.st_ino) != expected:
                    raise NvshimError(f"{rootfs}: the namespace's root is not the container's")
            return while_writable(root.fd, root.path, rootfs, lambda: each(root))

    def each(root: RootFS) -> dict:
        fields: dict = {}
        if before is not None:
            fields.update(before(root))
        for step in steps:
            fields.update(STEPS[step.command][2](root, step, ctx))
        return fields

    return in_mount_ns(pid, work)


def _identity(path: str) -> tuple[int, int]:
    try:
        st = os.stat(path)
    except OSError as err:
        raise NvshimError(f"{path}: cannot read: {err.strerror}") from None
    return st.st_dev, st.st_ino


def finishing_steps(hooks) -> tuple[list[HookArgs], list[str]]:
    """The ``nvshim-hook <finisher> ...`` entries of ``hooks`` parsed for in-process runs,
    and a description of the entries that are not ours (not run)."""
    steps, others = [], []
    for hook in hooks:
        args = list(hook.args)
        if len(args) >= 2 and os.path.basename(args[0]) == TOOL and args[1] in FINISHERS:
            steps.append(parse_step(args[1:]))
        elif len(args) >= 2 and os.path.basename(args[0]) == TOOL and args[1] == "finish":
            steps.extend(parse_finish(args[2:]))
        elif len(args) >= 2 and os.path.basename(args[0]) == TOOL and args[1] == "rdma-pair":
            continue  # host side: apply_edits runs it
        else:
            others.append(" ".join(args[:2]) or hook.path)
    return steps, others


def cuda_compat_for(rootfs: str, hooks):
    """The compat library the ``nvshim-hook enable-cuda-compat`` entry among ``hooks``
    will enable in the image at ``rootfs`` (a ``cudacompat.CompatLibrary``; None: no such
    entry, or not used). Here, beside the parser of those entries: the policy asks it
    before the container exists."""
    from nvshim.hook.cudacompat import in_image

    steps, _ = finishing_steps(hooks)
    for step in steps:
        if step.command == "enable-cuda-compat":
            return in_image(
                rootfs,
                step.host_driver_version or "",
                step.host_cuda_version or "",
                step.cuda_compat_container_root,
            )
    return None
