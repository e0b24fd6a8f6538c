"""How the flat parameter vector is laid out over the parameter servers.

The ``d`` parameters are split into ``S`` contiguous shards of near-equal size (the first
``d % S`` shards hold one more). Every actor rebuilds the same :class:`Layout` from
``(d, S, seed)``, so only plain numbers travel between them.

The gap ``RMS(theta_now - p_i)`` is measured on a fixed random sample of at most
:data:`GAP_PROBES` coordinates (every coordinate when ``d`` is smaller): a server keeps,
per worker, only the sampled coordinates of what it sent, so its memory does not grow
with ``k`` by more than ``k * GAP_PROBES`` numbers. The sample is drawn uniformly from
all ``d`` coordinates; each shard measures the coordinates that fall in its range, and
the sums of squares of all shards add up to the estimate of the whole vector's.

    >>> layout = Layout(10, servers=3, seed=0)
    >>> layout.bounds
    [(0, 4), (4, 7), (7, 10)]
    >>> [p.tolist() for p in layout.probes]
    [[0, 1, 2, 3], [0, 1, 2], [0, 1, 2]]
"""

from __future__ import annotations

import numpy as np

from dana.train.rules.codecs import part_bounds

#: The most coordinates on which the gap is measured.
GAP_PROBES = 16384


def shard_bounds(d: int, servers: int) -> list[tuple[int, int]]:
    """``servers`` contiguous ``[lo, hi)`` ranges covering ``range(d)``, sizes within one
    (the floor's :func:`~dana.train.rules.codecs.part_bounds`, which the simulator's codec
    also cuts a message by)."""
    return part_bounds(d, servers)


class Layout:
    """Shard bounds and, per shard, the local indices of the gap probes."""

    def __init__(self, d: int, servers: int, seed: int, probes: int = GAP_PROBES):
        self.d, self.servers = d, servers
        self.bounds = shard_bounds(d, servers)
        if d <= probes:
            sample = np.arange(d, dtype=np.int64)
        else:
            rng = np.random.default_rng([seed, 0x6761_70])
            sample = np.sort(rng.choice(d, size=probes, replace=False)).astype(np.int64)
        self.probes = [sample[(sample >= lo) & (sample < hi)] - lo for lo, hi in self.bounds]

    def split(self, vector: np.ndarray) -> list[np.ndarray]:
        """Views of ``vector``'s shards."""
        return [vector[lo:hi] for lo, hi in self.bounds]
