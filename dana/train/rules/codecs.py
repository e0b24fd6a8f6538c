"""Codecs of the workers' messages: what a push puts on the wire (``--compress NAME``).

A codec turns a flat float tensor into a :class:`Payload` (numpy arrays and plain
values, as everything the Ray runtime sends: :mod:`dana.ps.protocol`) and back. Each is
deterministic: the same tensor gives the same payload, bit for bit, in every runner.

- ``none``: the values themselves (the default; a run without a codec).
- ``fp16``: IEEE half precision, round to nearest even (hivemind's ``Float16``
  compression, learning-at-home/hivemind ``hivemind/compression/floating.py``):
  relative error <= 2^-11 in the normal range (|x| in [6.1e-5, 65504]); larger values
  saturate to +-65504 (not inf), smaller ones lose relative precision (subnormals).
- ``bf16``: bfloat16, round to nearest even: relative error <= 2^-8, the float32 range.
- ``int8``: blockwise 8-bit (QSGD-like, Alistarh et al. 2017, deterministic rounding;
  the blockwise absmax scale of hivemind's and bitsandbytes' 8-bit compression): blocks
  of :data:`INT8_BLOCK` values, each with the scale ``s = absmax / 127`` (float32), the
  codes ``round(x / s)`` (nearest, ties to even) in ``[-127, 127]``; error <= s/2 per
  element. ``n + 4*ceil(n/256)`` bytes.
- ``topk:F``: the ``ceil(F*n)`` largest magnitudes (``0 < F <= 1``), their indices
  (int32) and values (the message's dtype); the others are not sent. With error
  feedback (Stich, Cordonnier and Jaggi, "Sparsified SGD with memory", NeurIPS 2018):
  each worker keeps the residual ``r`` of what it did not send and sends
  ``C(m + r)``, then ``r = m + r - C(m + r)`` (:class:`Wire`); the sum of what it sent
  plus its residual is the sum of its messages.

On the message path (:class:`Wire`) a message is cut into the parameter servers'
shards (:func:`part_bounds`, the runtime's split) and each part encoded on its own, so
that a shard decodes its part alone and the simulator, which decodes every part at
once, applies the same values. ``topk`` keeps ``ceil(F*n_s)`` of each part's ``n_s``.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from dana.errors import ConfigError

# A payload from Ray's object store is read-only; the decoders only read it.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")

#: Values per scale of ``int8``.
INT8_BLOCK = 256
#: The codecs by name (``topk`` takes its fraction: ``topk:0.01``).
CODECS = ("none", "fp16", "bf16", "int8", "topk:F")


def part_bounds(d: int, servers: int) -> list[tuple[int, int]]:
    """``servers`` contiguous ``[lo, hi)`` ranges covering ``range(d)``, sizes within one
    (the first ``d % servers`` one larger): the parameter servers' shards
    (:mod:`dana.ps.layout` splits the vector by this)."""
    if servers < 1 or servers > d:
        raise ValueError(f"cannot split {d} parameters into {servers} shards")
    size, extra = divmod(d, servers)
    bounds, lo = [], 0
    for s in range(servers):
        hi = lo + size + (s < extra)
        bounds.append((lo, hi))
        lo = hi
    return bounds


@dataclass(frozen=True)
class Payload:
    """An encoded flat tensor: ``codec``'s name, its length ``n``, the dtype it decodes to
    and the arrays that cross the wire."""

    codec: str
    n: int
    dtype: str
    arrays: tuple[np.ndarray, ...]

    @property
    def nbytes(self) -> int:
        """The bytes on the wire (the arrays'; the few plain fields are not counted)."""
        return sum(a.nbytes for a in self.arrays)

    def copy(self) -> Payload:
        """The same payload owning its arrays."""
        return Payload(self.codec, self.n, self.dtype, tuple(np.array(a) for a in self.arrays))


class Codec:
    """A message codec: :meth:`encode`, :meth:`decode`, and the bytes of a payload."""

    name: ClassVar[str]
    #: Whether a worker keeps the residual of what it did not send (:class:`Wire`).
    error_feedback: ClassVar[bool] = False

    @property
    def spec(self) -> str:
        """The codec as ``--compress`` names it."""
        return self.name

    def encode(self, x: Tensor) -> Payload:
        raise NotImplementedError

    def decode(self, payload: Payload, out: Tensor | None = None) -> Tensor:
        """The values of ``payload``, written into ``out`` if given (``n`` values of the
        payload's dtype: a buffer kept across pushes spares a fresh allocation)."""
        raise NotImplementedError

    def nbytes(self, n: int, value_bytes: int) -> int:
        """The bytes of the payload of ``n`` values of ``value_bytes`` bytes each."""
        raise NotImplementedError

    def _payload(self, x: Tensor, *arrays: np.ndarray) -> Payload:
        """A payload of ``x`` (a CPU tensor) holding ``arrays``."""
        return Payload(self.spec, x.numel(), _dtype_name(x.dtype), arrays)

    def _check(self, payload: Payload, out: Tensor | None) -> Tensor:
        """``out``, or a new tensor for ``payload``'s values."""
        if payload.codec != self.spec:
            raise ValueError(f"a {payload.codec} payload given to the {self.spec} codec")
        if out is None:
            return torch.empty(payload.n, dtype=_dtype(payload.dtype))
        if out.shape != (payload.n,) or out.dtype != _dtype(payload.dtype):
            raise ValueError(
                f"decoding {payload.n} {payload.dtype} values into {tuple(out.shape)} {out.dtype}"
            )
        return out


class NoCodec(Codec):
    """The values themselves."""

    name = "none"

    def encode(self, x: Tensor) -> Payload:
        return self._payload(x, _numpy(x).copy())

    def decode(self, payload: Payload, out: Tensor | None = None) -> Tensor:
        return self._check(payload, out).copy_(_tensor(payload.arrays[0]))

    def nbytes(self, n: int, value_bytes: int) -> int:
        return n * value_bytes


class Fp16(Codec):
    """IEEE half precision, round to nearest even, saturating at +-65504."""

    name = "fp16"
    MAX = 65504.0

    def encode(self, x: Tensor) -> Payload:
        low, high = torch.aminmax(x) if x.numel() else (x.new_zeros(()), x.new_zeros(()))
        if low < -self.MAX or high > self.MAX:  # (beyond the range: saturate)
            x = x.clamp(-self.MAX, self.MAX)
        return self._payload(x, x.to(torch.float16).numpy())

    def decode(self, payload: Payload, out: Tensor | None = None) -> Tensor:
        return self._check(payload, out).copy_(_tensor(payload.arrays[0]))

    def nbytes(self, n: int, value_bytes: int) -> int:
        return 2 * n


class Bf16(Codec):
    """bfloat16, round to nearest even (the arrays hold its bits as int16)."""

    name = "bf16"

    def encode(self, x: Tensor) -> Payload:
        return self._payload(x, x.to(torch.bfloat16).view(torch.int16).numpy())

    def decode(self, payload: Payload, out: Tensor | None = None) -> Tensor:
        out = self._check(payload, out)
        return out.copy_(_tensor(payload.arrays[0]).view(torch.bfloat16))

    def nbytes(self, n: int, value_bytes: int) -> int:
        return 2 * n


class Int8(Codec):
    """Blocks of :data:`INT8_BLOCK` values, scale ``absmax/127`` (float32) each, codes
    ``round(x/scale)`` to nearest (ties to even); a block of zeros has scale 0."""

    name = "int8"
    block = INT8_BLOCK

    def encode(self, x: Tensor) -> Payload:
        n, b = x.numel(), self.block
        blocks = -(-n // b)
        if n == blocks * b:
            padded = x.view(blocks, b)
        else:
            padded = torch.zeros(blocks, b, dtype=x.dtype)
            padded.view(-1)[:n] = x
        absmax = torch.linalg.vector_norm(padded, ord=math.inf, dim=1)
        scale = (absmax / 127).to(torch.float32)
        divisor = scale.to(x.dtype).where(scale > 0, torch.ones((), dtype=x.dtype))
        codes = torch.div(padded, divisor[:, None]).round_().clamp_(-127, 127).to(torch.int8)
        return self._payload(x, codes.view(-1)[:n].numpy(), scale.numpy())

    def decode(self, payload: Payload, out: Tensor | None = None) -> Tensor:
        out = self._check(payload, out)
        n, b = payload.n, self.block
        scale = _tensor(payload.arrays[1]).to(out.dtype)
        out.copy_(_tensor(payload.arrays[0]))
        full = n // b
        out[: full * b].view(full, b).mul_(scale[:full, None])
        if full * b < n:
            out[full * b :].mul_(scale[full])
        return out

    def nbytes(self, n: int, value_bytes: int) -> int:
        return n + 4 * -(-n // self.block)


class TopK(Codec):
    """The ``ceil(fraction*n)`` largest magnitudes: indices (int32, increasing) and values."""

    name = "topk"
    error_feedback = True

    def __init__(self, fraction: float):
        if not (isinstance(fraction, float) and 0 < fraction <= 1):
            raise ValueError(f"topk's fraction must be in (0, 1], got {fraction!r}")
        self.fraction = fraction

    @property
    def spec(self) -> str:
        return f"topk:{self.fraction:g}"

    def kept(self, n: int) -> int:
        return min(n, max(1, math.ceil(self.fraction * n)))

    def encode(self, x: Tensor) -> Payload:
        n, k = x.numel(), self.kept(x.numel())
        values = x.numpy()
        # (numpy's introselect: 4x faster than torch.topk here; any order, then sorted)
        index = np.sort(np.argpartition(np.abs(values), n - k)[n - k :]).astype(np.int32)
        return self._payload(x, index, values[index])

    def decode(self, payload: Payload, out: Tensor | None = None) -> Tensor:
        out = self._check(payload, out).zero_()
        out[_tensor(payload.arrays[0]).to(torch.int64)] = _tensor(payload.arrays[1])
        return out

    def nbytes(self, n: int, value_bytes: int) -> int:
        return self.kept(n) * (4 + value_bytes)


_FIXED: dict[str, type[Codec]] = {c.name: c for c in (NoCodec, Fp16, Bf16, Int8)}


def build_codec(spec: str, flag: str = "--compress") -> Codec:
    """The codec ``spec`` names (``none``, ``fp16``, ``bf16``, ``int8``, ``topk:F``); a
    :class:`~dana.errors.ConfigError` naming the codecs otherwise."""
    choices = ", ".join(CODECS)
    if not isinstance(spec, str):
        raise ConfigError(f"{flag} must be a codec name ({choices}), got {spec!r}")
    name, sep, arg = spec.partition(":")
    if name in _FIXED and not sep:
        return _FIXED[name]()
    if name == "topk":
        try:
            fraction = float(arg)
        except ValueError:
            fraction = math.nan
        if not 0 < fraction <= 1:
            raise ConfigError(
                f"{flag} {spec!r}: topk takes the fraction of values each push keeps, "
                "in (0, 1]: topk:0.01"
            )
        return TopK(fraction)
    raise ConfigError(f"{flag} {spec!r} is unknown; choose one of: {choices} (0 < F <= 1)")


class Wire:
    """A run's codec between its workers' messages and the servers.

    :meth:`encode` cuts worker ``i``'s message into the ``servers`` shards' parts
    (:func:`part_bounds`) and encodes each; with error feedback the worker sends
    ``C(m + r_i)`` and keeps ``r_i = m + r_i - C(m + r_i)`` (its state:
    :meth:`state_dict`; lost when the worker leaves, :meth:`leave`). :meth:`decode`
    joins the parts' decoded values; :meth:`round_trip` is both, the simulator's path.
    """

    def __init__(
        self,
        codec: Codec,
        workers: int,
        d: int,
        servers: int = 1,
        dtype: torch.dtype = torch.float32,
        device: torch.device | None = None,
    ):
        self.codec, self.d, self.dtype = codec, d, dtype
        self.bounds = part_bounds(d, servers)
        self.buffer: Tensor | None = None  # (decoded pushes: one allocation, at the first)
        self.residual = (
            _padded_zeros(workers, d, dtype).to(device) if codec.error_feedback else None
        )

    def encode(self, i: int, message: Tensor) -> list[Payload]:
        """Worker ``i``'s message as one payload per shard (``message`` is not changed)."""
        return self._encode(i, message)[0]

    def _encode(self, i: int, message: Tensor) -> tuple[list[Payload], Tensor | None]:
        """The payloads, and with error feedback their decoded values (:meth:`decode`)."""
        if self.residual is None:
            return [self.codec.encode(message[lo:hi].cpu()) for lo, hi in self.bounds], None
        corrected = torch.add(message, self.residual[i])
        payloads = [self.codec.encode(corrected[lo:hi].cpu()) for lo, hi in self.bounds]
        sent = self.decode(payloads)
        torch.sub(corrected, sent.to(corrected.device), out=self.residual[i])
        return payloads, sent

    def decode(self, payloads: list[Payload]) -> Tensor:
        """The values of a whole push's payloads, in a buffer kept across calls (valid
        until the next call: copy it to keep it)."""
        if self.buffer is None:
            self.buffer = torch.empty(self.d, dtype=self.dtype)
        for (lo, hi), payload in zip(self.bounds, payloads, strict=True):
            self.codec.decode(payload, self.buffer[lo:hi])
        return self.buffer

    def round_trip(self, i: int, message: Tensor) -> Tensor:
        """What the servers apply of worker ``i``'s ``message`` (valid until the next
        call, as :meth:`decode`'s)."""
        payloads, sent = self._encode(i, message)
        return (self.decode(payloads) if sent is None else sent).to(message.device)

    def push_bytes(self, value_bytes: int) -> tuple[int, int]:
        """The bytes of one push on the wire, all shards, and of its largest part."""
        sizes = [self.codec.nbytes(hi - lo, value_bytes) for lo, hi in self.bounds]
        return sum(sizes), max(sizes)

    def leave(self, i: int) -> None:
        """Worker ``i`` left: its residual is lost with its machine (zero)."""
        if self.residual is not None:
            self.residual[i].zero_()

    def state_dict(self) -> dict[str, Any]:
        return {} if self.residual is None else {"residual": self.residual.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.residual is None:
            return
        if "residual" not in state or tuple(state["residual"].shape) != tuple(self.residual.shape):
            raise ValueError(
                f"the codec {self.codec.spec}'s saved state has no residual of shape "
                f"{tuple(self.residual.shape)}"
            )
        self.residual.copy_(state["residual"])


def push_bytes(spec: str, d: int, servers: int, value_bytes: int) -> int:
    """The bytes on the wire of one push of ``d`` values over ``servers`` shards through
    codec ``spec`` (each shard's part encoded on its own): a run's ``push_bytes``."""
    codec = build_codec(spec)
    return sum(codec.nbytes(hi - lo, value_bytes) for lo, hi in part_bounds(d, servers))


def _padded_zeros(workers: int, d: int, dtype: torch.dtype) -> Tensor:
    per_line = max(1, 64 // torch.empty((), dtype=dtype).element_size())
    return torch.zeros(workers, -(-d // per_line) * per_line, dtype=dtype)[:, :d]


def _tensor(array: np.ndarray) -> Tensor:
    """A tensor over ``array``'s memory, only ever read (Ray's arrays are read-only)."""
    return torch.from_numpy(array)


def _numpy(x: Tensor) -> np.ndarray:
    return x.detach().cpu().numpy()


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)
