"""The simulator's gradient engines: the in-flight workers' gradients, ahead of their pushes.

Every in-flight worker's parameters and batch are fixed at its pull, so the gradients
of the workers in flight do not depend on each other. When the simulator needs the
gradient of the worker whose push is due, an engine computes it together with those of
the next in-flight workers (in the order their pushes are due) that have none yet, and
keeps them until their pushes come; the pushes are then applied in event order exactly
as the sequential simulator applies them (same events, batches, staleness, log).

- :class:`BatchedEngine` (``batch_workers=B``): up to ``B`` gradients in one vectorised
  call (:class:`dana.train.task.stacked.StackedGradient`). Parameters equal the sequential
  simulator's within float rounding (the vectorised kernels add in another order).
  Memory: ``B`` stacked pulled copies and ``B`` gradients (``2 B d`` values) and ``B``
  sets of activations; :func:`auto_batch_workers` picks ``B`` to fit the device.
- :class:`ThreadedEngine` (``threads=N``): up to ``N`` gradients at once on ``N`` Python
  threads, each on its own model replica, with one intra-op thread each: gradients and
  losses are bit for bit the sequential simulator's with one thread. Pipelined: the
  threads compute the next ``N`` workers' gradients while the main thread applies a
  push, so the push's serial work (rules, gap, BatchNorm replay) overlaps them.

BatchNorm's running statistics are folded into the shared model when each push is
processed, in event order: from each worker's contribution (batched,
:func:`dana.train.task.stacked.apply_running`: within one rounding per update), or by
replaying the kernel's update on the inputs each worker's BatchNorm layers saw
(threaded, :func:`dana.train.task.stacked.replay_running`: bit for bit; memory: one set of
those inputs per pending gradient). A gradient that
draws random numbers from a shared generator is refused: its draws would follow the
order the gradients are computed in, not the sequential order (augmentation draws from
a generator seeded by each batch's key, :class:`dana.train.task.batches.KeyedBatchStream`).

The batched engine's pending gradients are part of the simulation's state
(:meth:`Engine.state_dict`), so that a resumed run continues exactly; the threaded
engine's are computed again after a resume, bit for bit the same.

- :class:`Pack` (``dana sweep --pack N``): the batched engine across runs. Each run's
  simulator holds a :class:`PackedEngine` of the pack, keyed by (run, worker): its own
  pending gradients, state and BatchNorm statistics. When a run's due worker has no
  gradient, one vectorised call computes it with that run's next ``B - 1`` workers due
  and each other run's next ``B`` workers due (``Schedule.due(-1, B)``, between its
  steps) that have none. A packed run equals the run alone as the batched engine
  equals the sequential simulator (float rounding).
"""

from __future__ import annotations

import dataclasses
import itertools
import queue
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import torch
from torch import Tensor

from dana.train.device import peak_bytes
from dana.train.rules.step import Loss, WorkerStep
from dana.train.task import inputs as I
from dana.train.task.stacked import (
    GradientSource,
    Replica,
    Running,
    StackedGradient,
    apply_running,
    replay_running,
    running_buffers,
)

#: ``inflight(i)``: the other workers in flight, in the order their pushes are due.
InFlight = Callable[[int], Iterable[int]]


class RunView(NamedTuple):
    """What a pack reads of one run between its steps: a worker's pulled parameters and
    batch, and ``due(size)``: up to ``size`` workers whose gradients come next."""

    pulled: Callable[[int], Tensor]
    batch: Callable[[int], Any]
    due: Callable[[int], list[int]]


