"""``nvshim-runtime``: an OCI runtime that wraps runc and injects GPUs at create.

Keep this module free of imports: the pass-through path loads it for every runc call.
"""

DEFAULT_RUNTIMES = ("runc", "crun")
DEFAULT_CONFIG = "/etc/nvshim/config.toml"  # $NVSHIM_CONFIG names another
