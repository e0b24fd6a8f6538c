"""A classification problem as the rules see it: a gradient and an evaluation at flat params.

:class:`Problem` ties a dataset, a model (made flat by :class:`FlatModel`), the
cross-entropy loss and the training augmentation together. The simulator and each Ray
worker build one from the same :class:`~dana.train.config.TrainConfig`; the model's
initial parameters depend only on ``config.seed``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from dana.data import Dataset, augment_batch, load_dataset
from dana.models import build_model
from dana.train.batches import BatchStream, WorkerBatches, batches_for
from dana.train.config import TrainConfig
from dana.train.device import resolve_device
from dana.train.flat import FlatModel
from dana.train.stacked import GradientSource


class Problem:
    def __init__(self, config: TrainConfig, dataset: Dataset | None = None):
        self.config = config
        self.dataset = dataset or load_dataset(
            config.dataset,
            config.data_dir,
            seed=config.seed,
            augment=config.augment,
            train_size=config.train_size,
            test_size=config.test_size,
        )
        ds = self.dataset
        if config.batch_size > ds.train_size:
            from dana.errors import ConfigError

            raise ConfigError(
                f"--batch-size {config.batch_size} is larger than the {ds.train_size} "
                f"training examples of {ds.name}"
            )
        dtype = getattr(torch, config.dtype)
        self.device = resolve_device(config.device)
        torch.manual_seed(config.seed)
        model = build_model(config.model, ds.channels, ds.image_size, ds.num_classes)
        self.flat = FlatModel(model.to(self.device), dtype)
        for name in ("train_x", "test_x", "train_y", "test_y"):
            t = getattr(ds, name)
            if t.is_floating_point() and dtype != torch.float32:
                t = t.to(dtype)
            setattr(ds, name, t.to(self.device))

    def batches(self, seed: int) -> BatchStream | WorkerBatches:
        """The stream of training batches seeded ``seed``: with augmentation, a
        :class:`~dana.train.batches.KeyedBatchStream`, whose keys seed each batch's
        augmentation draws; with ``--partition`` other than ``iid``, one stream per
        worker over its part (:class:`~dana.train.batches.WorkerBatches`)."""
        config = self.config
        return batches_for(
            config.partition,
            self.dataset.train_y,
            config.batch_size,
            seed,
            config.workers,
            keyed=bool(self.dataset.augment),
        )

    def source(self) -> GradientSource:
        """The model, loss and data, for the simulator's batched and threaded engines
        (augmentation draws no numbers in the order gradients are computed: a batch's
        draws are seeded by its key, :meth:`batches`)."""
        return GradientSource(self.flat, F.cross_entropy, self.inputs)

    def inputs(self, batch: Tensor | tuple[Tensor, int]) -> tuple[Tensor, Tensor]:
        """The training examples of ``batch`` on the device: rows (unaugmented), or
        ``(rows, key)`` (augmented with draws seeded by ``key``: the same whenever and
        on whichever thread it is called)."""
        rows, key = batch if isinstance(batch, tuple) else (batch, None)
        rows = rows.to(self.device)
        x = self.dataset.train_x[rows]
        if key is not None:
            x = augment_batch(x, torch.Generator().manual_seed(key))
        return x, self.dataset.train_y[rows]

    def initial_params(self) -> Tensor:
        return self.flat.flat.clone()

    def gradient(self, params: Tensor, batch: Tensor | tuple[Tensor, int]) -> tuple[Tensor, float]:
        """The loss's gradient (no weight decay) at ``params`` on ``batch`` (see
        :meth:`inputs`)."""
        return self.flat.gradient(params, *self.inputs(batch), F.cross_entropy)

    def evaluate(self, params: Tensor) -> tuple[float, float]:
        """(test loss, test error) at ``params``."""
        ds = self.dataset
        return self.flat.evaluate(params, ds.test_x, ds.test_y, F.cross_entropy)

    def state_dict(self) -> dict[str, Any]:
        return {"buffers": self.flat.buffers_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.flat.load_buffers_state(state["buffers"])
