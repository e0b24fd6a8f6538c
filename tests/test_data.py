"""Tests for dana.data: IDX and CIFAR files, the synthetic task, loading, augmentation."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
import torch

from dana.data import (
    DATASETS,
    DEFAULT_FASHION_DIR,
    Dataset,
    augment_batch,
    load_dataset,
    make_synthetic,
    read_cifar10,
    read_cifar100,
    read_idx,
    write_cifar10,
    write_cifar100,
    write_idx,
)
from dana.data.datasets import IDX_FILES
from dana.errors import ConfigError, DataError

# ---------------------------------------------------------------- helpers


def _images(n: int, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, *shape), generator=g, dtype=torch.uint8)


def _labels(n: int, num_classes: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, num_classes, (n,), generator=g)


def _write_idx_dir(
    folder: Path, n_train: int = 50, n_test: int = 20, size: int = 28, gz: bool = True
) -> tuple[torch.Tensor, ...]:
    """Four IDX files like MNIST's in ``folder``; returns the raw tensors written."""
    tensors = (
        _images(n_train, (size, size), 0),
        _labels(n_train, 10, 1).to(torch.uint8),
        _images(n_test, (size, size), 2),
        _labels(n_test, 10, 3).to(torch.uint8),
    )
    for name, t in zip(IDX_FILES, tensors):
        write_idx(folder / (name if gz else name.removesuffix(".gz")), t)
    return tensors


def _raise_names_file(path: Path, match: str, load=None) -> None:
    """``load()`` (default: ``read_idx(path)``) raises DataError naming ``path``."""
    with pytest.raises(DataError, match=match) as info:
        load() if load else read_idx(path)
    assert str(path) in str(info.value)


# ---------------------------------------------------------------- IDX


@pytest.mark.parametrize("name", ["x-idx3-ubyte.gz", "x-idx3-ubyte"])
def test_idx_round_trip(tmp_path: Path, name: str) -> None:
    images = _images(7, (5, 4))
    write_idx(tmp_path / name, images)
    back = read_idx(tmp_path / name)
    assert back.dtype == torch.uint8
    assert torch.equal(back, images)
    raw = (tmp_path / name).read_bytes()
    assert (raw[:2] == b"\x1f\x8b") == name.endswith(".gz")


@pytest.mark.parametrize("dtype", [torch.int16, torch.int32, torch.float32, torch.float64])
def test_idx_round_trip_other_dtypes(tmp_path: Path, dtype: torch.dtype) -> None:
    t = (torch.arange(24) - 7).reshape(2, 3, 4).to(dtype)
    write_idx(tmp_path / "t.idx", t)
    assert torch.equal(read_idx(tmp_path / "t.idx"), t)


def test_idx_missing(tmp_path: Path) -> None:
    _raise_names_file(tmp_path / "nope-idx1-ubyte.gz", "file not found")


@pytest.mark.parametrize("name", ["empty-idx1-ubyte", "empty-idx1-ubyte.gz"])
def test_idx_empty(tmp_path: Path, name: str) -> None:
    (tmp_path / name).write_bytes(b"")
    _raise_names_file(tmp_path / name, "empty")


def test_idx_wrong_magic(tmp_path: Path) -> None:
    path = tmp_path / "bad-idx1-ubyte"
    path.write_bytes(b"\x01\x00\x08\x01" + (3).to_bytes(4, "big") + b"abc")
    _raise_names_file(path, "magic")


def test_idx_unknown_type_code(tmp_path: Path) -> None:
    path = tmp_path / "bad-idx1-ubyte"
    path.write_bytes(b"\x00\x00\x07\x01" + (3).to_bytes(4, "big") + b"abc")
    _raise_names_file(path, "type code")


def test_idx_truncated_data(tmp_path: Path) -> None:
    path = tmp_path / "train-images-idx3-ubyte.gz"
    write_idx(path, _images(10, (28, 28)))
    payload = gzip.decompress(path.read_bytes())
    path.write_bytes(gzip.compress(payload[: 16 + 1000]))
    _raise_names_file(path, "truncated: header says 7840 bytes of data, found 1000")


def test_idx_truncated_header(tmp_path: Path) -> None:
    path = tmp_path / "short-idx3-ubyte"
    path.write_bytes(b"\x00\x00\x08\x03" + (10).to_bytes(4, "big"))
    _raise_names_file(path, "truncated")


def test_idx_trailing_garbage(tmp_path: Path) -> None:
    path = tmp_path / "long-idx1-ubyte"
    write_idx(path, _labels(5, 10).to(torch.uint8))
    path.write_bytes(path.read_bytes() + b"junk")
    _raise_names_file(path, "trailing")


