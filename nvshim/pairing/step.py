"""``nvshim-hook rdma-pair``: the pairing work at container start (``createRuntime``, in
the runtime's namespaces): claim the NICs (``--claim``, pairing.exclusive), then move
their netdevs into the container's network namespace (``--netdev OLD[=NEW]``). When the
move fails, the claims this step took are dropped again.

The arguments come from a spec, so they are checked against the host and the policy
before anything happens: a claim must name an RDMA device of the dev root, and a netdev
must belong to one, with ``netdev-handover`` on and a physical function named in
``move-physical``. No other host interface can be moved this way.
"""

from __future__ import annotations

from nvshim.errors import NvshimError
from nvshim.pairing import claims


def check_args(nics: list[str], netdevs: list[str], config) -> None:
    """NvshimError naming the first argument the host or the policy does not allow."""
    from nvshim.host.rdma import discover_rdma
    from nvshim.pairing.netdev import parse_move
    from nvshim.policy.pairing import matches

    cfg = config.pairing
    devices = discover_rdma(config.host.dev_root, [])
    names = {d.name for d in devices}
    for nic in nics:
        if nic not in names:
            raise NvshimError(f"rdma-pair: --claim {nic[:64]!r}: no such RDMA device")
    owners = {netdev: d for d in devices for netdev in d.netdevs}
    for spec in netdevs:
        old, _ = parse_move(spec)
        nic = owners.get(old)
        if nic is None:
            raise NvshimError(f"rdma-pair: --netdev {old!r}: not a netdev of an RDMA device")
        if not cfg.netdev_handover:
            raise NvshimError("rdma-pair: --netdev given but pairing.netdev-handover is false")
        if not nic.is_vf and not matches(nic, cfg.move_physical):
            raise NvshimError(
                f"rdma-pair: {old} is a physical function's netdev ({nic.name}) not named in "
                "pairing.move-physical"
            )


def run_pair_step(state, nics: list[str], netdevs: list[str], config) -> dict:
    """Do the step for the OCI ``state``; log fields; NvshimError with nothing left done."""
    check_args(nics, netdevs, config)
    inventory_dir = config.runtime.inventory_dir
    fields: dict = {}
    if nics:
        claimed = claims.claim(inventory_dir, nics, state.id, state.pid)
        fields["rdma_claimed"] = ",".join(claimed)
    if netdevs:
        from nvshim.pairing.netdev import move_netdevs

        try:
            fields.update(move_netdevs(state.pid, netdevs))
        except BaseException:
            claims.release(inventory_dir, nics, state.id)
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
