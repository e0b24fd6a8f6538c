"""Simulated time to reach a target test error, and the speed-up over SSGD it gives.

The time to target of a run is read from its ``metrics.csv``: the first evaluation at
or below the target, with the time linearly interpolated in ``sim_time`` between that
evaluation and the one before it (the error is taken to fall linearly between two
evaluations). A run that never reaches the target (or diverges first) has none.

The speed-up of an algorithm over ``ssgd`` at ``k`` workers is ``T_ssgd / T_algorithm``
with ``T`` the mean time to target over the seeds; it is defined only when every seed of
both reached the target.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from dana.experiments.results import Group

#: The rule, as the report states it.
TARGET_RULE = (
    "The time to target of a run is the simulated time (metrics.csv's sim_time) of its "
    "first evaluation at or below the target, linearly interpolated between that "
    "evaluation and the one before it; a group's time is the mean over its seeds, defined "
    "only when every seed reached the target; a diverged run never reaches it."
)


def time_to_target(rows: Sequence[dict[str, float]], target: float) -> float | None:
    """Simulated time at which the test error first reaches ``target`` (a fraction).

    >>> rows = [{"sim_time": 0, "test_error": 0.9}, {"sim_time": 100, "test_error": 0.5},
    ...         {"sim_time": 200, "test_error": 0.1}]
    >>> time_to_target(rows, 0.3)
    150.0
    >>> time_to_target(rows, 0.05) is None
    True
    """
    previous: dict[str, float] | None = None
    for row in rows:
        error, time = row["test_error"], row["sim_time"]
        if not (math.isfinite(error) and math.isfinite(time)):
            return None  # diverged: no later row counts
        if error <= target:
            if previous is None:
                return float(time)
            e0, t0 = previous["test_error"], previous["sim_time"]
            return float(t0 + (e0 - target) / (e0 - error) * (time - t0))
        previous = row
    return None


def group_time(group: Group | None, target: float) -> tuple[float | None, int, int]:
    """(mean time to target over the group's runs if all reached it, reached, runs)."""
    if group is None or not group.results:
        return None, 0, 0
    times = [time_to_target(r.metrics, target) for r in group.results]
    reached = [t for t in times if t is not None]
    mean = sum(reached) / len(reached) if reached and len(reached) == len(times) else None
    return mean, len(reached), len(times)


def speedup(reference: float | None, time: float | None) -> float | None:
    """``reference / time``, or None when either is missing."""
    if reference is None or time is None or time <= 0:
        return None
    return reference / time
