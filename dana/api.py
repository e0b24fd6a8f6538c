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

from dana.fitting import UserProblem, UserProblemSpec
from dana.sim.driver import build_simulator
from dana.sim.simulator import Simulator
from dana.train.config import TrainConfig
from dana.train.device import resolve_device
from dana.train.entries import check_callable, check_model, entry_config
from dana.train.records.pushlog import PushLog
from dana.train.resources import check_threads, default_threads, torch_threads
from dana.train.task.evaluation import cross_entropy
from dana.train.task.flat import FlatModel, LossFn
from dana.train.task.reading import TensorData


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
    warmup_epochs: float | None = TrainConfig.warmup_epochs,
    decay_epochs: Sequence[float] | None = TrainConfig.lr_decay_epochs,
    decay_factor: float = TrainConfig.lr_decay_factor,
    seed: int = TrainConfig.seed,
    dtype: str = TrainConfig.dtype,
    callback: Callable[[Simulator], bool | None] | None = None,
    threads: int | None = None,
    device: str | torch.device = TrainConfig.device,
    batch_workers: int | str = TrainConfig.batch_workers,
    cuda_graph: bool = TrainConfig.cuda_graph,
    cluster: str | dict[str, Any] | None = TrainConfig.cluster,
    partition: str = TrainConfig.partition,
    servers: int = TrainConfig.servers,
    **hparams: Any,
) -> SimulationResult:
    """Train ``model`` on ``(x, y)`` with ``workers`` simulated asynchronous workers and
    hand back the :class:`~dana.sim.simulator.Simulator`: the simulator alone, for study.

    The simulator is built as ``dana train`` and :func:`dana.fit` build it
    (:func:`dana.sim.driver.build_simulator`), with their defaults
    (:class:`~dana.train.config.TrainConfig`) and checks (a bad argument raises
    :class:`~dana.errors.ConfigError`); ``dana.fit`` adds the evaluations, the run
    directory and the Ray backend. Arguments of the same name mean what they mean there.

    Args:
        model: the ``torch.nn.Module`` to train; at the end it holds the master's
            parameters (for ``dana-slim`` the look-ahead, as the paper evaluates it).
        x, y: the training examples, one row per example.
        algorithm: any name of ``dana algorithms``; ``momentum`` and ``hparams`` go to it.
        loss_fn: ``loss_fn(model(x), y)``, the batch's mean loss (default: cross-entropy).
        callback: ``callback(sim)`` after every step; returning True stops the run.
        threads: CPU threads (default 1, or ``OMP_NUM_THREADS``; 0: one per core): up to
            that many in-flight gradients at once, bit for bit as one at a time. The
            process's own setting is restored at the end.
        device: where the model, data and simulation live (``model``, ``x``, ``y`` are
            moved there).
        batch_workers: up to that many in-flight gradients in one vectorised call
            (``"auto"``: as many as fit the device).
        cuda_graph: replay the gradient as one CUDA graph (the same results; faster
            on a GPU, :mod:`dana.train.task.captured`).
        cluster, servers, partition: the simulated cluster, the shards whose links
            carry the messages, the data per worker; with integer class labels the
            simulator counts the classes behind the applied pushes (``meter``).
        **hparams: the algorithm's other hyper-parameters.

    Returns:
        A :class:`SimulationResult`: the model, the simulator (its ``log``), the flat
        view of the model and the loss.
    """
    check_model(model, "simulate")
    check_callable(loss_fn, "loss_fn", "simulate")
    if callback is not None:
        check_callable(callback, "callback", "simulate", "callback(sim) -> True to stop")
    data = TensorData(x, y, "simulate(x, y)")
    where = resolve_device(device)
    config = entry_config(simulate, locals(), dataset="user", device=where.type)
    threads = check_threads(default_threads() if threads is None else threads)
    with torch_threads(threads):
        return _simulate(model, data, config, loss_fn, callback, threads, where)


def _simulate(
    model: nn.Module,
    data: TensorData,
    config: TrainConfig,
    loss_fn: LossFn,
    callback: Callable[[Simulator], bool | None] | None,
    threads: int,
    device: torch.device,
) -> SimulationResult:
    spec = UserProblemSpec(model, data, loss_fn, str(device))
    problem = UserProblem(config, spec, model)
    sim = build_simulator(config, problem, threads=threads)
    sim.run(epochs=config.epochs, callback=callback)
    if sim.engine is not None and hasattr(sim.engine, "close"):
        sim.engine.close()
    with torch.no_grad():
        problem.flat.load(sim.params())
    return SimulationResult(model, sim, problem.flat, loss_fn)
