"""The create path of ``nvshim-runtime``: decide, edit ``config.json``, log."""

from __future__ import annotations

import os

from nvshim import fastjson
from nvshim.config import Config, load_config
from nvshim.errors import NvshimError
from nvshim.log import log_decision
from nvshim.oci.bundle import load_spec

TOOL = "nvshim-runtime"


def prepare_bundle(bundle: str, container_id: str) -> Config:
    """Edit the bundle for a GPU request; a non-GPU container's file stays byte-identical.

    Returns the loaded configuration (the caller needs its runtime list). Raises
    NvshimError (logged) when the request cannot be satisfied.
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
    if selection is None:
        return config
    if selection.edits.is_empty():
        log_decision(config, TOOL, container_id, annotations=pod, **selection.log)
        return config
    from nvshim.fsutil import atomic_write
    from nvshim.oci.modify import apply_edits

    apply_edits(spec, selection.edits, [d.uuid for d in selection.devices])
    data = fastjson.dumps(spec).encode()
    atomic_write(os.path.join(bundle, "config.json"), data, backup=False, durable=False)
    log_decision(config, TOOL, container_id, annotations=pod, **selection.log)
    return config
