"""Read and write the official binary versions of CIFAR-10 and CIFAR-100.

CIFAR-10 (``cifar-10-batches-bin/``): ``data_batch_1.bin`` .. ``data_batch_5.bin`` and
``test_batch.bin``; each record is 1 label byte (0-9) then 3072 image bytes (the
red, green and blue 32x32 planes, row-major).

CIFAR-100 (``cifar-100-binary/``): ``train.bin`` and ``test.bin``; each record is a
coarse label byte (0-19), a fine label byte (0-99), then 3072 image bytes. The
readers return the fine label.

Readers accept the data folder itself or its parent holding that folder, and
return ``(train_images, train_labels, test_images, test_labels)``: uint8
``N x 3 x 32 x 32`` images and int64 labels. Every problem raises
:class:`~dana.errors.DataError` naming the file.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from dana.atomic import write_atomic
from dana.data.rawfile import read_nonempty
from dana.errors import DataError

__all__ = [
    "CIFAR10_FILES",
    "CIFAR10_FOLDER",
    "CIFAR100_FILES",
    "CIFAR100_FOLDER",
    "find_cifar_dir",
    "read_cifar10",
    "read_cifar100",
    "read_cifar_file",
    "write_cifar10",
    "write_cifar100",
]

IMAGE_SHAPE = (3, 32, 32)
IMAGE_BYTES = 3 * 32 * 32

CIFAR10_FOLDER = "cifar-10-batches-bin"
CIFAR10_TRAIN_FILES = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
CIFAR10_TEST_FILE = "test_batch.bin"
CIFAR10_FILES = (*CIFAR10_TRAIN_FILES, CIFAR10_TEST_FILE)

CIFAR100_FOLDER = "cifar-100-binary"
CIFAR100_FILES = ("train.bin", "test.bin")

Splits = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def find_cifar_dir(data_dir: str | os.PathLike[str], folder: str, files: tuple[str, ...]) -> Path:
    """The folder holding all of ``files``: ``data_dir`` itself or ``data_dir/folder``.

    Raises :class:`DataError` listing the expected files and the places looked in.
    """
    data_dir = Path(data_dir)
    candidates = [data_dir, data_dir / folder]
    for candidate in candidates:
        if all((candidate / name).is_file() for name in files):
            return candidate
    # Report the missing files of the more complete candidate.
    best = max(candidates, key=lambda c: sum((c / name).is_file() for name in files))
    missing = [name for name in files if not (best / name).is_file()]
    if not data_dir.exists():
        where = f"{data_dir} does not exist"
    else:
        where = f"missing in {best}: {', '.join(missing)}"
    raise DataError(
        f"{data_dir}: CIFAR files not found ({where}); expected {', '.join(files)} "
        f"in {data_dir} or in {data_dir / folder}"
    )


def read_cifar_file(
    path: str | os.PathLike[str], *, label_bytes: int, num_classes: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Read one CIFAR binary file: uint8 ``N x 3 x 32 x 32`` images, int64 labels.

    Each record is ``label_bytes`` label bytes then 3072 image bytes; the label is
    the last label byte (CIFAR-10: the only one; CIFAR-100: the fine label). With
    two label bytes the first (coarse, 0-19) is checked too.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    raw = read_nonempty(path)
    record = label_bytes + IMAGE_BYTES
    if len(raw) % record:
        raise DataError(
            f"{path}: truncated or not a CIFAR binary file: {len(raw)} bytes is not a "
            f"multiple of the record size {record} ({len(raw) // record} whole records "
            f"and {len(raw) % record} bytes left over)"
        )
    records = np.frombuffer(raw, dtype=np.uint8).reshape(-1, record)
    labels = records[:, label_bytes - 1]
    _check_labels(path, labels, num_classes, "label")
    if label_bytes == 2:
        _check_labels(path, records[:, 0], 20, "coarse label")
    images = records[:, label_bytes:].reshape(-1, *IMAGE_SHAPE)
    return torch.from_numpy(images.copy()), torch.from_numpy(labels.astype(np.int64))


def _check_labels(path: Path, labels: np.ndarray, num_classes: int, what: str) -> None:
    bad = np.flatnonzero(labels >= num_classes)
    if bad.size:
        raise DataError(
            f"{path}: {what} out of range: record {int(bad[0])} has {what} "
            f"{int(labels[bad[0]])}, valid 0..{num_classes - 1} (records with a bad {what}: "
            f"{bad.size})"
        )


def read_cifar10(data_dir: str | os.PathLike[str]) -> Splits:
    """Read CIFAR-10 from ``cifar-10-batches-bin/`` or its parent (10 classes)."""
    folder = find_cifar_dir(data_dir, CIFAR10_FOLDER, CIFAR10_FILES)
    parts = [
        read_cifar_file(folder / name, label_bytes=1, num_classes=10)
        for name in CIFAR10_TRAIN_FILES
    ]
    train_x = torch.cat([x for x, _ in parts])
    train_y = torch.cat([y for _, y in parts])
    test_x, test_y = read_cifar_file(folder / CIFAR10_TEST_FILE, label_bytes=1, num_classes=10)
    return train_x, train_y, test_x, test_y


def read_cifar100(data_dir: str | os.PathLike[str]) -> Splits:
    """Read CIFAR-100 from ``cifar-100-binary/`` or its parent (100 fine classes)."""
    folder = find_cifar_dir(data_dir, CIFAR100_FOLDER, CIFAR100_FILES)
    train_x, train_y = read_cifar_file(folder / "train.bin", label_bytes=2, num_classes=100)
    test_x, test_y = read_cifar_file(folder / "test.bin", label_bytes=2, num_classes=100)
    return train_x, train_y, test_x, test_y


def _records(images: torch.Tensor, *label_columns: torch.Tensor) -> bytes:
    """Records of the official format: label bytes then the 3072 image bytes."""
    if images.dtype != torch.uint8 or tuple(images.shape[1:]) != IMAGE_SHAPE:
        raise ValueError(
            f"CIFAR images must be uint8 N x 3 x 32 x 32, got {images.dtype} {tuple(images.shape)}"
        )
    n = images.shape[0]
    columns = []
    for labels in label_columns:
        if labels.shape != (n,):
            raise ValueError(f"expected {n} labels, got shape {tuple(labels.shape)}")
        if n and (labels.min() < 0 or labels.max() > 255):
            raise ValueError("CIFAR labels must fit in one byte (0..255)")
        columns.append(labels.cpu().numpy().astype(np.uint8).reshape(n, 1))
    pixels = images.cpu().contiguous().numpy().reshape(n, IMAGE_BYTES)
    return np.concatenate([*columns, pixels], axis=1).tobytes()


def write_cifar10(
    data_dir: str | os.PathLike[str],
    train_images: torch.Tensor,
    train_labels: torch.Tensor,
    test_images: torch.Tensor,
    test_labels: torch.Tensor,
) -> Path:
    """Write CIFAR-10 binary files into ``data_dir`` itself (for tests and tools).

    The training set is split into the five ``data_batch_*.bin`` files in order
    (as evenly as possible), so :func:`read_cifar10` returns it unchanged.
    Returns ``data_dir`` as a :class:`Path`.
    """
    data_dir = Path(data_dir)
    n = train_images.shape[0]
    bounds = np.linspace(0, n, len(CIFAR10_TRAIN_FILES) + 1).round().astype(int)
    for name, lo, hi in zip(CIFAR10_TRAIN_FILES, bounds[:-1], bounds[1:]):
        write_atomic(data_dir / name, _records(train_images[lo:hi], train_labels[lo:hi]))
    write_atomic(data_dir / CIFAR10_TEST_FILE, _records(test_images, test_labels))
    return data_dir


def write_cifar100(
    data_dir: str | os.PathLike[str],
    train_images: torch.Tensor,
    train_labels: torch.Tensor,
    test_images: torch.Tensor,
    test_labels: torch.Tensor,
    *,
    train_coarse: torch.Tensor | None = None,
    test_coarse: torch.Tensor | None = None,
) -> Path:
    """Write CIFAR-100 ``train.bin`` and ``test.bin`` into ``data_dir`` (fine labels).

    Coarse labels default to ``fine // 5`` (not CIFAR-100's real grouping; readers
    ignore them beyond a range check). Returns ``data_dir`` as a :class:`Path`.
    """
    data_dir = Path(data_dir)
    if train_coarse is None:
        train_coarse = train_labels // 5
    if test_coarse is None:
        test_coarse = test_labels // 5
    write_atomic(data_dir / "train.bin", _records(train_images, train_coarse, train_labels))
    write_atomic(data_dir / "test.bin", _records(test_images, test_coarse, test_labels))
    return data_dir
