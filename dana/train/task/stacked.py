"""Gradients of many workers at once: one vectorised call, or one replica per thread.

The simulator's batched and threaded engines (:mod:`dana.sim.compute`) take a
:class:`GradientSource`: the flat model, the loss, and a function from a batch (the rows
the stream drew) to its examples. Two ways to compute the gradients of ``B`` workers,
each at its own flat parameters on its own batch:

- :class:`StackedGradient`: one call of ``torch.func.vmap`` over
  ``torch.func.grad_and_value`` of ``functional_call`` on the stacked ``(B, d)``
  parameters and the stacked batches; the gradient comes out flat, ``(B, d)``.
- :class:`Replica`: a deep copy of the module with its own flat vector, for one thread.

BatchNorm (docs/ALGORITHMS.md, "Batched and threaded gradients"): each worker
normalises with its own batch's statistics, as a real worker does. The running
statistics are computed per worker from a zero start, which gives that worker's
contribution ``m * stat`` (``m`` the module's momentum; ``1`` for
``num_batches_tracked``); :func:`apply_running` then folds it into the shared module's
statistics, ``r <- (1 - m) r + m stat``, when the worker's push is processed, in event
order, as the sequential simulator's forward pass does (within one rounding per
update: that forward pass folds them in inside its kernel). BatchNorm without a
momentum (a cumulative average) is refused. A replica instead keeps the inputs of its
BatchNorm layers, and :func:`replay_running` makes the kernel's own update from them
at the push: bit for bit.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dana.train.task import inputs as I
from dana.train.task.captured import CapturedCall
from dana.train.task.flat import FlatModel, LossFn

#: ``inputs(batch) -> (x, y)``: the examples of a batch, on the model's device.
Inputs = Callable[[Any], tuple[Tensor, Tensor]]
#: One worker's running-statistic contributions, by buffer name.
Running = dict[str, Tensor]


@dataclass
class GradientSource:
    """What the batched and threaded engines need: the model (flat), the loss and the
    data. ``random``: a gradient draws random numbers from a shared generator, so its
    result depends on the order gradients are computed in; the engines refuse it
    (dana's own augmentation does not: each batch's draws are seeded by its key).
    ``cuda_graph``: the vectorised call is replayed as a CUDA graph
    (:mod:`dana.train.task.captured`)."""

    flat: FlatModel
    loss_fn: LossFn
    inputs: Inputs
    random: bool = False
    cuda_graph: bool = False


def running_buffers(module: nn.Module) -> dict[str, float]:
    """The buffers a forward pass updates (BatchNorm's running statistics), by name,
    with the factor ``1 - m`` the old value keeps (``1`` for ``num_batches_tracked``).

    ValueError for BatchNorm without a momentum (its update is a cumulative average,
    which cannot be split into per-worker contributions)."""
    found: dict[str, float] = {}
    for prefix, m in module.named_modules():
        if not isinstance(m, nn.modules.batchnorm._BatchNorm) or not m.track_running_stats:
            continue
        if m.momentum is None:
            raise ValueError(
                f"{prefix or 'the model'}: BatchNorm with momentum=None (a cumulative "
                "average) cannot be computed per worker; give it a momentum, or compute "
                "one worker at a time (batch workers 1, threads 1)"
            )
        dot = f"{prefix}." if prefix else ""
        found[dot + "running_mean"] = 1.0 - m.momentum
        found[dot + "running_var"] = 1.0 - m.momentum
        found[dot + "num_batches_tracked"] = 1.0
    return found


def apply_running(module: nn.Module, keep: dict[str, float], running: Running) -> None:
    """Fold one worker's contributions into ``module``'s statistics:
    ``r <- keep * r + contribution`` (in place)."""
    if not running:
        return
    buffers = dict(module.named_buffers())
    with torch.no_grad():
        for name, contribution in running.items():
            shared = buffers[name]
            if keep[name] != 1.0:
                shared.mul_(keep[name])
            shared.add_(contribution)


class StackedGradient:
    """The gradients of ``B`` workers in one vectorised call (``torch.func``).

    ``__call__(params (B, d), x (B, n, ...), y (B, n))`` returns the flat gradients
    ``(B, d)``, the ``B`` losses (on the device: reading them waits for it) and the
    ``B`` workers' running-statistic contributions (stacked, by buffer name). Random
    operations inside the model (dropout) raise: vmap refuses them, as their draws could
    not follow the sequential order. With ``source.cuda_graph`` the call is replayed as a
    CUDA graph (:mod:`dana.train.task.captured`), ``B`` padded to the next power of two
    with copies of the last worker's arguments (their results are dropped)."""

    def __init__(self, source: GradientSource):
        from torch.func import functional_call, grad_and_value, vmap

        flat = source.flat
        module = flat.module
        self.module, self.loss_fn = module, source.loss_fn
        self.keep = running_buffers(module)
        names = [n for n, p in module.named_parameters() if p.requires_grad]
        shapes = [p.shape for p in flat._params]
        sizes = flat._sizes
        if len(names) != len(shapes):
            raise ValueError("the model's parameters do not match its flat vector")

        def loss(p: Tensor, running: Running, fixed: Running, x: I.Inputs, y: Tensor):
            views = torch.split(p, sizes)
            params = {n: v.view(s) for n, v, s in zip(names, views, shapes)}
            args, kwargs = I.call_args(x)
            out = functional_call(module, (params, {**fixed, **running}), args, kwargs)
            value = self.loss_fn(out, y)
            return value, (value.detach(), running)

        self._call = vmap(grad_and_value(loss, has_aux=True), in_dims=(0, 0, None, 0, 0))
        self.captured = CapturedCall(self._stacked, module) if source.cuda_graph else None

    def __call__(self, params: Tensor, x: I.Inputs, y: Tensor) -> tuple[Tensor, Tensor, Running]:
        if not self.module.training:
            self.module.train()
        if self.captured is None:
            return self._stacked(params, x, y)
        b = params.shape[0]
        padded = 1 << (b - 1).bit_length()
        if padded > b:

            def pad(t: Tensor) -> Tensor:
                return torch.cat([t, t[-1:].expand(padded - b, *t.shape[1:])])

            params, x, y = pad(params), I.apply(x, pad), pad(y)
        grads, losses, running = self.captured(params, x, y)
        return grads[:b], losses[:b], {n: t[:b] for n, t in running.items()}

    def _stacked(self, params: Tensor, x: I.Inputs, y: Tensor) -> tuple[Tensor, Tensor, Running]:
        module = self.module
        b = params.shape[0]
        buffers = dict(module.named_buffers())
        running = {n: buffers[n].new_zeros((b, *buffers[n].shape)) for n in self.keep}
        fixed = {n: t for n, t in buffers.items() if n not in self.keep}
        grads, (_, (losses, new_running)) = self._call(params, running, fixed, x, y)
        return grads, losses.detach(), new_running


def batchnorms(module: nn.Module) -> dict[str, nn.modules.batchnorm._BatchNorm]:
    """The BatchNorm modules that keep running statistics, by name."""
    return {
        name: m
        for name, m in module.named_modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats
    }


def replay_running(module: nn.Module, inputs: Running) -> None:
    """Update ``module``'s BatchNorm running statistics from the inputs one worker's
    forward pass gave its BatchNorm layers, by the same kernel call the module's own
    forward pass makes (``F.batch_norm`` in training mode): bit for bit the update of
    the sequential simulator, momentum ``None`` (a cumulative average) included."""
    if not inputs:
        return
    layers = batchnorms(module)
    with torch.no_grad():
        for name, x in inputs.items():
            m = layers[name]
            m.num_batches_tracked.add_(1)
            factor = 1.0 / float(m.num_batches_tracked) if m.momentum is None else m.momentum
            F.batch_norm(x, m.running_mean, m.running_var, None, None, True, factor, m.eps)


class Replica:
    """A copy of the module with its own flat vector, for one thread.

    :meth:`gradient` gives one worker's gradient (a fresh tensor), its loss, and the
    inputs of its BatchNorm layers (kept for :func:`replay_running` at the worker's
    push: one set of these activations per pending gradient). The arithmetic is that
    of the shared module's :meth:`FlatModel.gradient`, so with one intra-op thread the
    gradient and loss are bit for bit the sequential simulator's."""

    def __init__(self, source: GradientSource):
        self.source = source
        self.flat = FlatModel(copy.deepcopy(source.flat.module))
        self._inputs: Running = {}
        for name, m in batchnorms(self.flat.module).items():
            m.register_forward_pre_hook(self._keeper(name))

    def _keeper(self, name: str):
        def keep(module: nn.Module, args: tuple[Any, ...]) -> None:
            self._inputs[name] = args[0].detach()

        return keep

    def gradient(self, params: Tensor, batch: Any) -> tuple[Tensor, Tensor, Running]:
        self._inputs = {}
        x, y = self.source.inputs(batch)
        grad, loss = self.flat.gradient(params, x, y, self.source.loss_fn)
        inputs, self._inputs = self._inputs, {}
        return grad.clone(), loss, inputs
