"""nvshim-hook: the OCI hook (standalone prestart mode and the in-container finishing steps)."""

# The steps that finish a container inside its mount namespace, and what separates them
# in one ``nvshim-hook finish STEP ARGS + STEP ARGS`` entry (never a link spec or an
# absolute folder). Here, not in nvshim.launch, so the hook does not import the edits.
FINISHERS = (
    "create-symlinks",
    "update-ldcache",
    "disable-device-node-modification",
    "chmod",
    "enable-cuda-compat",
    "update-application-profile",
)
STEP_SEPARATOR = "+"


def is_finisher(args) -> bool:
    """True for the arguments of an ``nvshim-hook <finishing step> ...`` entry."""
    return len(args) >= 2 and args[0] == "nvshim-hook" and args[1] in FINISHERS
