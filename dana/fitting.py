"""Train your own model on your own data with ``k`` asynchronous workers, on either runner.

:func:`fit` takes a ``torch.nn.Module`` (or a zero-argument factory that builds one),
training data and optional test data (each a pair of tensors ``(x, y)`` or any
``torch.utils.data.Dataset`` of ``(x, y)`` items), a loss, and ``backend="sim"`` (the
exact simulator, :mod:`dana.sim`) or ``backend="ray"`` (real workers and parameter-server
shards on Ray, :mod:`dana.ps`). Both run the loop of ``dana train``: evaluations every
``eval_every`` epochs, the same ``metrics.csv`` rows and ``summary.json`` figures, and
both return the same :class:`FitResult`.

On Ray the problem travels to the workers as one object in Ray's object store (a
:class:`UserProblemSpec`: the model or its factory, the data, the loss), pickled with
Ray's cloudpickle: a model class or loss defined in the driver script is shipped by
value, one defined in another module must be importable on the cluster's nodes (see
docs/DISTRIBUTED.md).

    >>> import torch, dana
    >>> g = torch.Generator().manual_seed(0)
    >>> x = torch.randn(512, 8, generator=g); y = (x[:, 0] > 0).long()
    >>> model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    >>> result = dana.fit(model, (x, y), workers=4, lr=0.05, epochs=2, batch_size=32)
    >>> [round(row["epoch"]) for row in result.metrics]
    [0, 1, 2]
    >>> result.summary["final_test_error"] < 0.2, len(result.log) == result.summary["pushes"]
    (True, True)
"""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dana.data import Dataset
from dana.errors import ConfigError, DanaError
from dana.train.backends import check_name, runner_class
from dana.train.batches import BatchStream, WorkerBatches, batches_for
from dana.train.config import TrainConfig
from dana.train.device import resolve_device
from dana.train.entries import Tracking, as_tensors, check_callable, check_model, entry_config
from dana.train.flat import FlatModel, LossFn
from dana.train.pushlog import PushLog
from dana.train.resources import check_threads, default_threads
from dana.train.rundir import RunDir, check_local
from dana.train.stacked import GradientSource
from dana.train.training import execute_run, start_run

ModelOrFactory = nn.Module | Callable[[], nn.Module]
Data = tuple[Any, Any] | torch.utils.data.Dataset


@dataclass
class UserProblemSpec:
    """What a worker needs to rebuild the problem: picklable, shipped once through Ray."""

    model: ModelOrFactory
    train: tuple[Tensor, Tensor]
    test: tuple[Tensor, Tensor]
    loss_fn: LossFn = F.cross_entropy
    device: str = "cpu"

    def build(self, config: TrainConfig) -> UserProblem:
        """The problem in a worker: its own replica of the model (the parameters
        always come from the servers)."""
        if isinstance(self.model, nn.Module):
            model = copy.deepcopy(self.model)
        else:
            torch.manual_seed(config.seed)
            model = self.model()
        return UserProblem(config, self, model)


