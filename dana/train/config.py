"""The configuration of one training run: every option of ``dana train``.

A run's ``config.json`` holds a :class:`TrainConfig` (and the package version), and
``dana train --config config.json`` reruns it. Values are validated in
:meth:`TrainConfig.validate`, which raises :class:`~dana.errors.ConfigError` naming the
bad option and what it accepts.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dana import algorithms
from dana.algorithms.base import Algorithm
from dana.errors import ConfigError
from dana.train.backends import RUNNERS
from dana.train.timing import TIMING_MODELS

BACKENDS = tuple(RUNNERS)
LR_SCALINGS = ("none", "linear")
DTYPES = ("float32", "float64")


@dataclass
class TrainConfig:
    """Every option of a run. The defaults train the small BatchNorm CNN on Fashion-MNIST
    with the paper's batch size, momentum and weight decay, and a learning rate (0.005,
    not the paper's 0.1) at which this CNN trains with up to 64 asynchronous workers:
    it is far more sensitive to staleness than ResNet-20 (docs/RESULTS.md)."""

    algorithm: str = "dana-slim"
    workers: int = 8
    dataset: str = "fashion-mnist"
    data_dir: str | None = None
    train_size: int | None = None
    test_size: int | None = None
    augment: bool | None = None
    model: str = "cnn"
    epochs: float = 3.0
    batch_size: int = 128
    lr: float = 0.005
    momentum: float = 0.9
    weight_decay: float = 1e-4
    lr_decay_epochs: list[float] = field(default_factory=list)
    lr_decay_factor: float = 0.1
    warmup_epochs: float = 1.0
    lr_scaling: str = "none"
    timing: str = "gamma"
    timing_params: dict[str, Any] = field(default_factory=dict)
    max_staleness: int | None = None
    algorithm_params: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    eval_every: float = 1.0
    checkpoint_every: float = 0.0
    tensorboard: bool = False
    mlflow: str | None = None
    mlflow_experiment: str = "dana"
    dtype: str = "float32"
    backend: str = "sim"
    address: str | None = None
    servers: int = 1
    time_scale: float = 0.0

    # -- construction -------------------------------------------------------------------
    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "config") -> TrainConfig:
        values = {k: v for k, v in values.items() if k != "dana_version"}
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ConfigError(
                f"{source}: unknown option(s) {', '.join(unknown)}; valid options: "
                f"{', '.join(sorted(names))}"
            )
        return cls(**values)

    @classmethod
    def from_file(cls, path: str | Path) -> dict[str, Any]:
        """The options in a YAML or JSON file, as a dict (not yet merged or validated)."""
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as e:
            raise ConfigError(f"{path}: cannot read the config file: {e.strerror}") from None
        try:
            values = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        except (json.JSONDecodeError, yaml.YAMLError) as e:
            raise ConfigError(
                f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {e}"
            ) from None
        if values is None:
            values = {}
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: a config file must hold a mapping of option: value")
        return {k.replace("-", "_"): v for k, v in values.items()}

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def peak_lr(self) -> float:
        """The rate after warm-up, before decay: ``lr``, or ``lr * workers`` with the
        linear-scaling rule (``lr_scaling: linear``; Goyal et al. 2017)."""
        return self.lr * self.workers if self.lr_scaling == "linear" else self.lr

    def algorithm_hparams(self) -> dict[str, Any]:
        """The hyper-parameters passed to the algorithm: momentum if it takes one, then
        ``algorithm_params``, then ``workers`` if it takes it (the elastic-averaging
        algorithms derive their coefficient from it)."""
        hparams: dict[str, Any] = {}
        names = algorithms.hparam_names(self.algorithm)
        if "momentum" in names:
            hparams["momentum"] = self.momentum
        hparams.update(self.algorithm_params)
        if "workers" in names:
            hparams["workers"] = self.workers
        return hparams

    # -- validation ---------------------------------------------------------------------
    def validate(self) -> TrainConfig:
        if self.algorithm not in algorithms.ALGORITHMS:
            raise ConfigError(
                f"--algorithm {self.algorithm!r} is unknown; choose one of: "
                f"{', '.join(algorithms.ALGORITHMS)} (see `dana algorithms`)"
            )
        _integer("workers", self.workers, 1)
        _integer("batch_size", self.batch_size, 1)
        _integer("seed", self.seed, 0)
        _integer("servers", self.servers, 1)
        if self.max_staleness is not None:
            _integer("max_staleness", self.max_staleness, 0)
        for name in ("train_size", "test_size"):
            if getattr(self, name) is not None:
                _integer(name, getattr(self, name), 1)
        _number("epochs", self.epochs, low=0, strict=True)
        _number("lr", self.lr, low=0, strict=True)
        _number("momentum", self.momentum, low=0)
        if self.momentum >= 1:
            raise ConfigError(f"--momentum must be in [0, 1), got {self.momentum!r}")
        _number("weight_decay", self.weight_decay, low=0)
        _number("warmup_epochs", self.warmup_epochs, low=0)
        _number("eval_every", self.eval_every, low=0, strict=True)
        _number("checkpoint_every", self.checkpoint_every, low=0)
        _number("time_scale", self.time_scale, low=0)
        _number("lr_decay_factor", self.lr_decay_factor, low=0, strict=True)
        if self.lr_decay_factor > 1:
            raise ConfigError(f"--lr-decay-factor must be in (0, 1], got {self.lr_decay_factor}")
        if not isinstance(self.lr_decay_epochs, list) or any(
            not isinstance(e, int | float) or isinstance(e, bool) or e <= 0
            for e in self.lr_decay_epochs
        ):
            raise ConfigError(
                f"--lr-decay-epochs must be positive numbers, got {self.lr_decay_epochs!r}"
            )
        if self.lr_decay_epochs != sorted(self.lr_decay_epochs):
            raise ConfigError(f"--lr-decay-epochs must increase, got {self.lr_decay_epochs!r}")
        if self.lr_scaling not in LR_SCALINGS:
            raise ConfigError(
                f"--lr-scaling {self.lr_scaling!r} is unknown; choose one of: "
                f"{', '.join(LR_SCALINGS)}"
            )
        if self.timing not in TIMING_MODELS:
            raise ConfigError(
                f"--timing {self.timing!r} is unknown; choose one of: {', '.join(TIMING_MODELS)}"
            )
        for name in ("timing_params", "algorithm_params"):
            if not isinstance(getattr(self, name), dict):
                raise ConfigError(f"{name} must be a mapping, got {getattr(self, name)!r}")
        if self.backend not in BACKENDS:
            raise ConfigError(
                f"--backend {self.backend!r} is unknown; choose one of: {', '.join(BACKENDS)}"
            )
        if self.dtype not in DTYPES:
            raise ConfigError(
                f"--dtype {self.dtype!r} is unknown; choose one of: {', '.join(DTYPES)}"
            )
        if self.servers > 1 and not algorithms.get(self.algorithm).elementwise:
            raise ConfigError(
                f"--servers {self.servers}: {self.algorithm}'s master rule is not "
                "element-wise (its state depends on the whole vector), so it cannot be split "
                "into shards; use --servers 1"
            )
        self.build_algorithm()
        return self

    def build_algorithm(self) -> Algorithm:
        """The run's algorithm, built from ``algorithm`` and :meth:`algorithm_hparams`
        (once: the object is kept while they stay the same)."""
        key = (self.algorithm, repr(sorted(self.algorithm_hparams().items())))
        cached = self.__dict__.get("_built")
        if cached is not None and cached[0] == key:
            return cached[1]
        try:
            algorithm = algorithms.build(self.algorithm, **self.algorithm_hparams())
        except (ValueError, TypeError) as e:
            raise ConfigError(f"--algorithm {self.algorithm}: {e}") from None
        self.__dict__["_built"] = (key, algorithm)
        return algorithm


def _integer(name: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"--{name.replace('_', '-')} must be an integer >= {low}, got {value!r}")


def _number(name: str, value: Any, low: float, strict: bool = False) -> None:
    ok = (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and (value > low if strict else value >= low)
    )
    if not ok:
        op = ">" if strict else ">="
        raise ConfigError(f"--{name.replace('_', '-')} must be a number {op} {low}, got {value!r}")
