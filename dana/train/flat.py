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

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

LossFn = Callable[[Tensor, Tensor], Tensor]


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
        self, params: Tensor, x: Tensor, y: Tensor, loss_fn: LossFn
    ) -> tuple[Tensor, float]:
        """The gradient of ``loss_fn(model(x), y)`` at ``params``, and the loss.

        The module computes at ``params`` itself (its parameters become views of it;
        leave ``params`` unchanged until this returns). The returned tensor is this
        model's gradient buffer: use it before the next call.
        """
        self._point_at(params)
        if not self.module.training:  # train() walks every submodule: skip it when it can
            self.module.train()
        for p in self._params:
            p.grad = None  # backward then stores fresh gradients instead of adding
        loss = loss_fn(self.module(x), y)
        loss.backward()
        grads = [p.grad for p in self._params]
        if any(g is None for g in grads):  # a parameter the loss does not depend on
            grads = [torch.zeros_like(p) if g is None else g for p, g in zip(self._params, grads)]
        torch.cat([g.reshape(-1) for g in grads], out=self.grad)
        return self.grad, loss.item()

    @torch.no_grad()
    def evaluate(
        self, params: Tensor, x: Tensor, y: Tensor, loss_fn: LossFn, batch_size: int = 1000
    ) -> tuple[float, float]:
        """Mean loss and error rate of ``params`` on ``(x, y)`` (:func:`evaluate_module`)."""
        self._point_at(params)
        found = evaluate_module(self.module, x, y, loss_fn, batch_size)
        return found["loss"], found["error"]

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


@torch.no_grad()
def evaluate_module(
    module: nn.Module, x: Tensor, y: Tensor, loss_fn: LossFn, batch_size: int = 1000
) -> dict[str, float]:
    """``{"loss": ..., "error": ...}`` of ``module`` (in eval mode) on ``(x, y)``.

    ``loss``: the mean of ``loss_fn`` over every target, each batch's mean weighted by
    its number of targets (``y.numel()``: the examples of a classifier, the tokens of a
    language model's ``N x T`` targets). ``error``: the fraction of targets whose
    ``argmax`` over the output's last dimension is wrong, when the targets are integer
    classes and the outputs have one more dimension than them (``N x C`` for ``N``,
    ``N x T x V`` for ``N x T``: the next-token error); NaN otherwise (a regression).
    The evaluation of every run: a metric is one more entry of this dictionary.
    Batches of ``batch_size`` examples, fewer for long sequences (at most that many
    targets per batch times 16).
    """
    module.eval()
    per_example = max(1, y[:1].numel())
    batch_size = max(1, min(batch_size, 16 * batch_size // per_example))
    total, count, wrong = 0.0, 0, 0
    classes = not y.is_floating_point()
    for start in range(0, len(x), batch_size):
        out = module(x[start : start + batch_size])
        target = y[start : start + batch_size]
        n = target.numel()
        total += loss_fn(out, target).item() * n
        count += n
        if classes and out.dim() == target.dim() + 1 and out.shape[:-1] == target.shape:
            wrong += (out.argmax(-1) != target).sum().item()
        else:
            classes = False
    return {"loss": total / count, "error": wrong / count if classes else math.nan}
