"""Train your own model on your own data with ``k`` asynchronous workers, on either runner.

:func:`fit` takes a ``torch.nn.Module`` (or a zero-argument factory that builds one),
training data and optional test data (tensors, a ``Dataset`` read per batch or an
``IterableDataset``: :mod:`dana.train.task.reading`), a loss, and ``backend="sim"`` (the
exact simulator, :mod:`dana.sim`) or ``backend="ray"`` (real workers and parameter-server
shards on Ray, :mod:`dana.ps`). Both run the loop of ``dana train``: evaluations every
``eval_every`` epochs (any task: :mod:`dana.train.task.evaluation`; a metric hook adds
columns), the same ``metrics.csv`` rows and ``summary.json`` figures, the final model
kept in the run directory, and both return the same :class:`FitResult`.

On Ray the problem travels to the workers as one object in Ray's object store (a
:class:`UserProblemSpec`: the model or its factory, the training data as given, the
loss), pickled with
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from dana.errors import ConfigError, DanaError
from dana.train.backends import check_name
from dana.train.config import PYTHON_NAMES, TrainConfig
from dana.train.device import resolve_device
from dana.train.entries import Tracking, check_callable, check_model, entry_config
from dana.train.records.pushlog import PushLog
from dana.train.records.rundir import RunDir, check_local
from dana.train.records.tracking import require_trackers
from dana.train.resources import check_threads, default_threads, torch_threads
from dana.train.task import inputs as I
from dana.train.task.batches import BatchStream, WorkerBatches, batches_for
from dana.train.task.evaluation import (
    TOKENS,
    MetricFn,
    check_metrics,
    cross_entropy,
    eval_batch_size,
    metric_column,
    perplexity,
    probe_task,
)
from dana.train.task.flat import FlatModel, LossFn
from dana.train.task.problem import FlatProblem
from dana.train.task.reading import (
    Data,
    MapData,
    ReadBatches,
    TensorData,
    data_source,
    place,
    reading,
)
from dana.train.training import add_columns, check_runner, execute_run, start_run

ModelOrFactory = nn.Module | Callable[[], nn.Module]
#: What a model or a loss raises on inputs or targets it cannot take (torch's shape and
#: dtype errors are RuntimeErrors; an out-of-range class label, an IndexError).
_MODEL_ERRORS = (RuntimeError, ValueError, TypeError, IndexError)


@dataclass
class UserProblemSpec:
    """What a worker needs to rebuild the problem: picklable, shipped once through Ray
    (the training data as they came: tensors, or the dataset object each worker reads
    itself; never the test data, which the driver evaluates)."""

    model: ModelOrFactory
    train: Data
    loss_fn: LossFn = cross_entropy
    device: str = "cpu"

    def build(self, config: TrainConfig) -> UserProblem:
        """The problem in a worker: its own replica of the model (the parameters
        always come from the servers)."""
        if isinstance(self.model, nn.Module):
            model = copy.deepcopy(self.model)
        else:
            model = seeded_model(self.model, config.seed)
        return UserProblem(config, self, model)


def seeded_model(factory: Callable[[], nn.Module], seed: int) -> nn.Module:
    """``factory()`` under ``torch.manual_seed(seed)``, the caller's global generator
    saved and restored around it (``torch.random.fork_rng``)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return factory()


@dataclass
class UserData:
    """What the runners read of the data: the training examples and their class labels
    (None when they are not classes, or not known before reading: the bias meter)."""

    train_size: int
    train_y: Tensor | None