def test_idx_corrupt_gzip(tmp_path: Path) -> None:
    path = tmp_path / "x-idx1-ubyte.gz"
    write_idx(path, _labels(500, 10).to(torch.uint8))
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])  # cut mid-stream
    _raise_names_file(path, "gzip")
    path.write_bytes(b"\x00\x00\x08\x01" + raw[4:])  # .gz name, not gzip content
    _raise_names_file(path, "gzip")


# ---------------------------------------------------------------- CIFAR


def test_cifar10_round_trip_and_parent_dir(tmp_path: Path) -> None:
    train_x, train_y = _images(23, (3, 32, 32), 0), _labels(23, 10, 1)
    test_x, test_y = _images(6, (3, 32, 32), 2), _labels(6, 10, 3)
    folder = write_cifar10(tmp_path / "cifar-10-batches-bin", train_x, train_y, test_x, test_y)
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]
    )
    assert (folder / "test_batch.bin").stat().st_size == 6 * 3073
    for where in (folder, tmp_path):
        got = read_cifar10(where)
        for a, b in zip(got, (train_x, train_y, test_x, test_y)):
            assert torch.equal(a, b)
        assert got[1].dtype == torch.int64


def test_cifar100_round_trip_uses_fine_labels(tmp_path: Path) -> None:
    train_x, train_y = _images(9, (3, 32, 32), 0), _labels(9, 100, 1)
    test_x, test_y = _images(4, (3, 32, 32), 2), _labels(4, 100, 3)
    folder = write_cifar100(tmp_path / "cifar-100-binary", train_x, train_y, test_x, test_y)
    raw = (folder / "train.bin").read_bytes()
    assert len(raw) == 9 * 3074
    assert raw[0] == int(train_y[0]) // 5 and raw[1] == int(train_y[0])
    for where in (folder, tmp_path):
        got = read_cifar100(where)
        for a, b in zip(got, (train_x, train_y, test_x, test_y)):
            assert torch.equal(a, b)


def test_cifar_missing_files(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="data_batch_1.bin") as info:
        read_cifar10(tmp_path)
    assert str(tmp_path) in str(info.value)
    folder = write_cifar10(
        tmp_path / "cifar-10-batches-bin", _images(5, (3, 32, 32)), _labels(5, 10), *_test10()
    )
    (folder / "data_batch_3.bin").unlink()
    with pytest.raises(DataError, match="missing in .*: data_batch_3.bin"):
        read_cifar10(tmp_path)
    with pytest.raises(DataError, match="train.bin, test.bin"):
        read_cifar100(tmp_path / "nowhere")


def _test10() -> tuple[torch.Tensor, torch.Tensor]:
    return _images(2, (3, 32, 32), 5), _labels(2, 10, 6)


def test_cifar_truncated_empty_and_bad_labels(tmp_path: Path) -> None:
    folder = write_cifar10(tmp_path, _images(10, (3, 32, 32)), _labels(10, 10), *_test10())
    path = folder / "data_batch_2.bin"
    path.write_bytes(path.read_bytes()[:-100])
    _raise_names_file(path, "truncated", lambda: read_cifar10(tmp_path))

    folder = write_cifar10(tmp_path, _images(10, (3, 32, 32)), _labels(10, 10), *_test10())
    (folder / "test_batch.bin").write_bytes(b"")
    _raise_names_file(folder / "test_batch.bin", "empty", lambda: read_cifar10(tmp_path))

    bad = _labels(10, 10)
    bad[3] = 10
    write_cifar10(tmp_path, _images(10, (3, 32, 32)), bad, *_test10())
    _raise_names_file(
        tmp_path / "data_batch_2.bin", "label out of range", lambda: read_cifar10(tmp_path)
    )

    bad = _labels(4, 100)
    bad[0] = 100
    write_cifar100(tmp_path, _images(4, (3, 32, 32)), bad, _images(2, (3, 32, 32)), bad[:2])
    _raise_names_file(tmp_path / "train.bin", "out of range", lambda: read_cifar100(tmp_path))


def test_load_cifar_normalises_and_augments_by_default(tmp_path: Path) -> None:
    write_cifar10(tmp_path, _images(20, (3, 32, 32)), _labels(20, 10), *_test10())
    ds = load_dataset("cifar10", tmp_path)
    assert (ds.channels, ds.image_size, ds.num_classes, ds.augment) == (3, 32, 10, True)
    assert ds.train_x.dtype == torch.float32
    assert torch.allclose(ds.train_x.mean(dim=(0, 2, 3)), torch.zeros(3), atol=1e-4)
    assert load_dataset("cifar10", tmp_path, augment=False).augment is False
    with pytest.raises(ConfigError, match="data-dir"):
        load_dataset("cifar100")


