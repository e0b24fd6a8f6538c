"""A model whose parameters are views into a flat vector.

The module's parameters are views into whichever flat vector it computes at: computing
a gradient at a worker's pulled parameters re-points them at that vector (no copy of
``d`` values), and the gradient lands in one flat buffer :attr:`FlatModel.grad`: the
master and worker rules only ever see flat vectors. :meth:`FlatModel.load` copies into
the model's own buffer :attr:`FlatModel.flat` and points the module back at it, so the
module then holds those parameters for good. Buffers (BatchNorm running statistics)
stay in the module and are shared by every forward pass.

    >>> import torch
    >>> net = FlatModel(torch.nn.Linear(3, 2))
    >>> net.flat.shape
    torch.Size([8])
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import Tensor, nn

from dana.train.task import inputs as I
from dana.train.task.evaluation import LossFn, MetricFn, evaluate_batches, evaluate_module

__all__ = ["FlatModel", "LossFn", "evaluate_module"]


class FlatModel:
    def __init__(self, module: nn.Module, dtype: torch.dtype | None = None):
        if dtype is not None:
            module.to(dtype)
        params = [p for p in module.parameters() if p.requires_grad]
        if not params:
            raise ValueError("the model has no trainable parameters")
        self.module = module
        self.flat = torch.cat([p.detach().reshape(-1) for p in params])
        self.grad = torch.zeros_like(self.flat)
        self._params = params
        self._sizes = [p.numel() for p in params]
        self._at: Tensor | None = None  # the vector the module's parameters view
        self._point_at(self.flat)

    @property
    def d(self) -> int:
        return self.flat.numel()

    def load(self, params: Tensor) -> None:
        """Copy ``params`` into the model's own buffer; the module holds them from now on."""
        self._point_at(self.flat)
        self.flat.copy_(params)

    def gradient(
        self, params: Tensor, x: I.Inputs, y: Tensor, loss_fn: LossFn
    ) -> tuple[Tensor, Tensor]:
        """The gradient of ``loss_fn(model(x), y)`` at ``params``, and the loss, a 0-d
        tensor (reading it on a GPU waits for the device; ``x`` any input of
        :mod:`dana.train.task.inputs`).

        The module computes at ``params`` itself (its parameters become views of it;
        leave ``params`` unchanged until this returns). The returned tensor is this
        model's gradient buffer: use it before the next call.
        """
        self._point_at(params)
        if not self.module.training:  # train() walks every submodule: skip it when it can
            self.module.train()
        for p in self._params:
            p.grad = None  # backward then stores fresh gradients instead of adding
        loss = loss_fn(I.call(self.module, x), y)
        loss.backward()
        grads = [p.grad for p in self._params]
        if any(g is None for g in grads):  # a parameter the loss does not depend on
            grads = [torch.zeros_like(p) if g is None else g for p, g in zip(self._params, grads)]
        torch.cat([g.reshape(-1) for g in grads], out=self.grad)
        return self.grad, loss.detach()

    def evaluate(
        self, params: Tensor, x: I.Inputs, y: Tensor, loss_fn: LossFn, batch_size: int = 1000
    ) -> tuple[float, float]:
        """Mean loss and error rate of ``params`` on ``(x, y)`` (:meth:`measure`)."""
        found = self.measure(params, x, y, loss_fn, batch_size)
        return found["loss"], found["error"]

    def measure(
        self,
        params: Tensor,
        x: I.Inputs,
        y: Tensor,
        loss_fn: LossFn,
        batch_size: int = 1000,
        metrics: Mapping[str, MetricFn] | None = None,
    ) -> dict[str, float]:
        """Loss, error rate and ``metrics`` of ``params`` on ``(x, y)``
        (:func:`dana.train.task.evaluation.evaluate_module`, the rule of every evaluation)."""
        self._point_at(params)
        return evaluate_module(self.module, x, y, loss_fn, batch_size, metrics)

    def measure_batches(
        self,
        params: Tensor,
        batches: Iterable[tuple[I.Inputs, Tensor]],
        loss_fn: LossFn,
        metrics: Mapping[str, MetricFn] | None = None,
    ) -> dict[str, float]:
        """:meth:`measure` on the ``(x, y)`` pairs of ``batches``, a test set read a
        batch at a time (:func:`dana.train.task.evaluation.evaluate_batches`)."""
        self._point_at(params)
        return evaluate_batches(self.module, batches, loss_fn, metrics)

    def _point_at(self, params: Tensor) -> None:
        """Make the module's parameters views of ``params`` (a copy into :attr:`flat`
        when ``params`` is not a contiguous vector of the model's size, dtype, device)."""
        if params is self._at:
            return
        flat = self.flat
        if not (
            params.shape == flat.shape
            and params.dtype == flat.dtype
            and params.device == flat.device
            and params.is_contiguous()
        ):
            flat.copy_(params)
            params = flat
        for p, view in zip(self._params, torch.split(params.detach(), self._sizes)):
            p.data = view.view_as(p)
        self._at = params

    def buffers_state(self) -> dict[str, Tensor]:
        return {k: v.clone() for k, v in self.module.named_buffers()}

    def load_buffers_state(self, state: dict[str, Tensor]) -> None:
        buffers = dict(self.module.named_buffers())
        for k, v in state.items():
            buffers[k].copy_(v)
