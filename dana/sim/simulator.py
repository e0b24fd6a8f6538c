"""The event-driven simulator: ``k`` asynchronous workers on one machine, exactly.

Every gradient computation takes a random time drawn from a timing model. The master
processes pushes in the order they finish (a priority queue of finish times, ties broken
by worker index); a worker that pushed pulls at once and starts its next computation on
the next batch of the shared stream. A gradient is computed when its push is processed,
at the parameters the worker pulled (kept in one ``(k, d)`` tensor), so the result is
exactly that of real asynchronous workers with those timings. A synchronous algorithm
(``ssgd``) runs in rounds: all ``k`` workers pull the same parameters, and a round costs
the slowest of its ``k`` computations.

For every push the simulator records the worker, the staleness (master updates between
its pull and this push), the gap ``RMS(theta_now - p_i)`` against the master's true
parameters (rebuilt from the workers' momenta for ``dana-slim``), the loss, the learning
rate and the simulated time. The same seed gives the same run, bit for bit on the CPU.

Bounded staleness (``max_staleness=s``, stale synchronous parallel): the simulator drives
the floor's :class:`~dana.train.gate.StalenessGate` (its start and push gates; the rule
is in :mod:`dana.train.gate`) with simulated time, counting every push as an update.
After each applied push, held pushes are retried in the order they were held, then idle
workers start in the order they began to wait. Waiting takes simulated time: a worker
held or idle resumes at the time of the push that frees it; ``wait_time`` sums these
waits over workers and ``waits`` counts them. A held worker's gradient is computed when
it finishes; its message (which may update the worker's own state, as ``dana-slim``'s
momentum) is made when its push is applied, as a master that keeps the momenta
(``dana-zero``) updates them then, so that the rebuilt ``theta`` of ``dana-slim`` never
counts a push the master has not applied. A rule that takes local steps makes its
message when the worker finishes (the message says whether it pushes at all). Staleness
and gap are logged when the push is applied.
Every push counts as an update in the gates (exact for every asynchronous rule). With
``s = 0`` one worker computes at a time; a synchronous algorithm (``ssgd``) runs in
rounds whose staleness is 0 (its barrier is the ``s = 0`` of an averaging master) and
ignores the bound. ``max_staleness=None`` (the default) never waits.

A cluster (``cluster=``, :mod:`dana.train.cluster`; docs/ALGORITHMS.md, "The clock,
exactly as simulated") puts the network, drift, data-dependent step times and workers
that leave and join into the clock: the simulator then runs the event loop of
:class:`dana.sim.clock.Clock` (pulls and pushes cross the links and queue at the
servers; a departed worker's computation is lost and the rules are told,
``leave``/``join``). A cluster without any of these (:func:`~dana.train.cluster.is_trivial`)
runs the loop above, bit for bit today's. With per-worker streams of batches
(:class:`~dana.train.batches.WorkerBatches`, ``--partition``) each worker draws from its
own part of the data; with ``labels`` the simulator counts each class's examples behind
the applied pushes (:class:`~dana.train.classmeter.ClassMeter`).

A codec of the pushes (``compress=``, :mod:`dana.train.codecs`): each message, once
made, is cut into the ``servers`` shards' parts, each encoded and decoded as the Ray
runtime's workers and shards do, and the master applies the decoded message; with
error feedback (``topk``) each worker's residual is part of the state. On a cluster a
push then carries its payload's bytes.

Batched and threaded gradients (``batch_workers=B``, ``threads=N``, with a ``source``):
an engine of :mod:`dana.sim.compute` computes the due worker's gradient together with
those of the next in-flight workers (:meth:`Simulator._due`), ahead of their pushes,
which are then processed exactly as above. On a device (``params`` on a GPU) the rules'
state and the simulator's buffers live there too.

Example::

    >>> import torch, dana
    >>> from dana.sim import Simulator
    >>> from dana.train.batches import BatchStream
    >>> A = torch.randn(64, 5, generator=torch.Generator().manual_seed(0))
    >>> def gradient(p, rows):  # least squares 0.5*|A p - 1|^2 / n on a batch of rows
    ...     r = A[rows] @ p - 1
    ...     return A[rows].T @ r / len(rows), 0.5 * float(r @ r) / len(rows)
    >>> sim = Simulator(dana.algorithms.build("dana-slim"), torch.zeros(5), gradient,
    ...                 BatchStream(64, 8), workers=4, lr=0.05, timing="gamma")
    >>> sim.run(pushes=400)
    >>> sim.log.loss[-1] < sim.log.loss[0]
    True
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from dana.algorithms.base import Algorithm, check_workers, move_tensors, per_worker_zeros
from dana.sim.clock import Clock
from dana.sim.compute import build_engine
from dana.train.batches import BatchStream
from dana.train.classmeter import ClassMeter
from dana.train.cluster import check_workers as check_cluster_workers
from dana.train.cluster import is_trivial, resolve_cluster, timing_of
from dana.train.codecs import Wire, build_codec
from dana.train.gate import StalenessGate, bounds_staleness
from dana.train.pushlog import PushLog
from dana.train.schedule import schedule_epoch
from dana.train.stacked import GradientSource
from dana.train.step import GradientFn, WorkerStep
from dana.train.timing import TimingModel, build_timing, relative_speeds


class Simulator:
    """Drive an algorithm's master and worker rules with ``k`` simulated workers.

    Args:
        algorithm: the algorithm (``dana.algorithms.build(name, ...)``).
        params: the initial flat parameter vector (its dtype is the simulation's).
        gradient: ``gradient(params, batch) -> (grad, loss)``, the gradient of the loss
            (without weight decay) at ``params`` on ``batch``.
        batches: the shared stream of batches (anything with ``next()``,
            ``batches_per_epoch``, ``state_dict()`` and ``load_state_dict()``).
        workers: ``k``.
        lr: the learning rate: a number, or a function of the fractional epoch
            (:class:`dana.train.schedule.LRSchedule`).
        weight_decay: added to every gradient at the point it is computed.
        timing: a timing model or its name (``constant``, ``gamma``,
            ``heterogeneous``, ``trace``), built with ``timing_params`` and ``seed``.
        measure_gap: record the gap of every push (O(d) per push).
        max_staleness: bound every push's staleness by this (see the module docstring);
            ``None``: no bound.
        batch_workers: compute the gradients of up to this many in-flight workers in
            one vectorised call (:mod:`dana.sim.compute`); needs ``source``.
        threads: compute up to this many in-flight gradients at once on as many
            threads (when ``batch_workers`` is 1); needs ``source``.
        source: the model, loss and data (:class:`dana.train.stacked.GradientSource`)
            the batched and threaded engines compute with; ``gradient`` is then used
            by neither.
        cluster: a cluster model (a preset name, a file, or a mapping:
            :mod:`dana.train.cluster`); its compute model replaces ``timing`` (which is
            then given by name). ``None``: today's clock, ``timing`` alone.
        servers: the parameter-server shards whose links carry the messages (and whose
            parts of a message a codec encodes one by one).
        compress: the codec of the pushes (``none``, ``fp16``, ``bf16``, ``int8``,
            ``topk:F``: :func:`dana.train.codecs.build_codec`).
        always_clock: run a cluster's event loop even when the cluster is trivial
            (:func:`~dana.train.cluster.is_trivial`), to check that it then gives the
            loop without a cluster bit for bit.
        labels: the training examples' labels: the simulator then counts the classes
            behind the applied pushes (``meter``), and a cluster's ``class_cost`` needs
            them.
    """

    def __init__(
        self,
        algorithm: Algorithm,
        params: Tensor,
        gradient: GradientFn,
        batches: BatchStream,
        workers: int,
        *,
        lr: float | Callable[[float], float] = 0.1,
        weight_decay: float = 0.0,
        timing: TimingModel | str = "constant",
        timing_params: dict[str, Any] | None = None,
        seed: int = 0,
        measure_gap: bool = True,
        max_staleness: int | None = None,
        batch_workers: int = 1,
        threads: int = 1,
        source: GradientSource | None = None,
        cluster: dict[str, Any] | str | None = None,
        servers: int = 1,
        labels: Any = None,
        always_clock: bool = False,
        compress: str = "none",
    ):
        self.algorithm = algorithm
        self.k = check_workers(workers)
        if cluster is not None:
            if not isinstance(timing, str):
                raise ValueError(
                    "with a cluster, name the timing model (timing='gamma', ...); the "
                    "cluster's compute section replaces it"
                )
            cluster = resolve_cluster(cluster, timing, timing_params)
            check_cluster_workers(cluster, self.k)
            timing, timing_params = timing_of(cluster)
        self.cluster = cluster
        codec = build_codec(compress, "compress")
        self.wire = (
            None
            if codec.name == "none"
            else Wire(codec, self.k, params.numel(), servers, params.dtype, params.device)
        )
        if not weight_decay >= 0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay!r}")
        self.schedule = lr if callable(lr) else _constant(lr)
        self.weight_decay = float(weight_decay)
        self.gradient = gradient
        self.batches = batches
        self.per_worker_batches = bool(getattr(batches, "per_worker", False))
        self.clock: Clock | None = None
        if cluster is not None and (always_clock or not is_trivial(cluster)):
            self.clock = Clock(self, cluster, servers, seed, labels, params)
            self.timing = self.clock.times.base
        else:
            self.timing = (
                build_timing(timing, self.k, seed, **(timing_params or {}))
                if isinstance(timing, str)
                else timing
            )
        self.measure_gap = measure_gap
        self.synchronous = algorithm.synchronous
        if max_staleness is not None and (
            isinstance(max_staleness, bool)
            or not isinstance(max_staleness, int)
            or max_staleness < 0
        ):
            raise ValueError(
                f"max_staleness must be an integer >= 0 or None, got {max_staleness!r}"
            )
        self.max_staleness = max_staleness
        self.bounded = bounds_staleness(max_staleness, self.synchronous)
        self.gate = StalenessGate(max_staleness) if self.bounded else None
        # Held pushes, in the order they were held: (worker, gradient or message, loss,
        # since, whether it is the message).
        self.held: list[tuple[int, Tensor, float, float, bool]] = []

        d = params.numel()
        self.master = algorithm.master(params, self.k)
        self.worker_rule = algorithm.worker(self.k, d, params.dtype)
        if algorithm.uses_speed:  # Dynamic Local Updates: the timing model's mean speeds
            times = self.clock.times if self.clock is not None else self.timing
            for i, speed in enumerate(relative_speeds(times)):
                self.worker_rule.set_speed(i, speed)
        if params.device.type != "cpu":
            move_tensors(self.master, params.device)
            move_tensors(self.worker_rule, params.device)
        self.worker_step = WorkerStep(self.worker_rule, gradient, weight_decay)
        self.engine = build_engine(self.worker_step, source, batch_workers, threads)
        # the parameters each worker computes at
        self.sent = per_worker_zeros(self.k, d, params.dtype, params.device)
        self._diff = params.new_empty(d)
        self.pulled_at = [0] * self.k  # master updates at each worker's last pull
        self.batch: list[Any] = [None] * self.k
        self.queue: list[tuple[float, int]] = []  # (finish time, worker)
        self.updates = 0  # master updates applied
        self.steps = 0  # gradient computations processed
        self.pushes = 0  # messages pushed to the master
        self.sim_time = 0.0
        self.log = PushLog()
        # pulled and not yet pushed: a departure loses the computation
        self.outstanding = [False] * self.k
        self.meter = ClassMeter(labels, self.k) if labels is not None else None
        if self.clock is not None:
            self.clock.start()
            return
        for i in range(self.k):
            if self.gate is not None:
                self.gate.queue(i, 0.0)
                self._release()
                continue
            self._pull(i)
            if not self.synchronous:
                heapq.heappush(self.queue, (self.timing.sample(i), i))

    @property
    def wait_time(self) -> float:
        """Simulated time workers spent waiting for the staleness bound (summed)."""
        return self.gate.wait_time if self.gate is not None else 0.0

    @property
    def waits(self) -> int:
        return self.gate.waits if self.gate is not None else 0

    @property
    def inflight(self) -> list[int]:
        """Bounded staleness: the workers pulled and not yet pushed, oldest pull first."""
        return self.gate.inflight if self.gate is not None else []

    @property
    def epoch(self) -> float:
        """Epochs of data consumed by the gradient computations processed so far."""
        return self.steps / self.batches.batches_per_epoch

    def lr(self) -> float:
        """The rate of the next update (``ssgd``: of the round under way; see
        :func:`~dana.train.schedule.schedule_epoch`)."""
        return self.schedule(
            schedule_epoch(
                self.steps,
                self.updates,
                self.k,
                self.batches.batches_per_epoch,
                self.synchronous,
            )
        )

    def params(self) -> Tensor:
        """The master's parameters to evaluate."""
        return self.master.params()

    @property
    def lost(self) -> int:
        """Computations lost to departures (a cluster's availability)."""
        return self.clock.lost if self.clock is not None else 0

    def step(self) -> None:
        """Process the next push (or, for a synchronous algorithm, the next round; on a
        cluster, the next event of :class:`~dana.sim.clock.Clock`)."""
        if self.clock is not None:
            return self.clock.step()
        if self.bounded:
            return self._step_bounded()
        if self.synchronous:
            self.sim_time += max(self.timing.sample(i) for i in range(self.k))
            for i in range(self.k):
                self._push(i)
            for i in range(self.k):
                self._pull(i)
            return
        finish, i = heapq.heappop(self.queue)
        self.sim_time = finish
        if self._push(i):
            self._pull(i)
        else:
            self.batch[i] = self._next_batch(i)
        heapq.heappush(self.queue, (finish + self.timing.sample(i), i))

    def run(
        self,
        pushes: int | None = None,
        epochs: float | None = None,
        callback: Callable[[Simulator], bool | None] | None = None,
    ) -> None:
        """Step until ``pushes`` gradient computations (or ``epochs`` epochs) are processed.

        ``callback(sim)`` runs after every step; returning True stops the run.
        """
        if (pushes is None) == (epochs is None):
            raise ValueError("give exactly one of pushes= or epochs=")
        if pushes is None:
            pushes = round(epochs * self.batches.batches_per_epoch)
        while self.steps < pushes:
            self.step()
            if callback is not None and callback(self):
                break

    def _gradient(self, i: int) -> tuple[Tensor, float]:
        """Worker ``i``'s gradient (weight decay included) on its batch, and the loss."""
        if self.engine is None:
            return self.worker_step.gradient(i, self.sent[i], self.batch[i])
        return self.engine.gradient(i, self.sent.__getitem__, self.batch.__getitem__, self._due)

    def _due(self, i: int) -> list[int]:
        """The workers whose gradients come after worker ``i``'s, in that order: the
        rest of a synchronous round, else the queue by finish time."""
        size = self.engine.lookahead if self.engine is not None else 1
        if self.clock is not None:
            return self.clock.due(i, size)
        if self.synchronous and not self.bounded:
            return list(range(i + 1, self.k))
        return [j for _, j in heapq.nsmallest(size, self.queue)]

    def _next_batch(self, i: int) -> Any:
        """Worker ``i``'s next batch: of the shared stream, or of its own."""
        return self.batches.next_for(i) if self.per_worker_batches else self.batches.next()

    def _message(self, i: int, grad: Tensor, lr: float) -> Tensor | None:
        """Worker ``i``'s message for ``grad``, made at ``lr`` (``None``: a local step), as
        the master receives it (through the codec, if any)."""
        message = self.worker_step.message(i, grad, lr)
        if message is None or self.wire is None:
            return message
        return self.wire.round_trip(i, message)

    def _push(self, i: int) -> bool:
        """Compute worker ``i``'s gradient and push its message; False for a local step."""
        grad, loss = self._gradient(i)
        lr = self.lr()
        gap = self._gap(i, lr) if self.measure_gap else math.nan
        staleness = self.updates - self.pulled_at[i]
        message = self._message(i, grad, lr)
        self.steps += 1
        if self.meter is not None:
            self.meter.computed(i, self.batch[i])
        if message is None:
            return False
        applied = self.master.push(i, message, lr)
        if applied:
            self.updates += 1
        self.pushes += 1
        self.log.append(
            worker=i, staleness=staleness, gap=gap, loss=loss, lr=lr, sim_time=self.sim_time
        )
        self._pushed(i, applied)
        return True

    def _pushed(self, i: int, applied: bool) -> None:
        """Worker ``i``'s push arrived: its computation is in the master's parameters if
        the rule ``applied`` it (a dropped push, Ringmaster's, counts for no class)."""
        self.outstanding[i] = False
        if self.meter is not None:
            if applied:
                self.meter.applied(i)
            else:
                self.meter.lost(i)

    # -- bounded staleness (the gate: dana.train.gate) -----------------------------------
    def _step_bounded(self) -> None:
        finish, i = heapq.heappop(self.queue)
        self.sim_time = finish
        if self.gate.allows_push(i, self.updates):
            pushed = self._push(i)
        else:
            held = self._compute(i)
            pushed = held is not None
            if pushed:  # (a local step is never held: its worker stays in flight)
                tensor, loss, is_message = held
                self.gate.hold(i, finish)
                self.held.append((i, tensor, loss, finish, is_message))
                return
        if not pushed:  # a local step: compute again, without pulling
            self.batch[i] = self._next_batch(i)
            heapq.heappush(self.queue, (finish + self.timing.sample(i), i))
            return
        self.gate.pushed(i)
        self.gate.queue(i, finish)
        self._release()

    def _release(self, start: Callable[[int], None] | None = None) -> None:
        """Apply the held pushes the bound now allows, in the order they were held, then
        start the waiting workers (``start(i)``: its pull; by default now, its
        computation queued)."""
        released = True
        while released:
            released = False
            for n, (i, held, loss, _, is_message) in enumerate(self.held):
                if self.gate.allows_push(i, self.updates):
                    del self.held[n]
                    self.gate.resume(i, self.sim_time)
                    self._apply(i, held, loss, is_message)
                    self.gate.pushed(i)
                    self.gate.queue(i, self.sim_time)
                    released = True
                    break
        for i in self.gate.release(self.updates, self.sim_time):
            if start is not None:
                start(i)
                continue
            self._pull(i)
            heapq.heappush(self.queue, (self.sim_time + self.timing.sample(i), i))

    def _compute(self, i: int) -> tuple[Tensor, float, bool] | None:
        """Worker ``i``'s computation to hold: a copy of its gradient (or, for a rule that
        takes local steps, of its message), the loss, and whether it is the message;
        ``None`` for a local step."""
        grad, loss = self._gradient(i)
        if self.worker_rule.local_steps:
            message = self._message(i, grad, self.lr())
            held = None if message is None else (message.clone(), loss, True)
        else:
            held = (grad.clone(), loss, False)
        self.steps += 1
        if self.meter is not None:
            self.meter.computed(i, self.batch[i])
        return held

    def _apply(
        self, i: int, held: Tensor, loss: float, is_message: bool, lr: float | None = None
    ) -> None:
        """Push a held computation of worker ``i`` and log it (``lr``: the rate its
        message was made at; by default the rate now)."""
        lr = self.lr() if lr is None else lr
        gap = self._gap(i, lr) if self.measure_gap else math.nan
        staleness = self.updates - self.pulled_at[i]
        if is_message:
            message = held
        else:
            message = self._message(i, held, lr)
        applied = self.master.push(i, message, lr)
        if applied:
            self.updates += 1
        self.pushes += 1
        self.log.append(
            worker=i, staleness=staleness, gap=gap, loss=loss, lr=lr, sim_time=self.sim_time
        )
        self._pushed(i, applied)

    def _pull(self, i: int) -> None:
        self.master.pull(i, self.lr(), out=self.sent[i])
        self.pulled_at[i] = self.updates
        self.batch[i] = self._next_batch(i)
        self.outstanding[i] = True

    def _gap(self, i: int, lr: float) -> float:
        """``RMS(theta_now - p_i)`` against the master's true parameters."""
        theta = self.worker_rule.true_params(self.master.gap_reference(), lr, out=self._diff)
        # An in-place difference and a dot product: on the CPU torch.dist takes twice as long.
        diff = torch.sub(theta, self.sent[i], out=self._diff)
        return math.sqrt(diff.dot(diff).item() / diff.numel())

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue this run exactly (tensors and plain values)."""
        return {
            "master": self.master.state_dict(),
            "workers": self.worker_rule.state_dict(),
            "sent": self.sent.clone(),
            "pulled_at": list(self.pulled_at),
            "batch": [b.clone() if isinstance(b, Tensor) else b for b in self.batch],
            "queue": [[t, i] for t, i in self.queue],
            "updates": self.updates,
            "steps": self.steps,
            "pushes": self.pushes,
            "sim_time": self.sim_time,
            "timing": self.timing.state_dict(),
            "batches": self.batches.state_dict(),
            "log": self.log.state_dict(),
            "wait_time": self.wait_time,
            "waits": self.waits,
            "outstanding": list(self.outstanding),
            **(self._bounded_state() if self.gate is not None else {}),
            **({"engine": self.engine.state_dict()} if self.engine is not None else {}),
            **({"meter": self.meter.state_dict()} if self.meter is not None else {}),
            **({"clock": self.clock.state_dict()} if self.clock is not None else {}),
            **({"wire": self.wire.state_dict()} if self.wire is not None else {}),
        }

    def _bounded_state(self) -> dict[str, Any]:
        gate = self.gate.state_dict()  # (its waits are saved with the run's, above)
        return {
            "inflight": gate["inflight"],
            "held": [
                [i, h.clone(), loss, since, is_message]
                for i, h, loss, since, is_message in self.held
            ],
            "idle": gate["idle"],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if tuple(state["sent"].shape) != tuple(self.sent.shape):
            raise ValueError(
                f"the saved simulation has {tuple(state['sent'].shape)} worker parameters, "
                f"this one {tuple(self.sent.shape)} (workers, d)"
            )
        self.master.load_state_dict(state["master"])
        self.worker_rule.load_state_dict(state["workers"])
        self.sent.copy_(state["sent"])
        self.pulled_at = [int(u) for u in state["pulled_at"]]
        self.batch = list(state["batch"])
        self.queue = [(float(t), int(i)) for t, i in state["queue"]]
        heapq.heapify(self.queue)
        self.updates, self.pushes = int(state["updates"]), int(state["pushes"])
        self.steps = int(state["steps"])
        self.sim_time = float(state["sim_time"])
        self.timing.load_state_dict(state["timing"])
        self.batches.load_state_dict(state["batches"])
        self.log.load_state_dict(state["log"])
        self.outstanding = [bool(x) for x in state.get("outstanding", [True] * self.k)]
        if self.meter is not None and "meter" in state:
            self.meter.load_state_dict(state["meter"])
        if self.clock is not None:
            self.clock.load_state_dict(state["clock"])
        if self.wire is not None:
            self.wire.load_state_dict(state.get("wire", {}))
        if self.engine is not None:  # (no pending gradients: they are computed again)
            self.engine.load_state_dict(state.get("engine", {}), self.sent.device)
        if self.gate is not None:
            # Entries of older checkpoints have no fifth field: they held messages.
            self.held = [
                (
                    int(e[0]),
                    e[1].clone(),
                    float(e[2]),
                    float(e[3]),
                    bool(e[4]) if len(e) > 4 else True,
                )
                for e in state["held"]
            ]
            inflight = [int(i) for i in state["inflight"]]
            self.gate = StalenessGate(self.max_staleness)
            self.gate.load_state_dict(
                {
                    "inflight": inflight,
                    "pulled": [[i, self.pulled_at[i]] for i in inflight],  # (every push updates)
                    "idle": state["idle"],
                    "held": [[i, since] for i, _, _, since, _ in self.held],
                    "waits": state.get("waits", 0),
                    "wait_time": state.get("wait_time", 0.0),
                    "held_starts": 0,  # (counts of refusals the simulator does not report)
                    "held_pushes": 0,
                }
            )


def _constant(lr: float) -> Callable[[float], float]:
    if not (isinstance(lr, int | float) and math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a positive number, got {lr!r}")
    return lambda epoch: lr
