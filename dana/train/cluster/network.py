"""The messages' time on a cluster's network: per-worker links, the servers' shared links.

Every push sends the rule's message and every pull receives parameters: one flat vector
of ``d`` values each, ``b = d * bytes_per_value`` bytes. With ``S`` parameter-server
shards (``--servers S``) the vector is split as the Ray runtime splits it, into ``S``
contiguous parts of near-equal size (the first ``d % S`` one value larger), each part
crossing its own shard's link; ``b_s = ceil(d/S) * bytes_per_value`` is the largest part.

A link of ``G`` Gbit/s carries ``G * 125,000`` bytes per ms. With ``w_i = b / (worker
i's bandwidth)`` and ``s = b_s / (a shard link's bandwidth)`` (0 for a link without a
limit) and ``L_i`` the worker's one-way latency:

- **push** sent at ``t`` (the computation's end): its first bit reaches the shards'
  links at ``a = t + L_i``. Each shard's ingress is a FIFO queue, one part at a time:
  its part starts at ``max(a, free)``, occupies the link ``s`` ms (``free`` moves
  there), and the push is complete at ``max(free, a + w_i)`` (it also cannot arrive
  faster than the worker's own link sends it);
- **pull** answered at ``t``: each shard's egress is a FIFO queue the same way, and the
  worker has the parameters at ``max(free, t + w_i) + L_i``.

With a codec of the pushes (``--compress``, :mod:`dana.train.rules.codecs`) a push is its
payload's bytes instead: each shard's part encoded on its own, ``b`` their sum and
``b_s`` the largest (a pull still carries the ``d`` values).

Every shard sees the same arrivals with parts of nearly the same size, so all shards
keep the same order; a message is complete when its largest part is, and only that
part's queue is simulated. A worker's own link carries one message at a time (it pushes,
then pulls), so it needs no queue.
"""

from __future__ import annotations

import math
from typing import Any

from dana.train.cluster.model import cycled
from dana.train.rules.codecs import Codec, part_bounds

#: Bytes a link of 1 Gbit/s carries in one ms (10^9 bits/s).
BYTES_PER_MS_PER_GBPS = 1e9 / 8 / 1000


def transfer_ms(nbytes: float, gbps: float | None) -> float:
    """The time (ms) ``nbytes`` take on a link of ``gbps`` Gbit/s (0 without a limit)."""
    return 0.0 if gbps is None else nbytes * 8.0 / (gbps * 1e6)


class Network:
    """The links of a cluster and the FIFO queues of the servers' links."""

    def __init__(
        self,
        network: dict[str, Any],
        workers: int,
        servers: int,
        d: int,
        value_bytes: float,
        codec: Codec | None = None,
    ):
        if value_bytes is None or not value_bytes > 0:
            raise ValueError(f"value_bytes must be > 0, got {value_bytes!r}")
        value_bytes = float(network["bytes_per_value"] or value_bytes)
        self.message_bytes = d * value_bytes
        self.part_bytes = math.ceil(d / servers) * value_bytes
        if codec is None:
            self.push_bytes, self.push_part_bytes = self.message_bytes, self.part_bytes
        else:  # each shard's part encoded on its own (the payloads' bytes)
            sizes = [codec.nbytes(hi - lo, value_bytes) for lo, hi in part_bounds(d, servers)]
            self.push_bytes, self.push_part_bytes = float(sum(sizes)), float(max(sizes))
        self.latency = [float(cycled(network["latency_ms"], i)) for i in range(workers)]
        bandwidth, shared = network["bandwidth_gbps"], network["server_bandwidth_gbps"]
        self.worker_ms = [
            transfer_ms(self.message_bytes, cycled(bandwidth, i)) for i in range(workers)
        ]
        self.push_worker_ms = [
            transfer_ms(self.push_bytes, cycled(bandwidth, i)) for i in range(workers)
        ]
        self.server_ms = transfer_ms(self.part_bytes, shared)
        self.push_server_ms = transfer_ms(self.push_part_bytes, shared)
        self.ingress_free = 0.0  # when the shards' ingress is free again
        self.egress_free = 0.0

    def to_server(self, worker: int, arrival: float) -> float:
        """A push whose first bit reaches the servers' links at ``arrival``: when the
        servers have all of it."""
        self.ingress_free = max(arrival, self.ingress_free) + self.push_server_ms
        return max(self.ingress_free, arrival + self.push_worker_ms[worker])

    def from_server(self, worker: int, sent: float) -> float:
        """A pull answered at ``sent``: when the worker has all of it."""
        self.egress_free = max(sent, self.egress_free) + self.server_ms
        return max(self.egress_free, sent + self.worker_ms[worker]) + self.latency[worker]

    def state_dict(self) -> dict[str, Any]:
        return {"ingress_free": self.ingress_free, "egress_free": self.egress_free}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ingress_free = float(state["ingress_free"])
        self.egress_free = float(state["egress_free"])
