"""What the Python entries (:func:`dana.fit`, :func:`dana.simulate`) share: their
arguments checked as ``dana train`` checks its options, and turned into one
:class:`~dana.train.config.TrainConfig`.

A keyword neither the entry nor the algorithm takes is refused as Python refuses one
(``TypeError: fit() got an unexpected keyword argument 'tensorbord'``), with the closest
name and the algorithm's hyper-parameters listed apart; data must be tensors (or
arrays) of one row per example, with finite values.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dana import algorithms
from dana.errors import ArgumentTypeError, ConfigError
from dana.train.config import PYTHON_NAMES, TrainConfig

#: The entries' names for the TrainConfig fields they name otherwise.
FIELDS = {python: field for field, python in PYTHON_NAMES.items()}
#: The TrainConfig fields, which an entry's keyword-only arguments may name.
CONFIG_FIELDS = {f.name for f in dataclasses.fields(TrainConfig)}


def check_keywords(entry: Callable[..., Any], algorithm: Any, hparams: Mapping[str, Any]) -> None:
    """ArgumentTypeError for a keyword in ``hparams`` (the entry's ``**hparams``) that is
    no hyper-parameter of ``algorithm``: a misspelt argument of ``entry``, most likely."""
    if not isinstance(algorithm, str) or algorithm not in algorithms.ALGORITHMS:
        return  # TrainConfig.validate names the unknown algorithm
    taken = algorithms.hparam_names(algorithm)
    for key in hparams:
        if key in taken:
            continue
        own = [
            name
            for name, p in inspect.signature(entry).parameters.items()
            if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
        ]
        close = difflib.get_close_matches(key, own + taken, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ArgumentTypeError(
            f"{entry.__name__}() got an unexpected keyword argument {key!r}{hint}; it takes "
            f"{', '.join(own)}; and {algorithm}'s hyper-parameters: "
            f"{', '.join(taken) or '(none)'} (see `dana algorithms`)"
        )


def entry_config(
    entry: Callable[..., Any], given: Mapping[str, Any], **derived: Any
) -> TrainConfig:
    """The validated TrainConfig of a call of ``entry``, from its ``locals()`` (``given``,
    taken before it rebinds an option): its keyword-only arguments that name a TrainConfig
    field (by the entry's names: ``decay_epochs``, ``decay_factor``), ``derived`` (the
    values the entry computes: the device's type, the model's name) over them, and its
    ``**`` keywords, the algorithm's hyper-parameters. ArgumentTypeError for an unknown
    keyword, ConfigError (a ValueError) naming a bad value."""
    arguments, hparams = _options(entry, given)
    arguments.update(derived)
    check_keywords(entry, arguments.get("algorithm"), hparams)
    values = {FIELDS.get(k, k): v for k, v in arguments.items()}
    values["algorithm_params"] = dict(hparams)
    decay = values.get("lr_decay_epochs")
    if isinstance(decay, Sequence) and not isinstance(decay, str):
        values["lr_decay_epochs"] = [_float(e) for e in decay]
    params = values.get("timing_params")
    values["timing_params"] = {} if params is None else params
    if isinstance(params, Mapping):
        values["timing_params"] = dict(params)
    return TrainConfig(**values).validate(PYTHON_NAMES)


def _options(entry: Callable[..., Any], given: Mapping[str, Any]) -> tuple[dict, dict]:
    """The TrainConfig options among ``entry``'s keyword-only arguments (its positional
    ones are the model and the data), and its ``**`` keywords, as ``given`` holds them."""
    options: dict[str, Any] = {}
    hparams: dict[str, Any] = {}
    for name, p in inspect.signature(entry).parameters.items():
        if p.kind is p.VAR_KEYWORD:
            hparams = dict(given[name])
        elif p.kind is p.KEYWORD_ONLY and FIELDS.get(name, name) in CONFIG_FIELDS:
            options[name] = given[name]
    return options, hparams


def _float(value: Any) -> Any:
    """A plain number as a float (config.json keeps floats); anything else as it is,
    for the schema to name."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


def check_model(model: Any, entry: str, factory: bool = False) -> None:
    """ArgumentTypeError unless ``model`` is a ``torch.nn.Module`` (or, with
    ``factory``, a zero-argument callable that builds one)."""
    if isinstance(model, torch.nn.Module) or (factory and callable(model)):
        return
    takes = (
        "a torch.nn.Module or a zero-argument function that builds one"
        if factory
        else ("a torch.nn.Module (dana.fit also takes a factory)")
    )
    raise ArgumentTypeError(f"{entry}(): model must be {takes}, got {type(model).__name__}")


def check_callable(
    value: Any, name: str, entry: str, use: str = "loss_fn(model(x), y) -> the batch's mean loss"
) -> None:
    """ArgumentTypeError unless ``value`` (the argument ``name`` of ``entry``) can be
    called, as ``use`` says it is."""
    if not callable(value):
        raise ArgumentTypeError(
            f"{entry}(): {name} must be a function, as {use}, got {type(value).__name__}"
        )


@dataclass
class Tracking:
    """Where :func:`dana.fit` logs a run besides its directory: a TensorBoard log
    directory, and the MLflow run's name and tags (with ``mlflow=``)."""

    tensorboard: Path | None = None
    run_name: str | None = None
    tags: dict[str, str] | None = None

    @classmethod
    def check(
        cls, tensorboard: Any, run_name: Any, tags: Any, mlflow: Any, entry: str = "fit"
    ) -> Tracking:
        """The arguments checked: ArgumentTypeError for a wrong type, ConfigError for
        ``run_name`` or ``tags`` without ``mlflow`` (they would be ignored)."""
        if tensorboard is not None and not isinstance(tensorboard, str | os.PathLike):
            raise ArgumentTypeError(
                f"{entry}(): tensorboard must be a directory (a str or Path) for the "
                f"TensorBoard logs, got {type(tensorboard).__name__}"
            )
        if run_name is not None and not isinstance(run_name, str):
            raise ArgumentTypeError(
                f"{entry}(): run_name must be a str, got {type(run_name).__name__}"
            )
        if tags is not None and not (
            isinstance(tags, Mapping) and all(isinstance(k, str) for k in tags)
        ):
            raise ArgumentTypeError(
                f"{entry}(): tags must be a mapping of name: value, got {type(tags).__name__}"
            )
        for name, value in (("run_name", run_name), ("tags", tags)):
            if value is not None and mlflow is None:
                raise ConfigError(
                    f"{entry}(): {name} names the MLflow run, and mlflow is not given: add "
                    f"mlflow=DIR_OR_URI, or drop {name}"
                )
        return cls(
            None if tensorboard is None else Path(tensorboard),
            run_name,
            None if tags is None else {k: str(v) for k, v in tags.items()},
        )
