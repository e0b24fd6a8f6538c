"""A classification problem as the rules see it: a gradient and an evaluation at flat params.

:class:`Problem` ties a dataset, a model (made flat by :class:`FlatModel`), the
cross-entropy loss and the training augmentation together. The simulator and each Ray
worker build one from the same :class:`~dana.train.config.TrainConfig`; the model's
initial parameters depend only on ``config.seed``.

A language model (``--dataset text`` with ``--model transformer-...``) is the same
problem over tokens: the data are windows of the model's context, the loss the
cross-entropy of every next token (:func:`token_cross_entropy`), the test error the
next-token error, and ``metrics.csv`` also gets the test perplexity
(:attr:`Problem.derived`).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from dana.data import Dataset, augment_batch, load_dataset
from dana.models import build_language_model, build_model, context_length, is_language_model
from dana.train.config import TrainConfig
from dana.train.device import resolve_device, to_device
from dana.train.resources import build_within_memory
from dana.train.task.batches import BatchStream, WorkerBatches, batches_for
from dana.train.task.captured import CapturedCall, captured_gradient
from dana.train.task.evaluation import perplexity
from dana.train.task.flat import FlatModel
from dana.train.task.stacked import GradientSource


class TrainingProblem(Protocol):
    """What the runners read of a problem: :class:`Problem` (a dataset and a model of
    dana's) and :class:`dana.fitting.UserProblem` (``dana.fit``'s model, data and loss)."""

    config: TrainConfig
    flat: FlatModel
    loss_fn: Any
    dataset: Any  #: ``train_size`` and ``train_y`` (the class labels, or None)
    measured: tuple[str, ...]  #: ``metrics.csv`` columns a metric hook measures
    derived: dict[str, Any]  #: ``metrics.csv`` columns computed from each row
    spec: Any  #: what a Ray worker rebuilds the problem from (None: from the config)

    def initial_params(self) -> Tensor: ...

    def batches(self, seed: int, worker: int | None = None) -> Any: ...

    def gradient(self, params: Tensor, batch: Any) -> tuple[Tensor, Tensor]: ...

    def inputs(self, batch: Any) -> tuple[Any, Tensor]: ...

    def source(self) -> GradientSource: ...

    def evaluate(self, params: Tensor) -> dict[str, float]: ...

    def model_info(self) -> dict[str, Any]: ...

    def references(self) -> dict[str, float]: ...

    def save_model(self, path: str | Path, params: Tensor) -> Path: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def token_cross_entropy(out: Tensor, target: Tensor) -> Tensor:
    """The mean cross-entropy over every target: ``out`` ``... x V`` logits, ``target``
    the classes ``...`` (a language model's ``N x T x V`` and ``N x T``)."""
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))


