"""A model's input: one tensor, a tuple of tensors or a dict of tensors.

The rule: an input ``x`` is a tensor (the model is called ``model(x)``), a tuple or
list of tensors (``model(*x)``) or a dict of tensors by argument name (``model(**x)``);
every tensor in it holds one row per example, so the examples ``rows`` of ``x`` are
the same rows of each tensor. Everything that calls a model on data (the gradient,
the vectorised gradients of several workers, the evaluation) goes through
:func:`call` and :func:`take`.

    >>> import torch
    >>> x = {"a": torch.zeros(4, 2), "b": torch.ones(4)}
    >>> count(x), take(x, torch.tensor([0, 2]))["a"].shape
    (4, torch.Size([2, 2]))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

#: A model's input (the module docstring gives the rule).
Inputs = Tensor | tuple[Tensor, ...] | list[Tensor] | dict[str, Tensor]


def is_structured(x: Any) -> bool:
    """Whether ``x`` is a tuple, list or dict of inputs (not one tensor)."""
    return isinstance(x, tuple | list | dict)


def apply(x: Inputs, fn: Callable[[Tensor], Tensor]) -> Inputs:
    """``fn`` applied to every tensor of ``x``, in the same structure."""
    if isinstance(x, dict):
        return {k: fn(v) for k, v in x.items()}
    if isinstance(x, tuple | list):
        return tuple(fn(v) for v in x)
    return fn(x)


def tensors(x: Inputs) -> list[Tensor]:
    """The tensors of ``x``, in order."""
    if isinstance(x, dict):
        return list(x.values())
    if isinstance(x, tuple | list):
        return list(x)
    return [x]


def take(x: Inputs, rows: Any) -> Inputs:
    """The examples ``rows`` (an index tensor or a slice) of ``x``."""
    return apply(x, lambda t: t[rows])


def count(x: Inputs) -> int:
    """The number of examples in ``x``; ValueError when its tensors disagree or one
    has no rows."""
    sizes = set()
    for t in tensors(x):
        if not torch.is_tensor(t) or t.dim() == 0:
            raise ValueError(
                "every input must be a tensor with one row per example, got "
                + (f"a {type(t).__name__}" if not torch.is_tensor(t) else "a 0-d tensor")
            )
        sizes.add(len(t))
    if len(sizes) != 1:
        raise ValueError(
            "every tensor of the input must hold one row per example, these hold "
            f"{sorted(sizes)} rows"
        )
    return sizes.pop()


def call(module: nn.Module | Callable[..., Any], x: Inputs) -> Any:
    """``module(x)``, ``module(*x)`` or ``module(**x)`` (the module docstring)."""
    if isinstance(x, dict):
        return module(**x)
    if isinstance(x, tuple | list):
        return module(*x)
    return module(x)


def call_args(x: Inputs) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``(args, kwargs)`` of the call :func:`call` makes (for ``functional_call``)."""
    if isinstance(x, dict):
        return (), dict(x)
    if isinstance(x, tuple | list):
        return tuple(x), {}
    return (x,), {}


def stack(xs: Sequence[Inputs]) -> Inputs:
    """The inputs of several batches stacked along a new first dimension (each
    tensor of the structure stacked with its counterparts)."""
    first = xs[0]
    if isinstance(first, dict):
        return {k: torch.stack([x[k] for x in xs]) for k in first}
    if isinstance(first, tuple | list):
        return tuple(torch.stack([x[i] for x in xs]) for i in range(len(first)))
    return torch.stack(list(xs))
