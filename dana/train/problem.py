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
        # (on the CPU: the draws of every augmentation, in the order gradients are computed)
        self.augment_generator = torch.Generator().manual_seed(config.seed + 1_000_003)

    @property
    def random_gradient(self) -> bool:
        """True when a gradient draws random numbers (augmentation): its result then
        depends on the order gradients are computed in."""
        return bool(self.dataset.augment)

    def source(self) -> GradientSource:
        """The model, loss and data, for the simulator's batched and threaded engines."""
        return GradientSource(self.flat, F.cross_entropy, self.inputs, self.random_gradient)

    def inputs(self, rows: Tensor) -> tuple[Tensor, Tensor]:
        """The examples ``rows`` of the training set, unaugmented, on the device."""
        rows = rows.to(self.device)
        return self.dataset.train_x[rows], self.dataset.train_y[rows]

    def initial_params(self) -> Tensor:
        return self.flat.flat.clone()

    def gradient(self, params: Tensor, rows: Tensor) -> tuple[Tensor, float]:
        """The loss's gradient (no weight decay) at ``params`` on the examples ``rows``."""
        rows = rows.to(self.device)
        x = self.dataset.train_x[rows]
        if self.dataset.augment:
            x = augment_batch(x, self.augment_generator)
        return self.flat.gradient(params, x, self.dataset.train_y[rows], F.cross_entropy)

    def evaluate(self, params: Tensor) -> tuple[float, float]:
        """(test loss, test error) at ``params``."""
        ds = self.dataset
        return self.flat.evaluate(params, ds.test_x, ds.test_y, F.cross_entropy)

    def state_dict(self) -> dict[str, Any]:
        return {
            "buffers": self.flat.buffers_state(),
            "augment_generator": self.augment_generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.flat.load_buffers_state(state["buffers"])
        self.augment_generator.set_state(state["augment_generator"])
