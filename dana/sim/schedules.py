"""The order of the simulator's events: a :class:`Schedule` drives a
:class:`~dana.sim.simulator.Simulator` through its public events.

- :class:`Free`: asynchronous workers, no bound. A priority queue of finish times (ties
  by worker index); the worker whose computation ends first pushes, pulls at once and
  starts its next computation on its next batch.
- :class:`Rounds`: a synchronous algorithm (``ssgd``, ``diloco``). All ``k`` workers
  pull the same parameters; a round costs the slowest worker's computations (one each,
  or a rule's ``H`` local steps and its push).
- :class:`Bounded`: :class:`Free` under a staleness bound (:mod:`dana.sim.bound`). A push
  the bound refuses is held; after each applied push, held pushes are retried in the
  order they were held, then idle workers start in the order they began to wait.
  Waiting takes simulated time: a worker resumes at the time of the push that frees it.
- :class:`dana.sim.clock.Clock`: a cluster's network, drift and departures.

A new driver is one more class with these methods. Runs packed into one process
(``dana sweep --pack``) each keep their own schedule; the pack reads each one's
:meth:`Schedule.due` (:class:`dana.sim.compute.Pack`).
"""

from __future__ import annotations

import heapq
from typing import Any, Protocol

from torch import Tensor

from dana.sim.clock import Clock
from dana.sim.events import Events, Work
from dana.train.cluster.model import check_workers, is_trivial, resolve_cluster, timing_of
from dana.train.cluster.timing import TimingModel, build_timing


class Schedule(Protocol):
    """What the simulator needs of an order of events."""

    def start(self) -> None:
        """Start every worker (at simulated time 0)."""

    def step(self) -> None:
        """Process the next event: a push, a round or a cluster's event."""

    def due(self, i: int, size: int) -> list[int]:
        """Up to ``size`` workers whose gradients come next after worker ``i``'s (the
        engines' look-ahead: :mod:`dana.sim.compute`); ``i = -1``, between steps: the
        next workers due (a pack's look-ahead into the other runs). Each listed worker's
        parameters and batch must stay as they are until its gradient is taken."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def counters(self) -> dict[str, Any]:
        """What a run's summary reports of the schedule."""


class Free:
    """Asynchronous workers without a bound (the module docstring)."""

    def __init__(self, sim: Events, timing: TimingModel):
        self.sim, self.timing = sim, timing
        self.queue: list[tuple[float, int]] = []  # (finish time, worker)

    def start(self) -> None:
        for i in range(self.sim.k):
            self.sim.pull(i)
            heapq.heappush(self.queue, (self.timing.sample(i), i))

    def step(self) -> None:
        sim = self.sim
        finish, i = heapq.heappop(self.queue)
        sim.sim_time = finish
        if sim.push(i):
            sim.pull(i)
        else:  # a local step: compute again, without pulling
            sim.advance(i)
        heapq.heappush(self.queue, (finish + self.timing.sample(i), i))

    def due(self, i: int, size: int) -> list[int]:
        return [j for _, j in heapq.nsmallest(size, self.queue)]

    def state_dict(self) -> dict[str, Any]:
        return {"queue": [[t, i] for t, i in self.queue]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.queue = [(float(t), int(i)) for t, i in state["queue"]]
        heapq.heapify(self.queue)

    def counters(self) -> dict[str, Any]:
        return {}


class Rounds(Free):
    """Synchronous rounds (the module docstring). Within a round the workers' computations
    end in time order (the queue), each local step on a worker's next batch; the round's
    pushes are applied in worker order when its slowest worker is done."""

    def start(self) -> None:
        for i in range(self.sim.k):
            self.sim.pull(i)

    def step(self) -> None:
        sim, k = self.sim, self.sim.k
        self.queue = [(sim.sim_time + self.timing.sample(i), i) for i in range(k)]
        heapq.heapify(self.queue)
        works: list[Work | None] = [None] * k
        end = sim.sim_time
        while self.queue:
            finish, i = heapq.heappop(self.queue)
            work = sim.compute(i)
            if work is None:  # a local step: the next one on the next batch
                sim.advance(i)
                heapq.heappush(self.queue, (finish + self.timing.sample(i), i))
                continue
            works[i] = work
            end = max(end, finish)
        sim.sim_time = end
        for i, work in enumerate(works):
            sim.push(i, work)
        for i in range(k):
            sim.pull(i)


class Bounded(Free):
    """Asynchronous workers under a staleness bound (the module docstring)."""

    def start(self) -> None:
        for i in range(self.sim.k):
            self.sim.bound.gate.queue(i, 0.0)
            self._start(self.sim.bound.release(self.sim))

    def step(self) -> None:
        sim, bound = self.sim, self.sim.bound
        finish, i = heapq.heappop(self.queue)
        sim.sim_time = finish
        if bound.gate.allows_push(i, sim.updates):
            pushed = sim.push(i)
        else:
            work = sim.compute(i)
            if work is not None:  # (a local step is never held: its worker stays in flight)
                sim.hold(i, work, finish)
                return
            pushed = False
        if not pushed:  # a local step: compute again, without pulling
            sim.advance(i)
            heapq.heappush(self.queue, (finish + self.timing.sample(i), i))
            return
        bound.pushed(i, finish)
        self._start(bound.release(sim))

    def _start(self, workers: list[int]) -> None:
        for i in workers:
            self.sim.pull(i)
            heapq.heappush(self.queue, (self.sim.sim_time + self.timing.sample(i), i))


def choose(
    sim: Events,
    timing: TimingModel | str,
    timing_params: dict[str, Any] | None,
    seed: int,
    cluster: dict[str, Any] | str | None,
    always_clock: bool,
    servers: int,
    labels: Any,
    params: Tensor,
) -> tuple[Schedule, TimingModel, Any]:
    """The simulator's schedule, its timing model and what its workers' speeds are read
    from (:func:`~dana.train.cluster.timing.relative_speeds`): the cluster's clock when a cluster
    is given (and not trivial, unless ``always_clock``), else :class:`Rounds` for a
    synchronous algorithm, :class:`Bounded` under a bound, :class:`Free` otherwise. A
    cluster's compute model replaces ``timing``, which must then be a name."""
    if cluster is not None:
        if not isinstance(timing, str):
            raise ValueError(
                "with a cluster, name the timing model (timing='gamma', ...); the "
                "cluster's compute section replaces it"
            )
        cluster = resolve_cluster(cluster, timing, timing_params)
        check_workers(cluster, sim.k)
        if always_clock or not is_trivial(cluster):
            clock = Clock(sim, cluster, servers, seed, labels, params)
            return clock, clock.times.base, clock.times
        timing, timing_params = timing_of(cluster)
    if isinstance(timing, str):
        timing = build_timing(timing, sim.k, seed, **(timing_params or {}))
    if sim.synchronous:
        return Rounds(sim, timing), timing, timing
    return (Bounded if sim.bound is not None else Free)(sim, timing), timing, timing
