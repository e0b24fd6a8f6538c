"""Standard CIFAR training augmentation as batched tensor operations."""

from __future__ import annotations

import torch

__all__ = ["augment_batch"]


def augment_batch(x: torch.Tensor, generator: torch.Generator, padding: int = 4) -> torch.Tensor:
    """Random crop from a zero-padded image, then a random horizontal flip, per image.

    ``x`` is ``N x C x H x W``. Each image is padded by ``padding`` zeros on every
    side, cropped back to ``H x W`` at a uniformly random offset, and mirrored
    left-right with probability 1/2: one gather for the whole batch, no Python
    loop over images. The random draws (offsets, then flips) come from
    ``generator`` only, so the same generator state gives the same batch.
    Returns a new tensor; ``x`` is not modified.
    """
    if x.dim() != 4:
        raise ValueError(f"augment_batch: expected N x C x H x W, got shape {tuple(x.shape)}")
    n, c, h, w = x.shape
    gdev = generator.device
    offsets = torch.randint(0, 2 * padding + 1, (2, n), generator=generator, device=gdev)
    flip = torch.rand(n, generator=generator, device=gdev) < 0.5
    offsets, flip = offsets.to(x.device), flip.to(x.device)
    padded = torch.nn.functional.pad(x, (padding, padding, padding, padding))
    wp = w + 2 * padding
    rows = offsets[0][:, None] + torch.arange(h, device=x.device)  # n x h
    ar = torch.arange(w, device=x.device)
    cols = offsets[1][:, None] + torch.where(flip[:, None], w - 1 - ar, ar)  # n x w
    index = (rows[:, :, None] * wp + cols[:, None, :]).reshape(n, 1, h * w).expand(n, c, h * w)
    return padded.reshape(n, c, -1).gather(2, index).reshape(n, c, h, w)