class FlatProblem:
    """What a problem does through its flat model (``flat``), its loss (``loss_fn``) and
    its :meth:`inputs`, the same for dana's datasets and models (:class:`Problem`) and a
    user's (:class:`dana.fitting.UserProblem`): the gradient, the engines' source, the
    model file and the checkpointed buffers."""

    config: TrainConfig
    flat: FlatModel
    loss_fn: Any

    def inputs(self, batch: Any) -> tuple[Any, Tensor]:
        raise NotImplementedError

    def references(self) -> dict[str, float]:
        """The losses a model must beat, by name (``summary.json``'s
        ``reference_losses``); none but a language model's."""
        return {}

    def model_info(self) -> dict[str, Any]:
        raise NotImplementedError

    def initial_params(self) -> Tensor:
        return self.flat.flat.clone()

    def gradient(self, params: Tensor, batch: Any) -> tuple[Tensor, Tensor]:
        """The loss's gradient (no weight decay) at ``params`` on ``batch`` (see
        :meth:`inputs`); with ``--cuda-graph`` replayed as a CUDA graph
        (:mod:`dana.train.task.captured`)."""
        if self.config.cuda_graph:
            return self.captured(params, *self.inputs(batch))
        return self.flat.gradient(params, *self.inputs(batch), self.loss_fn)

    @functools.cached_property
    def captured(self) -> CapturedCall:
        return captured_gradient(self.flat, self.loss_fn)

    def source(self) -> GradientSource:
        """The model, loss and data, for the simulator's batched and threaded engines
        (which compute gradients in any order: a batch's random draws, augmentation's,
        are seeded by the batch, :meth:`Problem.batches`)."""
        return GradientSource(
            self.flat, self.loss_fn, self.inputs, cuda_graph=self.config.cuda_graph
        )

    def save_model(self, path: str | Path, params: Tensor) -> Path:
        """Write the model at ``params`` (a run's final parameters, as evaluated), with
        its buffers, to ``path`` (a run directory: its ``model.safetensors``;
        :mod:`dana.train.records.modelfile`)."""
        from dana.train.records.modelfile import save_model

        flat = self.flat
        with torch.no_grad():
            flat.load(params.to(flat.flat.device, flat.flat.dtype))
        return save_model(path, flat.module, self.model_info())

    def state_dict(self) -> dict[str, Any]:
        return {"buffers": self.flat.buffers_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.flat.load_buffers_state(state["buffers"])


class Problem(FlatProblem):
    def __init__(self, config: TrainConfig, dataset: Dataset | None = None):
        self.config = config
        language = is_language_model(config.model)
        text = config.dataset.strip().lower() == "text"
        if text and not language:
            build_language_model(config.model, 256)  # (an image model: says which to choose)
        self.dataset = dataset or load_dataset(
            config.dataset,
            config.data_dir,
            seed=config.seed,
            augment=config.augment,
            train_size=config.train_size,
            test_size=config.test_size,
            seq_len=context_length(config.model) if language else None,
        )
        ds = self.dataset
        #: The loss of the model's output and the targets.
        self.loss_fn = token_cross_entropy if ds.kind == "tokens" else F.cross_entropy
        #: Columns of metrics.csv computed from each row (a language model's perplexity).
        self.derived = {"test_perplexity": perplexity} if ds.kind == "tokens" else {}
        #: Columns of metrics.csv measured at each evaluation beyond the loss and the
        #: error (a ``dana.fit`` metric hook's; none here).
        self.measured: tuple[str, ...] = ()
        self.spec = None  # (a Ray worker builds its own from the config)
        if config.batch_size > ds.train_size:
            from dana.errors import ConfigError

            raise ConfigError(
                f"--batch-size {config.batch_size} is larger than the {ds.train_size} "
                f"training examples of {ds.name}"
            )
        dtype = getattr(torch, config.dtype)
        self.device = resolve_device(config.device)
        torch.manual_seed(config.seed)
        if ds.kind == "tokens":
            model = build_within_memory(
                lambda: build_language_model(config.model, ds.num_classes),
                f"--model {config.model} over {ds.num_classes:,} tokens",
            )
        else:
            model = build_within_memory(
                lambda: build_model(config.model, ds.channels, ds.image_size, ds.num_classes),
                f"--model {config.model} for {ds.num_classes:,} classes of {ds.channels}x"
                f"{ds.image_size}x{ds.image_size} images",
            )
        self.flat = FlatModel(model.to(self.device), dtype)
        for name in ("train_x", "test_x", "train_y", "test_y"):
            t = getattr(ds, name)
            if t.is_floating_point() and dtype != torch.float32:
                t = t.to(dtype)
            setattr(ds, name, t.to(self.device))

    def references(self) -> dict[str, float]:
        """A language model's yardsticks: the test loss of the byte unigram and bigram
        models of the training text (:func:`dana.data.text.reference_losses`)."""
        ds = self.dataset
        if ds.kind != "tokens":
            return {}
        from dana.data.text import reference_losses

        return reference_losses(ds.train_x, ds.train_y, ds.test_x, ds.test_y, ds.num_classes)

    def batches(self, seed: int, worker: int | None = None) -> BatchStream | WorkerBatches:
        """The stream of training batches seeded ``seed`` (``worker``: a Ray worker's
        own stream; the same here, its seed says whose): with augmentation, a
        :class:`~dana.train.task.batches.KeyedBatchStream`, whose keys seed each batch's
        augmentation draws; with ``--partition`` other than ``iid``, one stream per
        worker over its part (:class:`~dana.train.task.batches.WorkerBatches`)."""
        config = self.config
        return batches_for(
            config.partition,
            self.dataset.train_y,
            config.batch_size,
            seed,
            config.workers,
            keyed=bool(self.dataset.augment),
        )

    def inputs(self, batch: Tensor | tuple[Tensor, int]) -> tuple[Tensor, Tensor]:
        """The training examples of ``batch`` on the device: rows (unaugmented), or
        ``(rows, key)`` (augmented with draws seeded by ``key``: the same whenever and
        on whichever thread it is called)."""
        rows, key = batch if isinstance(batch, tuple) else (batch, None)
        rows = to_device(rows, self.device)
        x = self.dataset.train_x[rows]
        if key is not None:
            x = augment_batch(x, torch.Generator().manual_seed(key))
        return x, self.dataset.train_y[rows]

    def evaluate(self, params: Tensor) -> dict[str, float]:
        """``{"loss", "error"}`` on the test set at ``params`` (the error of a language
        model: the next-token error; :mod:`dana.train.task.evaluation`)."""
        ds = self.dataset
        return self.flat.measure(params, ds.test_x, ds.test_y, self.loss_fn)

    def model_info(self) -> dict[str, Any]:
        """How to build this problem's model again (the model file's metadata)."""
        ds, config = self.dataset, self.config
        info: dict[str, Any] = {"model": config.model, "kind": ds.kind, "dataset": ds.name}
        info["num_classes"] = ds.num_classes
        if ds.kind == "tokens":
            info["context"] = ds.seq_len
        else:
            info.update(in_channels=ds.channels, image_size=ds.image_size)
        return info