class Engine:
    """Gradients computed ahead of their pushes, kept until the push (``pending``)."""

    def __init__(self, step: WorkerStep, source: GradientSource, size: int):
        if source.random:
            raise ValueError(
                "batched or threaded gradients need a gradient that draws no random "
                "numbers (its draws must follow the sequential order): draw them from a "
                "generator seeded per batch (as dana's augmentation does), or compute one "
                "worker at a time (--batch-workers 1 --threads 1)"
            )
        self.step, self.source, self.size = step, source, int(size)
        self.pending: dict[int, Any] = {}  # (a result, or its future: threaded)
        self.computed = 0  # gradients computed (a measure of work ahead)
        self.calls = 0  # calls of the engine's kernel

    def gradient(
        self,
        i: int,
        pulled: Callable[[int], Tensor],
        batch: Callable[[int], Any],
        inflight: InFlight,
    ) -> tuple[Tensor, Loss]:
        """Worker ``i``'s gradient (weight decay included) and loss. Starts it, with
        those of the next in-flight workers without one (:meth:`_room`), when it is not
        pending; folds its running statistics into the shared model."""
        start = [] if i in self.pending else [i]
        room = self._room(not start)
        if room:
            others = (j for j in inflight(i) if j != i and j not in self.pending)
            start += itertools.islice(others, room)
        if start:
            points = [self.step.rule.compute_at(j, pulled(j)) for j in start]
            self._start(start, points, [batch(j) for j in start])
            self.computed += len(start)
            self.calls += 1
        grad, loss, running = self._take(i)
        # (restores the rule's per-computation context, as a local-step rule keeps one)
        p = self.step.rule.compute_at(i, pulled(i))
        if self.step.weight_decay:
            grad.add_(p, alpha=self.step.weight_decay)
        self._fold(running)
        return grad, loss

    @property
    def lookahead(self) -> int:
        """How many of the next workers due ``inflight`` should list."""
        return self.size

    def _room(self, due_pending: bool) -> int:
        """How many other workers to start with the due one: the next ``size - 1`` when
        it has no gradient yet, else none (one call of up to ``size`` gradients)."""
        return 0 if due_pending else self.size - 1

    def _start(self, workers: list[int], points: list[Tensor], batches: list[Any]) -> None:
        """Compute (or start computing) the gradients of ``workers`` into ``pending``."""
        for j, result in zip(workers, self._compute(points, batches)):
            self.pending[j] = result

    def _take(self, i: int) -> tuple[Tensor, Loss, Running]:
        return self.pending.pop(i)

    def discard(self, i: int) -> None:
        """Forget worker ``i``'s gradient computed ahead, if any (the worker left: its
        computation is lost, and its BatchNorm statistics are never folded in, as the
        sequential simulator, which never computed it, never folds them)."""
        self.pending.pop(i, None)

    def close(self) -> None:
        """The run is over: release what the engine holds (threads, a pack's place)."""

    def _fold(self, running: Running) -> None:
        """Fold one worker's BatchNorm running statistics into the shared model."""
        raise NotImplementedError

    def _compute(
        self, points: list[Tensor], batches: list[Any]
    ) -> list[tuple[Tensor, Loss, Running]]:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        return {
            "pending": [
                [i, g.clone(), float(loss), {n: t.clone() for n, t in r.items()}]
                for i, (g, loss, r) in sorted(self.pending.items())
            ]
        }

    def load_state_dict(self, state: dict[str, Any], device: torch.device) -> None:
        self.pending = {
            int(i): (g.to(device).clone(), float(loss), {n: t.to(device) for n, t in r.items()})
            for i, g, loss, r in state.get("pending", [])
        }


class BatchedEngine(Engine):
    """Up to ``size`` gradients in one ``torch.func.vmap`` call."""

    def __init__(self, step: WorkerStep, source: GradientSource, size: int):
        super().__init__(step, source, size)
        self.stacked = StackedGradient(source)
        self._keep = self.stacked.keep  # (running_buffers: ValueError without a momentum)

    def _fold(self, running):
        apply_running(self.source.flat.module, self._keep, running)

    def _compute(self, points, batches):
        return stacked_call(self.stacked, points, [self.source.inputs(b) for b in batches])


def stacked_call(
    stacked: StackedGradient, points: list[Tensor], inputs: list[tuple[I.Inputs, Tensor]]
) -> list[tuple[Tensor, Tensor, Running]]:
    """The gradients at ``points`` on ``inputs`` (each an ``(x, y)`` batch) in one call
    of ``stacked``: each one's gradient, loss (0-d, on the device) and running
    statistics."""
    x = I.stack([xy[0] for xy in inputs])
    y = torch.stack([xy[1] for xy in inputs])
    grads, losses, running = stacked(torch.stack(points), x, y)
    return [
        (grads[n], losses[n], {k: v[n] for k, v in running.items()}) for n in range(len(points))
    ]