class UserProblem(FlatProblem):
    """:class:`dana.train.task.problem.Problem`'s interface on the user's model, data and loss
    (the gradient, the model file and the checkpointed buffers:
    :class:`~dana.train.task.problem.FlatProblem`'s).

    The evaluation is every run's (:mod:`dana.train.task.evaluation`): the loss, the error
    rate where the outputs and targets define one, and the ``metrics`` hook's values;
    token prediction (``N x T x V`` outputs against ``N x T`` integer targets) also
    gets ``test_perplexity``. ``test``: the evaluation data (the driver's; None in a
    Ray worker), read a batch at a time at each evaluation. The training data are read
    as :mod:`dana.train.task.reading` says.
    """

    def __init__(
        self,
        config: TrainConfig,
        spec: UserProblemSpec,
        model: nn.Module,
        test: Data | None = None,
        metrics: Mapping[str, MetricFn] | None = None,
    ):
        if not isinstance(model, nn.Module):
            raise ConfigError(f"the model must be a torch.nn.Module, got {type(model).__name__}")
        self.config, self.spec, self.loss_fn = config, spec, spec.loss_fn
        self.dtype = getattr(torch, config.dtype)
        self.device = torch.device(spec.device)
        model.to(self.device)
        try:
            self.flat = FlatModel(model, self.dtype)
        except ValueError as e:
            raise ConfigError(f"model: {e}") from None
        self.train = self._placed(spec.train)
        if isinstance(self.train, TensorData):  # (data read per batch: the test probe, below)
            self.check_fits(*self.train.rows(torch.arange(min(2, self.train.n))))
        labels = self.train.labels
        classes = labels is not None and labels.dim() == 1 and not labels.is_floating_point()
        self.dataset = UserData(self.train.n, labels if classes else None)
        self.test = None if test is None else self._placed(test)
        self.reads: ReadBatches | None = None  # the stream of read batches (batches())
        self.metrics = dict(metrics or {})
        #: metrics.csv's columns of the metric hook, and the derived perplexity.
        self.measured = tuple(metric_column(name) for name in self.metrics)
        self.derived: dict[str, Callable[[dict[str, float]], float]] = {}
        if self.test is not None:
            x, y = self.probe()
            self.check_fits(x, y, "test")
            self.test_batch = eval_batch_size(y)  # (examples an evaluation reads at once)
            if probe_task(self.flat.module, x, y) == TOKENS:
                self.derived["test_perplexity"] = perplexity

    def _placed(self, data: Data) -> Data:
        """``data``, on the device if held in memory (read batches are placed as read)."""
        return data.to(self.device, self.dtype) if isinstance(data, TensorData) else data

    def check_fits(self, x: I.Inputs, y: Tensor, what: str = "train") -> None:
        """ConfigError, saying what to change, unless the model takes ``x`` (two examples
        of the ``what`` data) and the loss its outputs and the targets ``y``: a run would
        fail at its first step with the raw error. In eval mode, without gradients (no
        running statistics move)."""
        module, training = self.flat.module, self.flat.module.training
        shapes = [tuple(t.shape) for t in I.tensors(x)]
        module.eval()
        try:
            with torch.no_grad():
                try:
                    out = I.call(module, x)
                except _MODEL_ERRORS as e:
                    raise ConfigError(
                        f"model: it cannot take the {what} data's inputs (shape "
                        f"{shapes[0] if len(shapes) == 1 else shapes} for two examples): "
                        f"{type(e).__name__}: {e}; give the model an input layer of the "
                        "data's size (in_features, in_channels, ...) or reshape the data"
                    ) from None
                try:
                    self.loss_fn(out, y)
                except _MODEL_ERRORS as e:
                    raise ConfigError(
                        f"loss_fn: it cannot take the model's outputs (shape "
                        f"{tuple(getattr(out, 'shape', ()))}) and the {what} data's targets "
                        f"(shape {tuple(y.shape)}, {y.dtype}): {type(e).__name__}: {e}; class "
                        "labels must be integers for a classification loss (the default "
                        "cross-entropy): pass y.long(); for other targets pass a loss_fn that "
                        "takes them (e.g. torch.nn.functional.mse_loss)"
                    ) from None
        finally:
            module.train(training)

    def _on_device(self, x: I.Inputs, y: Tensor) -> tuple[I.Inputs, Tensor]:
        return place(x, self.device, self.dtype), place(y, self.device, self.dtype)

    def probe(self) -> tuple[I.Inputs, Tensor]:
        """Two test examples, on the device."""
        return self._on_device(*self.test.rows(torch.arange(min(2, self.test.n))))

    def batches(
        self, seed: int, worker: int | None = None
    ) -> BatchStream | WorkerBatches | ReadBatches:
        """The run's stream seeded ``seed`` (``worker``: one Ray worker's own): rows of
        tensors in memory, or batches read when drawn (:class:`ReadBatches`, keyed by
        the run's seed, the worker and its step)."""
        config, data = self.config, self.train
        if isinstance(data, TensorData):
            return batches_for(config.partition, data.y, config.batch_size, seed, config.workers)
        if config.partition != "iid" and data.labels is None:
            raise ConfigError(
                f"partition {config.partition!r} splits the data by class: it needs the "
                "labels, (x, y) tensors or a Dataset with a `targets` attribute of integer "
                "labels; use partition='iid'"
            )
        rows = None
        if isinstance(data, MapData):  # (an iterable's batches come in its own order)
            labels = data.labels if data.labels is not None else torch.zeros(data.n)
            rows = batches_for(config.partition, labels, config.batch_size, seed, config.workers)
        self.reads = ReadBatches(data, config.batch_size, config.seed, rows, worker)
        return self.reads

    def inputs(self, batch: Any) -> tuple[I.Inputs, Tensor]:
        """A batch's examples on the device: rows of the tensors, or a batch of the read
        stream (:meth:`ReadBatches.take`)."""
        return self._on_device(
            *(self.train.rows(batch) if torch.is_tensor(batch) else self.reads.take(batch))
        )

    def evaluate(self, params: Tensor) -> dict[str, float]:
        """The test set's loss, error rate and metrics at ``params``, a batch at a time."""
        batches = (self._on_device(x, y) for x, y in self.test.batches(self.test_batch))
        return self.flat.measure_batches(params, batches, self.loss_fn, self.metrics)

    def model_info(self) -> dict[str, Any]:
        """The model file's metadata: a user's model, loaded into the user's factory."""
        return {"model": self.config.model, "kind": "user"}


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

    def evaluate(self, x: I.Inputs, y: Tensor) -> tuple[float, float]:
        """(mean loss, error rate or NaN) of the final parameters on ``(x, y)``
        (:mod:`dana.train.task.evaluation`)."""
        found = self.measure(x, y)
        return found["loss"], found["error"]

    def measure(self, x: I.Inputs, y: Tensor) -> dict[str, float]:
        """``{"loss", "error", NAME...}`` of the final parameters on ``(x, y)``, the
        run's ``metrics`` included."""
        problem = self.problem
        x, y = (place(v, problem.device, problem.dtype) for v in (x, y))
        return problem.flat.measure(
            problem.flat.flat, x, y, problem.loss_fn, metrics=problem.metrics
        )


