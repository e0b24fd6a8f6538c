"""A text corpus as fixed-length byte sequences, for language models (``--dataset text``).

Tokens are bytes (a vocabulary of 256: no tokenizer, nothing to download; a UTF-8 text is
read as its bytes). ``--data-dir`` is either

- one file: its first 90% of bytes are the training text and the last 10% the test text
  (a contiguous split, as nanoGPT's character-level Shakespeare: the test text is text
  the model never trained on, not sequences shuffled out of it),
- a directory holding ``train.txt`` and ``test.txt`` (or ``val.txt``): those, or
- a directory of fortune files (``fortune``'s format: texts separated by lines holding
  ``%``, each file beside its ``.dat`` index): every fortune of every indexed file, in
  file-name order; every tenth fortune (the 10th, 20th, ...) is test text, the others
  training text, each followed by its ``%`` line. Without ``--data-dir`` this reads
  :data:`DEFAULT_TEXT_DIR`, Debian's ``fortunes`` package (English: quotations, jokes,
  poems, definitions; 2,313,989 training and 262,674 test bytes in fortunes 1:1.99.1-7.3).

Each split is cut into non-overlapping windows of ``T`` tokens (``T``: the model's
context): example ``i`` is ``x = text[i*T : i*T + T]`` and its targets the next bytes
``y = text[i*T + 1 : i*T + T + 1]``; the last bytes that do not fill a window are left
out. An epoch is one pass over the training windows.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

from dana.errors import DataError

#: The tokens: bytes.
VOCAB = 256
#: The fraction of a single file's bytes that is training text (the rest: test text).
TRAIN_FRACTION = 0.9
#: The corpus read without ``--data-dir`` (Debian packages ``fortunes`` and ``fortunes-min``).
DEFAULT_TEXT_DIR = "/usr/share/games/fortunes"
#: One fortune in ``TEST_EVERY`` (the last of each run of that many) is test text.
TEST_EVERY = 10
#: The line that ends a fortune.
_FORTUNE_END = re.compile(rb"^%\n", re.MULTILINE)
_HINT = (
    "give --data-dir a text file (split 90/10 into training and test text), a directory "
    "holding train.txt and test.txt, or a directory of fortune files"
)
_FORTUNES_HINT = (
    f"install the default corpus with `apt-get install fortunes` (it goes to "
    f"{DEFAULT_TEXT_DIR}), or {_HINT[5:]}"
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


def _raw(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise DataError(f"{path}: cannot read the text: {e.strerror}; {_HINT}") from None


def _read(path: Path) -> torch.Tensor:
    raw = _raw(path)
    if not raw:
        return torch.zeros(0, dtype=torch.uint8)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)


def fortune_files(path: Path) -> list[Path]:
    """The fortune files of directory ``path``: each plain file with a ``.dat`` index
    beside it, in name order (empty: not a directory of fortunes)."""
    return sorted(
        p
        for p in path.iterdir()
        if p.suffix == "" and p.is_file() and p.with_name(p.name + ".dat").is_file()
    )


def read_fortunes(files: list[Path]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(train, test)`` bytes of fortune ``files`` (the module doc): every
    :data:`TEST_EVERY`-th fortune is test text, each fortune followed by its ``%`` line."""
    parts: tuple[list[bytes], list[bytes]] = ([], [])
    count = 0
    for path in files:
        for fortune in _FORTUNE_END.split(_raw(path)):
            if fortune.strip():
                count += 1
                parts[count % TEST_EVERY == 0].append(fortune.rstrip(b"\n") + b"\n%\n")
    train, test = (torch.frombuffer(bytearray(b"".join(p)), dtype=torch.uint8) for p in parts)
    return train, test


def read_text(
    data_dir: str | os.PathLike[str] | None, seq_len: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(train_x, train_y, test_x, test_y)`` of the corpus at ``data_dir`` (see the module
    doc), windows of ``seq_len`` tokens. DataError for a missing or too short text."""
    default = data_dir is None
    path = Path(DEFAULT_TEXT_DIR if default else data_dir)
    if default and not path.is_dir():
        raise DataError(
            f"--dataset text without --data-dir reads {path}: missing; {_FORTUNES_HINT}"
        )
    if path.is_dir():
        train_file = path / "train.txt"
        test_file = next((path / n for n in ("test.txt", "val.txt") if (path / n).is_file()), None)
        fortunes = fortune_files(path) if not train_file.is_file() else []
        if fortunes:
            train, test = read_fortunes(fortunes)
            splits = {"training": (train, path), "test": (test, path)}
        elif not train_file.is_file() or test_file is None:
            raise DataError(
                f"{path}: holds no train.txt and test.txt (or val.txt) and no fortune files "
                f"(with their .dat indices); {_FORTUNES_HINT if default else _HINT}"
            )
        else:
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


def reference_losses(
    train_x: torch.Tensor,
    train_y: torch.Tensor,
    test_x: torch.Tensor,
    test_y: torch.Tensor,
    vocab: int = VOCAB,
) -> dict[str, float]:
    """The test loss (nats per token) of the byte unigram and bigram models of the
    training windows, each count plus one (Laplace): the yardsticks a language model must
    beat. The unigram predicts every target from the training targets' frequencies; the
    bigram predicts ``y[t]`` from ``x[t]``, the byte before it.

    >>> x, y = windows(torch.tensor(list(b"abababab"), dtype=torch.uint8), 3)
    >>> ref = reference_losses(x, y, x, y, vocab=4 + 95)
    >>> ref["bigram"] < ref["unigram"]
    True
    """
    unigram = torch.bincount(train_y.flatten(), minlength=vocab).double() + 1.0
    pairs = torch.bincount((train_x * vocab + train_y).flatten(), minlength=vocab * vocab)
    bigram = pairs.double().view(vocab, vocab) + 1.0
    log_unigram = (unigram / unigram.sum()).log()
    log_bigram = (bigram / bigram.sum(1, keepdim=True)).log()
    return {
        "unigram": -float(log_unigram[test_y.flatten()].mean()),
        "bigram": -float(log_bigram[test_x.flatten(), test_y.flatten()].mean()),
    }
