"""Load a dataset by name into memory, normalised, as a :class:`Dataset`.

Names (:data:`DATASETS`, a registry: :func:`register_dataset` adds one):

- ``fashion-mnist``: the four IDX files in ``data_dir``, by default
  :data:`DEFAULT_FASHION_DIR` (Debian package ``dataset-fashion-mnist``);
- ``mnist``: the same four file names, in ``data_dir`` (required);
- ``cifar10`` / ``cifar100``: the official binary versions, in ``data_dir``
  (required; the ``cifar-10-batches-bin`` / ``cifar-100-binary`` folder or its parent);
- ``synthetic``: :func:`~dana.data.synthetic.make_synthetic` with ``seed``
  (``data_dir`` is ignored);
- ``folder``: your images in class sub-folders of ``data_dir/train`` and
  ``data_dir/test`` (:mod:`dana.data.folder`);
- ``tensors``: your arrays in ``torch.save`` or ``.npz`` files (:mod:`dana.data.tensors`);
- ``text``: a text corpus, ``data_dir`` a file or a directory of ``train.txt`` and
  ``test.txt`` (:mod:`dana.data.text`), as sequences of ``seq_len`` byte tokens.

Images become float32 ``N x C x H x W``, normalised per channel with the mean and
standard deviation of the training images used; labels are int64. Text becomes int64
``N x T`` token windows and their ``N x T`` next tokens (``kind == "tokens"``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from dana.data.augment import augment_batch
from dana.data.cifar import Splits, read_cifar10, read_cifar100
from dana.data.idx import read_idx
from dana.data.synthetic import make_synthetic
from dana.errors import ConfigError, DataError

__all__ = [
    "DATASETS",
    "DatasetEntry",
    "register_dataset",
    "DEFAULT_FASHION_DIR",
    "IDX_FILES",
    "Dataset",
    "augment_batch",
    "load_dataset",
]

DEFAULT_FASHION_DIR = "/usr/share/datasets/fashion-mnist"
# (train images, train labels, test images, test labels); each may also lack ".gz".
IDX_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)
#: MNIST's and Fashion-MNIST's classes (their labels are 0 to 9), and ``synthetic``'s.
IDX_CLASSES = SYNTHETIC_CLASSES = 10
_FASHION_HINT = (
    "install it with `apt-get install dataset-fashion-mnist` or pass --data-dir DIR "
    "holding the four IDX files"
)


@dataclass
class Dataset:
    """A classification dataset held in memory: images, or token sequences.

    Images (``kind == "images"``): ``train_x`` and ``test_x`` are float32
    ``N x C x H x W`` normalised per channel with the training statistics ``mean`` and
    ``std`` (in the source's pixel units scaled to [0, 1] for 8-bit images);
    ``train_y`` and ``test_y`` are int64. ``augment`` says whether training batches
    should go through :func:`augment_batch`. Tokens (``kind == "tokens"``): ``*_x``
    int64 ``N x T`` windows of text, ``*_y`` the next token at each position (the
    classes: ``num_classes`` the vocabulary).
    """

    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int
    augment: bool
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    kind: str = "images"

    @property
    def seq_len(self) -> int:
        """Tokens per sequence (T; token data only)."""
        return self.train_x.shape[1]

    @property
    def channels(self) -> int:
        """Number of image channels (C)."""
        return self.train_x.shape[1]

    @property
    def image_size(self) -> int:
        """Image side in pixels (H; images are square)."""
        return self.train_x.shape[2]

    @property
    def train_size(self) -> int:
        """Number of training examples."""
        return self.train_x.shape[0]

    @property
    def test_size(self) -> int:
        """Number of test examples."""
        return self.test_x.shape[0]


def _find_idx_files(name: str, data_dir: Path, default_dir: bool) -> list[Path]:
    """The four IDX files in ``data_dir`` (``.gz`` or raw), or a DataError saying which lack."""
    hint = _FASHION_HINT if name == "fashion-mnist" else "pass --data-dir DIR holding them"
    if not data_dir.is_dir():
        what = "default directory" if default_dir else "directory"
        raise DataError(f"{data_dir}: {name} {what} not found; {hint}")
    found, missing = [], []
    for gz_name in IDX_FILES:
        candidates = [data_dir / gz_name, data_dir / gz_name.removesuffix(".gz")]
        path = next((p for p in candidates if p.is_file()), None)
        if path is None:
            missing.append(gz_name)
        found.append(path)
    if missing:
        raise DataError(
            f"{data_dir}: {name} files missing: {', '.join(missing)} (or without .gz); "
            f"expected {', '.join(IDX_FILES)}; {hint}"
        )
    return found


def _read_idx_pair(
    images_path: Path, labels_path: Path, num_classes: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Images (uint8 N x 1 x H x W) and labels (int64) from two IDX files, cross-checked."""
    images, labels = read_idx(images_path), read_idx(labels_path)
    if images.dtype != torch.uint8 or images.dim() != 3:
        raise DataError(
            f"{images_path}: expected uint8 images N x H x W, got {images.dtype} "
            f"with shape {tuple(images.shape)}"
        )
    if images.shape[1] != images.shape[2]:
        raise DataError(f"{images_path}: images must be square, got {tuple(images.shape[1:])}")
    if labels.dtype != torch.uint8 or labels.dim() != 1:
        raise DataError(
            f"{labels_path}: expected uint8 labels of 1 dimension, got {labels.dtype} "
            f"with shape {tuple(labels.shape)}"
        )
    if labels.shape[0] != images.shape[0]:
        raise DataError(
            f"{labels_path}: {labels.shape[0]} labels but {images_path} has "
            f"{images.shape[0]} images"
        )
    if labels.numel() and int(labels.max()) >= num_classes:
        raise DataError(
            f"{labels_path}: label {int(labels.max())} out of range 0..{num_classes - 1}"
        )
    return images.unsqueeze(1), labels.long()


def _load_idx(name: str, data_dir: str | os.PathLike[str] | None) -> Splits:
    """Raw uint8 splits of MNIST or Fashion-MNIST."""
    default_dir = data_dir is None
    if default_dir:
        if name != "fashion-mnist":
            raise ConfigError(f"dataset {name!r} needs --data-dir DIR holding the four IDX files")
        data_dir = DEFAULT_FASHION_DIR
    paths = _find_idx_files(name, Path(data_dir), default_dir)
    train_x, train_y = _read_idx_pair(paths[0], paths[1], IDX_CLASSES)
    test_x, test_y = _read_idx_pair(paths[2], paths[3], IDX_CLASSES)
    if test_x.shape[1:] != train_x.shape[1:]:
        raise DataError(
            f"{paths[2]}: test images are {tuple(test_x.shape[2:])}, "
            f"training images {tuple(train_x.shape[2:])}"
        )
    return train_x, train_y, test_x, test_y


def _check_size(what: str, value: int | None, available: int | None = None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{what} must be a positive integer, got {value!r}")
    if available is not None and value > available:
        raise ConfigError(f"{what} is {value} but the dataset has only {available} examples")


def _check_synthetic_fits(train_size: int, test_size: int) -> None:
    """ConfigError before generating a synthetic set that does not fit the memory: each
    example is a 1 x 16 x 16 float32 image and a label, about three times over while
    it is made."""
    from dana.memory import check_fits

    check_fits(
        3 * (train_size + test_size) * (16 * 16 * 4 + 8),
        f"--dataset synthetic of {train_size:,} training and {test_size:,} test examples",
        "lower --train-size or --test-size",
    )


def _channel_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and (unbiased) std of ``N x C x H x W`` images, in float64.

    8-bit images go through a 256-bin histogram per channel: exact and fast.
    """
    if x.dtype != torch.uint8:
        std, mean = torch.std_mean(x.double(), dim=(0, 2, 3))
        return mean, std
    values = torch.arange(256, dtype=torch.float64)
    means, stds = [], []
    for c in range(x.shape[1]):
        counts = torch.bincount(x[:, c].reshape(-1), minlength=256).double()
        n = counts.sum()
        mean = (counts * values).sum() / n
        var = (counts * (values - mean) ** 2).sum() / (n - 1).clamp_min(1)
        means.append(mean)
        stds.append(var.sqrt())
    return torch.stack(means), torch.stack(stds)


def _normalise(
    train: torch.Tensor, test: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, tuple[tuple[float, ...], tuple[float, ...]]]:
    """Float32 copies normalised per channel by the training mean and std, and the stats.

    The stats are returned in [0, 1] pixel units for 8-bit images.
    """
    scale = 255.0 if train.dtype == torch.uint8 else 1.0
    mean, std = _channel_stats(train)
    std = torch.where(std > 1e-8 * scale, std, torch.ones_like(std))
    shift = mean.float().reshape(1, -1, 1, 1)
    inv_std = (1 / std).float().reshape(1, -1, 1, 1)
    # One new float32 tensor per split: subtract (promotes uint8 to float32), then scale.
    train = torch.sub(train, shift).mul_(inv_std)
    test = torch.sub(test, shift).mul_(inv_std)
    return train, test, (tuple((mean / scale).tolist()), tuple((std / scale).tolist()))


@dataclass(frozen=True)
class Request:
    """What a reader is asked for (``load_dataset``'s arguments)."""

    name: str
    data_dir: str | os.PathLike[str] | None
    seed: int
    train_size: int | None
    test_size: int | None
    seq_len: int | None
    augment: bool | None


#: A reader: ``(train_x, train_y, test_x, test_y, num_classes)`` of a request.
Reader = Callable[[Request], tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]]


@dataclass(frozen=True)
class DatasetEntry:
    """A dataset by name: its reader; ``kind`` (``images`` or ``tokens``); whether
    ``--augment`` is on by default; whether it reads files (``--data-dir``)."""

    read: Reader
    kind: str = "images"
    augment: bool = False
    reads_files: bool = True


def _idx(request: Request):
    return (*_load_idx(request.name, request.data_dir), IDX_CLASSES)


def _synthetic(request: Request):
    train_size, test_size = request.train_size or 2000, request.test_size or 500
    _check_synthetic_fits(train_size, test_size)
    splits = make_synthetic(
        request.seed, train_size=train_size, test_size=test_size, num_classes=SYNTHETIC_CLASSES
    )
    return (*splits, SYNTHETIC_CLASSES)


def _cifar(request: Request):
    ten = request.name == "cifar10"
    if request.data_dir is None:
        folder = "cifar-10-batches-bin" if ten else "cifar-100-binary"
        raise ConfigError(
            f"dataset {request.name!r} needs --data-dir DIR: the {folder} folder of the "
            "official binary version, or its parent"
        )
    return (*(read_cifar10 if ten else read_cifar100)(request.data_dir), 10 if ten else 100)


def _folder(request: Request):
    from dana.data.folder import read_image_folder

    *splits, classes = read_image_folder(request.data_dir)
    return (*splits, len(classes))


def _tensors(request: Request):
    from dana.data.tensors import read_tensors

    return read_tensors(request.data_dir)


def _text(request: Request):
    from dana.data.text import VOCAB, read_text

    _check_size("seq_len", request.seq_len)
    if request.augment:
        raise ConfigError("--augment flips and crops images; --dataset text has none")
    return (*read_text(request.data_dir, request.seq_len or 64), VOCAB)


#: The datasets by name (:func:`register_dataset` adds one).
DATASETS: dict[str, DatasetEntry] = {
    "fashion-mnist": DatasetEntry(_idx),
    "mnist": DatasetEntry(_idx),
    "cifar10": DatasetEntry(_cifar, augment=True),
    "cifar100": DatasetEntry(_cifar, augment=True),
    "synthetic": DatasetEntry(_synthetic, reads_files=False),
    "folder": DatasetEntry(_folder),
    "tensors": DatasetEntry(_tensors),
    "text": DatasetEntry(_text, kind="tokens"),
}


def register_dataset(name: str, entry: DatasetEntry) -> DatasetEntry:
    """Add a dataset under ``name`` (``--dataset name``)."""
    name = name.strip().lower()
    if name in DATASETS and DATASETS[name] != entry:
        raise ValueError(f"a dataset named {name!r} is already registered")
    DATASETS[name] = entry
    return entry


def _entry(name: str) -> DatasetEntry | None:
    """The registry's entry of dataset ``name`` (any case, spaces around); ``None`` for
    an unknown name, which :func:`load_dataset` refuses."""
    return DATASETS.get(name.strip().lower())


def dataset_kind(name: str) -> str:
    """The kind of dataset ``name`` (``images`` or ``tokens``); ``images`` for an unknown
    name."""
    entry = _entry(name)
    return entry.kind if entry is not None else "images"


def reads_files(name: str) -> bool:
    """Whether dataset ``name`` reads files (``--data-dir``); True for an unknown name."""
    entry = _entry(name)
    return entry is None or entry.reads_files


def load_dataset(
    name: str,
    data_dir: str | os.PathLike[str] | None = None,
    *,
    seed: int = 0,
    augment: bool | None = None,
    train_size: int | None = None,
    test_size: int | None = None,
    seq_len: int | None = None,
) -> Dataset:
    """Load dataset ``name`` (one of :data:`DATASETS`) into a normalised :class:`Dataset`.

    ``train_size`` / ``test_size`` keep the first n examples (for quick runs; for
    ``synthetic`` they set how many are generated: defaults 2000 and 500; for ``text``,
    sequences of ``seq_len`` tokens, default 64).
    ``seed`` only matters for ``synthetic``. ``augment`` defaults to the dataset's
    (True for CIFAR). Raises :class:`ConfigError` for a bad name or size
    and :class:`DataError` for missing or corrupt files.

    >>> ds = load_dataset("synthetic", train_size=1000)
    >>> ds.train_size, ds.test_size, ds.channels, ds.image_size, ds.num_classes
    (1000, 500, 1, 16, 10)
    """
    name = name.strip().lower()
    if name not in DATASETS:
        raise ConfigError(f"unknown dataset {name!r}; valid: {', '.join(DATASETS)}")
    entry = DATASETS[name]
    _check_size("train_size", train_size)
    _check_size("test_size", test_size)
    request = Request(name, data_dir, seed, train_size, test_size, seq_len, augment)
    train_x, train_y, test_x, test_y, num_classes = entry.read(request)
    _check_size("train_size", train_size, train_x.shape[0])
    _check_size("test_size", test_size, test_x.shape[0])
    train_x, train_y = train_x[:train_size], train_y[:train_size].clone()
    test_x, test_y = test_x[:test_size], test_y[:test_size].clone()
    for split, count in (("training", train_x.shape[0]), ("test", test_x.shape[0])):
        if count == 0:
            raise DataError(
                f"{name}: the {split} set is empty (0 examples{f' in {data_dir}' if data_dir else ''}); "
                "give a --data-dir whose files hold examples"
            )
    if entry.kind == "tokens":
        return Dataset(name, train_x, train_y, test_x, test_y, num_classes, False, kind="tokens")
    train_x, test_x, (mean, std) = _normalise(train_x, test_x)
    return Dataset(
        name=name,
        train_x=train_x,
        train_y=train_y,
        test_x=test_x,
        test_y=test_y,
        num_classes=num_classes,
        augment=entry.augment if augment is None else bool(augment),
        mean=mean,
        std=std,
    )
