"""Where a run computes: ``--device cpu|cuda|auto`` (``dana train``, ``dana sweep``,
``dana.simulate``, ``dana.fit``).

:func:`resolve_device` turns the option (a name or a ``torch.device``) into a
``torch.device``: ``auto`` is ``cuda`` when torch sees a GPU, else ``cpu``; ``cuda``
where torch sees none is a :class:`~dana.errors.ConfigError` (exit 2). The data, the
model, the rules' state, the simulator's buffers and the evaluation then live there.

Determinism (docs/ALGORITHMS.md, "The simulator on a device"): on the CPU the same seed
gives the same run bit for bit. On CUDA the event order, the batches, the staleness and
the timing are the same (they are drawn on the CPU), but the gradients are not bit for
bit reproducible: cuDNN picks convolution algorithms by timing and some of its
backward kernels add in a nondeterministic order, so two runs agree only within float
rounding, which grows along the run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dana.errors import ConfigError


def check_cuda(what: str = "--device cuda") -> None:
    """ConfigError when torch sees no CUDA device."""
    if not torch.cuda.is_available():
        build = torch.version.cuda
        raise ConfigError(
            f"{what}: this torch sees no CUDA device ("
            + (f"built with CUDA {build}, but no GPU is visible" if build else "a CPU-only build")
            + "); use --device cpu, or --device auto to take a GPU only where there is one"
        )


def resolve_device(device: str | torch.device | None) -> torch.device:
    """The ``torch.device`` for ``device`` (``None``: the CPU; ``auto``: a GPU when
    there is one); ConfigError for a name torch does not know or an absent GPU."""
    if device is None:
        return torch.device("cpu")
    if isinstance(device, str) and device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        where = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ConfigError(f"device {device!r}: {e}; use cpu, cuda or auto") from None
    if where.type == "cuda":
        check_cuda(f"device {str(device)!r}")
    elif where.type != "cpu":
        raise ConfigError(f"device {str(device)!r}: dana computes on cpu or cuda")
    return where


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device``. From the CPU to a GPU through pinned memory, without waiting:
    a copy from ordinary memory waits for the device to finish its queued work (a host
    synchronisation per batch)."""
    if device.type == "cuda" and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def peak_bytes(device: torch.device, fn: Callable[[], Any]) -> int:
    """The most CUDA memory ``fn()`` holds at once on ``device`` beyond what was held
    before it, in bytes (at least 1): what ``--batch-workers auto`` and ``--pack auto``
    size by."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    fn()
    torch.cuda.synchronize(device)
    return max(1, torch.cuda.max_memory_allocated(device) - base)
