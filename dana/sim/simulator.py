"""The event-driven simulator: ``k`` asynchronous workers on one machine, exactly.

:class:`Simulator` holds a run's state and offers its events; a schedule
(:mod:`dana.sim.schedules`) orders them. A gradient is computed when its push is
processed, at the parameters its worker pulled: the run is exactly that of real
asynchronous workers with the drawn times, bit for bit the same for the same seed on the
CPU. Each push logs its worker, staleness (master updates since its pull), gap
``RMS(theta_now - p_i)`` against the master's true parameters, loss, rate and time. On a
GPU the loss and the gap stay on the device until the log is read (``sync_free``): a
push makes no host synchronisation, so the host queues the next pushes' work while the
device computes.

Example::

    >>> import torch, dana
    >>> from dana.sim import Simulator
    >>> from dana.train.task.batches import BatchStream
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

import functools
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from dana.algorithms.base import Algorithm, check_workers, move_tensors, per_worker_zeros
from dana.sim.bound import Bound
from dana.sim.clock import Clock
from dana.sim.compute import Pack, RunView, build_engine
from dana.sim.events import Work
from dana.sim.schedules import Schedule, choose
from dana.train.cluster.classmeter import ClassMeter
from dana.train.cluster.timing import TimingModel, relative_speeds
from dana.train.config import TrainConfig
from dana.train.records.pushlog import Later, PushLog
from dana.train.rules.codecs import Wire, build_codec
from dana.train.rules.gate import bounds_staleness, check_staleness
from dana.train.rules.schedule import constant_schedule, next_rate
from dana.train.rules.step import GradientFn, Loss, WorkerStep
from dana.train.task.batches import BatchStream
from dana.train.task.stacked import GradientSource

_COUNTERS = ("updates", "pushes", "steps")


class Simulator:
    """Drive an algorithm's master and worker rules with ``k`` simulated workers.

    Args:
        algorithm: the algorithm (``dana.algorithms.build(name, ...)``).
        params: the initial flat parameters (their dtype and device are the run's).
        gradient: ``gradient(params, batch) -> (grad, loss)``, without weight decay.
        batches: the stream of batches (``next()``, ``batches_per_epoch``, state), or
            one per worker (:class:`~dana.train.task.batches.WorkerBatches`).
        workers: ``k``.
        lr: a number, or a function of the fractional epoch (``LRSchedule``).
        weight_decay: added to every gradient where it is computed.
        timing: a timing model, or its name built with ``timing_params`` and ``seed``.
        measure_gap: record the gap of every push (O(d) a push).
        max_staleness: the staleness bound (:mod:`dana.sim.bound`); ``None``: none.
        batch_workers, threads, source: the engines (:mod:`dana.sim.compute`): this
            many in-flight gradients in one vectorised call, or on as many threads,
            computed with ``source``'s model, loss and data.
        cluster: a cluster (a preset, a file or a mapping: :mod:`dana.train.cluster.model`);
            its compute model replaces ``timing``, then given by name.
        servers: the shards whose links carry the messages and whose parts a codec
            encodes one by one.
        labels: the training labels: count the classes behind the applied pushes.
        always_clock: run a trivial cluster's clock (it equals no cluster, bit for bit).
        compress: the codec of the pushes (:func:`dana.train.rules.codecs.build_codec`).
        pack: the runs this one is advanced with (:class:`dana.sim.compute.Pack`): its
            gradients are computed with theirs, ``batch_workers`` ahead of its own.
        sync_free: keep each push's loss and gap on the device until the log is read
            (:class:`~dana.train.records.pushlog.PushLog`, ``defer``); the same records.
            ``None``: when the parameters are on a GPU.
    """

    def __init__(
        self,
        algorithm: Algorithm,
        params: Tensor,
        gradient: GradientFn,
        batches: BatchStream,
        workers: int,
        *,
        lr: float | Callable[[float], float] = TrainConfig.lr,
        weight_decay: float = TrainConfig.weight_decay,
        timing: TimingModel | str = TrainConfig.timing,
        timing_params: dict[str, Any] | None = None,
        seed: int = TrainConfig.seed,
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
        pack: Pack | None = None,
        sync_free: bool | None = None,
    ):
        self.algorithm = algorithm
        self.k = k = check_workers(workers)
        d = params.numel()
        self.lr_schedule = lr if callable(lr) else constant_schedule(lr)
        self.weight_decay = float(weight_decay)
        self.gradient_fn, self.batches = gradient, batches
        self.per_worker_batches = bool(getattr(batches, "per_worker", False))
        self.measure_gap = measure_gap
        self.sync_free = params.device.type != "cpu" if sync_free is None else bool(sync_free)
        self.synchronous = algorithm.synchronous
        self.round_steps = algorithm.round_steps
        self.max_staleness = check_staleness(max_staleness)
        bounded = bounds_staleness(max_staleness, self.synchronous)
        self.bound = Bound(max_staleness) if bounded else None
        codec, self.wire = build_codec(compress, "compress"), None
        if codec.name != "none":
            self.wire = Wire(codec, k, d, servers, params.dtype, params.device)
        self.schedule: Schedule
        self.schedule, self.timing, speeds_of = choose(
            self, timing, timing_params, seed, cluster, always_clock, servers, labels, params
        )
        self.master = algorithm.master(params, k)
        self.worker_rule = algorithm.worker(k, d, params.dtype)
        for i, speed in enumerate(relative_speeds(speeds_of) if algorithm.uses_speed else []):
            self.worker_rule.set_speed(i, speed)  # (Dynamic Local Updates)
        if params.device.type != "cpu":
            move_tensors(self.master, params.device)
            move_tensors(self.worker_rule, params.device)
        self.worker_step = WorkerStep(self.worker_rule, gradient, weight_decay, self.wire)
        member = None
        if pack is not None:  # (between its steps: its next workers due, schedule.due(-1))
            view = RunView(
                lambda j: self.sent[j], lambda j: self.batch[j], lambda n: self.schedule.due(-1, n)
            )
            member = (pack, view)
        self.engine = build_engine(self.worker_step, source, batch_workers, threads, member)
        self.sent = per_worker_zeros(k, d, params.dtype, params.device)  # each one's pull
        self._diff = params.new_empty(d)
        self.pulled_at = [0] * k  # master updates at each worker's last pull
        self.batch: list[Any] = [None] * k
        # master updates applied, gradient computations processed, messages pushed
        self.updates = self.steps = self.pushes = 0
        self.sim_time = 0.0
        self.log = PushLog(defer=self.sync_free)
        self.outstanding = [False] * k  # pulled and not yet pushed: a departure loses it
        self.meter = ClassMeter(labels, k) if labels is not None else None
        self.schedule.start()

    @property
    def wait_time(self) -> float:
        """Simulated time workers spent waiting for the staleness bound (summed)."""
        return self.bound.gate.wait_time if self.bound is not None else 0.0

    @property
    def waits(self) -> int:
        return self.bound.gate.waits if self.bound is not None else 0

    @property
    def held(self) -> list[tuple[int, Work, float]]:
        """Bounded staleness: the pushes held (worker, work, since), in the order held."""
        return self.bound.held if self.bound is not None else []

    @property
    def clock(self) -> Clock | None:
        """The cluster's clock, when a cluster drives the run."""
        return self.schedule if isinstance(self.schedule, Clock) else None

    @property
    def epoch(self) -> float:
        """Epochs of data consumed by the gradient computations processed so far."""
        return self.steps / self.batches.batches_per_epoch

    def lr(self) -> float:
        """The rate of the next update (:func:`~dana.train.rules.schedule.next_rate`)."""
        per_epoch = self.batches.batches_per_epoch
        args = (self.steps, self.updates, self.k, per_epoch, self.synchronous, self.round_steps)
        return next_rate(self.lr_schedule, *args)

    def params(self) -> Tensor:
        """The master's parameters to evaluate."""
        return self.master.params()

    # -- driving --------------------------------------------------------------------------
    def step(self) -> None:
        """Process the schedule's next event (a push, a round, a cluster's event)."""
        self.schedule.step()

    def run(
        self,
        pushes: int | None = None,
        epochs: float | None = None,
        callback: Callable[[Simulator], bool | None] | None = None,
    ) -> None:
        """Step until ``pushes`` gradient computations (or ``epochs`` epochs) are processed;
        ``callback(sim)`` runs after every step, and returning True stops the run."""
        if (pushes is None) == (epochs is None):
            raise ValueError("give exactly one of pushes= or epochs=")
        if pushes is None:
            pushes = round(epochs * self.batches.batches_per_epoch)
        while self.steps < pushes:
            self.step()
            if callback is not None and callback(self):
                break

    # -- events ---------------------------------------------------------------------------
    def pull(self, i: int) -> None:
        """Worker ``i`` pulls the master's parameters and takes its next batch."""
        self.master.pull(i, self.lr(), out=self.sent[i])
        self.pulled_at[i] = self.updates
        self.advance(i)
        self.outstanding[i] = True

    def advance(self, i: int) -> None:
        """Worker ``i`` takes its next batch (of the shared stream, or of its own)."""
        batches = self.batches
        self.batch[i] = batches.next_for(i) if self.per_worker_batches else batches.next()

    def gradient(self, i: int) -> tuple[Tensor, Loss]:
        """Worker ``i``'s gradient (weight decay included) on its batch, and the loss."""
        if self.engine is None:
            return self.worker_step.gradient(i, self.sent[i], self.batch[i])
        due = functools.partial(self.schedule.due, size=self.engine.lookahead)
        return self.engine.gradient(i, self.sent.__getitem__, self.batch.__getitem__, due)

    def compute(self, i: int, *, count: bool = True) -> Work | None:
        """Worker ``i``'s computation, to apply later: a copy of its gradient, or (a rule
        with local steps) of its message made now; ``None``: a local step (counted).
        ``count``: count the step now rather than when the work is applied or held."""
        grad, loss = self.gradient(i)
        if self.worker_rule.local_steps:
            lr = self.lr()
            message = self.worker_step.message(i, grad, lr)
            work = None if message is None else Work(message.clone(), loss, True, lr, count)
        else:
            work = Work(grad.clone(), loss, False, None, count)
        if count or work is None:
            self.steps += 1
        if self.meter is not None:
            self.meter.computed(i, self.batch[i])
        return work

    def push(self, i: int, work: Work | None = None) -> bool:
        """Worker ``i``'s push reaches the master: its ``work``, or its gradient computed
        now; logged. Returns False for a local step (nothing pushed)."""
        if work is None:
            grad, loss = self.gradient(i)
            lr = self.lr()
        else:
            self.steps += not work.counted
            loss, lr = work.loss, self.lr() if work.lr is None else work.lr
        gap = self._gap(i, lr) if self.measure_gap else math.nan
        staleness = self.updates - self.pulled_at[i]
        if work is None:
            message = self.worker_step.message(i, grad, lr)
            self.steps += 1
            if self.meter is not None:
                self.meter.computed(i, self.batch[i])
            if message is None:
                return False
        else:
            message = (
                work.tensor if work.is_message else self.worker_step.message(i, work.tensor, lr)
            )
        applied = bool(self.master.push(i, message, lr))
        self.updates += applied
        self.pushes += 1
        self.log.append(
            worker=i, staleness=staleness, gap=gap, loss=loss, lr=lr, sim_time=self.sim_time
        )
        self.outstanding[i] = False
        if self.meter is not None:  # (a dropped push, Ringmaster's, counts for no class)
            (self.meter.applied if applied else self.meter.lost)(i)
        return True

    def hold(self, i: int, work: Work, now: float) -> None:
        """The bound refuses worker ``i``'s push: it waits from ``now`` until
        :meth:`Bound.release <dana.sim.bound.Bound.release>`, at the rate then."""
        self.steps += not work.counted
        self.bound.hold(i, work._replace(lr=None, counted=True), now)

    def leave(self, i: int) -> bool:
        """Worker ``i`` leaves: its computation under way or held is lost and the rules
        are told. Returns whether it had a computation under way."""
        lost, self.outstanding[i] = self.outstanding[i], False
        if self.bound is not None:
            self.bound.forget(i)
        if self.engine is not None:
            self.engine.discard(i)
        if self.meter is not None:
            self.meter.lost(i)
        if self.master.leave(i, self.lr()):
            self.updates += 1
        self.worker_rule.leave(i)
        if self.wire is not None:
            self.wire.leave(i)  # (its residual is lost with its machine)
        return lost

    def join(self, i: int) -> None:
        """Worker ``i`` returns (it pulls next)."""
        self.master.join(i)
        self.worker_rule.join(i)

    def _gap(self, i: int, lr: float) -> float | Later:
        """``RMS(theta_now - p_i)`` against the master's true parameters (``sync_free``:
        read when the log is)."""
        theta = self.worker_rule.true_params(self.master.gap_reference(), lr, out=self._diff)
        # An in-place difference and a dot product: on the CPU torch.dist takes twice as long.
        diff = torch.sub(theta, self.sent[i], out=self._diff)
        square = diff.dot(diff)
        if self.sync_free:
            return Later(square, self._rms)
        return self._rms(square.item())

    def _rms(self, square: float) -> float:
        return math.sqrt(square / self._diff.numel())

    # -- state ----------------------------------------------------------------------------
    def _parts(self) -> dict[str, Any]:
        """The parts whose own state the run's holds, by key."""
        parts = {"master": self.master, "workers": self.worker_rule, "timing": self.timing}
        parts.update(batches=self.batches, log=self.log, engine=self.engine, meter=self.meter)
        return {key: part for key, part in {**parts, "wire": self.wire}.items() if part is not None}

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue this run exactly (tensors and plain values)."""
        return {
            **{key: part.state_dict() for key, part in self._parts().items()},
            **{c: getattr(self, c) for c in _COUNTERS},
            "sent": self.sent.clone(),
            "pulled_at": list(self.pulled_at),
            "batch": [b.clone() if isinstance(b, Tensor) else b for b in self.batch],
            "sim_time": self.sim_time,
            "wait_time": self.wait_time,
            "waits": self.waits,
            "outstanding": list(self.outstanding),
            **self.schedule.state_dict(),
            **(self.bound.state_dict() if self.bound is not None else {}),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if tuple(state["sent"].shape) != tuple(self.sent.shape):
            raise ValueError(
                f"the saved simulation has {tuple(state['sent'].shape)} worker parameters, "
                f"this one {tuple(self.sent.shape)} (workers, d)"
            )
        for key, part in self._parts().items():
            if key == "engine":  # (no pending gradients: they are computed again)
                part.load_state_dict(state.get(key, {}), self.sent.device)
            elif key in state or key != "meter":  # (older checkpoints have no meter)
                part.load_state_dict(state.get(key, {}))
        self.sent.copy_(state["sent"])
        self.pulled_at = [int(u) for u in state["pulled_at"]]
        self.batch = list(state["batch"])
        self.updates, self.pushes, self.steps = (int(state[c]) for c in _COUNTERS)
        self.sim_time = float(state["sim_time"])
        self.outstanding = [bool(x) for x in state.get("outstanding", [True] * self.k)]
        self.schedule.load_state_dict(state)
        if self.bound is not None:
            self.bound.load_state_dict(state, self.pulled_at)
