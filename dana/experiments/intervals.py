"""The interval every verdict and ranking states: the seeds' range for 2-3 seeds, a
seeded bootstrap interval of the mean for more, none for one seed.

>>> import numpy as np
>>> interval(np.array([1.0, 3.0, 2.0]))
(1.0, 3.0)
>>> interval(np.array([1.0])) is None
True
"""

from __future__ import annotations

import numpy as np

#: Bootstrap resamples, and the fixed seed that makes every page reproducible.
DRAWS, SEED = 10_000, 0
#: The bootstrap interval's coverage (its 5th and 95th percentiles).
COVERAGE = 90

INTERVAL_RULE = (
    "the interval is the seeds' range (min..max) for 2-3 seeds, a bootstrap "
    f"{COVERAGE}% interval of the mean ({DRAWS} resamples, seed {SEED}) for 4 or more, "
    "none for one seed"
)


def interval(values: np.ndarray) -> tuple[float, float] | None:
    """The interval of ``values`` (:data:`INTERVAL_RULE`).

    Args:
        values: one value per seed.

    Returns:
        ``(low, high)``, or None for fewer than two values.
    """
    values = np.asarray(values, dtype=float)
    if len(values) < 2:
        return None
    if len(values) <= 3:
        return float(values.min()), float(values.max())
    draws = np.random.default_rng(SEED).integers(0, len(values), (DRAWS, len(values)))
    tail = (100 - COVERAGE) / 2
    low, high = np.percentile(values[draws].mean(axis=1), [tail, 100 - tail])
    return float(low), float(high)