class ThreadedEngine(Engine):
    """Up to ``size`` gradients at once on ``size`` threads, one replica each, with one
    intra-op thread (set for the whole process while the engine exists).

    Pipelined: ``size`` gradients of the next workers due are kept computing while the
    main thread waits for the due one and then applies its push (the rules, the gap,
    the BatchNorm replay), so the threads never wait for the push. This is exact
    because an in-flight worker's point and batch stay fixed until its push."""

    def __init__(self, step: WorkerStep, source: GradientSource, size: int):
        super().__init__(step, source, size)
        torch.set_num_threads(1)
        self.replicas: queue.SimpleQueue[Replica] = queue.SimpleQueue()
        for _ in range(self.size):
            self.replicas.put(Replica(source))
        self.pool = ThreadPoolExecutor(self.size, thread_name_prefix="dana-worker")
        # The global RNG's state from the first gradient on: nothing may draw from it
        # while gradients are computed, and with the pipeline some always are.
        self._rng: Tensor | None = None

    def _fold(self, inputs):
        replay_running(self.source.flat.module, inputs)

    @property
    def lookahead(self) -> int:
        return self.size + len(self.pending) + 1

    def _room(self, due_pending: bool) -> int:
        # keep ``size`` gradients besides the due one computing or done
        return max(0, self.size - (len(self.pending) - due_pending))

    def _start(self, workers, points, batches):
        if self._rng is None:
            self._rng = torch.random.get_rng_state()
        for j, point, b in zip(workers, points, batches):
            self.pending[j] = self.pool.submit(self._one, point, b)

    def _take(self, i):
        result = self.pending.pop(i).result()
        if self._rng is not None and not torch.equal(self._rng, torch.random.get_rng_state()):
            raise RuntimeError(
                "torch's global generator moved while gradients were computed on several "
                "threads: the model drew random numbers (dropout?), or code run between "
                "the simulator's steps did; the draws would not follow the sequential "
                "order: use --threads 1 (or draw from a torch.Generator of your own)"
            )
        return result

    def discard(self, i: int) -> None:
        future = self.pending.pop(i, None)
        if future is not None and not future.cancel():
            future.exception()  # (wait for it: its replica goes back to the pool)

    def state_dict(self) -> dict[str, Any]:
        return {}  # (the pending gradients are computed again, bit for bit)

    def load_state_dict(self, state: dict[str, Any], device: torch.device) -> None:
        self._drop()

    def _one(self, point: Tensor, batch: Any) -> tuple[Tensor, Loss, Running]:
        replica = self.replicas.get()
        try:
            return replica.gradient(point, batch)
        finally:
            self.replicas.put(replica)

    def _drop(self) -> None:
        """Forget the pending gradients (waiting for those being computed)."""
        for future in self.pending.values():
            future.cancel()
        for future in self.pending.values():
            if not future.cancelled():
                future.exception()
        self.pending = {}

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


class Pack:
    """Runs of one model shape advanced together (the module docstring): the gradients
    they need next, in one vectorised call across runs. The first run's model computes
    every run's gradients (:class:`StackedGradient` replaces its parameters and buffers
    by each run's), so a run joins only when its model, fixed buffers and loss are the
    same; its batches come from its own ``inputs`` (its own data order and seed)."""

    def __init__(self) -> None:
        self.members: list[PackedEngine] = []
        self.stacked: StackedGradient | None = None
        self.calls = 0  # vectorised calls made

    def join(self, step: WorkerStep, source: GradientSource, size: int, view: RunView):
        """A run's engine in the pack (``size``: its own look-ahead, ``B``); ValueError
        when its model or loss is not the pack's."""
        engine = PackedEngine(self, step, source, size, view)
        if self.stacked is None:
            self.stacked = StackedGradient(source)
        else:
            _check_same(self.stacked, source)
        self.members.append(engine)
        return engine

    def compute(
        self, engine: PackedEngine, workers: list[int], points: list[Tensor], batches: list[Any]
    ) -> None:
        """Compute the gradients of ``engine``'s ``workers`` (at ``points``, on
        ``batches``) and those of the other runs' next workers due without one, into
        each run's ``pending``, in one call."""
        assert self.stacked is not None
        jobs = [(engine, workers, points, batches)]
        for other in self.members:
            if other is engine:
                continue
            ahead = [j for j in other.view.due(other.size) if j not in other.pending]
            if ahead:
                rule, view = other.step.rule, other.view
                points = [rule.compute_at(j, view.pulled(j)) for j in ahead]
                jobs.append((other, ahead, points, [view.batch(j) for j in ahead]))
                other.computed += len(ahead)
        inputs = [e.source.inputs(b) for e, _, _, bs in jobs for b in bs]
        results = iter(stacked_call(self.stacked, [p for _, _, ps, _ in jobs for p in ps], inputs))
        for e, js, _, _ in jobs:
            for j in js:
                e.pending[j] = next(results)
        self.calls += 1

    def leave(self, engine: PackedEngine) -> None:
        """A run's engine leaves the pack (its run is over)."""
        if engine in self.members:
            self.members.remove(engine)


