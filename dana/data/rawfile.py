"""Reading a dataset's binary file (IDX, CIFAR): one place for the errors every such
file can have, each a :class:`~dana.errors.DataError` naming the file."""

from __future__ import annotations

from pathlib import Path

from dana.errors import DataError


def read_nonempty(path: Path) -> bytes:
    """The bytes of the file ``path`` (its caller has checked that it is one); DataError
    when it cannot be read or is empty."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise DataError(f"{path}: cannot read: {e.strerror or e}") from e
    if not raw:
        raise DataError(f"{path}: empty file")
    return raw
