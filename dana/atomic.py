"""Write files so that they appear complete or not at all.

A write goes to a temporary file in the same folder, named ``.NAME.XXXXXXXX.tmpSUFFIX``
(:func:`temporaries` finds them), then renames it over ``NAME``. A process killed inside
a write leaves that temporary file behind; the owner of the folder removes it with
:func:`remove_temporaries` (``dana train --resume`` does). Every file gets the mode a
plain ``open()`` would give it (``0o666`` less the umask), not ``mkstemp``'s ``0o600``,
so that all the files of a run have one mode.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from dana.errors import WriteError

__all__ = [
    "atomic_path",
    "remove_temporaries",
    "temporaries",
    "write_atomic",
    "write_text_atomic",
]


def write_atomic(path: str | os.PathLike[str], payload: bytes) -> None:
    """Write ``payload`` to ``path`` via a temporary file in the same folder and a rename.

    Creates the parent folders. A crash or an error leaves no partial file behind, and
    an existing file at ``path`` is replaced only once the new one is complete on disk.
    An OSError (a full disk, say) becomes a :class:`~dana.errors.WriteError` naming the
    file.
    """
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    write_atomic(path, text.encode())


def file_mode() -> int:
    """The mode ``open()`` gives a new file: ``0o666`` less the process's umask."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


class atomic_path:
    """A context manager giving a temporary path that replaces ``path`` on success.

    >>> with atomic_path("/tmp/figure.png") as tmp:  # doctest: +SKIP
    ...     fig.savefig(tmp)
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)

    def __enter__(self) -> Path:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(
                dir=self.path.parent,
                prefix=f".{self.path.name}.",
                suffix=".tmp" + self.path.suffix,
            )
            os.fchmod(fd, file_mode())
            os.close(fd)
        except OSError as e:
            raise _write_error(self.path, e) from None
        self.tmp = Path(tmp)
        return self.tmp

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            try:
                os.replace(self.tmp, self.path)
                return
            except OSError as e:
                self.tmp.unlink(missing_ok=True)
                raise _write_error(self.path, e) from None
        self.tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and not isinstance(exc, WriteError):
            raise _write_error(self.path, exc) from None


def _write_error(path: Path, e: OSError) -> WriteError:
    kept = " (the previous file is kept)" if path.is_file() else ""
    return WriteError(
        e.errno or 0,
        f"cannot write {path}: {e.strerror or e}{kept}; free space or fix the folder's "
        "permissions, then run again",
    )


def _pattern(name: str) -> re.Pattern[str]:
    suffix = Path(name).suffix
    return re.compile(re.escape(f".{name}.") + r"[A-Za-z0-9_]{8}" + re.escape(f".tmp{suffix}"))


def temporaries(path: str | os.PathLike[str]) -> list[Path]:
    """The temporary files an interrupted write of ``path`` left (none but ours: the
    name must match ``mkstemp``'s pattern for ``path`` exactly)."""
    path = Path(path)
    if not path.parent.is_dir():
        return []
    pattern = _pattern(path.name)
    return sorted(p for p in path.parent.iterdir() if pattern.fullmatch(p.name) and p.is_file())


def remove_temporaries(path: str | os.PathLike[str]) -> list[Path]:
    """Remove the temporary files of interrupted writes of ``path``; the ones removed."""
    found = temporaries(path)
    for p in found:
        p.unlink(missing_ok=True)
    return found
