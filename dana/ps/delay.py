"""Emulated step times: make one machine behave like a slower or heterogeneous cluster.

With ``time_scale > 0`` (``dana train --backend ray --time-scale S``) every worker step
is padded with a sleep so that it lasts at least ``duration * S`` seconds, where
``duration`` is drawn from the run's timing model (``--timing``, the simulator's models
and parameters): ``--timing heterogeneous --time-scale 0.001`` reads the model's numbers
as milliseconds (mean step 128 ms, workers' speeds spread by 30%). A step that already
took longer (the gradient itself, or a busy machine) is not padded. ``time_scale = 0``
(the default) adds no delay: the workers run at their real speed and ``--timing`` has no
effect on a Ray run.

Each worker builds the whole model (so that ``heterogeneous`` gives every worker the
same per-worker mean as in the simulator with the same seed), then draws its own
durations from a generator seeded by ``(seed, worker, incarnation)``. The same model
gives a worker its speed relative to the fastest (:func:`worker_speed`), for a rule
that sizes its work by it (Dynamic Local Updates).
"""

from __future__ import annotations

import time

import numpy as np

from dana.train.cluster.timing import build_timing, relative_speeds
from dana.train.config import TrainConfig


def worker_speed(config: TrainConfig, worker: int) -> float:
    """Worker ``worker``'s emulated speed relative to the fastest worker's, from the
    whole timing model (the simulator's numbers with the same seed); needs
    ``time_scale > 0`` (without emulation a worker does not know the others' speeds)."""
    if config.time_scale <= 0:
        raise ValueError("a worker's relative speed is only known with time_scale > 0")
    model = build_timing(config.timing, config.workers, config.seed, **config.timing_params)
    return relative_speeds(model)[worker]


class StepDelay:
    def __init__(self, config: TrainConfig, worker: int, incarnation: int):
        self.worker, self.scale = worker, float(config.time_scale)
        self.model = build_timing(
            config.timing, config.workers, config.seed, **config.timing_params
        )
        self.model.rng = np.random.Generator(np.random.PCG64([config.seed, worker, incarnation]))

    def pad(self, started: float, batch: object = None) -> bool:
        """Sleep until ``started`` (a ``time.perf_counter()``) plus this step's duration;
        False (no departure: :class:`~dana.ps.emulation.ClusterDelay` has them)."""
        left = self.model.sample(self.worker) * self.scale - (time.perf_counter() - started)
        if left > 0:
            time.sleep(left)
        return False
