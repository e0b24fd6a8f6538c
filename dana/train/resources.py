"""What a run takes from the machine: CPU threads and memory.

Threads (``--threads N``, ``dana.simulate(threads=N)``): the number of CPU threads the
run uses, set with :func:`use_threads` before any work. The default is one (or
``OMP_NUM_THREADS`` where the environment sets it). The
simulator computes one gradient at a time, and torch's default (one intra-op thread per
core) spin-waits against any other busy process: on a shared machine each step then
runs many times slower (docs/BENCHMARKS.md, "Threads under load"). ``0`` means one per
core.

Memory (:func:`check_memory`): the simulator holds ``(k, d)`` per-worker state (what
each worker computes at, the rule's per-worker vectors; with ``--batch-workers B`` also
``B`` stacked pulled copies and gradients), on the run's device; :func:`state_bytes`
counts it from the rule itself (its state at a small ``d``, for one and two workers)
and the run is refused before it starts when the estimate exceeds the memory available
there.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from dana import algorithms
from dana.errors import ConfigError
from dana.memory import _gib, available_memory, check_fits

DEFAULT_THREADS = 1
MAX_THREADS = 1024
_PROBE_D = 64  # a multiple of a cache line of float64 and float32: no row padding


def cores() -> int:
    """The CPU cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def default_threads() -> int:
    """``OMP_NUM_THREADS`` where the environment sets it, else :data:`DEFAULT_THREADS`."""
    value = os.environ.get("OMP_NUM_THREADS", "")
    return int(value) if value.isdigit() else DEFAULT_THREADS


def check_threads(threads: Any) -> int:
    """``threads`` as an int (0: one per core), or ConfigError."""
    if isinstance(threads, bool) or not isinstance(threads, int) or not 0 <= threads <= MAX_THREADS:
        raise ConfigError(
            f"--threads must be an integer in [0, {MAX_THREADS}] (0: one per core), got {threads!r}"
        )
    return threads or cores()


def use_threads(threads: int | None = None) -> int:
    """Make torch use ``threads`` intra-op threads (default :func:`default_threads`; 0:
    one per core) and one inter-op thread; return the intra-op count.

    Inter-op threads can be set only once per process, before any inter-op work; a
    later call leaves them as they are."""
    n = check_threads(default_threads() if threads is None else threads)
    torch.set_num_threads(n)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass  # set before in this process (a second run, a test): it stays
    return n


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """torch's intra-op threads set to ``threads`` inside the block, and the process's
    own count restored after it (a Python entry leaves its caller's setting as it was)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _state_size(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(_state_size(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(_state_size(v) for v in value)
    return 0


def state_bytes(
    algorithm: str, hparams: dict[str, Any], workers: int, d: int, dtype: torch.dtype
) -> int:
    """Bytes of the simulator's state for ``workers`` workers of a ``d``-parameter model:
    the rule's master and worker state and the simulator's ``(k, d)`` parameters sent.

    The rule is built at a small ``d`` with one and two workers; its state grows
    linearly in both, which gives the bytes per worker and the shared bytes."""
    params = torch.zeros(_PROBE_D, dtype=dtype)

    def size(k: int) -> int:
        # the elastic-averaging rules are built for their k (their coefficient is beta/k)
        algo = algorithms.build(
            algorithm, **{**hparams, **({"workers": k} if "workers" in hparams else {})}
        )
        master = algo.master(params, k)
        worker = algo.worker(k, _PROBE_D, dtype)
        return _state_size(master.state_dict()) + _state_size(worker.state_dict())

    one, two = size(1), size(2)
    itemsize = params.element_size()
    per_worker = (two - one) / _PROBE_D + itemsize  # + the parameters sent to it
    shared = max(0.0, (one - (two - one)) / _PROBE_D)
    return int(per_worker * workers * d + shared * d)


def check_memory(config: Any, d: int, available: int | None = None) -> int:
    """ConfigError when the simulator's state for ``config`` (with checkpoints: twice it,
    as a checkpoint serialises a copy) does not fit the memory available; the bytes."""
    dtype = getattr(torch, config.dtype)
    need = state_bytes(config.algorithm, config.algorithm_hparams(), config.workers, d, dtype)
    batch_workers = getattr(config, "batch_workers", 1)
    if isinstance(batch_workers, int) and batch_workers > 1:
        # the batched engine's stacked pulled copies and gradients (activations aside)
        need += 2 * min(batch_workers, config.workers) * d * dtype.itemsize
    peak = 2 * need if config.checkpoint_every > 0 else need
    if available is None:
        available = _device_memory(getattr(config, "device", "cpu"))
    if available is not None and peak > available:
        per_worker = need / config.workers / 2**20
        raise ConfigError(
            f"--workers {config.workers} of {config.model} ({d:,} parameters, {config.dtype}) "
            f"need about {_gib(peak)} for the simulator's state ({per_worker:.1f} MiB per "
            f"worker{', twice at a checkpoint' if peak > need else ''}); "
            f"{_gib(available)} of memory is available: use at most "
            f"{max(1, int(config.workers * available / peak)):,} workers or a smaller model"
        )
    return peak


#: A model in a run takes its parameters, their flat copy and a gradient: this many
#: copies of its parameters at least (:func:`build_within_memory`).
MODEL_COPIES = 3


def build_within_memory(factory: Callable[[], torch.nn.Module], what: str) -> torch.nn.Module:
    """``factory()``, once a build on the meta device (no memory) has shown that the
    model fits the memory available (:func:`check_fits`, naming ``what`` and the count of
    parameters); a model that cannot be built on the meta device is built directly."""
    try:
        with torch.device("meta"):
            probe = factory()
    except ConfigError:
        raise
    except Exception:  # a model whose construction reads values: no estimate
        probe = None
    if probe is not None:
        count = sum(p.numel() for p in probe.parameters())
        check_fits(
            MODEL_COPIES * 4 * count,
            f"{what} ({count:,} parameters)",
            "choose a smaller model (or check the dataset's image size and number of classes)",
        )
    return factory()


def _device_memory(device: str) -> int | None:
    """The free memory where the state lives: the GPU's for a CUDA run, else the host's."""
    if device in ("cuda", "auto") and torch.cuda.is_available():
        return int(torch.cuda.mem_get_info()[0])
    return available_memory()
