"""Images in class folders (the ``ImageFolder`` layout), read with Pillow.

``dana train --dataset folder --data-dir DIR`` reads::

    DIR/train/<class>/<image>    the training images, one sub-folder per class
    DIR/test/<class>/<image>     the test images (``val/`` is accepted for ``test/``)

Classes are the sub-folder names of ``train/`` in sorted order (label 0, 1, ...); every
class of ``test/`` must also be one of ``train/``. Files with an image extension
(:data:`IMAGE_EXTENSIONS`) are read; others (``.DS_Store``, notes) are skipped. All
images must have one size, and be square (the models take ``C x S x S`` inputs); they
become one channel when every image is gray (R = G = B everywhere), else three (RGB). An unreadable image,
another size or an empty folder is a :class:`~dana.errors.DataError` naming the file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from dana.errors import ConfigError, DataError

IMAGE_EXTENSIONS = (
    ".png",
    ".jpg",
    ".jpeg",
    ".bmp",
    ".gif",
    ".tif",
    ".tiff",
    ".webp",
    ".ppm",
    ".pgm",
)

LAYOUT = "DIR/train/<class>/<image> and DIR/test/<class>/<image>"


def _image_lib():
    try:
        from PIL import Image
    except ImportError:
        raise ConfigError(
            "--dataset folder needs Pillow: pip install pillow (or the extra dana-async[images])"
        ) from None
    return Image


def _class_files(split: Path) -> dict[str, list[Path]]:
    classes = sorted(p for p in split.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise DataError(f"{split}: no class sub-folders; expected {LAYOUT}")
    files = {}
    for folder in classes:
        images = sorted(
            p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS
        )
        if not images:
            raise DataError(
                f"{folder}: no images (extensions {', '.join(IMAGE_EXTENSIONS)}); "
                "remove the empty class folder or add its images"
            )
        files[folder.name] = images
    return files


def read_image_folder(
    data_dir: str | Path | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, list[str]]:
    """``(train_x, train_y, test_x, test_y, classes)``: uint8 ``N x C x S x S`` images,
    int64 labels, and the class names in label order."""
    if data_dir is None:
        raise ConfigError(f"--dataset folder needs --data-dir DIR laid out as {LAYOUT}")
    root = Path(data_dir)
    if not root.is_dir():
        raise DataError(f"{root}: not a directory; --dataset folder expects {LAYOUT}")
    train_dir = root / "train"
    test_dir = next((root / n for n in ("test", "val") if (root / n).is_dir()), None)
    if not train_dir.is_dir() or test_dir is None:
        missing = "train/" if not train_dir.is_dir() else "test/ (or val/)"
        raise DataError(f"{root}: no {missing} folder; --dataset folder expects {LAYOUT}")
    Image = _image_lib()
    train_files, test_files = _class_files(train_dir), _class_files(test_dir)
    classes = list(train_files)
    unknown = sorted(set(test_files) - set(classes))
    if unknown:
        raise DataError(
            f"{test_dir}: class folder(s) {', '.join(unknown)} are not in {train_dir} "
            f"(its classes: {', '.join(classes)})"
        )
    first: tuple[Path, tuple[int, int]] | None = None
    arrays = []
    for files in (train_files, test_files):
        for paths in files.values():
            for path in paths:
                img = _open(Image, path)
                if first is None:
                    first = (path, img.size)
                    if img.size[0] != img.size[1]:
                        raise DataError(
                            f"{path}: the image is {img.size[0]}x{img.size[1]}; the models "
                            "take square images: crop or resize them all to one square size"
                        )
                elif img.size != first[1]:
                    raise DataError(
                        f"{path}: the image is {img.size[0]}x{img.size[1]}, but {first[0]} "
                        f"is {first[1][0]}x{first[1][1]}; all images must have one size"
                    )
                arrays.append(np.asarray(img.convert("RGB"), dtype=np.uint8))
    x = torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2)  # N x 3 x S x S
    if torch.equal(x[:, 0], x[:, 1]) and torch.equal(x[:, 1], x[:, 2]):
        x = x[:, :1]  # every image is gray: one channel
    x = x.contiguous()
    labels = [
        classes.index(name)
        for files in (train_files, test_files)
        for name, paths in files.items()
        for _ in paths
    ]
    y = torch.tensor(labels, dtype=torch.int64)
    n = sum(len(p) for p in train_files.values())
    return x[:n], y[:n], x[n:], y[n:], classes


def _open(Image, path: Path):
    try:
        with Image.open(path) as img:
            img.load()
            return img.copy()
    except Exception as e:  # Pillow raises several kinds for a bad file
        raise DataError(f"{path}: not a readable image ({e})") from None
