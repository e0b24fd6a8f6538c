"""A worker's step, the same in every runner (docs/ALGORITHMS.md, "Master and worker rules").

1. compute at ``p = rule.compute_at(i, pulled)``: ``g = grad f(p) + wd * p`` on the
   worker's batch (the gradient function gives the loss without weight decay);
2. make the message at the learning rate of its push: ``rule.set_lr(lr)``, then
   ``rule.message(i, g)`` (``None``: a local step, nothing is pushed).

The simulator holds every worker's rule in one (``i`` is the worker), a Ray worker
holds its own (``i = 0``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torch import Tensor

from dana.algorithms.base import WorkerRule

if TYPE_CHECKING:
    from dana.train.rules.codecs import Wire

#: A loss: a number, or a 0-d tensor (read when the records are read, so that a step on a
#: GPU waits for nothing: :mod:`dana.train.records.pushlog`).
Loss = float | Tensor
#: ``gradient(params, batch) -> (grad, loss)``; the step may modify ``grad`` in place.
GradientFn = Callable[[Tensor, Any], tuple[Tensor, Loss]]


class WorkerStep:
    """The gradient and the message of a worker rule's workers (``wire``: messages as
    the servers decode them, :meth:`dana.train.rules.codecs.Wire.round_trip`: the simulator's
    codec)."""

    def __init__(
        self,
        rule: WorkerRule,
        gradient: GradientFn,
        weight_decay: float = 0.0,
        wire: Wire | None = None,
    ):
        if not weight_decay >= 0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay!r}")
        self.rule, self.gradient_fn, self.weight_decay = rule, gradient, float(weight_decay)
        self.wire = wire

    def gradient(self, i: int, pulled: Tensor, batch: Any) -> tuple[Tensor, Loss]:
        """Worker ``i``'s gradient (weight decay included) at what it pulled, and the loss."""
        p = self.rule.compute_at(i, pulled)
        grad, loss = self.gradient_fn(p, batch)
        if self.weight_decay:
            grad.add_(p, alpha=self.weight_decay)
        return grad, loss

    def message(self, i: int, grad: Tensor, lr: float) -> Tensor | None:
        """Worker ``i``'s message for ``grad``, made at ``lr`` (``None``: a local step)."""
        self.rule.set_lr(lr)
        message = self.rule.message(i, grad)
        if message is None or self.wire is None:
            return message
        return self.wire.round_trip(i, message)
