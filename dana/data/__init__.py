"""Datasets: IDX (MNIST, Fashion-MNIST), CIFAR-10/100 binary, and a synthetic task.

:func:`load_dataset` returns a normalised in-memory :class:`Dataset`;
:func:`augment_batch` is the CIFAR training augmentation (random crop and flip).
"""

from dana.data.augment import augment_batch
from dana.data.cifar import read_cifar10, read_cifar100, write_cifar10, write_cifar100
from dana.data.datasets import (
    DATASETS,
    DEFAULT_FASHION_DIR,
    Dataset,
    DatasetEntry,
    load_dataset,
    register_dataset,
)
from dana.data.idx import read_idx, write_idx
from dana.data.synthetic import make_synthetic

__all__ = [
    "DATASETS",
    "DEFAULT_FASHION_DIR",
    "Dataset",
    "DatasetEntry",
    "augment_batch",
    "load_dataset",
    "make_synthetic",
    "read_cifar10",
    "read_cifar100",
    "read_idx",
    "register_dataset",
    "write_cifar10",
    "write_cifar100",
    "write_idx",
]
