"""Arrays saved by the user: ``torch.save`` files or NumPy ``.npz`` archives.

``dana train --dataset tensors --data-dir PATH`` reads, where ``PATH`` is

- a directory holding ``train.pt`` and ``test.pt`` (each ``torch.save`` of a dict with
  keys ``x`` and ``y``, or of a pair ``(x, y)``), or ``train.npz`` and ``test.npz``
  (arrays ``x`` and ``y``);
- one file, ``.pt`` (a dict) or ``.npz``, holding ``train_x``, ``train_y``, ``test_x``
  and ``test_y``.

``x``: images ``N x C x S x S`` (or ``N x S x S``: one channel), uint8 (pixels 0..255)
or floating point; ``y``: integer class labels ``0 .. C-1`` of length ``N``; the number
of classes is the largest label plus one. ``.pt`` files are loaded with
``torch.load(weights_only=True)``: tensors and plain containers only, no code. A file
that is missing, unreadable, or holds the wrong keys, shapes or types is a
:class:`~dana.errors.DataError` naming the file and what is wrong.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dana.errors import ConfigError, DataError

LAYOUT = (
    "a directory with train.pt and test.pt (or train.npz and test.npz) holding x and y, "
    "or one .pt or .npz file holding train_x, train_y, test_x and test_y"
)


def read_tensors(
    data_dir: str | Path | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """``(train_x, train_y, test_x, test_y, num_classes)`` from ``data_dir``."""
    if data_dir is None:
        raise ConfigError(f"--dataset tensors needs --data-dir PATH: {LAYOUT}")
    path = Path(data_dir)
    if path.is_dir():
        for ext in (".pt", ".npz"):
            train, test = path / f"train{ext}", path / f"test{ext}"
            if train.is_file() and test.is_file():
                tx, ty = _split(train, _load(train), ("x", "y"))
                vx, vy = _split(test, _load(test), ("x", "y"))
                break
        else:
            raise DataError(
                f"{path}: no train.pt and test.pt, nor train.npz and test.npz; {LAYOUT}"
            )
        train_path, test_path = train, test
    elif path.is_file():
        values = _load(path)
        tx, ty = _split(path, values, ("train_x", "train_y"))
        vx, vy = _split(path, values, ("test_x", "test_y"))
        train_path = test_path = path
    else:
        raise DataError(f"{path}: no such file or directory; --dataset tensors expects {LAYOUT}")
    tx, ty = _check(train_path, tx, ty, "training")
    vx, vy = _check(test_path, vx, vy, "test")
    if vx.shape[1:] != tx.shape[1:]:
        raise DataError(
            f"{test_path}: test images are {tuple(vx.shape[1:])}, training images "
            f"{tuple(tx.shape[1:])}"
        )
    if vx.dtype != tx.dtype:
        vx = vx.to(tx.dtype) if tx.is_floating_point() else vx.float()
        tx = tx.float()
    num_classes = int(max(ty.max(), vy.max())) + 1
    return tx, ty, vx, vy, num_classes


def _load(path: Path) -> Any:
    if path.suffix == ".npz":
        try:
            with np.load(path, allow_pickle=False) as archive:
                return {k: archive[k] for k in archive.files}
        except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
            raise DataError(f"{path}: not a readable .npz archive ({e})") from None
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except Exception as e:  # torch raises many kinds for a corrupt or foreign file
        raise DataError(
            f"{path}: not a readable torch.save file of tensors ({str(e).splitlines()[0]})"
        ) from None


def _split(path: Path, values: Any, keys: tuple[str, str]) -> tuple[Any, Any]:
    if isinstance(values, tuple | list) and keys == ("x", "y") and len(values) == 2:
        return values[0], values[1]
    if not isinstance(values, dict):
        raise DataError(
            f"{path}: expected a dict with keys {', '.join(keys)}, got {type(values).__name__}"
        )
    missing = [k for k in keys if k not in values]
    if missing:
        raise DataError(
            f"{path}: missing key(s) {', '.join(missing)} (it has: "
            f"{', '.join(map(str, values)) or 'none'}); {LAYOUT}"
        )
    return values[keys[0]], values[keys[1]]


def _tensor(path: Path, value: Any, name: str) -> torch.Tensor:
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "uifb":
            raise DataError(f"{path}: {name} has dtype {value.dtype}, expected numbers")
        return torch.from_numpy(value)
    if isinstance(value, torch.Tensor):
        return value
    raise DataError(f"{path}: {name} is a {type(value).__name__}, expected a tensor or array")


def _check(path: Path, x: Any, y: Any, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = _tensor(path, x, f"{what} x"), _tensor(path, y, f"{what} y")
    if x.dim() == 3:
        x = x.unsqueeze(1)
    if x.dim() != 4 or x.shape[2] != x.shape[3]:
        raise DataError(
            f"{path}: {what} x has shape {tuple(x.shape)}; expected square images "
            "N x C x S x S (or N x S x S); for other inputs use dana.fit from Python"
        )
    if x.dtype != torch.uint8 and not x.is_floating_point():
        raise DataError(f"{path}: {what} x has dtype {x.dtype}; expected uint8 or floats")
    if x.is_floating_point() and not torch.isfinite(x).all():
        raise DataError(f"{path}: {what} x holds NaN or infinite values")
    if y.dim() != 1 or y.is_floating_point() or y.dtype == torch.bool:
        raise DataError(
            f"{path}: {what} y has shape {tuple(y.shape)} and dtype {y.dtype}; expected "
            "integer class labels, one per image"
        )
    if len(y) != len(x):
        raise DataError(f"{path}: {len(y)} {what} labels for {len(x)} images")
    if len(x) == 0:
        raise DataError(f"{path}: no {what} examples")
    if int(y.min()) < 0:
        raise DataError(f"{path}: {what} label {int(y.min())} is negative; labels are 0 .. C-1")
    return x.contiguous(), y.long()
