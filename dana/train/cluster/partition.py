"""Data per worker: which training examples each of ``k`` workers draws its batches from.

``--partition`` (``TrainConfig.partition``) names the split:

- ``iid``: no split: every worker takes the next batch of one shared shuffled stream
  (:class:`~dana.train.task.batches.BatchStream`), as the simulator always has;
- ``dirichlet:ALPHA``: for every class, the proportions of its examples that go to each
  worker are drawn from a symmetric Dirichlet distribution ``Dir(ALPHA, ..., ALPHA)``
  (Yurochkin et al., "Bayesian Nonparametric Federated Learning of Neural Networks",
  ICML 2019): small ``ALPHA`` (0.1) gives each worker a few classes, large ``ALPHA``
  (100) nearly IID parts. The draw is repeated until every worker holds at least
  ``min_size`` examples (a batch). NIID-Bench's label-skew split (Li et al., ICDE 2022)
  also stops giving a worker examples once it holds ``N/k``; this one does not;
- ``shards:N``: the examples sorted by label (ties in a random order) are cut into
  ``k*N`` contiguous shards of near-equal size, and each worker gets ``N`` of them at
  random (McMahan et al., "Communication-Efficient Learning of Deep Networks from
  Decentralized Data", AISTATS 2017, with ``N = 2``): each worker sees about ``N``
  classes.

:func:`partition` is a pure function of (the labels, ``k``, the seed, the split and
``min_size``), so that every runner (the simulator now, the Ray workers later) computes
the same parts. The parts are disjoint and cover every example; each is sorted.

    >>> import numpy as np
    >>> parts = partition(np.repeat(np.arange(4), 25), 4, seed=0, spec="shards:1")
    >>> sorted(len(p) for p in parts), len(np.unique(np.concatenate(parts)))
    ([25, 25, 25, 25], 100)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dana.errors import ConfigError

KINDS = ("iid", "dirichlet", "shards")
#: Dirichlet draws tried before giving up on a split where every worker has a batch.
MAX_TRIES = 1000
#: A salt for the partition's generator (apart from every other draw of the run).
PARTITION_SALT = 0x9A27


def parse_partition(spec: str) -> tuple[str, float | int | None]:
    """``"dirichlet:0.3"`` -> ``("dirichlet", 0.3)``; ConfigError naming the fix."""
    if not isinstance(spec, str):
        raise ConfigError(
            f"--partition must be a string (iid, dirichlet:ALPHA, shards:N), got {spec!r}"
        )
    kind, _, value = spec.partition(":")
    if kind == "iid" and not value:
        return "iid", None
    if kind == "dirichlet":
        try:
            alpha = float(value)
        except ValueError:
            alpha = math.nan
        if not (math.isfinite(alpha) and alpha > 0):
            raise ConfigError(
                f"--partition {spec!r}: dirichlet:ALPHA needs a concentration ALPHA > 0, "
                "e.g. dirichlet:0.5 (small: a few classes per worker; large: nearly iid)"
            )
        return "dirichlet", alpha
    if kind == "shards":
        if not value.isdigit() or int(value) < 1:
            raise ConfigError(
                f"--partition {spec!r}: shards:N needs a number of shards per worker N >= 1, "
                "e.g. shards:2"
            )
        return "shards", int(value)
    raise ConfigError(f"--partition {spec!r} is unknown; give iid, dirichlet:ALPHA or shards:N")


def partition(
    labels: np.ndarray, workers: int, seed: int, spec: str, min_size: int = 1
) -> list[np.ndarray] | None:
    """Each worker's examples (indices into the training set), or None for ``iid``
    (one shared stream). ConfigError if a worker would hold fewer than ``min_size``."""
    kind, value = parse_partition(spec)
    if kind == "iid":
        return None
    labels = np.asarray(labels).astype(np.int64).reshape(-1)
    n = len(labels)
    if n < workers * min_size:
        raise ConfigError(
            f"--partition {spec}: {n} training examples cannot give each of {workers} workers "
            f"a batch of {min_size}; use fewer workers, a smaller batch or more data"
        )
    rng = np.random.Generator(
        np.random.PCG64(np.random.SeedSequence([seed, PARTITION_SALT, workers]))
    )
    if kind == "shards":
        return _shards(labels, workers, int(value), rng, min_size, spec)
    return _dirichlet(labels, workers, float(value), rng, min_size, spec)


def _dirichlet(
    labels: np.ndarray,
    workers: int,
    alpha: float,
    rng: np.random.Generator,
    min_size: int,
    spec: str,
) -> list[np.ndarray]:
    classes = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    for _ in range(MAX_TRIES):
        parts: list[list[np.ndarray]] = [[] for _ in range(workers)]
        for examples in classes:
            examples = rng.permutation(examples)
            shares = rng.dirichlet(np.full(workers, alpha))
            cuts = (np.cumsum(shares)[:-1] * len(examples)).astype(np.int64)
            for worker, chunk in enumerate(np.split(examples, cuts)):
                parts[worker].append(chunk)
        merged = [np.sort(np.concatenate(p)) for p in parts]
        if min(len(p) for p in merged) >= min_size:
            return merged
    raise ConfigError(
        f"--partition {spec}: in {MAX_TRIES} draws some worker always got fewer than "
        f"{min_size} examples (a batch); raise ALPHA, or use fewer workers or a smaller batch"
    )


def _shards(
    labels: np.ndarray,
    workers: int,
    per_worker: int,
    rng: np.random.Generator,
    min_size: int,
    spec: str,
) -> list[np.ndarray]:
    count = workers * per_worker
    if count > len(labels):
        raise ConfigError(
            f"--partition {spec}: {count} shards of {len(labels)} examples would be empty; "
            "lower N or the number of workers"
        )
    shuffled = rng.permutation(len(labels))
    ordered = shuffled[np.argsort(labels[shuffled], kind="stable")]
    shards = np.array_split(ordered, count)
    owner = rng.permutation(count)
    parts = [
        np.sort(np.concatenate([shards[s] for s in owner[w * per_worker : (w + 1) * per_worker]]))
        for w in range(workers)
    ]
    if min(len(p) for p in parts) < min_size:
        raise ConfigError(
            f"--partition {spec}: a worker holds {min(len(p) for p in parts)} examples, fewer "
            f"than a batch ({min_size}); use fewer workers or a smaller batch"
        )
    return parts


def check_partition_option(config: Any, backend: Any, flag: Any) -> None:
    """A run's ``partition`` option: a valid spec, and data per worker only on a backend
    that splits the data (the simulator). ``flag(name)``: how the caller names an option."""
    kind, _ = parse_partition(config.partition)
    if kind != "iid" and not backend.partitions:
        raise ConfigError(
            f"{flag('partition')} {config.partition}: each worker of {flag('backend')} "
            f"{config.backend} draws its own shuffle of the whole training set (iid), and a "
            "partition would need the run's split on every worker and a new split when "
            f"workers join; split the data per worker in the simulator ({flag('backend')} sim)"
        )