# ---------------------------------------------------------------- load_dataset (IDX)


@pytest.mark.parametrize("name", ["mnist", "fashion-mnist"])
@pytest.mark.parametrize("gz", [True, False])
def test_load_idx_dataset(tmp_path: Path, name: str, gz: bool) -> None:
    train_x, train_y, test_x, test_y = _write_idx_dir(tmp_path, gz=gz)
    ds = load_dataset(name, tmp_path)
    assert isinstance(ds, Dataset)
    assert (ds.name, ds.num_classes, ds.augment) == (name, 10, False)
    assert (ds.train_size, ds.test_size, ds.channels, ds.image_size) == (50, 20, 1, 28)
    assert ds.train_x.shape == (50, 1, 28, 28) and ds.train_x.dtype == torch.float32
    assert ds.train_y.dtype == torch.int64 and torch.equal(ds.train_y, train_y.long())
    assert torch.equal(ds.test_y, test_y.long())
    # Normalisation by training statistics, applied to both splits.
    mean = train_x.double().mean() / 255
    std = train_x.double().std() / 255
    assert ds.mean[0] == pytest.approx(float(mean), rel=1e-5)
    assert ds.std[0] == pytest.approx(float(std), rel=1e-4)
    assert float(ds.train_x.mean()) == pytest.approx(0.0, abs=1e-5)
    assert float(ds.train_x.std()) == pytest.approx(1.0, abs=1e-4)
    expected_test = (test_x.double() / 255 - mean) / std
    assert torch.allclose(ds.test_x[:, 0].double(), expected_test, atol=1e-4)


def test_load_idx_train_and_test_size(tmp_path: Path) -> None:
    _, train_y, _, test_y = _write_idx_dir(tmp_path)
    ds = load_dataset("mnist", tmp_path, train_size=10, test_size=5)
    assert (ds.train_size, ds.test_size) == (10, 5)
    assert torch.equal(ds.train_y, train_y[:10].long())
    assert float(ds.train_x.mean()) == pytest.approx(0.0, abs=1e-5)
    for kwargs in ({"train_size": 51}, {"test_size": 21}, {"train_size": 0}, {"test_size": -1}):
        with pytest.raises(ConfigError):
            load_dataset("mnist", tmp_path, **kwargs)


def test_load_idx_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="data-dir"):
        load_dataset("mnist")
    with pytest.raises(DataError, match="apt-get install dataset-fashion-mnist"):
        load_dataset("fashion-mnist", tmp_path / "absent")
    _write_idx_dir(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DataError, match="missing: t10k-labels-idx1-ubyte.gz") as info:
        load_dataset("mnist", tmp_path)
    assert str(tmp_path) in str(info.value)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", _labels(19, 10).to(torch.uint8))
    with pytest.raises(DataError, match="19 labels but .*t10k-images.* has 20 images"):
        load_dataset("mnist", tmp_path)
    bad = _labels(20, 10).to(torch.uint8)
    bad[7] = 12
    write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", bad)
    with pytest.raises(DataError, match="t10k-labels-idx1-ubyte.gz: label 12 out of range"):
        load_dataset("mnist", tmp_path)


def test_unknown_dataset_lists_valid_names() -> None:
    with pytest.raises(ConfigError, match="unknown dataset 'imagenet'") as info:
        load_dataset("imagenet")
    for name in DATASETS:
        assert name in str(info.value)


@pytest.mark.skipif(
    not Path(DEFAULT_FASHION_DIR, IDX_FILES[0]).exists(), reason="Fashion-MNIST not installed"
)
def test_real_fashion_mnist() -> None:
    ds = load_dataset("fashion-mnist")
    assert ds.train_x.shape == (60000, 1, 28, 28)
    assert ds.test_x.shape == (10000, 1, 28, 28)
    assert torch.equal(torch.bincount(ds.train_y), torch.full((10,), 6000))
    assert ds.mean[0] == pytest.approx(0.2860, abs=1e-3)
    assert ds.std[0] == pytest.approx(0.3530, abs=1e-3)


# ---------------------------------------------------------------- synthetic


def test_synthetic_deterministic_and_seeded() -> None:
    a = make_synthetic(3, train_size=600, test_size=40)
    b = make_synthetic(3, train_size=600, test_size=40)
    c = make_synthetic(4, train_size=600, test_size=40)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0], c[0])
    assert a[0].shape == (600, 1, 16, 16) and a[0].dtype == torch.float32
    assert a[1].dtype == torch.int64 and set(a[1].tolist()) <= set(range(10))
    # A smaller set is a prefix of a larger one; the test set ignores train_size.
    d = make_synthetic(3, train_size=300, test_size=10)
    assert torch.equal(a[0][:300], d[0]) and torch.equal(a[1][:300], d[1])
    assert torch.equal(a[2][:10], d[2])


