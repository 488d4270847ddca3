"""Images for test clusters beyond the base ones (tests/k8s/artifacts.py): the nvshim node
installer image as a docker archive containerd imports, cached by the image's inputs."""

from __future__ import annotations

import json
import os

from tests.cri_util import layer_archive
from tests.debroot import cached


def node_image_archive(tag: str = "localhost/nvshim-node:test") -> str:
    """A docker archive of the node installer image named ``tag``: the root tarball that
    tests/node_image.py builds (cached by its inputs) as the one layer, with the entrypoint
    packaging/container/build.py gives the image."""
    from tests.node_image import node_image

    rootfs = node_image()

    def make(path: str) -> None:
        os.makedirs(path)
        layer_archive(rootfs, os.path.join(path, "image.tar"), [tag], entrypoint=_entrypoint())

    stat = os.stat(rootfs)
    key = {"rootfs": rootfs, "size": stat.st_size, "mtime": stat.st_mtime_ns, "tag": tag}
    return os.path.join(cached("k8s-node-image", key, make), "image.tar")


def _entrypoint() -> list[str]:
    """The image's entrypoint as packaging/container/build.py sets it."""
    import importlib.util

    from tests.debroot import REPO

    spec = importlib.util.spec_from_file_location(
        "nvshim_image_build", os.path.join(REPO, "packaging", "container", "build.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return json.loads(module.ENTRYPOINT)
