"""Gradients replayed as CUDA graphs (``--cuda-graph``).

A small model's step on a GPU is bound by the host: each kernel of the forward and
backward pass is launched from Python, and the device waits between them.
:class:`CapturedCall` records a gradient call ``fn(params, x, y)`` once per shape of its
arguments into a CUDA graph (``torch.cuda.graph``) over static buffers; each call
copies its arguments into those buffers, replays the graph (the same kernels on the
same values as the call itself, so the same results, in one launch) and returns copies
of the outputs. Two calls are recorded so: one worker's gradient
(:func:`captured_gradient`, :meth:`FlatModel.gradient
<dana.train.task.flat.FlatModel.gradient>`) and the batched engine's ``B`` workers at
once (:class:`~dana.train.task.stacked.StackedGradient`, ``B`` padded to a power of
two so that a few graphs serve every ``B``).

- Before a capture, CUDA needs warm-up calls (on the side stream the capture then uses,
  as PyTorch's whole-network capture does): they run the call for real, so the
  module's buffers (BatchNorm's running statistics) are saved before them and restored
  after; the first replay then folds the batch in once, as the call would.
- The graph reads the buffers it was recorded with, whatever the module points at
  later (an evaluation re-points it).
- Memory: each recorded shape keeps its own pool, the activations of one call.
- A call that reads a value on the host (BatchNorm without a momentum reads its batch
  count) cannot be recorded: the capture fails with an error that says so.
- On the CPU there is no graph: the call runs on the same static buffers, after the
  same warm-up and restore, so what surrounds the graph is what the CPU tests check;
  the results are the call's bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from dana.errors import ConfigError
from dana.train.task import inputs as I
from dana.train.task.flat import FlatModel, LossFn

#: Calls run before a capture (PyTorch's CUDA graph notes: lazy initialisation, cuDNN's
#: choice of kernels).
WARMUP_CALLS = 3


@dataclass
class _Recorded:
    """One argument shape's static buffers, graph (``None`` on the CPU) and outputs."""

    params: Tensor
    x: I.Inputs
    y: Tensor
    graph: Any = None
    outputs: Any = None


class CapturedCall:
    """``fn(params, x, y)`` replayed as a CUDA graph (the module docstring).

    Args:
        fn: the call: tensors in (``x`` any input of :mod:`dana.train.task.inputs`),
            a tensor, or a tuple or dict of tensors (nested once), out.
        module: the module whose buffers the warm-up calls must leave as they were.
    """

    def __init__(self, fn: Callable[[Tensor, I.Inputs, Tensor], Any], module: nn.Module):
        self.fn, self.module = fn, module
        self.recorded: dict[tuple[Any, ...], _Recorded] = {}

    def __call__(self, params: Tensor, x: I.Inputs, y: Tensor) -> Any:
        key = _signature(params, x, y)
        entry = self.recorded.get(key)
        fresh = entry is None
        if entry is None:
            entry = _Recorded(
                torch.empty_like(params), I.apply(x, torch.empty_like), torch.empty_like(y)
            )
        entry.params.copy_(params)
        for static, value in zip(I.tensors(entry.x), I.tensors(x)):
            static.copy_(value)
        entry.y.copy_(y)
        if fresh:
            self._record(entry)
            self.recorded[key] = entry
        if entry.graph is None:
            return _copy(self._call(entry))
        entry.graph.replay()
        return _copy(entry.outputs)

    def _call(self, entry: _Recorded) -> Any:
        return self.fn(entry.params, entry.x, entry.y)

    def _record(self, entry: _Recorded) -> None:
        """Warm up, capture (on a GPU) and restore the module's buffers."""
        buffers = list(self.module.buffers())
        saved = [b.clone() for b in buffers]
        device = entry.params.device
        try:
            if device.type == "cuda":
                side = torch.cuda.Stream(device)
                side.wait_stream(torch.cuda.current_stream(device))
                with torch.cuda.stream(side):
                    for _ in range(WARMUP_CALLS):
                        self._call(entry)
                torch.cuda.current_stream(device).wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                # (on the warm-up's stream: the libraries' handles made there serve it)
                with torch.cuda.graph(graph, stream=side):
                    entry.outputs = self._call(entry)
                entry.graph = graph
            else:
                for _ in range(WARMUP_CALLS):
                    self._call(entry)
        except RuntimeError as e:
            raise ConfigError(
                f"--cuda-graph: the gradient cannot be recorded as a CUDA graph ({e}); "
                "a model whose forward pass reads a value on the host (BatchNorm without "
                "a momentum, a branch on a tensor) cannot: run without --cuda-graph"
            ) from None
        finally:
            with torch.no_grad():
                for b, s in zip(buffers, saved):
                    b.copy_(s)


def captured_gradient(flat: FlatModel, loss_fn: LossFn) -> CapturedCall:
    """``flat.gradient(params, x, y, loss_fn)`` replayed as a CUDA graph: the gradient
    (a copy) and the loss."""
    return CapturedCall(lambda p, x, y: flat.gradient(p, x, y, loss_fn), flat.module)


def _signature(params: Tensor, x: I.Inputs, y: Tensor) -> tuple[Any, ...]:
    """What a graph is recorded for: the structure, shapes and dtypes of the arguments."""
    keys = tuple(x) if isinstance(x, dict) else ()
    tensors = [params, *I.tensors(x), y]
    return (type(x).__name__, keys, *((t.shape, t.dtype, t.device) for t in tensors))


def _copy(outputs: Any) -> Any:
    """Copies of the outputs' tensors (a replay overwrites the graph's own)."""
    if isinstance(outputs, Tensor):
        return outputs.clone()
    if isinstance(outputs, dict):
        return {k: _copy(v) for k, v in outputs.items()}
    if isinstance(outputs, tuple | list):
        return type(outputs)(_copy(v) for v in outputs)
    return outputs
