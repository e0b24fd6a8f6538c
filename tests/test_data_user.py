"""``--dataset folder`` (images in class folders) and ``--dataset tensors`` (torch.save /
.npz files): what they read, and a clear exit 2 naming the file for each malformed one."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from dana.cli import main
from dana.data import load_dataset
from dana.errors import DanaError

TINY = ["--model", "linear", "--batch-size", "8", "--epochs", "1", "--quiet", "--workers", "2"]


def _write_images(root, split, classes, n, size=8, rgb=False, seed=0):
    rng = np.random.default_rng(seed)
    for label, name in enumerate(classes):
        folder = root / split / name
        folder.mkdir(parents=True)
        for i in range(n):
            base = 40 + 160 * label  # the classes differ in brightness: learnable
            pixels = np.clip(base + rng.integers(-30, 30, (size, size)), 0, 255).astype(np.uint8)
            if rgb:
                pixels = np.stack([pixels, pixels // 2, 255 - pixels], axis=-1)
            Image.fromarray(pixels).save(folder / f"{i}.png")
    (root / split / classes[0] / "notes.txt").write_text("not an image: skipped")


@pytest.fixture
def folder(tmp_path):
    root = tmp_path / "images"
    _write_images(root, "train", ["cat", "dog"], 24)
    _write_images(root, "test", ["cat", "dog"], 6, seed=1)
    return root


def test_image_folder_reads_classes_in_sorted_order(folder):
    ds = load_dataset("folder", folder)
    assert (ds.train_size, ds.test_size, ds.channels, ds.image_size) == (48, 12, 1, 8)
    assert ds.num_classes == 2
    assert ds.train_y.tolist() == [0] * 24 + [1] * 24
    # Normalised by the training statistics: "dog" images are the brighter ones.
    assert ds.train_x[ds.train_y == 1].mean() > 0 > ds.train_x[ds.train_y == 0].mean()


def test_rgb_images_keep_three_channels(tmp_path):
    _write_images(tmp_path, "train", ["a", "b", "c"], 4, rgb=True)
    _write_images(tmp_path, "val", ["a", "c"], 2, rgb=True)
    ds = load_dataset("folder", tmp_path)
    assert (ds.channels, ds.num_classes, ds.test_size) == (3, 3, 4)
    assert ds.test_y.tolist() == [0, 0, 2, 2]  # labels follow the training classes


def test_dana_train_on_an_image_folder(folder, tmp_path):
    out = tmp_path / "run"
    assert main(["train", "--dataset", "folder", "--data-dir", str(folder), *TINY,
                 "--lr", "0.05", "--out", str(out)]) == 0  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dataset"] == "folder" and summary["final_test_error"] < 0.5


def _expect_exit_2(capsys, *args, fragments):
    assert main(["train", *args, *TINY, "--out", str(args[-1]) + "-run"]) == 2
    err = capsys.readouterr().err
    for fragment in fragments:
        assert fragment in err, err


def test_malformed_image_folders(folder, capsys):
    bad = folder / "train" / "dog" / "3.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    _expect_exit_2(capsys, "--dataset", "folder", "--data-dir", str(folder),
                   fragments=[str(bad), "not a readable image"])  # fmt: skip
    Image.fromarray(np.zeros((9, 9), np.uint8)).save(bad)
    _expect_exit_2(capsys, "--dataset", "folder", "--data-dir", str(folder),
                   fragments=[str(bad), "9x9", "one size"])  # fmt: skip
    bad.unlink()
    for p in (folder / "test" / "cat").iterdir():
        p.unlink()
    _expect_exit_2(capsys, "--dataset", "folder", "--data-dir", str(folder),
                   fragments=[str(folder / "test" / "cat"), "no images"])  # fmt: skip
    (folder / "test").rename(folder / "elsewhere")
    _expect_exit_2(capsys, "--dataset", "folder", "--data-dir", str(folder),
                   fragments=[str(folder), "no test/"])  # fmt: skip


def _arrays(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 3
    x = (y.view(-1, 1, 1) * 80 + torch.randint(0, 40, (n, 6, 6), generator=g)).to(torch.uint8)
    return x, y


def test_tensors_from_torch_save_files_and_npz(tmp_path):
    (tx, ty), (vx, vy) = _arrays(30), _arrays(9, seed=1)
    torch.save({"x": tx, "y": ty}, tmp_path / "train.pt")
    torch.save((vx, vy), tmp_path / "test.pt")
    ds = load_dataset("tensors", tmp_path)
    assert (ds.train_size, ds.test_size, ds.channels, ds.image_size, ds.num_classes) == (
        30, 9, 1, 6, 3,
    )  # fmt: skip
    assert torch.equal(ds.test_y, vy)
    single = tmp_path / "all.npz"
    np.savez(single, train_x=tx.numpy(), train_y=ty.numpy(), test_x=vx.numpy(), test_y=vy.numpy())
    other = load_dataset("tensors", single)
    assert torch.equal(other.train_x, ds.train_x) and torch.equal(other.train_y, ds.train_y)
    out = tmp_path / "run"
    assert main(["train", "--dataset", "tensors", "--data-dir", str(single), *TINY,
                 "--out", str(out)]) == 0  # fmt: skip


@pytest.mark.parametrize(
    "write, fragments",
    [
        (lambda d: (d / "train.pt").write_bytes(b"garbage"), ["train.pt", "not a readable"]),
        (lambda d: torch.save({"x": _arrays(8)[0]}, d / "train.pt"), ["train.pt", "missing key(s) y"]),
        (lambda d: torch.save({"x": torch.zeros(8, 3, 4, 5), "y": torch.zeros(8, dtype=torch.long)},
                              d / "train.pt"), ["train.pt", "(8, 3, 4, 5)", "square"]),
        (lambda d: torch.save({"x": _arrays(8)[0], "y": torch.zeros(7, dtype=torch.long)},
                              d / "train.pt"), ["train.pt", "7 training labels for 8 images"]),
        (lambda d: torch.save({"x": _arrays(8)[0], "y": torch.zeros(8)}, d / "train.pt"),
         ["train.pt", "integer class labels"]),
    ],
)  # fmt: skip
def test_malformed_tensor_files(tmp_path, capsys, write, fragments):
    x, y = _arrays(8)
    torch.save({"x": x, "y": y}, tmp_path / "test.pt")
    torch.save({"x": x, "y": y}, tmp_path / "train.pt")
    write(tmp_path)
    _expect_exit_2(capsys, "--dataset", "tensors", "--data-dir", str(tmp_path), fragments=fragments)


def test_missing_paths_and_npz_keys(tmp_path):
    with pytest.raises(DanaError, match="needs --data-dir"):
        load_dataset("tensors")
    with pytest.raises(DanaError, match="no train.pt and test.pt"):
        load_dataset("tensors", tmp_path)
    np.savez(tmp_path / "x.npz", train_x=np.zeros((4, 2, 2)))
    with pytest.raises(DanaError, match="x.npz: missing key\\(s\\) train_y"):
        load_dataset("tensors", tmp_path / "x.npz")
    with pytest.raises(DanaError, match="needs --data-dir DIR"):
        load_dataset("folder")
