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
import torch.nn.functional as F
from torch import Tensor, nn

from dana import algorithms
from dana.sim.compute import auto_batch_workers
from dana.sim.simulator import Simulator
from dana.train.batches import batches_for
from dana.train.device import resolve_device
from dana.train.flat import FlatModel, LossFn
from dana.train.pushlog import PushLog
from dana.train.resources import check_threads, default_threads
from dana.train.schedule import LRSchedule
from dana.train.stacked import GradientSource


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
    algorithm: str = "dana-slim",
    workers: int = 8,
    lr: float = 0.1,
    momentum: float = 0.9,
    weight_decay: float = 0.0,
    epochs: float = 1.0,
    batch_size: int = 128,
    loss_fn: LossFn = F.cross_entropy,
    timing: str = "gamma",
    timing_params: dict[str, Any] | None = None,
    warmup_epochs: float = 0.0,
    decay_epochs: Sequence[float] = (),
    seed: int = 0,
    callback: Callable[[Simulator], bool | None] | None = None,
    threads: int | None = None,
    device: str | torch.device = "cpu",
    batch_workers: int | str = 1,
    cluster: str | dict[str, Any] | None = None,
    partition: str = "iid",
    servers: int = 1,
    **hparams: Any,
) -> SimulationResult:
    """Train ``model`` on ``(x, y)`` with ``workers`` simulated asynchronous workers.

    ``algorithm`` is any name in :data:`dana.algorithms.ALGORITHMS`; ``momentum`` is
    passed to it when it takes one, and ``hparams`` (``lc=...``, ``nesterov=...``) too.
    At the end ``model`` holds the master's parameters (for ``dana-slim`` the
    look-ahead, as the paper evaluates it).

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
    """
    previous = torch.get_num_threads()
    threads = check_threads(default_threads() if threads is None else threads)
    torch.set_num_threads(threads)
    try:
        return _simulate(
            model, x, y, algorithm=algorithm, workers=workers, lr=lr, momentum=momentum,
            weight_decay=weight_decay, epochs=epochs, batch_size=batch_size, loss_fn=loss_fn,
            timing=timing, timing_params=timing_params, warmup_epochs=warmup_epochs,
            decay_epochs=decay_epochs, seed=seed, callback=callback, threads=threads,
            device=resolve_device(device), batch_workers=batch_workers, cluster=cluster,
            partition=partition, servers=servers, **hparams,
        )  # fmt: skip
    finally:
        torch.set_num_threads(previous)


def _simulate(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    *,
    algorithm: str,
    workers: int,
    lr: float,
    momentum: float,
    weight_decay: float,
    epochs: float,
    batch_size: int,
    loss_fn: LossFn,
    timing: str,
    timing_params: dict[str, Any] | None,
    warmup_epochs: float,
    decay_epochs: Sequence[float],
    seed: int,
    callback: Callable[[Simulator], bool | None] | None,
    threads: int,
    device: torch.device,
    batch_workers: int | str,
    cluster: str | dict[str, Any] | None,
    partition: str,
    servers: int,
    **hparams: Any,
) -> SimulationResult:
    names = algorithms.hparam_names(algorithm)
    if "momentum" in names:
        hparams.setdefault("momentum", momentum)
    algo = algorithms.build(algorithm, **hparams)
    flat = FlatModel(model.to(device))
    x, y = x.to(device), y.to(device)
    batches = batches_for(partition, y, batch_size, seed, workers)
    labels = y if not y.is_floating_point() and y.dim() == 1 else None
    schedule = LRSchedule(lr, workers, warmup_epochs, tuple(decay_epochs))

    def inputs(rows: Tensor) -> tuple[Tensor, Tensor]:
        rows = rows.to(device)
        return x[rows], y[rows]

    def gradient(params: Tensor, rows: Tensor) -> tuple[Tensor, float]:
        return flat.gradient(params, *inputs(rows), loss_fn)

    source = GradientSource(flat, loss_fn, inputs)
    if batch_workers == "auto":
        batch_workers = auto_batch_workers(source, workers, torch.arange(batch_size), device)
    if not (isinstance(batch_workers, int) and not isinstance(batch_workers, bool)) or (
        batch_workers < 1
    ):
        raise ValueError(f"batch_workers must be an integer >= 1 or 'auto', got {batch_workers!r}")
    if batch_workers > 1 or device.type != "cpu":
        threads = 1  # (the batched call or the GPU: torch's intra-op threads, as set)

    sim = Simulator(
        algo,
        flat.flat.clone(),
        gradient,
        batches,
        workers,
        lr=schedule,
        weight_decay=weight_decay,
        timing=timing,
        timing_params=timing_params,
        seed=seed,
        batch_workers=batch_workers,
        threads=threads,
        source=source if batch_workers > 1 or threads > 1 else None,
        cluster=cluster,
        servers=servers,
        labels=labels,
    )
    sim.run(epochs=epochs, callback=callback)
    if sim.engine is not None and hasattr(sim.engine, "close"):
        sim.engine.close()
    with torch.no_grad():
        flat.load(sim.params())
    return SimulationResult(model, sim, flat, loss_fn)