def fit(
    model: ModelOrFactory,
    train: Any,
    test: Any = None,
    *,
    loss_fn: LossFn = cross_entropy,
    metrics: Mapping[str, MetricFn] | None = None,
    algorithm: str = TrainConfig.algorithm,
    workers: int = TrainConfig.workers,
    lr: float = TrainConfig.lr,
    momentum: float = TrainConfig.momentum,
    weight_decay: float = TrainConfig.weight_decay,
    epochs: float = TrainConfig.epochs,
    batch_size: int = TrainConfig.batch_size,
    warmup_epochs: float | None = TrainConfig.warmup_epochs,
    decay_epochs: Sequence[float] | None = TrainConfig.lr_decay_epochs,
    decay_factor: float = TrainConfig.lr_decay_factor,
    lr_scaling: str = TrainConfig.lr_scaling,
    eval_every: float = TrainConfig.eval_every,
    checkpoint_every: float = TrainConfig.checkpoint_every,
    timing: str = TrainConfig.timing,
    timing_params: dict[str, Any] | None = None,
    cluster: str | dict[str, Any] | None = TrainConfig.cluster,
    partition: str = TrainConfig.partition,
    max_staleness: int | None = TrainConfig.max_staleness,
    compress: str = TrainConfig.compress,
    seed: int = TrainConfig.seed,
    dtype: str = TrainConfig.dtype,
    backend: str = TrainConfig.backend,
    address: str | None = TrainConfig.address,
    servers: int = TrainConfig.servers,
    standby: bool = TrainConfig.standby,
    server_timeout: float = TrainConfig.server_timeout,
    relay_log_bytes: int = TrainConfig.relay_log_bytes,
    time_scale: float = TrainConfig.time_scale,
    max_workers: int | None = TrainConfig.max_workers,
    grow_at: str | None = TrainConfig.grow_at,
    device: str | torch.device = TrainConfig.device,
    batch_workers: int | str = TrainConfig.batch_workers,
    cuda_graph: bool = TrainConfig.cuda_graph,
    threads: int | None = None,
    num_workers: int = 0,
    out: str | Path | None = None,
    progress: bool = False,
    mlflow: str | None = TrainConfig.mlflow,
    mlflow_experiment: str = TrainConfig.mlflow_experiment,
    wandb: str | None = TrainConfig.wandb,
    run_name: str | None = None,
    tags: dict[str, Any] | None = None,
    tensorboard: str | Path | None = None,
    **hparams: Any,
) -> FitResult:
    """Train ``model`` on ``train`` with ``workers`` asynchronous workers: ``dana train``
    on your own model, data and loss.

    Every option is ``dana train``'s (``dana train --help``; the names: underscores
    for dashes, ``decay_epochs`` for ``--lr-decay-epochs``, ``decay_factor`` for
    ``--lr-decay-factor``), with the same defaults (:class:`~dana.train.config.TrainConfig`)
    and checks: a bad argument raises :class:`~dana.errors.ConfigError` (a
    ``ValueError``) saying what it accepts. ``warmup_epochs=None`` and
    ``decay_epochs=None`` are the automatic warm-up and decay (``[]``: none).

    Args:
        model: a ``torch.nn.Module`` (its parameters are the start; on Ray each worker
            gets a copy), or a zero-argument factory (called after
            ``torch.manual_seed(seed)``, here and in each Ray worker).
        train: ``(x, y)`` tensors, a ``Dataset`` of ``(x, y)`` items read per batch, or
            an ``IterableDataset`` with ``__len__`` (:mod:`dana.train.task.reading`; ``x`` a
            tensor, tuple or dict of tensors: ``model(x)``, ``model(*x)``, ``model(**x)``).
        test: the evaluation data, as ``train`` (default: ``train``).
        loss_fn: ``loss_fn(model(x), y)``, the batch's mean loss (default: the
            cross-entropy over the output's last dimension).
        metrics: ``{"NAME": fn}``, ``fn(outputs, targets) -> float`` on each test batch,
            averaged over the examples: the column ``test_NAME``.
        algorithm: any name of ``dana algorithms``; ``momentum`` and ``hparams``
            (``lc=...``, ``nesterov=...``) go to it.
        backend: any registered runner (``sim``, ``ray``); ``address`` joins a running
            Ray cluster (``"auto"``; default: a private local Ray for this call).
        device: where it computes (``"cpu"``, ``"cuda"``, ``"auto"``, a ``torch.device``;
            on Ray the workers, each with a share of the GPUs).
        threads: the simulator's CPU threads (default 1, or ``OMP_NUM_THREADS``).
        num_workers: reader processes of a map-style ``Dataset`` (DataLoader's option;
            default 0: read in process), in each process that reads (the simulator's,
            each Ray worker's); the same batches whatever the number.
        out: write the run directory there (new or empty; the final model as
            ``model.safetensors``: ``dana.load_model(out, model=make_model)``); default a
            temporary one, removed at the end. A failed fit leaves nothing there.
        progress: show a progress bar.
        mlflow, mlflow_experiment, run_name, tags: also track the run in MLflow, as an
            MLflow run named ``run_name`` (default: the run directory's name) with
            ``tags`` besides ``dana.run_dir`` (the run directory, with ``out=``).
        wandb: also track the run in Weights & Biases, in this project (offline unless
            the environment sets ``WANDB_MODE``).
        tensorboard: also write TensorBoard logs into this directory.
        **hparams: the algorithm's other hyper-parameters.

    Returns:
        A :class:`FitResult`: the trained ``model`` (the master's parameters), the
        metrics rows, the summary and the push log.
    """
    check_model(model, "fit", factory=True)
    tracking = Tracking.check(tensorboard, run_name, tags, mlflow)
    check_callable(loss_fn, "loss_fn", "fit")
    check_name(backend, "backend")
    where = resolve_device(device)
    threads = check_threads(default_threads() if threads is None else threads)
    config = entry_config(
        fit,
        locals(),
        dataset="user",
        model="user",  # its class once built, below
        augment=False,
        device=where.type,
        mlflow=None if mlflow is None else str(mlflow),
        tensorboard=tensorboard is not None,
    )
    require_trackers(config.to_dict())
    metrics = check_metrics(metrics)
    train_data = data_source(train, "train", num_workers)
    test_data = train_data if test is None else data_source(test, "test", num_workers)
    if batch_size > train_data.n:
        raise ConfigError(
            f"batch_size {batch_size} is larger than the {train_data.n} training examples"
        )
    spec = UserProblemSpec(model, train_data, loss_fn, str(where))
    instance = model if isinstance(model, nn.Module) else seeded_model(model, seed)
    config = replace(config, model=type(instance).__name__)  # what trackers show
    problem = UserProblem(config, spec, instance, test_data, metrics)
    if out is None:
        with (
            tempfile.TemporaryDirectory(prefix="dana-fit-") as tmp,
            torch_threads(threads),
            reading(train_data, test_data),
        ):
            run = RunDir(Path(tmp) / "run")
            return _run(config, problem, run, progress, threads, tracking, kept=False)
    check_local(out, "out")
    run = RunDir(out)
    run.check_new("out")
    with (
        run.removed_on_failure(errors=(Exception,), keep_results=False),
        torch_threads(threads),
        reading(train_data, test_data),
    ):
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
    kept: bool = True,
) -> FitResult:
    """The fit of ``problem`` into ``run`` (``kept``: False for a temporary directory,
    deleted afterwards, which no tracker may name)."""
    from dana.version import __version__

    runner_cls = check_runner(config, problem, PYTHON_NAMES)
    runner: Any = runner_cls(config, run, problem, threads=threads)
    add_columns(run, problem)
    start_run(run, config, __version__)
    if tracking.tensorboard is not None:
        run.tensorboard = tracking.tensorboard
        run.open_tensorboard()
    title = f"{config.algorithm}, k={config.workers}, {config.model}"
    tracked = {"name": tracking.run_name, "tags": tracking.tags, "kept": kept}
    try:
        summary = execute_run(runner, config, run, title, progress, problem, tracked)
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
