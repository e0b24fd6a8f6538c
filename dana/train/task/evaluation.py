"""What an evaluation measures of any model's outputs against its targets: one rule.

Every evaluation (``dana train``'s and ``dana.fit``'s evaluation points, on either
runner; ``FitResult.evaluate``; ``dana.simulate``'s ``SimulationResult.evaluate``) is
:func:`evaluate_module`:

- **the loss**, always: the mean of ``loss_fn`` over every target, each batch's mean
  weighted by its number of targets (``y.numel()``: the examples of a classifier, the
  tokens of a language model's ``N x T`` targets, the values of ``N x D`` regression
  targets);
- **the error rate**, only where it is defined (:func:`task_of`): integer targets and
  outputs with one more dimension, of at least two classes, last (``N x C`` against
  ``N``: classification; ``N x T x V`` against ``N x T``: token prediction, the
  next-token error): the fraction of targets whose ``argmax`` is wrong. Anything else
  (float targets, ``N x 1`` or ``N x D`` outputs: a regression) has none: NaN, never
  a rate broadcast from mismatched shapes;
- **the perplexity** ``exp(loss)`` of token prediction, a column derived from each
  row (:func:`perplexity`);
- **each metric of a hook** (``dana.fit(metrics={"mae": fn})``): ``fn(outputs,
  targets) -> float`` on each batch, its mean over the batches weighted by their
  examples (so a metric that is a mean over examples, MAE or top-5 accuracy, is that
  mean over the whole test set); the column ``test_NAME`` of ``metrics.csv``
  (:func:`metric_column`), ``final_test_NAME`` in ``summary.json``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dana.train.task import inputs as I

#: ``loss_fn(outputs, targets)``: a batch's mean loss.
LossFn = Callable[[Any, Tensor], Tensor]
#: ``fn(outputs, targets) -> float``: one metric of a batch.
MetricFn = Callable[[Any, Tensor], Any]

#: What an evaluation can be of (:func:`task_of`).
CLASSES, TOKENS, VALUES = "classes", "tokens", "values"
#: The names the evaluation itself uses: a metric may not take them.
RESERVED = ("loss", "error", "perplexity")
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


def task_of(out: Any, target: Tensor) -> str:
    """``"classes"`` (``N x C`` outputs, ``C >= 2``, integer targets ``N``), ``"tokens"``
    (``N x T x V`` against integer ``N x T``: one class per position) or ``"values"``
    (anything else: no error rate)."""
    if not torch.is_tensor(out) or target.is_floating_point() or target.is_complex():
        return VALUES
    if target.dtype == torch.bool:
        return VALUES
    if out.dim() == target.dim() + 1 and out.shape[:-1] == target.shape and out.shape[-1] > 1:
        return TOKENS if target.dim() >= 2 else CLASSES
    return VALUES


def cross_entropy(out: Tensor, target: Tensor) -> Tensor:
    """The mean cross-entropy over every target, the classes on the output's last
    dimension when it has one more than the targets (``N x C`` against ``N``, ``N x T x
    V`` against ``N x T``), else torch's (the classes on dimension 1): ``dana.fit``'s
    default loss."""
    if out.dim() == target.dim() + 1 and out.shape[:-1] == target.shape:
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))
    return F.cross_entropy(out, target)


def perplexity(row: Mapping[str, float]) -> float:
    """``exp(test_loss)``: the test perplexity of a token model's metrics row."""
    loss = row["test_loss"]
    if math.isnan(loss):
        return math.nan
    return math.exp(loss) if loss < 709.0 else math.inf  # (exp overflows past 709.78)


def metric_column(name: str) -> str:
    """The ``metrics.csv`` column of the metric ``name``: ``test_NAME``."""
    return f"test_{name}"