class PackedEngine(Engine):
    """One run's engine in a :class:`Pack`: its pending gradients (its checkpoint's, as
    the batched engine's), folded into its own model; computed by the pack."""

    def __init__(
        self, pack: Pack, step: WorkerStep, source: GradientSource, size: int, view: RunView
    ):
        super().__init__(step, source, size)
        self.pack, self.view = pack, view
        self._keep = running_buffers(source.flat.module)  # (ValueError without a momentum)

    def _fold(self, running):
        apply_running(self.source.flat.module, self._keep, running)

    def _start(self, workers, points, batches):
        self.pack.compute(self, workers, points, batches)

    def close(self) -> None:
        self.pack.leave(self)


def _check_same(stacked: StackedGradient, source: GradientSource) -> None:
    """ValueError unless ``source``'s model and loss are those ``stacked`` computes with:
    the same modules, parameter shapes and dtype, and buffers besides the running
    statistics equal."""
    mine, theirs = stacked.module, source.flat.module
    fixed = [n for n, _ in mine.named_buffers() if n not in stacked.keep]
    a, b = dict(mine.named_buffers()), dict(theirs.named_buffers())
    same = (
        repr(mine) == repr(theirs)
        and stacked.loss_fn is source.loss_fn
        and [(p.shape, p.dtype) for p in mine.parameters()]
        == [(p.shape, p.dtype) for p in theirs.parameters()]
        and a.keys() == b.keys()
        and all(torch.equal(a[n], b[n]) for n in fixed)
    )
    if not same:
        raise ValueError(
            "runs packed together need the same model (modules, parameter shapes, dtype, "
            "buffers) and loss; run this one alone"
        )


def build_engine(
    step: WorkerStep,
    source: GradientSource | None,
    batch_workers: int = 1,
    threads: int = 1,
    pack: tuple[Pack, RunView] | None = None,
) -> Engine | None:
    """The engine for ``batch_workers`` and ``threads`` (``None``: one worker at a time,
    the sequential simulator). ``pack``: the run's engine in that pack, looking ahead
    ``batch_workers`` workers; else ``batch_workers > 1`` takes the batched engine
    (torch's own intra-op threads then serve the one call), else ``threads > 1`` the
    threaded one."""
    if batch_workers < 1 or threads < 1:
        raise ValueError(f"batch_workers and threads must be >= 1, got {batch_workers}, {threads}")
    if batch_workers == 1 and threads == 1 and pack is None:
        return None
    if source is None:
        raise ValueError(
            "batched or threaded gradients need the model, loss and data "
            "(source=dana.train.task.stacked.GradientSource(...))"
        )
    if pack is not None:
        return pack[0].join(step, source, batch_workers, pack[1])
    if batch_workers > 1:
        return BatchedEngine(step, source, batch_workers)
    return ThreadedEngine(step, source, threads)


def auto_batch_workers(
    source: GradientSource, workers: int, batch: Any, device: torch.device, share: float = 0.5
) -> int:
    """``B`` for ``batch_workers="auto"``: on the CPU 1 (the vectorised call does not
    beat one worker at a time there: docs/BENCHMARKS.md); on a GPU the most workers
    (at most ``workers``) whose stacked parameters, gradients and activations fit in
    ``share`` of the free memory, from the peak memory of one probe call of two (with
    ``source.cuda_graph`` twice that: a graph per power of two up to ``B``, each with
    its own memory, hold about two calls' worth)."""
    if device.type != "cuda":
        return 1
    flat = source.flat
    stacked = StackedGradient(dataclasses.replace(source, cuda_graph=False))
    p = flat.flat.detach().unsqueeze(0).repeat(2, 1)
    x, y = source.inputs(batch)
    pair = peak_bytes(device, lambda: stacked(p, I.stack([x, x]), torch.stack([y, y])))
    per_worker = max(1, pair // 2) * (2 if source.cuda_graph else 1)
    free, _ = torch.cuda.mem_get_info(device)
    return max(1, min(workers, int(share * free // per_worker)))
