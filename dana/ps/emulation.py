"""A cluster model in real time: a Ray worker that computes, sends and leaves as modelled.

With ``--cluster`` and ``--time-scale S > 0`` on Ray, each worker lives the simulator's
cluster model (docs/ALGORITHMS.md, "The clock, exactly as simulated") on the wall
clock, one model millisecond lasting ``S`` seconds. Model time is ``(now - clock_zero)
/ S``, ``clock_zero`` the servers' start of training. The pieces are the simulator's
own, built per worker:

- **compute**: a computation of worker ``i`` starting at model time ``t`` on batch ``B``
  lasts :meth:`~dana.train.cluster.steptimes.StepTimes.duration` ``(i, t, B)`` (the compute
  model's draw, ``x`` the worker's factor, drift, slow episodes, class costs); the
  model's draws come from a generator seeded by ``(seed, worker, incarnation)`` (the
  simulator draws from one generator in event order: the same distribution, not the
  same numbers); a step that took longer for real is not padded;
- **transfers**: worker ``i``'s own link (:class:`~dana.train.cluster.network.Network`): a push
  is complete at the servers ``L_i + w_i`` after the computation ends (``w_i`` its
  message's bytes over the link's bandwidth), a pull is with the worker ``w_i + L_i``
  after the servers answered, the first pull request (and one after a return) takes
  ``L_i``. The worker sleeps to the push's modelled arrival and makes its real call
  then; the servers' answer counts as made at that instant, and the worker sleeps to
  its modelled arrival ``w_i + L_i`` later, so the real call's time (Ray, the relay, a
  busy machine) is taken out of the modelled transfer, as a real step's compute is
  taken out of its modelled duration (it adds only when it is longer). The servers' shared links (``server_bandwidth_gbps``, their FIFO queues) are
  **left out**: the workers' sleeps are independent, nothing here queues them;
- **departures** (:class:`~dana.train.cluster.availability.Availability`, its per-worker
  generators): a worker whose departure falls before its push is complete loses that
  computation (nothing is pushed: no sequence number taken), as does one whose
  departure falls while a pull is on its way; it then tells the run (``relay_member``:
  ``master.leave(i, lr)`` on every shard), resets its own rule state
  (``rule.leave``), and, if the spell has a return, sleeps until it, then ``rule.join``,
  ``relay_member`` (``master.join(i)``) and a fresh pull (after ``L_i``). A spell with no
  return ends the worker's loop: it is gone for good (so does the run's end while the
  worker is away: it asks every :data:`AWAY_POLL` s). Departures are checked when a
  computation ends and when a pull arrives (a worker waiting at the staleness bound's
  start gate leaves at its next check).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from dana.train.cluster.availability import Availability
from dana.train.cluster.network import Network
from dana.train.cluster.steptimes import StepTimes
from dana.train.config import TrainConfig
from dana.train.rules.members import capacity

#: Seconds between two questions of a worker away to the servers: is the run over?
AWAY_POLL = 0.5


class ClusterDelay:
    """Worker ``worker``'s emulated cluster (the module docstring gives the rule).

    Args: the run's config (with a resolved ``cluster`` and ``time_scale > 0``), the
    worker's index and incarnation, ``d`` and the bytes of one value, the training
    labels (for ``class_cost``), and ``clock_zero`` (seconds since the epoch at model
    time 0)."""

    def __init__(
        self,
        config: TrainConfig,
        worker: int,
        incarnation: int,
        d: int,
        value_bytes: int,
        labels: Any,
        clock_zero: float,
    ):
        cluster, k = config.cluster, capacity(config)
        self.worker, self.scale, self.clock_zero = worker, float(config.time_scale), clock_zero
        self.times = StepTimes(cluster["compute"], k, config.seed, labels)
        self.times.base.rng = np.random.Generator(
            np.random.PCG64([config.seed, worker, incarnation])
        )
        network = Network(cluster["network"], k, config.servers, d, value_bytes)
        self.latency = network.latency[worker]
        self.link = network.worker_ms[worker]  # one message over this worker's own link
        self.availability = Availability(cluster["availability"], k, config.seed)
        self.answered: float | None = None  # model ms the servers answered (modelled)
        self.leave_at: float | None = None  # model ms of the next departure
        self.rejoin_at: float | None = None
        self.away = self.returned = 0
        self._spell(self.now())

    def now(self) -> float:
        """Model time (ms)."""
        return (time.time() - self.clock_zero) / self.scale

    def _wall(self, t: float) -> float:
        return self.clock_zero + t * self.scale

    def _sleep_until(self, t: float) -> None:
        left = self._wall(t) - time.time()
        if left > 0:
            time.sleep(left)

    def _spell(self, now: float) -> None:
        spell = self.availability.next_spell(self.worker, now)
        self.leave_at, self.rejoin_at = (None, None) if spell is None else spell

    def _until(self, t: float) -> bool:
        """Sleep until model time ``t``, or until the departure if it comes first: True
        if the worker leaves (the work under way is lost)."""
        if self.leave_at is not None and self.leave_at <= t:
            self._sleep_until(self.leave_at)
            return True
        self._sleep_until(t)
        return False

    # -- the worker's hooks ---------------------------------------------------------------
    def request(self) -> None:
        """A pull request on its way (the first one, one after a return): ``L_i``; the
        servers answer when it is there."""
        time.sleep(self.latency * self.scale)
        self.answered = self.now()

    def received(self) -> bool:
        """Parameters answered at the modelled moment (the request's or the push's
        arrival; else now) have reached the worker ``w_i + L_i`` later: sleep until
        then (the real call's time counts as part of it). True: the worker left
        meanwhile."""
        answered = self.now() if self.answered is None else self.answered
        self.answered = None
        return self._until(answered + self.link + self.latency)

    def pad(self, started: float, batch: Any = None) -> bool:
        """A computation that began at ``started`` (``time.perf_counter()``) on ``batch``
        has ended for real: sleep to its modelled end and its push's arrival. True: the
        worker left first (the computation is lost)."""
        elapsed = time.perf_counter() - started
        start = self.now() - elapsed / self.scale
        end = start + self.times.duration(self.worker, start, batch)
        self.answered = max(end, self.now()) + self.latency + self.link
        return self._until(self.answered)

    def depart(self, over: Callable[[], bool] = lambda: False) -> bool:
        """The worker has left (and told the run): sleep until its return; True if it
        returns (draw its next spell then), False if it is gone for good or the run
        ended meanwhile (``over()``, asked every :data:`AWAY_POLL` s while away)."""
        self.away += 1
        if self.rejoin_at is None:
            return False
        while (left := self._wall(self.rejoin_at) - time.time()) > 0:
            time.sleep(min(left, AWAY_POLL))
            if over():
                return False
        self.returned += 1
        self._spell(self.rejoin_at)
        return True
