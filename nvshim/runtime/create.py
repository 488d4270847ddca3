"""The create path of ``nvshim-runtime``: decide, edit ``config.json``, log."""

from __future__ import annotations

import os

from nvshim import fastjson
from nvshim.config import Config, load_config
from nvshim.errors import NvshimError
from nvshim.log import log_decision
from nvshim.memo import Last
from nvshim.oci.bundle import load_spec
from nvshim.record import replace

TYPE_CHECKING = False  # typing costs ~5 ms at import, per container
if TYPE_CHECKING:
    from nvshim.edits import ContainerEdits
    from nvshim.hook.args import HookArgs

TOOL = "nvshim-runtime"


def split_finishers(edits: ContainerEdits) -> tuple[ContainerEdits, list[HookArgs]]:
    """``edits`` without nvshim-hook's finishing-step entries, and those steps parsed
    (once per process for the same hooks: the steps are never modified once parsed)."""
    hooks = tuple(edits.hooks)
    kept = _split.get((hooks,))
    if kept is None:
        kept = _split.keep((hooks,), _split_hooks(hooks))
    rest, steps = kept
    if not steps:
        return edits, []
    return replace(edits, hooks=list(rest)), list(steps)


# the last hooks split (a worker's next create of the same shape has the same ones)
_split = Last()


def _split_hooks(hooks: tuple) -> tuple[tuple, tuple]:
    """The hooks that are not nvshim-hook's finishing steps, and those steps parsed."""
    from nvshim.hookentries import is_finisher

    ours = [h for h in hooks if is_finisher(h.args)]
    if not ours:
        return hooks, ()
    from nvshim.hook.steps import finishing_steps

    steps, _ = finishing_steps(ours)
    return tuple(h for h in hooks if h not in ours), tuple(steps)


def split_mounts(edits: ContainerEdits, spec: dict) -> tuple[ContainerEdits, list]:
    """``edits`` without the binds nvshim-runtime attaches itself once runc has created
    the container (``nvshim.runtime.finish``), and those binds: every one whose options
    it gives the attributes runc would (``nvshim.rootfs.bind.runc_attrs``), unless the
    spec holds it already (the engine's own CDI support). runc spends about 0.25 ms of
    CPU on each bind it makes; attached from here one costs a third of that. A kernel
    without the new mount API (before Linux 5.12) leaves every bind to runc."""
    if not edits.mounts:
        return edits, []
    from nvshim.oci.modify import spec_binds
    from nvshim.rootfs.bind import mount_api, runc_attrs

    if not mount_api():
        return edits, []
    present = spec_binds(spec)
    ours, kept = [], []
    for m in edits.mounts:
        attachable = m.type in (None, "", "bind") and runc_attrs(m.options) is not None
        if attachable and (m.container_path, m.host_path) not in present:
            ours.append(m)
        else:
            kept.append(m)
    return (replace(edits, mounts=kept), ours) if ours else (edits, [])


class Prepared:
    """What ``prepare_bundle`` leaves for the caller: the configuration (its runtime
    list), the finishing steps and the binds deferred to the runtime (``finish_here``)
    with the container root and annotations they need, and the low-level runtime when it
    was already looked up for the exec marker (None otherwise)."""

    __slots__ = ("config", "steps", "mounts", "rootfs", "annotations", "runtime")

    def __init__(
        self,
        config: Config,
        steps=(),
        rootfs: str = "",
        annotations=None,
        runtime=None,
        mounts=(),
    ) -> None:
        self.config, self.steps, self.mounts = config, list(steps), list(mounts)
        self.rootfs, self.annotations, self.runtime = rootfs, annotations, runtime


def _marker_root(config: Config, root_flag: str | None) -> tuple[str, str | None]:
    """What the exec marker records (the low-level runtime's state root, "" if unknown)
    and the runtime it was found for (None: none found)."""
    from nvshim.runtime.lowlevel import runtime_for
    from nvshim.runtime.markers import state_root

    try:
        runtime = runtime_for(config)
    except NvshimError:  # no runtime: the create fails after the marker anyway
        return "", None
    return state_root(root_flag, runtime), runtime


def prepare_bundle(
    bundle: str, container_id: str, finish_here: bool = False, root_flag: str | None = None
) -> Prepared:
    """Edit the bundle for a GPU request; a non-GPU container's file stays byte-identical.

    ``finish_here`` (``create``): the finishing steps and the binds runc would make
    (``split_mounts``) are left out of the spec and returned for the runtime to run and
    attach after the low-level create (``nvshim.runtime.finish``). ``root_flag``: the
    call's global ``--root``, which the exec marker records (``nvshim.runtime.markers``).
    Raises NvshimError (logged) when the request cannot be satisfied.
    """
    config = load_config()
    spec = load_spec(bundle)
    pod = spec.get("annotations")
    from nvshim.policy.select import edits_for_spec

    try:
        selection = edits_for_spec(spec, config, bundle=bundle)
    except NvshimError as err:
        log_decision(
            config, TOOL, container_id, error=err, echo=False, annotations=pod, bundle=bundle
        )
        raise
    from nvshim.runtime.markers import mark_prepared
    from nvshim.trusted import CACHE_DIR

    if selection is None or selection.edits.is_empty():
        mark_prepared(CACHE_DIR, container_id, prepared=False)
    if selection is None:
        return Prepared(config)
    if selection.edits.is_empty():
        log_decision(config, TOOL, container_id, annotations=pod, **selection.log)
        return Prepared(config)
    from nvshim.defaults import fault_point
    from nvshim.fsutil import atomic_write
    from nvshim.oci.modify import apply_edits

    edits, steps, mounts, rootfs = selection.edits, [], [], ""
    if finish_here:
        from nvshim.hook.state import rootfs_path

        edits, steps = split_finishers(edits)
        edits, mounts = split_mounts(edits, spec)
        rootfs = rootfs_path(spec, bundle) if steps or mounts else ""
    apply_edits(spec, edits, [d.uuid for d in selection.devices])
    data = fastjson.dumps(spec).encode()
    root, runtime = _marker_root(config, root_flag)
    mark_prepared(CACHE_DIR, container_id, root)
    fault_point("rewrite")
    atomic_write(os.path.join(bundle, "config.json"), data, durable=False)
    log_decision(config, TOOL, container_id, annotations=pod, **selection.log)
    return Prepared(config, steps, rootfs, pod, runtime, mounts)
