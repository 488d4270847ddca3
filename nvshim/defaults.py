"""Defaults the config and the runtime share (the config's path, the low-level runtimes).

Free of imports, and low: the runtime's pass-through path loads it for every runc call,
and ``nvshim.config`` reads it without loading the runtime.
"""

DEFAULT_RUNTIMES = ("runc", "crun")
DEFAULT_CONFIG = "/etc/nvshim/config.toml"  # $NVSHIM_CONFIG names another
