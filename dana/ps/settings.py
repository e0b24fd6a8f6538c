"""What the server shards are built from: the few values of the run's configuration each
one needs, its parameters and its points.

The servers never see the :class:`~dana.train.config.TrainConfig`: the driver reads it
here once (:func:`server_settings`), and each shard is built, and rebuilt after a fault,
from the same arguments (:func:`server_args`), which Ray pickles for the actor.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dana.algorithms.base import Algorithm
from dana.ps.layout import Layout, shard_bounds
from dana.train.config import TrainConfig
from dana.train.rules.gate import bounds_staleness
from dana.train.rules.members import capacity, parse_grow_at
from dana.train.training import build_schedule

#: What a server is built from: its positional and keyword arguments.
ServerArgs = tuple[tuple[Any, ...], dict[str, Any]]


def server_settings(
    config: TrainConfig, d: int, batches_per_epoch: int, algorithm: Algorithm | None = None
) -> list[dict[str, Any]]:
    """Per shard, the keyword arguments of its server that ``config`` sets
    (:class:`~dana.ps.shard.ShardServer`'s; shard 0's also
    :class:`~dana.ps.head.HeadServer`'s): the run's algorithm (``None``: built from
    ``config``), its learning-rate schedule, its workers (``k`` at the start, ``k_max``
    at most), the growth it admits (``--grow-at``), the shard's gap probes
    (:class:`~dana.ps.layout.Layout`); for shard 0 the staleness bound (None: no gate)
    and its relay's timeout and log bytes."""
    if algorithm is None:
        algorithm = config.build_algorithm()
    common = dict(
        algorithm=algorithm,
        schedule=build_schedule(config, batches_per_epoch),
        workers=config.workers,
        k_max=capacity(config),
        batches_per_epoch=batches_per_epoch,
        grow=[] if algorithm.synchronous else parse_grow_at(config.grow_at),
    )
    probes = Layout(d, config.servers, config.seed).probes
    settings = [dict(common, probes=probe) for probe in probes]
    bounded = bounds_staleness(config.max_staleness, algorithm.synchronous)
    settings[0].update(
        bound=config.max_staleness if bounded else None,
        timeout=config.server_timeout,
        log_bytes=config.relay_log_bytes,
    )
    return settings


def server_args(
    config: TrainConfig,
    algorithm: Algorithm,
    initial: np.ndarray,
    batches_per_epoch: int,
    *,
    end: int | None,
    evals: set[int],
    checkpoints: set[int],
    states: list[dict[str, Any]] | None,
) -> list[ServerArgs]:
    """Per shard, what its server is built from: its slice of the ``initial`` parameters,
    its :func:`server_settings`, the run's ``end`` (None: the driver ends it), its
    evaluation and checkpoint points, and its checkpointed state (``states``; None: a
    fresh run)."""
    d = len(initial)
    settings = server_settings(config, d, batches_per_epoch, algorithm)
    return [
        (
            (initial[lo:hi],),
            dict(
                settings[s],
                end=end,
                evals=sorted(evals),
                checkpoints=sorted(checkpoints),
                state=None if states is None else states[s],
            ),
        )
        for s, (lo, hi) in enumerate(shard_bounds(d, config.servers))
    ]
