"""Simulate ``k`` asynchronous workers training your own model, in a few lines.

Example::

    >>> import torch, dana
    >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
    <torch._C.Generator object at ...>
    >>> X = torch.randn(512, 20); y = (X[:, 0] > 0).long()
    >>> model = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    >>> result = dana.simulate(model, X, y, algorithm="dana-slim", workers=8, lr=0.05,
    ...                        momentum=0.9, epochs=3, batch_size=32, timing="gamma")
    >>> bool(result.log.numpy()["staleness"].mean() > 5)  # about k-1 pushes land in between
    True
    >>> bool(result.evaluate(X, y)[1] < 0.2)  # the model now holds the master's parameters
    True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from dana.sim.compute import auto_batch_workers
from dana.sim.simulator import Simulator
from dana.train.batches import batches_for
from dana.train.config import TrainConfig
from dana.train.device import resolve_device
from dana.train.entries import as_tensors, check_callable, check_model, entry_config
from dana.train.evaluation import cross_entropy
from dana.train.flat import FlatModel, LossFn
from dana.train.pushlog import PushLog
from dana.train.resources import check_threads, default_threads
from dana.train.stacked import GradientSource
from dana.train.training import build_schedule


@dataclass
class SimulationResult:
    model: nn.Module
    simulator: Simulator
    flat: FlatModel
    loss_fn: LossFn

    @property
    def log(self) -> PushLog:
        return self.simulator.log

    def evaluate(self, x: Tensor, y: Tensor) -> tuple[float, float]:
        """(mean loss, error rate) of the master's parameters on ``(x, y)``."""
        return self.flat.evaluate(self.simulator.params(), x, y, self.loss_fn)


def simulate(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    *,
    algorithm: str = TrainConfig.algorithm,
    workers: int = TrainConfig.workers,
    lr: float = TrainConfig.lr,
    momentum: float = TrainConfig.momentum,
    weight_decay: float = TrainConfig.weight_decay,
    epochs: float = TrainConfig.epochs,
    batch_size: int = TrainConfig.batch_size,
    loss_fn: LossFn = cross_entropy,
    timing: str = TrainConfig.timing,
    timing_params: dict[str, Any] | None = None,
    warmup_epochs: float | None = None,
    decay_epochs: Sequence[float] | None = None,
    decay_factor: float = TrainConfig.lr_decay_factor,
    seed: int = TrainConfig.seed,
    callback: Callable[[Simulator], bool | None] | None = None,
    threads: int | None = None,
    device: str | torch.device = "cpu",
    batch_workers: int | str = 1,
    cluster: str | dict[str, Any] | None = None,
    partition: str = TrainConfig.partition,
    servers: int = TrainConfig.servers,
    **hparams: Any,
) -> SimulationResult:
    """Train ``model`` on ``(x, y)`` with ``workers`` simulated asynchronous workers.

    The defaults and the checks are ``dana train``'s (:class:`~dana.train.config.TrainConfig`):
    ``dana-slim``, 8 workers, 3 epochs of batches of 128 per worker, lr 0.005, momentum
    0.9, weight decay 1e-4, ``gamma`` timing; ``warmup_epochs=None``: the automatic
    warm-up from ``lr/k`` (60 steps per worker, within 1/8 and 2/3 of the run);
    ``decay_epochs=None``: one decay x``decay_factor`` at 9/10 of the run (``[]``: none).
    A bad argument raises :class:`~dana.errors.ConfigError` (a ``ValueError``) saying
    what it accepts, as ``dana train`` does.

    ``algorithm`` is any name in :data:`dana.algorithms.ALGORITHMS`; ``momentum`` is
    passed to it when it takes one, and ``hparams`` (``lc=...``, ``nesterov=...``) too.
    At the end ``model`` holds the master's parameters (for ``dana-slim`` the
    look-ahead, as the paper evaluates it). ``callback(sim)`` runs after every step;
    returning True stops the run.

    ``threads``: the number of CPU threads the simulation uses (torch's intra-op
    threads; default 1, or ``OMP_NUM_THREADS`` where set, which holds up when other
    processes keep cores busy; 0: one per core), as ``dana train --threads``: on the CPU
    the gradients of up to that many in-flight workers are computed at once, one thread
    each, bit for bit as one at a time. The process's own setting is restored at the
    end.

    ``device``: where the model, the data and the simulation live (``"cpu"``,
    ``"cuda"``, ``"auto"`` or a ``torch.device``; ``model``, ``x`` and ``y`` are moved
    there). ``batch_workers``: compute the gradients of up to that many in-flight
    workers in one vectorised call (``"auto"``: as many as fit the device), as
    ``dana train --batch-workers`` (docs/ALGORITHMS.md, "Batched and threaded
    gradients").

    ``cluster``: the simulated cluster (a preset name, a YAML file or a mapping; its
    compute model replaces ``timing``), ``servers`` the parameter-server shards whose
    links carry the messages, ``partition`` the data per worker (``iid``,
    ``dirichlet:ALPHA``, ``shards:N``), as ``dana train --cluster``, ``--servers`` and
    ``--partition`` (docs/ALGORITHMS.md, "The clock, exactly as simulated"). With
    integer class labels ``y`` the simulator counts each class's examples behind the
    applied pushes (``result.simulator.meter``).

    ``dana.fit`` runs the whole loop of ``dana train`` (evaluations, a run directory,
    either backend); this is the simulator alone, with the :class:`Simulator` at hand.
    """
    check_model(model, "simulate")
    check_callable(loss_fn, "loss_fn", "simulate")
    x, y = as_tensors((x, y), "simulate(x, y)")
    where = resolve_device(device)
    config = entry_config(
        simulate,
        hparams,
        algorithm=algorithm,
        workers=workers,
        dataset="user",
        epochs=epochs,
        batch_size=batch_size,
        lr=lr,
        momentum=momentum,
        weight_decay=weight_decay,
        decay_epochs=decay_epochs,
        decay_factor=decay_factor,
        warmup_epochs=warmup_epochs,
        timing=timing,
        timing_params=timing_params,
        seed=seed,
        device=where.type,
        batch_workers=batch_workers,
        cluster=cluster,
        partition=partition,
        servers=servers,
    )
    previous = torch.get_num_threads()
    threads = check_threads(default_threads() if threads is None else threads)
    torch.set_num_threads(threads)
    try:
        return _simulate(model, x, y, config, loss_fn, callback, threads, where)
    finally:
        torch.set_num_threads(previous)


