"""Simulated time to reach a target test error, and the speed-up over SSGD it gives.

The target is on the report's metric (:class:`~dana.experiments.results.Metric`): the
test error, or the test loss where there is no error to compare (language models).
The time to target of a run is read from its ``metrics.csv``: the first evaluation at
or below the target, with the time linearly interpolated in ``sim_time`` between that
evaluation and the one before it (the error is taken to fall linearly between two
evaluations). A run that never reaches the target (or diverges first) has none.

The speed-up of a row over SSGD at ``k`` workers is ``T_ssgd / T_row`` with ``T`` the
mean time to target over the seeds; it is defined only when every seed of both reached
the target; where the row reached it and SSGD did not, a lower bound takes its place
(:func:`speedup_bound`: SSGD would have needed longer than its whole run). The
reference is the plain ``ssgd`` row with the row's other settings, but
``lr_scaling`` and ``algorithm_params`` at their defaults: ``ssgd (lr_scaling=linear)``
is compared with ``ssgd``, as every other row is. Where the sweep also has ``ssgd``
with the linear-scaling rule, every other row gets a second speed-up, over it
(:func:`scaled_reference_row`): SSGD as the paper runs it may never reach a
near-baseline target, the scaled one does.

Targets (:func:`choose_targets`): a stated one, or by default the one-worker baseline's
mean final error + 0.5 and + 1 percentage points (a loss: + 1% and + 2% of it). A target the baseline reaches at its
first evaluation after the start is not used: the time to it would measure the first
evaluation interval, not the training.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from dana.experiments.results import Group, Results, row_label
from dana.train.config import TrainConfig

#: The default targets: the baseline's mean final error plus these percentage points
#: (:attr:`Metric.offsets <dana.experiments.results.Metric>` as fractions; a loss's: 1%
#: and 2% of the baseline's final loss).
NEAR_BASELINE_PP = (0.5, 1.0)

#: The first-evaluation rule, as the report states it.
FIRST_EVALUATION_RULE = (
    "A target that a seed of the one-worker baseline reaches at its first evaluation "
    "after the start (the first metrics row with updates > 0) is not used: the time to "
    "it would measure the evaluation interval, not the training."
)

#: The speed-up's reference, as the report states it.
REFERENCE_RULE = (
    "The speed-up of a row is over the plain `ssgd` row at the same k (same other "
    "settings, the learning rate not scaled), so `ssgd (lr_scaling=linear)` is compared "
    "with `ssgd` too."
)

#: The second reference, as the report states it where the sweep has it.
SCALED_REFERENCE_RULE = (
    "The sweep also has `ssgd (lr_scaling=linear)` (the rate x k after the warm-up): a "
    "second speed-up follows, over it (`vs linear`; `linear not reached`, `no linear`)."
)

#: Why a row has no speed-up at a k (the speed-up plot writes these in its cells).
NOT_REACHED, DIVERGED, NO_SSGD, SSGD_NOT_REACHED, PENDING = (
    "not reached",
    "diverged",
    "no ssgd",
    "ssgd not reached",
    "pending",
)

#: The rule, as the report states it.
TARGET_RULE = (
    "The time to target of a run is the simulated time (metrics.csv's sim_time) of its "
    "first evaluation at or below the target, linearly interpolated between that "
    "evaluation and the one before it; a group's time is the mean over its seeds, defined "
    "only when every seed reached the target; a diverged run never reaches it."
)


def time_to_target(
    rows: Sequence[dict[str, float]], target: float, key: str = "test_error"
) -> float | None:
    """Simulated time at which the column ``key`` (the test error, as a fraction, or the
    test loss) first reaches ``target``.

    >>> rows = [{"sim_time": 0, "test_error": 0.9}, {"sim_time": 100, "test_error": 0.5},
    ...         {"sim_time": 200, "test_error": 0.1}]
    >>> time_to_target(rows, 0.3)
    150.0
    >>> time_to_target(rows, 0.05) is None
    True
    """
    previous: dict[str, float] | None = None
    for row in rows:
        error, time = row[key], row["sim_time"]
        if not (math.isfinite(error) and math.isfinite(time)):
            return None  # diverged: no later row counts
        if error <= target:
            if previous is None:
                return float(time)
            e0, t0 = previous[key], previous["sim_time"]
            return float(t0 + (e0 - target) / (e0 - error) * (time - t0))
        previous = row
    return None


def group_time(group: Group | None, target: float) -> tuple[float | None, int, int]:
    """(mean time to target over the group's runs if all reached it, reached, runs)."""
    if group is None or not group.results:
        return None, 0, 0
    key = group.metric.key
    times = [time_to_target(r.metrics, target, key) for r in group.results]
    reached = [t for t in times if t is not None]
    mean = sum(reached) / len(reached) if reached and len(reached) == len(times) else None
    return mean, len(reached), len(times)


def first_evaluation(rows: Sequence[dict[str, float]]) -> dict[str, float] | None:
    """The first metrics row after the start (``updates > 0``), or None."""
    for row in rows:
        if row.get("updates", 0) > 0:
            return row
    return None


def passed_at_first_evaluation(group: Group, target: float) -> dict[str, float] | None:
    """The first evaluation after the start of a seed of ``group`` that is at or below
    ``target`` (the earliest such row among the seeds), or None when no seed is there."""
    hits = []
    key = group.metric.key
    for run in group.runs:
        row = first_evaluation(run.metrics)
        if row is not None and math.isfinite(row[key]) and row[key] <= target:
            hits.append(row)
    return min(hits, key=lambda r: r[key]) if hits else None


@dataclass
class Target:
    """A time-to-target target: its value (a fraction), how it was chosen, and why it is
    not used (``skip``), if it is not."""

    value: float
    text: str
    skip: str | None = None


def choose_targets(results: Results, target: float | None = None) -> list[Target]:
    """``target`` if given, else the baseline's mean final error + each of
    :data:`NEAR_BASELINE_PP`; each checked against the first-evaluation rule."""
    base = results.baseline()
    metric = results.metric
    have_base = base is not None and len(base.finals()) > 0
    if target is not None:
        targets = [Target(target, f"the stated target {metric.show(target)}")]
    elif have_base and metric.is_error:
        error = float(base.finals().mean())
        targets = [
            Target(
                error + pp / 100,
                f"the one-worker baseline's final test error + {pp:g} pp = "
                f"{100 * error:.2f}% + {pp:g} pp = {100 * error + pp:.2f}%",
            )
            for pp in NEAR_BASELINE_PP
        ]
    elif have_base:  # a loss: relative to the baseline's, whatever its scale
        value = float(base.finals().mean())
        targets = [
            Target(
                value + abs(value) * offset,
                f"the one-worker baseline's final {metric.name} + {100 * offset:g}% = "
                f"{value:.4f} + {abs(value) * offset:.4f} = "
                f"{metric.show(value + abs(value) * offset)}",
            )
            for offset in metric.offsets
        ]
    else:
        return []
    if base is not None:
        for t in targets:
            row = passed_at_first_evaluation(base, t.value)
            if row is not None:
                at, limit = row[metric.key], t.value
                if metric.is_error:
                    at, limit = f"{100 * at:.2f}%", f"{100 * limit:.2f}%"
                else:
                    at, limit = metric.show(at), metric.show(limit)
                t.skip = (
                    f"Not used: the one-worker baseline is at {at} "
                    f"already at its first evaluation after the start (epoch "
                    f"{row['epoch']:g}, {int(row['updates'])} updates), at or below "
                    f"{limit}; a time to it would measure the evaluation "
                    "interval, not the training."
                )
    return targets


def _ssgd_row(results: Results, group: Group, lr_scaling: str) -> str:
    """The label of the ``ssgd`` row with ``group``'s settings, ``lr_scaling`` and the
    algorithm's own settings (``algorithm_params``) at their defaults."""
    config = {
        **group.runs[0].config,
        "algorithm": "ssgd",
        "lr_scaling": lr_scaling,
        "algorithm_params": TrainConfig().algorithm_params,
    }
    return row_label(config, results.row_keys)


def reference_row(results: Results, group: Group) -> str:
    """The label of the ``ssgd`` row a speed-up of ``group`` is measured against: the
    group's settings with ``algorithm = ssgd`` and the algorithm's own settings
    (``lr_scaling``, ``algorithm_params``) at their defaults."""
    return _ssgd_row(results, group, TrainConfig().lr_scaling)


def has_scaled_ssgd(results: Results) -> bool:
    """Whether the sweep has an ``ssgd`` row with the linear-scaling rule."""
    return "lr_scaling" in results.row_keys and any(
        group.runs
        and group.runs[0].config.get("algorithm") == "ssgd"
        and group.runs[0].config.get("lr_scaling") == "linear"
        for group in results.groups.values()
    )


def scaled_reference_row(results: Results, group: Group) -> str | None:
    """The label of the ``ssgd (lr_scaling=linear)`` row with ``group``'s other settings
    (the algorithm's own at their defaults), if the sweep has that row at some k and
    ``group`` is not it; else None."""
    if "lr_scaling" not in results.row_keys:  # (then every ssgd row is the plain one)
        return None
    label = _ssgd_row(results, group, "linear")
    if label == group.row or not any(row == label for row, _ in results.groups):
        return None
    return label


def speedup_cell(
    results: Results, group: Group, target: float, reference_label: str | None = None
) -> tuple[float | None, str]:
    """(speed-up over SSGD, "") or (None, why there is none): :data:`PENDING` (no result
    yet), :data:`DIVERGED` (every seed that missed the target diverged),
    :data:`NOT_REACHED`, :data:`NO_SSGD` (no reference row at this k) or
    :data:`SSGD_NOT_REACHED`. The reference: the row labelled ``reference_label``, by
    default :func:`reference_row`."""
    if not group.results:
        return None, PENDING
    time = group_time(group, target)[0]
    if time is None:
        missed = [
            r for r in group.results if time_to_target(r.metrics, target, group.metric.key) is None
        ]
        return None, DIVERGED if all(r.status == "diverged" for r in missed) else NOT_REACHED
    label = reference_label or reference_row(results, group)
    reference = results.group(label, group.workers)
    if reference is None or not reference.results:
        return None, NO_SSGD
    reference_time = group_time(reference, target)[0]
    if reference_time is None:
        return None, SSGD_NOT_REACHED
    return speedup(reference_time, max(time, 1e-300)), ""


def speedup_bound(
    results: Results, group: Group, target: float, reference_label: str | None = None
) -> float | None:
    """Where every seed of ``group`` reached ``target`` and its reference (as in
    :func:`speedup_cell`) did not on every seed, a lower bound on the speed-up: the
    reference's mean over its seeds of the time to the target, a seed that never reached
    it counted at the time its run ended (it would have needed longer; a diverged seed at
    its last finite time), over ``group``'s mean time. None when there is no such bound."""
    time = group_time(group, target)[0]
    label = reference_label or reference_row(results, group)
    reference = results.group(label, group.workers)
    if time is None or reference is None or not reference.results:
        return None
    if group_time(reference, target)[0] is not None:
        return None  # (reached: the speed-up itself is defined)
    times = []
    for run in reference.results:
        reached = time_to_target(run.metrics, target, reference.metric.key)
        ends = [r["sim_time"] for r in run.metrics if math.isfinite(r["sim_time"])]
        times.append(reached if reached is not None else max(ends, default=math.nan))
    bound = speedup(float(sum(times) / len(times)), max(time, 1e-300))
    return bound if bound is not None and math.isfinite(bound) else None


def speedup_cells(
    results: Results, target: float
) -> dict[tuple[str, int], tuple[float | None, str]]:
    """:func:`speedup_cell` of every group with k > 1 (the baseline aside)."""
    base = results.baseline()
    return {
        key: speedup_cell(results, group, target)
        for key, group in results.groups.items()
        if key[1] > 1 and group is not base
    }


def speedup_bounds(results: Results, target: float) -> dict[tuple[str, int], float]:
    """:func:`speedup_bound` of every group with k > 1 that has one."""
    base = results.baseline()
    bounds = {
        key: speedup_bound(results, group, target)
        for key, group in results.groups.items()
        if key[1] > 1 and group is not base
    }
    return {key: b for key, b in bounds.items() if b is not None}


def speedup(reference: float | None, time: float | None) -> float | None:
    """``reference / time``, or None when either is missing."""
    if reference is None or time is None or time <= 0:
        return None
    return reference / time
