"""``nvshim-hook``: the OCI hook. Reads the OCI state on stdin; see ``--help``.

Runs as root on container input under ``python -I -S``: standard library and nvshim's
standard-library-only modules. Every decision is one line in the log file; errors also
go to stderr and give a non-zero exit status.
"""

from __future__ import annotations

import os
import sys

from nvshim.config import amended, load_config
from nvshim.errors import NvshimError, error_line, one_line
from nvshim.hook.args import HelpRequested, HookArgs, parse_args, parse_finish
from nvshim.hook.steps import Context, finishing_steps, run_steps
from nvshim.log import log_decision

TOOL = "nvshim-hook"
# Variables that must never reach a root hook (a hook entry without an explicit env):
# logged so the misconfiguration is visible.
RISKY_ENV = ("LD_", "PYTHON")


def prestart(state, ctx: Context) -> dict | None:
    """Standalone mode: apply the edits of a GPU request not already handled by
    nvshim-runtime. None (nothing logged) for containers that ask for no GPU."""
    from nvshim.hook.state import annotations, load_spec, rootfs_path
    from nvshim.oci.modify import INJECTED_ANNOTATION  # set by nvshim-runtime

    spec = load_spec(state.bundle)
    if INJECTED_ANNOTATION in annotations(spec):
        return None
    from nvshim.policy.select import edits_for_spec

    selection = edits_for_spec(spec, ctx.config, bundle=state.bundle)
    if selection is None:
        return None
    fields = dict(selection.log)
    if selection.edits.is_empty():
        return fields
    from nvshim.policy.request import spec_env

    check_mps_env(spec_env(spec), selection.edits.env)
    fields.update(apply_edits(state, rootfs_path(spec, state.bundle), selection.edits, ctx))
    return fields


def check_mps_env(container_env: dict[str, str], edit_env: list[str]) -> None:
    """A prestart hook cannot set env, so MPS sharing is enforced by refusal: every
    ``CUDA_MPS_*`` value the policy sets must already be the container's (unset counts
    as empty). Raises NvshimError naming the first mismatch."""
    for entry in edit_env:
        key, _, want = entry.partition("=")
        if not key.startswith("CUDA_MPS_"):
            continue
        have = container_env.get(key, "")
        if have != want:
            raise NvshimError(
                f"{key}={have!r} but the GPU's sharing policy needs {want!r}; a prestart "
                "hook cannot change env: use nvshim-runtime or the shared CDI spec"
            )


def apply_edits(state, rootfs: str, edits, ctx: Context) -> dict:
    """Apply ``edits`` to the running container ``state`` (prestart): mounts, device
    nodes, finishing steps inside its mount namespace, then cgroup v1 device access."""
    from nvshim.hook import apply
    from nvshim.hook.cgroup import V2_MESSAGE, allow_devices, devices_cgroup

    nodes = apply.plan_nodes(edits.device_nodes)
    if nodes and devices_cgroup(state.pid) is None:
        raise NvshimError(V2_MESSAGE)
    steps, others = finishing_steps(edits.hooks)
    fields: dict = {}
    if any(h.args[1:2] == ("rdma-pair",) for h in edits.hooks):
        from nvshim.pairing.step import pair_steps, run_pair_step

        for nics, netdevs in pair_steps(edits.hooks):
            fields.update(run_pair_step(state, nics, netdevs, ctx.config))
    planned = apply.plan_mounts(edits.mounts)
    try:

        def before(root) -> dict:
            return {
                "mounts": apply.attach_mounts(root, planned),
                "device_nodes": apply.make_nodes(root, nodes),
            }

        fields.update(run_steps(state.pid, rootfs, steps, ctx, before))
    finally:
        apply.close_mounts(planned)
    if nodes:
        allow_devices(state.pid, [n.rule for n in nodes])
        fields["devices_allowed"] = ",".join(f"{n.major}:{n.minor}" for n in nodes)
    fields.update(apply.not_applied(edits))
    if others:
        fields["hooks_not_run"] = ";".join(others)
    return fields