def check_metrics(metrics: Mapping[str, MetricFn] | None) -> dict[str, MetricFn]:
    """``metrics`` as a dict, checked: names that make a column (a letter, then
    letters, digits, ``_``; not ``loss``, ``error``, ``perplexity``), callables as
    values. TypeError or ValueError naming the argument and the fix."""
    if metrics is None:
        return {}
    if not isinstance(metrics, Mapping):
        raise TypeError(
            f"metrics must be a dict of name -> fn(outputs, targets) -> float, got "
            f"{type(metrics).__name__}"
        )
    for name, fn in metrics.items():
        if not isinstance(name, str) or not _NAME.match(name) or name in RESERVED:
            raise ValueError(
                f"metrics: the name {name!r} cannot be a column of metrics.csv; use a letter "
                "then letters, digits or _ (not loss, error or perplexity), e.g. 'mae'"
            )
        if not callable(fn):
            raise TypeError(
                f"metrics[{name!r}] must be a function fn(outputs, targets) -> float, got "
                f"{type(fn).__name__}"
            )
    return dict(metrics)


def _value(name: str, found: Any) -> float:
    try:
        return float(found.item() if torch.is_tensor(found) else found)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(
            f"metrics[{name!r}] must return one number (a float or a one-element tensor), "
            f"got {type(found).__name__}"
        ) from None


def eval_batch_size(y: Tensor, batch_size: int = 1000) -> int:
    """Examples per evaluation batch: ``batch_size``, fewer for long targets (at most
    ``16 * batch_size`` targets a batch, by the first example's)."""
    per_example = max(1, y[:1].numel())
    return max(1, min(batch_size, 16 * batch_size // per_example))


def in_batches(x: I.Inputs, y: Tensor, size: int) -> Iterator[tuple[I.Inputs, Tensor]]:
    """``(x, y)`` in consecutive batches of ``size`` examples."""
    for start in range(0, len(y), size):
        rows = slice(start, start + size)
        yield I.take(x, rows), y[rows]


@torch.no_grad()
def evaluate_batches(
    module: nn.Module,
    batches: Iterable[tuple[I.Inputs, Tensor]],
    loss_fn: LossFn,
    metrics: Mapping[str, MetricFn] | None = None,
) -> dict[str, float]:
    """``{"loss", "error", NAME...}`` of ``module`` (in eval mode) on the examples of
    ``batches`` (``(x, y)`` pairs: a test set read a batch at a time), by the module
    docstring's rule."""
    module.eval()
    metrics = metrics or {}
    total, count, wrong, n = 0.0, 0, 0, 0
    sums = dict.fromkeys(metrics, 0.0)
    task = None
    for x, target in batches:
        out = I.call(module, x)
        targets = target.numel()
        total += float(loss_fn(out, target)) * targets
        count += targets
        n += len(target)
        task = task_of(out, target) if task is None else task
        if task != VALUES:
            wrong += (out.argmax(-1) != target).sum().item()
        for name, fn in metrics.items():
            sums[name] += _value(name, fn(out, target)) * len(target)
    found = {"loss": total / count, "error": wrong / count if task != VALUES else math.nan}
    return {**found, **{name: s / n for name, s in sums.items()}}


def evaluate_module(
    module: nn.Module,
    x: I.Inputs,
    y: Tensor,
    loss_fn: LossFn,
    batch_size: int = 1000,
    metrics: Mapping[str, MetricFn] | None = None,
) -> dict[str, float]:
    """``{"loss", "error", NAME...}`` of ``module`` (in eval mode) on ``(x, y)``, by the
    module docstring's rule, in batches of :func:`eval_batch_size` examples."""
    batches = in_batches(x, y, eval_batch_size(y, batch_size))
    return evaluate_batches(module, batches, loss_fn, metrics)


def probe_task(module: nn.Module, x: I.Inputs, y: Tensor) -> str:
    """The task of ``module`` on ``(x, y)`` (:func:`task_of`), from its outputs on two
    examples, in eval mode (the mode is restored)."""
    training = module.training
    module.eval()
    try:
        with torch.no_grad():
            out = I.call(module, I.take(x, slice(0, 2)))
    finally:
        module.train(training)
    return task_of(out, y[:2])
