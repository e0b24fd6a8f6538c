"""A cluster model fitted to a Ray run's own records, for the simulator to replay.

``dana fit-cluster RUN_DIR`` reads the run's ``step_times.csv`` (one row per applied
push: the worker, its *cycle* (the time since its previous push was applied: its step
and its exchange with the servers), its *step* as the worker measured it (the gradient
and the message, with ``--time-scale``'s pad) and the time the push was applied) and
gives the cluster model (:mod:`dana.train.cluster.model`) that the simulator's clock then runs
(``dana train --cluster FILE``). Times are in the model's unit, the millisecond of
simulated time: a run with ``--time-scale S > 0`` read its model's numbers as ``S``
seconds each, so a measured second is ``1/S`` units; a run without emulation is taken
at its own speed (a second is 1000 units).

Each worker's first push is left out (its cycle holds the start-up: the first pull, the
data set's first read). Then, with ``c`` a worker's steps, ``y`` its cycles:

- **compute**: worker ``i``'s mean step ``m_i``; ``worker_factors[i] = m_i / min_j m_j``
  (the fastest worker's factor is 1) and the compute model's mean is ``min_j m_j``; its
  spread is the coefficient of variation of all steps, each divided by its worker's
  mean; the model is ``gamma`` (``shape = 1/cv^2``, ``scale = mean/shape``) or
  ``lognormal`` (``mean``, ``cv``), whichever gives the normalized steps the higher
  likelihood;
- **network**: one round trip per push (the push and the next pull travel together,
  ``relay_exchange``), so each worker's link gets ``latency_ms[i] = median(y - c) / 2``
  (what the servers spend on a push, and waits at their queue, are folded in);
  bandwidths stay unlimited, since one message size cannot tell a latency from a
  bandwidth;
- **availability**: a cycle longer than ``gap_factor`` (10) times its worker's median
  cycle is an absence (a crash and restart, a preemption): the worker leaves one median
  cycle after its previous push and rejoins one median cycle before this one.

Drift (periodic, slow spells) and data-dependent costs are not fitted: the fitted model
is stationary apart from the absences. A run whose ``step_times.csv`` has no step
column (written before it was recorded) gets its cycles as its steps and no latency.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from dana.errors import DataError
from dana.train.cluster.model import resolve_cluster
from dana.train.cluster.timing import read_trace_rows

#: A cycle this many times its worker's median is an absence.
GAP_FACTOR = 10.0
#: Pushes per worker, after the first, below which nothing is fitted.
MIN_PUSHES = 3


def read_step_times(path: str | Path) -> dict[str, np.ndarray]:
    """The columns of a Ray run's ``step_times.csv``: ``worker``, ``cycle``, ``step``
    (the cycle where the file has no step column) and ``time`` (NaN where absent)."""
    path = Path(path)
    rows = read_trace_rows(path, "step times file")
    header = [c.strip() for c in rows[0]]
    where = {name: header.index(name) for name in ("compute", "time") if name in header}
    columns: dict[str, list[float]] = {"worker": [], "cycle": [], "step": [], "time": []}
    for line, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        try:
            values = [float(v) for v in row]
            worker, cycle = int(values[0]), values[1]
            step = values[where["compute"]] if "compute" in where else cycle
            time = values[where["time"]] if "time" in where else math.nan
        except (IndexError, ValueError):
            raise DataError(f"{path}:{line}: expected numbers, got {row!r}") from None
        columns["worker"].append(worker)
        columns["cycle"].append(cycle)
        columns["step"].append(step if math.isfinite(step) else cycle)
        columns["time"].append(time)
    if not columns["worker"]:
        raise DataError(f"{path}: the step times have no rows")
    return {k: np.asarray(v, dtype=np.int64 if k == "worker" else np.float64) for k, v in
            columns.items()}  # fmt: skip


def fit_cluster(run_dir: str | Path, gap_factor: float = GAP_FACTOR) -> dict[str, Any]:
    """The resolved cluster model of the Ray run in ``run_dir`` (see the module's rule)."""
    import json

    run = Path(run_dir)
    times = run / "step_times.csv"
    if not times.is_file():
        raise DataError(
            f"{run}: no step_times.csv; fit a cluster to the directory of a finished "
            "`dana train --backend ray` run"
        )
    try:
        config = json.loads((run / "config.json").read_text())
    except (OSError, ValueError):
        raise DataError(f"{run}: no readable config.json; is it a run directory?") from None
    scale = float(config.get("time_scale") or 0.0)
    unit = 1.0 / scale if scale > 0 else 1000.0  # model units (ms) per measured second
    columns = read_step_times(times)
    workers = int(config.get("workers") or columns["worker"].max() + 1)
    steps, cycles, pushed = [], [], []
    for i in range(workers):
        mine = np.flatnonzero(columns["worker"] == i)[1:]  # the first push holds start-up
        if len(mine) < MIN_PUSHES:
            raise DataError(
                f"{times}: worker {i} has {len(mine) + 1} pushes; fitting needs at least "
                f"{MIN_PUSHES + 1} per worker (a longer run)"
            )
        steps.append(columns["step"][mine] * unit)
        cycles.append(columns["cycle"][mine] * unit)
        pushed.append(columns["time"][mine] * unit)
    means = np.array([s.mean() for s in steps])
    base = float(means.min())
    normalized = np.concatenate([s / m for s, m in zip(steps, means)])
    cv = float(normalized.std() / normalized.mean())
    latency = [max(0.0, float(np.median(y - c)) / 2) for y, c in zip(cycles, steps)]
    raw = {
        "name": f"fitted-{run.name}",
        "description": f"fitted to the Ray run {run.name} by dana fit-cluster",
        "compute": {**_compute_model(normalized, base, cv),
                    "worker_factors": [round(float(m / base), 6) for m in means]},
        "network": {"latency_ms": [round(x, 6) for x in latency]},
        "availability": {"preemptions": _absences(cycles, pushed, gap_factor)},
    }  # fmt: skip
    return resolve_cluster(raw)


def _compute_model(normalized: np.ndarray, mean: float, cv: float) -> dict[str, Any]:
    """``gamma`` or ``lognormal`` with this mean and CV, whichever is likelier for the
    steps divided by their worker's mean (mean 1); ``constant`` when they do not vary."""
    if cv < 1e-9:
        return {"model": "constant", "duration": mean}
    x = np.clip(normalized, 1e-12, None)
    shape = 1.0 / cv**2
    gamma = float(np.sum((shape - 1) * np.log(x) - shape * x + shape * math.log(shape)))
    gamma -= len(x) * math.lgamma(shape)
    s2 = math.log1p(cv**2)
    mu = -s2 / 2
    lognormal = float(np.sum(-np.log(x) - (np.log(x) - mu) ** 2 / (2 * s2)))
    lognormal -= len(x) * 0.5 * math.log(2 * math.pi * s2)
    if gamma >= lognormal:
        return {"model": "gamma", "shape": shape, "scale": mean / shape}
    return {"model": "lognormal", "mean": mean, "cv": cv}


def _absences(
    cycles: list[np.ndarray], pushed: list[np.ndarray], gap_factor: float
) -> list[dict[str, Any]]:
    """Each cycle longer than ``gap_factor`` times its worker's median, as an absence."""
    out = []
    for i, (y, t) in enumerate(zip(cycles, pushed)):
        typical = float(np.median(y))
        for n in np.flatnonzero(y > gap_factor * typical):
            if not math.isfinite(t[n]):
                continue
            leave, rejoin = t[n] - y[n] + typical, t[n] - typical
            if rejoin > leave > 0:
                out.append({"worker": i, "leave_ms": float(leave), "rejoin_ms": float(rejoin)})
    return out
