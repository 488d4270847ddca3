"""The contract between the specs nvshim writes (CDI, the runtime's ``config.json``,
hooks.d) and ``nvshim-hook``: the finishing steps' names, how one entry folds several,
and the OCI hook entries that run the hook. Writers and the hook both import this; it
sits below both (the hook reads only the names: ``Hook`` loads where an entry is made)."""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing costs milliseconds at import, per container
if TYPE_CHECKING:
    from nvshim.edits import Hook

# The steps that finish a container inside its mount namespace, and what separates them
# in one ``nvshim-hook finish STEP ARGS + STEP ARGS`` entry (never a link spec or an
# absolute folder).
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


# The whole environment hook processes get: nothing from the container.
HOOK_ENV = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C.UTF-8")
# nvshim's own settings passed on from the process writing an entry (never the container)
PASSED_ON = ("NVSHIM_CONFIG", "NVSHIM_CACHE_DIR")


def hook_env() -> tuple[str, ...]:
    """``HOOK_ENV`` plus the ``PASSED_ON`` variables set in this process."""
    return HOOK_ENV + tuple(f"{n}={os.environ[n]}" for n in PASSED_ON if os.environ.get(n))


def hook_entry(hook_path: str, hook_name: str, *args: str) -> Hook:
    """An OCI hook entry running ``nvshim-hook <args>`` with the minimal explicit env.

    A non-default nvshim config or cache directory (``NVSHIM_CONFIG``,
    ``NVSHIM_CACHE_DIR`` of the process writing the entry, an operator's choice, never
    the container's) is passed on so the hook uses the same ones.
    """
    from nvshim.edits import Hook

    return Hook(hook_name=hook_name, path=hook_path, args=("nvshim-hook", *args), env=hook_env())


def fold_finishers(hooks: list[Hook]) -> list[Hook]:
    """Fold nvshim-hook finishing-step entries sharing a stage, path and env into one
    ``nvshim-hook finish STEP ARGS + STEP ARGS ...`` entry: one process per container
    instead of one per step. Other hooks keep their place."""
    from nvshim.edits import Hook

    out: list[Hook] = []
    folded: dict[tuple, int] = {}
    for hook in hooks:
        args = list(hook.args)
        if not is_finisher(args):
            out.append(hook)
            continue
        key = (hook.hook_name, hook.path, hook.env, hook.timeout)
        if key not in folded:
            folded[key] = len(out)
            out.append(
                Hook(
                    hook.hook_name,
                    hook.path,
                    ("nvshim-hook", "finish", *args[1:]),
                    hook.env,
                    hook.timeout,
                )
            )
            continue
        first = out[folded[key]]
        out[folded[key]] = Hook(
            first.hook_name,
            first.path,
            (*first.args, STEP_SEPARATOR, *args[1:]),
            first.env,
            first.timeout,
        )
    return out
