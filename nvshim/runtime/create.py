"""The create path of ``nvshim-runtime``: decide, edit ``config.json``, log."""

from __future__ import annotations

import os

from nvshim import fastjson
from nvshim.config import Config, load_config
from nvshim.errors import NvshimError
from nvshim.log import log_decision
from nvshim.oci.bundle import load_spec
from nvshim.record import replace

TYPE_CHECKING = False  # typing costs ~5 ms at import, per container
if TYPE_CHECKING:
    from nvshim.edits import ContainerEdits
    from nvshim.hook.args import HookArgs

TOOL = "nvshim-runtime"


def mark_prepared(container_id: str, prepared: bool = True) -> None:
    """Leave (or, for a container asking for no GPU, remove a stale) marker the front
    looks for. Without it an exec would escape the enforcement, so failing to write it
    fails the create."""
    from nvshim.runtime import MARKER_DIR
    from nvshim.trusted import CACHE_DIR

    if "/" in container_id or container_id in ("", ".", ".."):
        return
    directory = os.path.join(CACHE_DIR, MARKER_DIR)
    path = os.path.join(directory, container_id)
    if not prepared:
        try:
            os.unlink(path)
        except OSError:
            pass
        return
    try:
        os.makedirs(directory, mode=0o755, exist_ok=True)
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644))
    except OSError as err:
        raise NvshimError(f"{directory}: cannot write the exec marker: {err.strerror}") from None


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


class Prepared:
    """What ``prepare_bundle`` leaves for the caller: the configuration (its runtime
    list), the finishing steps deferred to the runtime (``finish_here``) with the
    container root and annotations they need."""

    __slots__ = ("config", "steps", "rootfs", "annotations")

    def __init__(self, config: Config, steps=(), rootfs: str = "", annotations=None) -> None:
        self.config, self.steps, self.rootfs = config, list(steps), rootfs
        self.annotations = annotations


def prepare_bundle(bundle: str, container_id: str, finish_here: bool = False) -> Prepared:
    """Edit the bundle for a GPU request; a non-GPU container's file stays byte-identical.

    ``finish_here`` (``create``): the finishing steps are left out of the spec and
    returned for the runtime to run after the low-level create
    (``nvshim.runtime.finish``). Raises NvshimError (logged) when the request cannot be
    satisfied.
    """
    config = load_config()
    spec = load_spec(bundle)
    pod = spec.get("annotations")
    from nvshim.policy.select import edits_for_spec

    try:
        selection = edits_for_spec(spec, config)
    except NvshimError as err:
        log_decision(
            config, TOOL, container_id, error=err, echo=False, annotations=pod, bundle=bundle
        )
        raise
    if selection is None or selection.edits.is_empty():
        mark_prepared(container_id, prepared=False)
    if selection is None:
        return Prepared(config)
    if selection.edits.is_empty():
        log_decision(config, TOOL, container_id, annotations=pod, **selection.log)
        return Prepared(config)
    from nvshim.fsutil import atomic_write
    from nvshim.oci.modify import apply_edits

    edits, steps, rootfs = selection.edits, [], ""
    if finish_here:
        from nvshim.hook.state import rootfs_path

        edits, steps = split_finishers(edits)
        rootfs = rootfs_path(spec, bundle) if steps else ""
    apply_edits(spec, edits, [d.uuid for d in selection.devices])
    data = fastjson.dumps(spec).encode()
    mark_prepared(container_id)
    atomic_write(os.path.join(bundle, "config.json"), data, backup=False, durable=False)
    log_decision(config, TOOL, container_id, annotations=pod, **selection.log)
    return Prepared(config, steps, rootfs, pod)
