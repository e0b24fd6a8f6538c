"""A worker process's push: its gradient at the pulled parameters, its rule's message and
the codec's encoding of it (one process's own rule, codec residual and model buffers).

The Ray worker (:mod:`dana.ps.worker`) makes its pushes with a :class:`PushMaker`, and
``dana replay`` (:mod:`dana.ps.replay`) makes them again with the same one, so that the
two take the very same floating-point steps.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dana.algorithms.base import WorkerRule, move_tensors
from dana.ps.protocol import Push
from dana.train.config import TrainConfig
from dana.train.rules.codecs import Wire, build_codec
from dana.train.rules.step import WorkerStep


class PushMaker:
    """Worker ``index``'s pushes with ``rule`` (its process's) on ``problem``: the step of
    :class:`~dana.train.rules.step.WorkerStep`, at the rate the servers last told; with
    ``--device cuda`` computed there (the rule moved there), sent from the CPU; with a
    codec (``--compress``) encoded per shard (:class:`~dana.train.rules.codecs.Wire`:
    ``topk``'s residual is this process's, from zero)."""

    def __init__(self, config: TrainConfig, index: int, problem: Any, rule: WorkerRule):
        d = problem.flat.d
        self.index, self.rule, self.flat = index, rule, problem.flat
        self.device = problem.flat.flat.device
        if self.device.type != "cpu":
            move_tensors(rule, self.device)
        self.worker_step = WorkerStep(rule, problem.gradient, config.weight_decay)
        codec = build_codec(config.compress)
        dtype = getattr(torch, config.dtype)
        self.wire = None if codec.name == "none" else Wire(codec, 1, d, config.servers, dtype)
        self.sends_offset = rule.theta_offset(1.0) is not None
        self.has_buffers = any(True for _ in problem.flat.module.buffers())

    def push(self, params: Tensor, batch: Any, lr: float, seq: int, number: int) -> Push:
        """Push ``seq``: the step at ``params`` on ``batch`` (its stream's ``number``-th),
        made at ``lr``; its message ``None`` for a local step. ``compute`` is left NaN
        (the caller times the step)."""
        grad, loss = self.worker_step.gradient(0, params.to(self.device), batch)
        message = self.worker_step.message(0, grad, lr)
        offset = self.rule.theta_offset(1.0) if self.sends_offset and message is not None else None
        if self.device.type != "cpu":
            message = None if message is None else message.cpu()
            offset = None if offset is None else offset.cpu()
        buffers = (
            {k: v.cpu().numpy() for k, v in self.flat.buffers_state().items()}
            if self.has_buffers and message is not None
            else None
        )
        if message is None or self.wire is None:
            sent = _numpy(message)
        else:
            sent = self.wire.encode(0, message)
        return Push(self.index, seq, sent, float(loss), _numpy(offset), buffers, math.nan, number)


def _numpy(tensor: Tensor | None) -> np.ndarray | None:
    return None if tensor is None else tensor.numpy()
