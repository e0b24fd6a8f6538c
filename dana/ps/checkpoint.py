"""A Ray run's checkpoint: what it holds and how it crosses between Ray and the file.

The servers snapshot their state at checkpoint points (without stopping) as numpy arrays
and plain values; the driver adds the merged log, the metrics rows and the latest model
buffers, turns every array into a tensor and writes the file with
:meth:`RunDir.save_checkpoint` (atomic: the previous checkpoint is replaced only once the
new one is whole). ``--resume`` reads it with ``torch.load(weights_only=True)``: tensors,
numbers, strings, lists and dicts only.

Layout::

    {"format": "dana-ray/1",
     "servers": [per shard: {"master": rule state, "steps", "updates", "pushes",
                 "local_steps", "last_seq", "applied", "joins"}],
     "log": merged per-push log up to the checkpoint (columns as tensors),
     "rows": metrics rows so far, "logged": pushes summarised in rows,
     "wall_seconds": training time so far, "buffers": model buffers (BatchNorm)}

The workers' own rule state (``dana-slim``'s momenta) is not in it: resumed workers
start it from zero, as restarted ones do.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from dana.errors import DanaError

FORMAT = "dana-ray/1"


def to_tensors(value: Any) -> Any:
    """Numpy arrays (also inside dicts and lists) to tensors that own their memory."""
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.array(value))
    if isinstance(value, dict):
        return {k: to_tensors(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_tensors(v) for v in value]
    return value


def to_numpy(value: Any) -> Any:
    """Tensors (also inside dicts and lists) to numpy arrays, for sending to an actor."""
    if isinstance(value, Tensor):
        return value.numpy()
    if isinstance(value, dict):
        return {k: to_numpy(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_numpy(v) for v in value]
    return value


def build_state(
    servers: list[dict[str, Any]],
    log: dict[str, Tensor],
    rows: list[dict[str, float]],
    logged: int,
    wall_seconds: float,
    buffers: dict[str, np.ndarray] | None,
) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "servers": to_tensors(servers),
        "log": log,
        "rows": [dict(r) for r in rows],
        "logged": int(logged),
        "wall_seconds": float(wall_seconds),
        "buffers": to_tensors(buffers or {}),
    }


def check_state(state: dict[str, Any], servers: int) -> None:
    """Raise :class:`DanaError` unless ``state`` is a Ray checkpoint for ``servers`` shards."""
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise DanaError(
            "the checkpoint was not written by a Ray run (--backend ray); resume it with the "
            "backend that wrote it"
        )
    if len(state["servers"]) != servers:
        raise DanaError(
            f"the checkpoint holds {len(state['servers'])} server shards, the config asks "
            f"for {servers}"
        )
