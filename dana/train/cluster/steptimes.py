"""Each computation's duration on a cluster: the compute model's draw, then its factors.

The duration of a computation of worker ``i`` that starts at simulated time ``t`` (ms)
on a batch of examples ``B`` is, multiplied in this order (a factor that is not set is
not applied):

1. ``T``: the compute model's draw for worker ``i``
   (:class:`~dana.train.cluster.timing.TimingModel`, drawn from its generator in event order);
2. ``x f_i``: the worker's factor, ``worker_factors[i % n]`` (a slow machine: 2);
3. ``x (1 + a sin(2 pi (t/P + i/k)))``: periodic drift of amplitude ``a`` and period
   ``P`` ms, each worker's phase shifted by ``i/k`` of a period;
4. ``x s`` while worker ``i`` is in a slow episode at ``t``: each worker's episodes
   start after gaps ``~ Exp(every_ms)`` and last ``~ Exp(length_ms)``, drawn from a
   generator of the worker's own (so they do not depend on the order of events);
5. ``x mean_{e in B} c_{y_e}``: the batch's cost, the mean of the per-class cost
   factors ``class_cost`` over its examples' labels (a data-dependent step time: a
   class whose examples cost more makes its batches slower).

Factors 3 and 4 are read once, at the start of the computation. With none of 2 to 5 the
duration is the model's draw, bit for bit.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from dana.errors import ConfigError
from dana.train.cluster.model import cycled, timing_of
from dana.train.cluster.timing import build_timing

#: Salts of the generators of slow episodes and availability (per worker), so that they
#: draw apart from the compute model's generator and from each other.
EPISODES_SALT, AVAILABILITY_SALT = 0x510E, 0xA7A1


def worker_generator(seed: int, salt: int, worker: int) -> np.random.Generator:
    """The generator of worker ``worker``'s draws of one kind (``salt``)."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, salt, worker])))


class SlowEpisodes:
    """Each worker's slow episodes: gaps ``~ Exp(every)``, lengths ``~ Exp(length)``."""

    def __init__(self, every: float, length: float, factor: float, workers: int, seed: int):
        self.every, self.length, self.slow = every, length, factor
        self.rngs = [worker_generator(seed, EPISODES_SALT, i) for i in range(workers)]
        self.spells = [self._draw(i, 0.0) for i in range(workers)]

    def _draw(self, worker: int, after: float) -> tuple[float, float]:
        rng = self.rngs[worker]
        start = after + float(rng.exponential(self.every))
        return start, start + float(rng.exponential(self.length))

    def factor(self, worker: int, t: float) -> float:
        """``slow`` if ``worker`` is in an episode at ``t``, else 1 (``t`` never
        decreases for one worker: its computations follow each other)."""
        start, end = self.spells[worker]
        while end <= t:
            start, end = self.spells[worker] = self._draw(worker, end)
        return self.slow if start <= t else 1.0

    def state_dict(self) -> dict[str, Any]:
        return {
            "rngs": [r.bit_generator.state for r in self.rngs],
            "spells": [list(s) for s in self.spells],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for rng, s in zip(self.rngs, state["rngs"]):
            rng.bit_generator.state = s
        self.spells = [(float(a), float(b)) for a, b in state["spells"]]


class StepTimes:
    """The durations of a cluster's computations (the module docstring gives the rule).

    ``compute``: a resolved cluster's compute section (:mod:`dana.train.cluster.model`);
    ``labels``: the training set's labels (needed by ``class_cost``)."""

    def __init__(
        self,
        compute: dict[str, Any],
        workers: int,
        seed: int = 0,
        labels: np.ndarray | torch.Tensor | None = None,
    ):
        self.workers = workers
        model, params = timing_of({"compute": compute})
        self.base = build_timing(model, workers, seed, **params)
        factors = [float(cycled(compute["worker_factors"], i)) for i in range(workers)]
        self.factors = factors if any(f != 1 for f in factors) else None
        self.periodic = compute["periodic"]
        episodes = compute["slow_episodes"]
        self.episodes = (
            SlowEpisodes(
                episodes["every_ms"], episodes["length_ms"], episodes["factor"], workers, seed
            )
            if episodes
            else None
        )
        self.example_cost = None
        if compute["class_cost"] is not None:
            self.example_cost = example_costs(compute["class_cost"], labels)

    def duration(self, worker: int, start: float, batch: Any) -> float:
        """The duration of ``worker``'s computation starting at ``start`` on ``batch``."""
        t = self.base.sample(worker)
        if self.factors is not None:
            t *= self.factors[worker]
        if self.periodic is not None:
            phase = start / self.periodic["period_ms"] + worker / self.workers
            t *= 1.0 + self.periodic["amplitude"] * math.sin(2.0 * math.pi * phase)
        if self.episodes is not None:
            t *= self.episodes.factor(worker, start)
        if self.example_cost is not None:
            rows = batch[0] if isinstance(batch, tuple) else batch
            t *= float(
                self.example_cost[np.asarray(rows.cpu() if torch.is_tensor(rows) else rows)].mean()
            )
        return t

    def mean_time(self, worker: int) -> float:
        """The worker's mean step time before drift and data costs: the model's mean
        times its factor (what Dynamic Local Updates read)."""
        mean = self.base.mean_time(worker)
        return mean * self.factors[worker] if self.factors is not None else mean

    def state_dict(self) -> dict[str, Any]:
        """The state beyond the compute model's (saved as the simulator's ``timing``)."""
        return {"episodes": self.episodes.state_dict()} if self.episodes is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.episodes is not None:
            self.episodes.load_state_dict(state["episodes"])


def example_costs(class_cost: list[float], labels: Any) -> np.ndarray:
    """Each training example's cost factor: ``class_cost[label]``."""
    if labels is None:
        raise ConfigError(
            "the cluster's compute.class_cost needs the training labels: give the simulator "
            "labels= (dana train and dana.simulate do)"
        )
    labels = np.asarray(labels.cpu() if torch.is_tensor(labels) else labels).astype(np.int64)
    classes = int(labels.max()) + 1 if len(labels) else 0
    if len(class_cost) < classes:
        raise ConfigError(
            f"the cluster's compute.class_cost gives {len(class_cost)} factors, but the "
            f"training labels go up to {classes - 1}: give one factor per class ({classes})"
        )
    return np.asarray(class_cost, dtype=np.float64)[labels]
