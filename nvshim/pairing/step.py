"""``nvshim-hook rdma-pair``: the pairing work at container start (``createRuntime``, in
the runtime's namespaces): claim the NICs (``--claim``, pairing.exclusive), then move
their netdevs into the container's network namespace (``--netdev OLD[=NEW]``). When the
move fails, the claims this step took are dropped again."""

from __future__ import annotations

from nvshim.pairing import claims


def run_pair_step(state, nics: list[str], netdevs: list[str], config) -> dict:
    """Do the step for the OCI ``state``; log fields; NvshimError with nothing left done."""
    state_dir = config.get("runtime", "state-dir")
    fields: dict = {}
    if nics:
        fields["rdma_claimed"] = ",".join(claims.claim(state_dir, nics, state.id, state.pid))
    if netdevs:
        from nvshim.pairing.netdev import move_netdevs

        try:
            fields.update(move_netdevs(state.pid, netdevs))
        except BaseException:
            claims.release(state_dir, nics, state.id)
            raise
    return fields


def pair_steps(hooks) -> list[tuple[list[str], list[str]]]:
    """(claims, netdevs) of each ``nvshim-hook rdma-pair`` entry in ``hooks`` (for the
    standalone prestart hook, which runs them itself)."""
    from nvshim.hook.args import parse_step

    out = []
    for hook in hooks:
        args = list(hook.args)
        if (
            len(args) >= 2
            and args[0].rsplit("/", 1)[-1] == "nvshim-hook"
            and args[1] == "rdma-pair"
        ):
            step = parse_step(args[1:])
            out.append((step.claim, step.netdev))
    return out
