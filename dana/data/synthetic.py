"""A small synthetic image classification task, generated deterministically from a seed.

Each class has a smooth random template (a coarse Gaussian grid upsampled
bilinearly to the image size). An example of class ``c`` is its template, shifted
by a random offset of up to ``max_shift`` pixels (zero fill), scaled by a random
contrast in ``[0.5, 1.5]``, plus i.i.d. Gaussian pixel noise of standard deviation
``noise``. Shifts and noise make it learnable, not trivial: with the defaults the
small ``cnn`` reaches about 83% test accuracy after 100 SGD steps of batch 64 and
about 85% after 300 (chance: 10%), logistic regression about 75%.

Defaults: 10 classes, 1 channel, 16x16 images, 2000 training and 500 test
examples (a fast stand-in for Fashion-MNIST; pass ``image_size=28`` to mirror it).
The templates, the training set and the test set come from independent streams
derived from the seed, and examples are drawn in fixed blocks, so a smaller
``train_size`` gives a prefix of a larger one and never changes the test set.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["make_synthetic"]


_BLOCK = 256  # examples drawn per generator: a smaller set is a prefix of a larger one


def _generator(*key: int) -> torch.Generator:
    """An independent generator for one stream of a seed, e.g. ``(seed, split, block)``."""
    state = np.random.SeedSequence([k & 0xFFFFFFFF for k in key]).generate_state(1, np.uint64)[0]
    return torch.Generator().manual_seed(int(state) & ((1 << 63) - 1))


def _examples(
    templates: torch.Tensor, n: int, max_shift: int, noise: float, seed: int, split: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``n`` examples of a split, drawn in whole blocks of ``_BLOCK``."""
    blocks = [
        _block(templates, _BLOCK, max_shift, noise, _generator(seed, split, b))
        for b in range(-(-n // _BLOCK))
    ]
    return torch.cat([x for x, _ in blocks])[:n], torch.cat([y for _, y in blocks])[:n]


def _block(
    templates: torch.Tensor, n: int, max_shift: int, noise: float, g: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` noisy, shifted, contrast-scaled copies of random templates, and their classes."""
    num_classes, channels, size, _ = templates.shape
    labels = torch.randint(0, num_classes, (n,), generator=g)
    contrast = 0.5 + torch.rand(n, 1, 1, 1, generator=g)
    shift = torch.randint(-max_shift, max_shift + 1, (2, n), generator=g)
    # Shift by gathering from a zero-padded copy: output pixel (i, j) reads padded
    # pixel (i + p - dy, j + p - dx).
    p = max_shift
    padded = F.pad(templates[labels], (p, p, p, p))
    ar = torch.arange(size)
    rows = (ar[None, :] + p - shift[0][:, None])[:, :, None]  # n x size x 1
    cols = (ar[None, :] + p - shift[1][:, None])[:, None, :]  # n x 1 x size
    index = (rows * (size + 2 * p) + cols).reshape(n, 1, -1).expand(n, channels, -1)
    images = padded.reshape(n, channels, -1).gather(2, index).reshape(n, channels, size, size)
    images = contrast * images + noise * torch.randn(images.shape, generator=g)
    return images, labels


def make_synthetic(
    seed: int = 0,
    *,
    train_size: int = 2000,
    test_size: int = 500,
    num_classes: int = 10,
    channels: int = 1,
    image_size: int = 16,
    max_shift: int = 3,
    noise: float = 2.0,
    grid: int = 4,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Generate ``(train_x, train_y, test_x, test_y)``: float32 N x C x H x W, int64 labels.

    ``grid`` is the side of the coarse random grid each template is upsampled
    from (smaller: smoother templates). Same arguments, same tensors, bit for bit.

    >>> train_x, train_y, test_x, test_y = make_synthetic(seed=1)
    >>> tuple(train_x.shape), tuple(test_y.shape)
    ((2000, 1, 16, 16), (500,))
    """
    for name, value, low in (
        ("train_size", train_size, 1),
        ("test_size", test_size, 1),
        ("num_classes", num_classes, 2),
        ("channels", channels, 1),
        ("image_size", image_size, 2),
        ("grid", grid, 1),
        ("max_shift", max_shift, 0),
    ):
        if value < low:
            raise ValueError(f"make_synthetic: {name} must be at least {low}, got {value}")
    if noise < 0:
        raise ValueError(f"make_synthetic: noise must be non-negative, got {noise}")
    coarse = torch.randn(num_classes, channels, grid, grid, generator=_generator(seed, 0))
    templates = F.interpolate(
        coarse, size=(image_size, image_size), mode="bilinear", align_corners=True
    )
    templates = templates / templates.std(dim=(1, 2, 3), keepdim=True).clamp_min(1e-6)
    train_x, train_y = _examples(templates, train_size, max_shift, noise, seed, 1)
    test_x, test_y = _examples(templates, test_size, max_shift, noise, seed, 2)
    return train_x, train_y, test_x, test_y