def _simulate(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    config: TrainConfig,
    loss_fn: LossFn,
    callback: Callable[[Simulator], bool | None] | None,
    threads: int,
    device: torch.device,
) -> SimulationResult:
    algo = config.build_algorithm()
    flat = FlatModel(model.to(device))
    x, y = x.to(device), y.to(device)
    batches = batches_for(config.partition, y, config.batch_size, config.seed, config.workers)
    labels = y if not y.is_floating_point() and y.dim() == 1 else None
    schedule = build_schedule(config, batches.batches_per_epoch)

    def inputs(rows: Tensor) -> tuple[Tensor, Tensor]:
        rows = rows.to(device)
        return x[rows], y[rows]

    def gradient(params: Tensor, rows: Tensor) -> tuple[Tensor, float]:
        return flat.gradient(params, *inputs(rows), loss_fn)

    source = GradientSource(flat, loss_fn, inputs)
    batch_workers = config.batch_workers
    if batch_workers == "auto":
        batch_workers = auto_batch_workers(
            source, config.workers, torch.arange(config.batch_size), device
        )
    if batch_workers > 1 or device.type != "cpu":
        threads = 1  # (the batched call or the GPU: torch's intra-op threads, as set)

    sim = Simulator(
        algo,
        flat.flat.clone(),
        gradient,
        batches,
        config.workers,
        lr=schedule,
        weight_decay=config.weight_decay,
        timing=config.timing,
        timing_params=config.timing_params,
        seed=config.seed,
        batch_workers=batch_workers,
        threads=threads,
        source=source if batch_workers > 1 or threads > 1 else None,
        cluster=config.cluster,
        servers=config.servers,
        labels=labels,
    )
    sim.run(epochs=config.epochs, callback=callback)
    if sim.engine is not None and hasattr(sim.engine, "close"):
        sim.engine.close()
    with torch.no_grad():
        flat.load(sim.params())
    return SimulationResult(model, sim, flat, loss_fn)
