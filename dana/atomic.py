"""Write files so that they appear complete or not at all."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["atomic_path", "write_atomic", "write_text_atomic"]


def write_atomic(path: str | os.PathLike[str], payload: bytes) -> None:
    """Write ``payload`` to ``path`` via a temporary file in the same folder and a rename.

    Creates the parent folders. A crash or an error leaves no partial file behind, and
    an existing file at ``path`` is replaced only once the new one is complete on disk.
    """
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    write_atomic(path, text.encode())


class atomic_path:
    """A context manager giving a temporary path that replaces ``path`` on success.

    >>> with atomic_path("/tmp/figure.png") as tmp:  # doctest: +SKIP
    ...     fig.savefig(tmp)
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)

    def __enter__(self) -> Path:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(
            dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp" + self.path.suffix
        )
        os.close(fd)
        self.tmp = Path(tmp)
        return self.tmp

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            os.replace(self.tmp, self.path)
        else:
            self.tmp.unlink(missing_ok=True)
