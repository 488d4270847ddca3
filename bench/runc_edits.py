"""The spec an injecting runtime hands runc for a GPU: nvshim's edits with the driver's
binds in it, as NVIDIA's CDI spec has runc make them (nvshim's own create attaches them
itself, after runc). Run by ``bench.creates.edited_bundle`` in a fresh interpreter."""

from __future__ import annotations

import os

from nvshim import fastjson
from nvshim.edits import ContainerEdits
from nvshim.oci.modify import apply_edits
from nvshim.runtime.create import prepare_bundle


def edit(bundle: str, cid: str) -> None:
    """Edit ``bundle`` as nvshim's create does, then put the binds it left out back in."""
    prepared = prepare_bundle(bundle, cid, True)
    path = os.path.join(bundle, "config.json")
    with open(path) as fh:
        spec = fastjson.loads(fh.read())
    annotations = dict(spec.get("annotations") or {})  # what nvshim's create recorded
    apply_edits(spec, ContainerEdits(mounts=prepared.mounts), [])
    spec["annotations"] = annotations
    with open(path, "w") as fh:
        fh.write(fastjson.dumps(spec))