class UserProblem:
    """:class:`dana.train.problem.Problem`'s interface on the user's model, data and loss.

    The test error is the fraction of ``argmax(model(x)) != y`` when the targets are
    integer class labels and the outputs ``N x C``; otherwise NaN (the test loss is
    still the mean of ``loss_fn`` over batches of 1000, weighted by their size).
    """

    def __init__(self, config: TrainConfig, spec: UserProblemSpec, model: nn.Module):
        if not isinstance(model, nn.Module):
            raise ConfigError(f"the model must be a torch.nn.Module, got {type(model).__name__}")
        self.config, self.spec, self.loss_fn = config, spec, spec.loss_fn
        dtype = getattr(torch, config.dtype)
        device = torch.device(spec.device)
        model.to(device)
        try:
            self.flat = FlatModel(model, dtype)
        except ValueError as e:
            raise ConfigError(f"model: {e}") from None

        def place(t: Tensor) -> Tensor:
            return t.to(device, dtype) if t.is_floating_point() else t.to(device)

        (train_x, train_y), (test_x, test_y) = spec.train, spec.test
        self.dataset = Dataset(
            name="user",
            train_x=place(train_x),
            train_y=place(train_y),
            test_x=place(test_x),
            test_y=place(test_y),
            num_classes=0,
            augment=False,
        )

    def initial_params(self) -> Tensor:
        return self.flat.flat.clone()

    def batches(self, seed: int) -> BatchStream | WorkerBatches:
        config = self.config
        return batches_for(
            config.partition, self.dataset.train_y, config.batch_size, seed, config.workers
        )

    def gradient(self, params: Tensor, rows: Tensor) -> tuple[Tensor, float]:
        return self.flat.gradient(params, *self.inputs(rows), self.loss_fn)

    def inputs(self, rows: Tensor) -> tuple[Tensor, Tensor]:
        ds = self.dataset
        rows = rows.to(ds.train_x.device)
        return ds.train_x[rows], ds.train_y[rows]

    def source(self) -> GradientSource:
        return GradientSource(self.flat, self.loss_fn, self.inputs)

    def evaluate(self, params: Tensor) -> tuple[float, float]:
        return self.evaluate_on(params, self.dataset.test_x, self.dataset.test_y)

    @torch.no_grad()
    def evaluate_on(
        self, params: Tensor, x: Tensor, y: Tensor, batch_size: int = 1000
    ) -> tuple[float, float]:
        """(mean loss, error rate or NaN) of ``params`` on ``(x, y)``, in eval mode."""
        flat = self.flat
        flat._point_at(params)
        flat.module.eval()
        classification = not y.is_floating_point() and y.dim() == 1
        total, wrong = 0.0, 0
        for start in range(0, len(x), batch_size):
            xb, yb = x[start : start + batch_size], y[start : start + batch_size]
            out = flat.module(xb)
            total += self.loss_fn(out, yb).item() * len(yb)
            if classification and out.dim() == 2:
                wrong += (out.argmax(1) != yb).sum().item()
            else:
                classification = False
        return total / len(x), wrong / len(x) if classification else float("nan")

    def state_dict(self) -> dict[str, Any]:
        return {"buffers": self.flat.buffers_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.flat.load_buffers_state(state["buffers"])


@dataclass
class FitResult:
    """What :func:`fit` returns, the same for both backends.

    ``model`` holds the final parameters (the master's, as evaluated: for ``dana-slim``
    the look-ahead); ``metrics`` are the rows of ``metrics.csv`` (one per evaluation);
    ``summary`` the figures of ``summary.json``; ``log`` the per-push table
    (``log.numpy()``: worker, staleness, gap, loss, lr, sim_time columns); ``run_dir``
    the run directory when ``out`` was given (else None: the files were temporary).
    """

    model: nn.Module
    metrics: list[dict[str, float]]
    summary: dict[str, Any]
    log: PushLog
    backend: str
    run_dir: Path | None = None
    problem: UserProblem | None = field(default=None, repr=False)

    def evaluate(self, x: Tensor, y: Tensor) -> tuple[float, float]:
        """(mean loss, error rate) of the final parameters on ``(x, y)``."""
        flat = self.problem.flat
        place = self.problem.dataset.train_x
        x = x.to(place.device, place.dtype) if x.is_floating_point() else x.to(place.device)
        return self.problem.evaluate_on(flat.flat, x, y.to(place.device))


def fit(
    model: ModelOrFactory,
    train: Data,
    test: Data | None = None,
    *,
    loss_fn: LossFn = F.cross_entropy,
    algorithm: str = TrainConfig.algorithm,
    workers: int = TrainConfig.workers,
    lr: float = TrainConfig.lr,
    momentum: float = TrainConfig.momentum,
    weight_decay: float = TrainConfig.weight_decay,
    epochs: float = TrainConfig.epochs,
    batch_size: int = TrainConfig.batch_size,
    warmup_epochs: float | None = None,
    decay_epochs: Sequence[float] | None = None,
    decay_factor: float = TrainConfig.lr_decay_factor,
    eval_every: float = TrainConfig.eval_every,
    timing: str = TrainConfig.timing,
    timing_params: dict[str, Any] | None = None,
    cluster: str | dict[str, Any] | None = None,
    partition: str = TrainConfig.partition,
    max_staleness: int | None = None,
    seed: int = TrainConfig.seed,
    dtype: str = TrainConfig.dtype,
    backend: str = TrainConfig.backend,
    address: str | None = None,
    servers: int = TrainConfig.servers,
    standby: bool = TrainConfig.standby,
    device: str | torch.device = "cpu",
    batch_workers: int | str = 1,
    threads: int | None = None,
    time_scale: float = TrainConfig.time_scale,
    out: str | Path | None = None,
    progress: bool = False,
    mlflow: str | None = None,
    mlflow_experiment: str = TrainConfig.mlflow_experiment,
    run_name: str | None = None,
    tags: dict[str, Any] | None = None,
    tensorboard: str | Path | None = None,
    **hparams: Any,
) -> FitResult:
    """Train ``model`` on ``train`` with ``workers`` asynchronous workers; a :class:`FitResult`.

    The defaults and the checks are ``dana train``'s (:class:`~dana.train.config.TrainConfig`):
    ``dana-slim``, 8 workers, 3 epochs of batches of 128 per worker, lr 0.005, momentum
    0.9, weight decay 1e-4, ``gamma`` timing, an evaluation every epoch; ``warmup_epochs
    =None``: the automatic warm-up from ``lr/k`` (60 steps per worker, within 1/8 and 2/3
    of the run); ``decay_epochs=None``: one decay x``decay_factor`` at 9/10 of the run
    (``[]``: none). A bad argument raises :class:`~dana.errors.ConfigError` (a
    ``ValueError``) saying what it accepts, as ``dana train`` does. ``backend``: any
    registered runner (:data:`dana.train.backends.RUNNERS`: ``sim``, ``ray``).

    ``model``: a module (its current parameters are the start; on Ray each worker gets a
    copy), or a zero-argument factory (called after ``torch.manual_seed(seed)``, once
    here and once in each Ray worker). ``test`` defaults to the training data.
    ``loss_fn(model(x), y)`` must return the batch's mean loss. ``algorithm`` is any name
    of ``dana algorithms``; ``momentum`` goes to it when it takes one, and ``hparams``
    (``lc=...``, ``nesterov=...``) too. ``backend="ray"``: ``address`` joins a running
    cluster (``"auto"``; default: a private local Ray for this call), ``servers`` splits
    the parameters into that many shards, ``standby=False`` runs without shard 0's
    standby replica (cheaper pushes; a lost shard 0 then ends the run: ``dana train
    --no-standby``), ``time_scale`` emulates the ``timing`` model
    (see ``dana train --help``). ``device``: where it computes (``"cpu"``, ``"cuda"``,
    ``"auto"`` or a ``torch.device``; on Ray the workers, each with a share of the
    cluster's GPUs, while the servers stay on the CPU). ``batch_workers`` and
    ``threads``: the simulator's batched and threaded gradients, as ``dana train
    --batch-workers`` and ``--threads``. ``out``: write the run directory there (as
    ``dana train --out`` does), else into a temporary one, removed at the end.
    ``mlflow``: also track the run there, as ``dana train --mlflow`` does, as an MLflow
    run named ``run_name`` (default: the run directory's name) with ``tags`` besides
    ``dana.run_dir``; ``tensorboard``: also write TensorBoard logs into that directory.
    With ``out``, a failed fit leaves nothing there, and ``out`` must be new or empty
    (as ``dana train --out``): files fit did not write are never overwritten. ``cluster``
    and ``partition`` (the simulator only): the simulated cluster and the data per
    worker, as ``dana train --cluster`` and ``--partition`` (``servers`` then splits the
    messages over the shards' links). The
    simulator on a GPU is tested where one is lent (the tests marked ``cuda``).
    """
    check_model(model, "fit", factory=True)
    tracking = Tracking.check(tensorboard, run_name, tags, mlflow)
    check_callable(loss_fn, "loss_fn", "fit")
    check_name(backend, "backend")
    where = resolve_device(device)
    threads = check_threads(default_threads() if threads is None else threads)
    config = entry_config(
        fit,
        hparams,
        algorithm=algorithm,
        workers=workers,
        dataset="user",
        model=type(model).__name__ if isinstance(model, nn.Module) else "user",
        augment=False,
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
        cluster=cluster,
        partition=partition,
        max_staleness=max_staleness,
        seed=seed,
        eval_every=eval_every,
        dtype=dtype,
        backend=backend,
        address=address,
        servers=servers,
        standby=standby,
        time_scale=time_scale,
        device=where.type,
        batch_workers=batch_workers,
        mlflow=None if mlflow is None else str(mlflow),
        mlflow_experiment=mlflow_experiment,
        tensorboard=tensorboard is not None,
    )
    if config.mlflow:
        from dana.train.tracking import import_mlflow

        import_mlflow()
    train_xy = as_tensors(train, "train")
    test_xy = train_xy if test is None else as_tensors(test, "test")
    if batch_size > len(train_xy[0]):
        raise ConfigError(
            f"batch_size {batch_size} is larger than the {len(train_xy[0])} training examples"
        )
    spec = UserProblemSpec(model, train_xy, test_xy, loss_fn, str(where))
    if isinstance(model, nn.Module):
        instance = model
    else:
        torch.manual_seed(seed)
        instance = model()
    problem = UserProblem(config, spec, instance)
    if out is None:
        with tempfile.TemporaryDirectory(prefix="dana-fit-") as tmp:
            return _run(config, problem, RunDir(Path(tmp) / "run"), progress, threads, tracking)
    check_local(out, "out")
    run = RunDir(out)
    run.check_new("out")
    with run.removed_on_failure(errors=(Exception,), keep_results=False):
        result = _run(config, problem, run, progress, threads, tracking)
    result.run_dir = run.path
    return result


def _run(
    config: TrainConfig,
    problem: UserProblem,
    run: RunDir,
    progress: bool,
    threads: int,
    tracking: Tracking,
) -> FitResult:
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _run_on(config, problem, run, progress, threads, tracking)
    finally:
        torch.set_num_threads(previous)


def _run_on(
    config: TrainConfig,
    problem: UserProblem,
    run: RunDir,
    progress: bool,
    threads: int,
    tracking: Tracking,
) -> FitResult:
    from dana.version import __version__

    runner_cls = runner_class(config.backend)
    runner_cls.check(config, problem)
    runner: Any = runner_cls(config, run, problem, threads=threads)
    start_run(run, config, __version__)
    if tracking.tensorboard is not None:
        run.tensorboard = tracking.tensorboard
        run.open_tensorboard()
    title = f"{config.algorithm}, k={config.workers}, {config.model}"
    mlflow_run = {"run_name": tracking.run_name, "tags": tracking.tags}
    try:
        summary = execute_run(runner, config, run, title, progress, mlflow_run=mlflow_run)
    except DanaError as e:
        if "No module named" not in str(e):
            raise
        raise DanaError(
            f"{e}\nThe Ray workers could not unpickle the model, data or loss: define them "
            "in the driver script (shipped by value), make their module importable on every "
            "node (runtime_env working_dir or py_modules), or call "
            "ray.cloudpickle.register_pickle_by_value(module) before dana.fit"
        ) from None
    with torch.no_grad():
        problem.flat.load(runner.final_params())
    return FitResult(
        problem.flat.module,
        [dict(r) for r in runner.rows],
        summary,
        runner.log,
        config.backend,
        problem=problem,
    )
