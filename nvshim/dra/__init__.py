"""nvshim's Kubernetes DRA driver (``nvshim dra``): a kubelet plugin that publishes the
node's GPUs and MIG devices as ResourceSlices and prepares each allocated ResourceClaim
as a transient CDI spec holding nvshim's own edits and enforcement."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from nvshim.host.model import Gpu, MigDevice

DRIVER_NAME = "gpu.nvshim.io"
CDI_VENDOR = "k8s.gpu.nvshim.io"  # the claim specs' kind is <vendor>/claim
CDI_CLASS = "claim"
DEFAULT_KUBELET_DIR = "/var/lib/kubelet"
DEFAULT_CDI_DIR = "/var/run/cdi"
DEFAULT_MPS_ROOT = "/run/nvshim/dra-mps"


def device_name(device: Gpu | MigDevice) -> str:
    """The ResourceSlice name of a device: ``gpu-<index>`` or ``mig-<gpu>-<n>``."""
    parent = getattr(device, "parent_index", None)
    return f"gpu-{device.index}" if parent is None else f"mig-{parent}-{device.index}"
