"""A text corpus as fixed-length byte sequences, for language models (``--dataset text``).

Tokens are bytes (a vocabulary of 256: no tokenizer, nothing to download; a UTF-8 text is
read as its bytes). ``--data-dir`` is either

- one file: its first 90% of bytes are the training text and the last 10% the test text
  (a contiguous split, as nanoGPT's character-level Shakespeare: the test text is text
  the model never trained on, not sequences shuffled out of it), or
- a directory holding ``train.txt`` and ``test.txt`` (or ``val.txt``): those.

Each split is cut into non-overlapping windows of ``T`` tokens (``T``: the model's
context): example ``i`` is ``x = text[i*T : i*T + T]`` and its targets the next bytes
``y = text[i*T + 1 : i*T + T + 1]``; the last bytes that do not fill a window are left
out. An epoch is one pass over the training windows.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from dana.errors import DataError

#: The tokens: bytes.
VOCAB = 256
#: The fraction of a single file's bytes that is training text (the rest: test text).
TRAIN_FRACTION = 0.9
_HINT = (
    "give --data-dir a text file (split 90/10 into training and test text) or a directory "
    "holding train.txt and test.txt"
)


def windows(data: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)``: ``data`` (1-D bytes) cut into non-overlapping windows of ``seq_len``
    tokens and their next tokens, int64 ``N x seq_len`` each.

    >>> x, y = windows(torch.arange(10, dtype=torch.uint8), 4)
    >>> x.tolist(), y.tolist()
    ([[0, 1, 2, 3], [4, 5, 6, 7]], [[1, 2, 3, 4], [5, 6, 7, 8]])
    """
    count = max(0, (len(data) - 1) // seq_len)
    data = data.long()
    x = data[: count * seq_len].view(count, seq_len)
    y = data[1 : count * seq_len + 1].view(count, seq_len)
    return x, y


def _read(path: Path) -> torch.Tensor:
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise DataError(f"{path}: cannot read the text: {e.strerror}; {_HINT}") from None
    if not raw:
        return torch.zeros(0, dtype=torch.uint8)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)


def read_text(
    data_dir: str | os.PathLike[str] | None, seq_len: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(train_x, train_y, test_x, test_y)`` of the corpus at ``data_dir`` (see the module
    doc), windows of ``seq_len`` tokens. DataError for a missing or too short text."""
    if data_dir is None:
        raise DataError(f"--dataset text needs --data-dir: {_HINT}")
    path = Path(data_dir)
    if path.is_dir():
        train_file = path / "train.txt"
        test_file = next((path / n for n in ("test.txt", "val.txt") if (path / n).is_file()), None)
        if not train_file.is_file() or test_file is None:
            raise DataError(f"{path}: holds no train.txt and test.txt (or val.txt); {_HINT}")
        splits = {
            "training": (_read(train_file), train_file),
            "test": (_read(test_file), test_file),
        }
    elif path.is_file():
        data = _read(path)
        cut = int(TRAIN_FRACTION * len(data))
        splits = {"training": (data[:cut], path), "test": (data[cut:], path)}
    else:
        raise DataError(f"{path}: no such file or directory; {_HINT}")
    single = not path.is_dir()
    out = []
    for split, (data, source) in splits.items():
        x, y = windows(data, seq_len)
        if len(x) == 0:
            part = " (the first 90%)" if split == "training" else " (the last 10%)"
            raise DataError(
                f"{source}: the {split} text{part if single else ''} has {len(data)} bytes, "
                f"fewer than one sequence of {seq_len} tokens and its next token "
                f"({seq_len + 1} bytes); give a longer text (one file: at least "
                f"{10 * (seq_len + 1)} bytes) or a model with a shorter context"
            )
        out += [x, y]
    return out[0], out[1], out[2], out[3]
