"""A model whose parameters are views into one flat buffer.

Loading a worker's parameters is one copy into :attr:`FlatModel.flat`, and the gradient
lands in one flat buffer :attr:`FlatModel.grad`: the master and worker rules only ever
see flat vectors. Buffers (BatchNorm running statistics) stay in the module and are
shared by every forward pass.

    >>> import torch
    >>> net = FlatModel(torch.nn.Linear(3, 2))
    >>> net.flat.shape
    torch.Size([8])
"""

from __future__ import annotations

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
        offset = 0
        for p in params:
            n = p.numel()
            p.data = self.flat[offset : offset + n].view_as(p)
            p.grad = self.grad[offset : offset + n].view_as(p)
            offset += n

    @property
    def d(self) -> int:
        return self.flat.numel()

    def load(self, params: Tensor) -> None:
        self.flat.copy_(params)

    def gradient(
        self, params: Tensor, x: Tensor, y: Tensor, loss_fn: LossFn
    ) -> tuple[Tensor, float]:
        """The gradient of ``loss_fn(model(x), y)`` at ``params``, and the loss.

        The returned tensor is this model's gradient buffer: use it before the next call.
        """
        self.flat.copy_(params)
        self.module.train()
        self.grad.zero_()
        loss = loss_fn(self.module(x), y)
        loss.backward()
        return self.grad, loss.item()

    @torch.no_grad()
    def evaluate(
        self, params: Tensor, x: Tensor, y: Tensor, loss_fn: LossFn, batch_size: int = 1000
    ) -> tuple[float, float]:
        """Mean loss and error rate (fraction misclassified) of ``params`` on ``(x, y)``."""
        self.flat.copy_(params)
        self.module.eval()
        total_loss, wrong = 0.0, 0
        for start in range(0, len(x), batch_size):
            out = self.module(x[start : start + batch_size])
            target = y[start : start + batch_size]
            total_loss += loss_fn(out, target).item() * len(target)
            wrong += (out.argmax(1) != target).sum().item()
        return total_loss / len(x), wrong / len(x)

    def buffers_state(self) -> dict[str, Tensor]:
        return {k: v.clone() for k, v in self.module.named_buffers()}

    def load_buffers_state(self, state: dict[str, Tensor]) -> None:
        buffers = dict(self.module.named_buffers())
        for k, v in state.items():
            buffers[k].copy_(v)
