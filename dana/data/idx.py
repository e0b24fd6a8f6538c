"""Read and write the IDX format of MNIST and Fashion-MNIST, gzipped or raw.

An IDX file is a 4-byte magic number (two zero bytes, a type code, the number of
dimensions), one big-endian 32-bit size per dimension, then the data, big-endian,
in C order. A file is decompressed when its name ends in ``.gz`` or its content
starts with the gzip signature.

Every problem with a file raises :class:`~dana.errors.DataError` whose message
starts with the file's path and says what is wrong, e.g.::

    .../train-images-idx3-ubyte.gz: truncated: header says 47040000 bytes of data, found 1000
"""

from __future__ import annotations

import gzip
import os
import zlib
from pathlib import Path

import numpy as np
import torch

from dana.atomic import write_atomic
from dana.data.rawfile import read_nonempty
from dana.errors import DataError

__all__ = ["read_idx", "write_idx"]

# IDX type code -> big-endian numpy dtype.
_CODE_TO_DTYPE = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_TORCH_TO_CODE = {
    torch.uint8: 0x08,
    torch.int8: 0x09,
    torch.int16: 0x0B,
    torch.int32: 0x0C,
    torch.float32: 0x0D,
    torch.float64: 0x0E,
}
_GZIP_SIGNATURE = b"\x1f\x8b"


def _read_bytes(path: Path) -> bytes:
    """The file's content, decompressed if it is gzipped."""
    if not path.exists():
        raise DataError(f"{path}: file not found")
    if not path.is_file():
        raise DataError(f"{path}: not a regular file")
    raw = read_nonempty(path)
    is_gzip = raw[:2] == _GZIP_SIGNATURE
    if path.suffix == ".gz" and not is_gzip:
        raise DataError(f"{path}: not a gzip file (name ends in .gz but no gzip signature)")
    if not is_gzip:
        return raw
    try:
        data = gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as e:
        raise DataError(f"{path}: corrupt gzip data: {e}") from e
    if not data:
        raise DataError(f"{path}: empty after gzip decompression")
    return data


def read_idx(path: str | os.PathLike[str]) -> torch.Tensor:
    """Read an IDX file (``.gz`` or raw) into a tensor of its dtype and shape.

    Raises :class:`DataError` naming the file when it is missing, empty, not valid
    gzip, has a bad magic number, or holds fewer or more data bytes than its
    header announces.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     write_idx(f"{d}/labels-idx1-ubyte.gz", torch.tensor([3, 1, 4], dtype=torch.uint8))
    ...     read_idx(f"{d}/labels-idx1-ubyte.gz")
    tensor([3, 1, 4], dtype=torch.uint8)
    """
    path = Path(path)
    data = _read_bytes(path)
    if len(data) < 4:
        raise DataError(f"{path}: truncated: {len(data)} bytes, too short for the IDX magic")
    if data[0] != 0 or data[1] != 0:
        raise DataError(
            f"{path}: not an IDX file: magic number {data[:4].hex()} "
            "(the first two bytes must be 0)"
        )
    code, ndim = data[2], data[3]
    if code not in _CODE_TO_DTYPE:
        valid = ", ".join(f"0x{c:02x}" for c in _CODE_TO_DTYPE)
        raise DataError(f"{path}: unknown IDX type code 0x{code:02x} (valid: {valid})")
    if ndim == 0:
        raise DataError(f"{path}: IDX header says 0 dimensions")
    header_size = 4 + 4 * ndim
    if len(data) < header_size:
        raise DataError(
            f"{path}: truncated: header needs {header_size} bytes for {ndim} dimensions, "
            f"found {len(data)}"
        )
    shape = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    dtype = _CODE_TO_DTYPE[code]
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    found = len(data) - header_size
    if found < expected:
        raise DataError(f"{path}: truncated: header says {expected} bytes of data, found {found}")
    if found > expected:
        raise DataError(
            f"{path}: trailing garbage: header says {expected} bytes of data, found {found}"
        )
    array = np.frombuffer(data, dtype=dtype, offset=header_size).reshape(shape)
    # Native byte order, writable memory: torch needs both.
    return torch.from_numpy(array.astype(dtype.newbyteorder("="), copy=True))


def write_idx(path: str | os.PathLike[str], tensor: torch.Tensor) -> None:
    """Write ``tensor`` as an IDX file, gzipped when ``path`` ends in ``.gz``.

    Supported dtypes: uint8 (the MNIST type), int8, int16, int32, float32, float64.
    The file appears complete or not at all (written to a temporary name, then
    renamed). See :func:`read_idx` for an example.
    """
    path = Path(path)
    if tensor.dtype not in _TORCH_TO_CODE:
        valid = ", ".join(str(t) for t in _TORCH_TO_CODE)
        raise ValueError(f"write_idx: unsupported dtype {tensor.dtype} (valid: {valid})")
    if tensor.dim() == 0 or tensor.dim() > 255:
        raise ValueError(f"write_idx: tensor must have 1 to 255 dimensions, got {tensor.dim()}")
    code = _TORCH_TO_CODE[tensor.dtype]
    array = tensor.detach().cpu().contiguous().numpy()
    header = bytes([0, 0, code, array.ndim]) + np.asarray(array.shape, dtype=">u4").tobytes()
    payload = header + array.astype(_CODE_TO_DTYPE[code], copy=False).tobytes()
    if path.suffix == ".gz":
        payload = gzip.compress(payload, compresslevel=6, mtime=0)
    write_atomic(path, payload)