def require_check(state, args: HookArgs) -> dict:
    """A claim spec's createRuntime check: the container's ``NVIDIA_REQUIRE_*`` (from its
    config.json) against the host facts the spec was written with. RequirementError
    refuses the container."""
    from nvshim.hook.state import load_spec, rootfs_path
    from nvshim.policy.request import requirements_of, spec_env
    from nvshim.policy.require import check_requirements

    spec = load_spec(state.bundle)
    requirements, disabled = requirements_of(spec_env(spec))
    devices = [tuple(d.split(":", 1)) for d in args.device if ":" in d]
    driver, cuda, found = args.driver or "", args.cuda or "", None
    if requirements and not disabled:
        from nvshim.hook.cudacompat import in_image, judged_versions

        # the claim spec's enable-cuda-compat step has the host driver only (host.edits)
        try:
            found = in_image(rootfs_path(spec, state.bundle), driver)
        except NvshimError:
            found = None  # no root to look at: the host's driver it is
        driver, cuda = judged_versions(found, driver, cuda)
    check_requirements(requirements, cuda, driver, devices, disabled)
    fields = {"requirements": ",".join(sorted(requirements)) or "none", "disabled": disabled}
    if found is not None:
        fields["cuda_compat"] = found.version
    return fields


def _run(args: HookArgs, state, ctx: Context) -> dict | None:
    if args.command == "prestart":
        return prestart(state, ctx)
    if args.command == "rdma-pair":
        from nvshim.pairing.step import run_pair_step

        return run_pair_step(state, args.claim, args.netdev, ctx.config)
    if args.command == "mps-check":
        from nvshim.mps.enforce import check_daemon

        sharing = ctx.config.sharing
        warning = check_daemon(sharing.mps_root, args.uuid, sharing.on_daemon_down)
        return {"device": args.uuid, "mps_warning": warning}
    if args.command == "require-check":
        return require_check(state, args)
    from nvshim.hook.state import annotations, load_spec, rootfs_path
    from nvshim.oci.modify import INJECTED_ANNOTATION

    steps = parse_finish(args.steps) if args.command == "finish" else [args]
    spec = load_spec(state.bundle)
    fields = run_steps(state.pid, rootfs_path(spec, state.bundle), steps, ctx)
    # one line per container: nvshim-runtime already logged this one's decision
    return None if INJECTED_ANNOTATION in annotations(spec) else fields


def _state(args: HookArgs):
    """The OCI state: stdin, or NVIDIA's ``--container-spec FILE`` (``-``: stdin)."""
    from nvshim.hook.state import read_state

    source = args.container_spec
    if source in (None, "", "-"):
        return read_state(sys.stdin.buffer)
    try:
        with open(source, "rb") as stream:
            return read_state(stream)
    except OSError as err:
        raise NvshimError(f"--container-spec {source}: cannot read: {err.strerror}") from None


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``nvshim-hook`` launcher; returns the exit status."""
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
    except HelpRequested as shown:
        sys.stdout.write(shown.text)
        return 0
    except NvshimError as err:
        print(error_line(TOOL, err), file=sys.stderr)
        return err.exit_code
    try:
        config = load_config(args.config)
    except NvshimError as err:
        print(f"{TOOL}: error: {err}", file=sys.stderr)
        return 1
    if args.log_format:
        config = amended(config, "runtime", log_format=args.log_format)
    env_names = ",".join(sorted(os.environ)) or "-"
    container_id = "-"
    pod = None
    ctx = Context(config)
    try:
        state = _state(args)
        container_id, pod = state.id, state.annotations
        fields = _run(args, state, ctx)
    except Exception as err:  # noqa: BLE001 - every failure is one logged line, no traceback
        message = one_line(err)
        error = err if isinstance(err, NvshimError) else message
        log_decision(config, TOOL, container_id, error=error, annotations=pod, step=args.command)
        return err.exit_code if isinstance(err, NvshimError) else 1
    finally:
        ctx.close()
    risky = ",".join(sorted(k for k in os.environ if k.startswith(RISKY_ENV))) or None
    if fields is not None or risky:
        log_decision(
            config,
            TOOL,
            container_id,
            annotations=pod,
            step=args.command,
            **(fields or {}),
            hook_env=env_names,
            unsafe_hook_env=risky,
        )
    return 0