def test_load_synthetic() -> None:
    ds = load_dataset("synthetic", seed=1, train_size=300, test_size=100)
    assert (ds.train_size, ds.test_size, ds.channels, ds.image_size) == (300, 100, 1, 16)
    assert (ds.num_classes, ds.augment) == (10, False)
    assert float(ds.train_x.mean()) == pytest.approx(0.0, abs=1e-5)
    assert float(ds.train_x.std()) == pytest.approx(1.0, abs=1e-4)
    default = load_dataset("synthetic")
    assert (default.train_size, default.test_size) == (2000, 500)
    other = load_dataset("synthetic", seed=2, train_size=300, test_size=100)
    assert not torch.equal(ds.train_x, other.train_x)


def test_synthetic_is_learnable_but_not_trivial() -> None:
    """A linear model learns it well above chance (10%) but far from perfectly."""
    torch.manual_seed(0)
    ds = load_dataset("synthetic", seed=0)
    model = torch.nn.Linear(ds.channels * ds.image_size**2, ds.num_classes)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(0)
    for _ in range(100):
        idx = torch.randint(0, ds.train_size, (64,), generator=g)
        loss = torch.nn.functional.cross_entropy(model(ds.train_x[idx].flatten(1)), ds.train_y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        acc = (model(ds.test_x.flatten(1)).argmax(1) == ds.test_y).float().mean().item()
    assert 0.4 < acc < 0.9


# ---------------------------------------------------------------- augmentation


def test_augment_batch_shape_determinism_and_effect() -> None:
    x = torch.randn(64, 3, 8, 8)
    before = x.clone()
    a = augment_batch(x, torch.Generator().manual_seed(0))
    b = augment_batch(x, torch.Generator().manual_seed(0))
    c = augment_batch(x, torch.Generator().manual_seed(1))
    assert a.shape == x.shape and a.dtype == x.dtype
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(x, before)
    changed = (a != x).flatten(1).any(1)
    assert changed.sum() >= 60  # an image stays put with probability 1/162


def test_augment_batch_is_crop_of_padded_or_its_mirror() -> None:
    """Every output is an 8x8 window of the zero-padded image, possibly mirrored."""
    x = torch.arange(1, 1 + 32 * 2 * 8 * 8, dtype=torch.float32).reshape(32, 2, 8, 8)
    out = augment_batch(x, torch.Generator().manual_seed(0))
    padded = torch.nn.functional.pad(x, (4, 4, 4, 4))
    flips = shifts = 0
    for i in range(x.shape[0]):
        matches = []
        for dy in range(9):
            for dx in range(9):
                window = padded[i, :, dy : dy + 8, dx : dx + 8]
                for flip in (False, True):
                    if torch.equal(out[i], window.flip(-1) if flip else window):
                        matches.append((dy, dx, flip))
        assert len(matches) == 1, f"image {i} is not a crop of its padded input"
        dy, dx, flip = matches[0]
        flips += flip
        shifts += (dy, dx) != (4, 4)
    assert 4 <= flips <= 28 and shifts >= 24


def test_augment_batch_zero_pads() -> None:
    """Shifted images bring in zeros at the border (one offset is far from the centre)."""
    x = torch.ones(200, 1, 6, 6)
    out = augment_batch(x, torch.Generator().manual_seed(0))
    assert set(out.unique().tolist()) == {0.0, 1.0}
    assert (out == 0).flatten(1).any(1).float().mean() > 0.8


def test_a_registered_dataset_loads_by_name():
    """A new dataset is one entry of the registry: load_dataset and a run find it."""
    from dana.data import DATASETS, DatasetEntry, register_dataset

    def read(request):
        g = torch.Generator().manual_seed(request.seed)
        x = torch.rand(12, 1, 4, 4, generator=g)
        return x[:8], torch.arange(8) % 3, x[8:], torch.arange(4) % 3, 3

    register_dataset("tiny", DatasetEntry(read, reads_files=False))
    try:
        ds = load_dataset("TINY", seed=1)
        assert (ds.train_size, ds.test_size, ds.num_classes, ds.augment) == (8, 4, 3, False)
        with pytest.raises(ValueError, match="already registered"):
            register_dataset("tiny", DatasetEntry(read))
    finally:
        DATASETS.pop("tiny")
