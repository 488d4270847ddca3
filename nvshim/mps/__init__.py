"""GPU sharing: the sharing config, per-GPU MPS control daemons, and per-container MPS
enforcement (FACTS §6).

Layout on the host, per shared GPU or MIG device (``<root>`` is ``[sharing] mps-root``)::

    <root>/<uuid>/pipe   CUDA_MPS_PIPE_DIRECTORY of its daemon (pid file, control socket)
    <root>/<uuid>/log    CUDA_MPS_LOG_DIRECTORY of its daemon (control.log)
    <root>/<uuid>/shm    a small tmpfs: the daemon's /dev/shm and its clients' /dev/shm
    <root>/<uuid>/state.json  what ``nvshim mps start`` changed (compute mode to restore)

Inside a client container the pipe directory is always ``CONTAINER_PIPE_DIR``.
"""

from __future__ import annotations

CONTAINER_PIPE_DIR = "/run/nvidia-mps"
CONTAINER_SHM_DIR = "/dev/shm"
PID_FILE = "nvidia-cuda-mps-control.pid"
CONTROL_BINARY = "nvidia-cuda-mps-control"
MPS_ENV_PREFIX = "CUDA_MPS_"
