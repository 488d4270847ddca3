"""``nvshim-runtime``: an OCI runtime that wraps runc and injects GPUs at create.

Keep this module free of imports: the pass-through path loads it for every runc call.
"""

DEFAULT_RUNTIMES = ("runc", "crun")
DEFAULT_CONFIG = "/etc/nvshim/config.toml"  # $NVSHIM_CONFIG names another
FRONT_CACHE = "runtime-front"  # the low-level runtime, for the sh front (passthrough.py)
MARKER_DIR = "exec"  # one empty file per container id nvshim prepared (create.py)
