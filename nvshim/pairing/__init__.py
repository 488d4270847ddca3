"""Host-side work of GPU-NIC pairing at container start: NIC claims (``claims``) and the
netdev hand-over into the container's network namespace (``netdev``), run by the
``nvshim-hook rdma-pair`` step (``step``). The choice of NICs is policy
(``nvshim.policy.pairing``); discovery is ``nvshim.host.topology``."""
