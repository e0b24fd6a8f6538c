"""How long each gradient computation takes, in simulated time.

A timing model draws the duration of worker ``i``'s next computation. The simulator
calls :meth:`TimingModel.sample` once per computation, in event order, so the same seed
gives the same durations. The unit of simulated time is the millisecond (``gamma``'s
mean step of 128 is 128 ms); a cluster model (:mod:`dana.train.cluster.model`) adds
per-worker factors, drift, data-dependent costs and the network around these models.

- ``constant``: every computation takes ``duration``: round robin, staleness ``k-1``.
- ``gamma``: ``Gamma(shape, scale)`` for every worker; the DANA authors' values
  ``shape=100, scale=1.28`` (mean 128, coefficient of variation 0.1).
- ``heterogeneous``: the coefficient-of-variation method of Ali et al. (2000), "Task
  execution time modeling for heterogeneous computing systems": each worker draws its
  own mean once, ``mean_i ~ Gamma(1/machine_cv^2, mean*machine_cv^2)``, then each of its
  computations takes ``Gamma(1/task_cv^2, mean_i*task_cv^2)``. Defaults (ours):
  ``mean=128`` (as ``gamma``), ``machine_cv=0.3`` (workers' speeds spread by about
  30%), ``task_cv=0.1`` (as ``gamma``'s jitter).
- ``lognormal``: ``exp(N(mu, sigma^2))`` with mean ``mean`` and coefficient of
  variation ``cv`` (``sigma^2 = ln(1 + cv^2)``, ``mu = ln(mean) - sigma^2/2``): the
  heavy right tail of measured step times on shared machines. Defaults ``mean=128``,
  ``cv=0.1``.
- ``pareto``: Pareto type I with tail index ``alpha > 1`` and mean ``mean`` (scale
  ``x_m = mean*(alpha - 1)/alpha``, ``P(T > t) = (x_m/t)^alpha``): a power-law tail of
  stragglers (the variance is infinite for ``alpha <= 2``). Defaults ``mean=128``,
  ``alpha=3``.
- ``trace``: replay measured step times from a CSV file with a header
  ``worker,duration`` and one row per computation (the format every Ray run writes to
  ``step_times.csv``). Worker ``i`` replays the durations of trace worker
  ``i % m`` (``m`` workers in the file) in order, cycling when they run out.

Every model also states each worker's mean step time (:meth:`TimingModel.mean_time`);
:func:`relative_speeds` turns them into the speeds relative to the fastest worker that
Dynamic Local Updates size each worker's local phase by.
"""

from __future__ import annotations

import csv
import inspect
import io
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from dana.atomic import write_text_atomic
from dana.errors import ConfigError, DataError
from dana.textfile import is_number


class TimingModel:
    """Draws computation times; its state is the random generator's (and a position)."""

    name: str = ""

    def __init__(self, workers: int, seed: int = 0):
        self.workers = workers
        self.rng = np.random.Generator(np.random.PCG64(seed))

    def sample(self, worker: int) -> float:
        raise NotImplementedError

    def mean_time(self, worker: int) -> float:
        """The expected duration of worker ``worker``'s computations (its speed is the
        inverse): what Dynamic Local Updates read (:func:`relative_speeds`)."""
        raise NotImplementedError(f"timing model {self.name!r} gives no mean step time")

    def params(self) -> dict[str, Any]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state["rng"]


class Constant(TimingModel):
    name = "constant"

    def __init__(self, workers: int, seed: int = 0, duration: float = 1.0):
        super().__init__(workers, seed)
        self.duration = _positive("duration", duration)

    def sample(self, worker: int) -> float:
        return self.duration

    def mean_time(self, worker: int) -> float:
        return self.duration

    def params(self) -> dict[str, Any]:
        return {"duration": self.duration}


class Gamma(TimingModel):
    name = "gamma"

    def __init__(self, workers: int, seed: int = 0, shape: float = 100.0, scale: float = 1.28):
        super().__init__(workers, seed)
        self.shape = _positive("shape", shape)
        self.scale = _positive("scale", scale)

    def sample(self, worker: int) -> float:
        return float(self.rng.gamma(self.shape, self.scale))

    def mean_time(self, worker: int) -> float:
        return self.shape * self.scale

    def params(self) -> dict[str, Any]:
        return {"shape": self.shape, "scale": self.scale}


class Lognormal(TimingModel):
    name = "lognormal"

    def __init__(self, workers: int, seed: int = 0, mean: float = 128.0, cv: float = 0.1):
        super().__init__(workers, seed)
        self.mean = _positive("mean", mean)
        self.cv = _positive("cv", cv)
        self.sigma = math.sqrt(math.log1p(self.cv**2))
        self.mu = math.log(self.mean) - self.sigma**2 / 2

    def sample(self, worker: int) -> float:
        return float(self.rng.lognormal(self.mu, self.sigma))

    def mean_time(self, worker: int) -> float:
        return self.mean

    def params(self) -> dict[str, Any]:
        return {"mean": self.mean, "cv": self.cv}


class Pareto(TimingModel):
    name = "pareto"

    def __init__(self, workers: int, seed: int = 0, mean: float = 128.0, alpha: float = 3.0):
        super().__init__(workers, seed)
        self.mean = _positive("mean", mean)
        if not (isinstance(alpha, int | float) and not isinstance(alpha, bool) and alpha > 1):
            raise ConfigError(
                f"timing parameter alpha (the Pareto tail index) must be a number > 1 (a "
                f"finite mean), got {alpha!r}"
            )
        self.alpha = _positive("alpha", alpha)
        self.scale = self.mean * (self.alpha - 1) / self.alpha  # x_m

    def sample(self, worker: int) -> float:
        # numpy's pareto is Lomax (Pareto II from 0): x_m * (1 + Lomax) is Pareto I.
        return float(self.scale * (1.0 + self.rng.pareto(self.alpha)))

    def mean_time(self, worker: int) -> float:
        return self.mean

    def params(self) -> dict[str, Any]:
        return {"mean": self.mean, "alpha": self.alpha}


class Heterogeneous(TimingModel):
    name = "heterogeneous"

    def __init__(
        self,
        workers: int,
        seed: int = 0,
        mean: float = 128.0,
        machine_cv: float = 0.3,
        task_cv: float = 0.1,
    ):
        super().__init__(workers, seed)
        self.mean = _positive("mean", mean)
        self.machine_cv = _positive("machine_cv", machine_cv)
        self.task_cv = _positive("task_cv", task_cv)
        shape = 1.0 / machine_cv**2
        self.worker_means = self.rng.gamma(shape, mean / shape, size=workers)

    def sample(self, worker: int) -> float:
        shape = 1.0 / self.task_cv**2
        return float(self.rng.gamma(shape, self.worker_means[worker] / shape))

    def mean_time(self, worker: int) -> float:
        return float(self.worker_means[worker])

    def params(self) -> dict[str, Any]:
        return {"mean": self.mean, "machine_cv": self.machine_cv, "task_cv": self.task_cv}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "worker_means": self.worker_means.tolist()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.worker_means = np.asarray(state["worker_means"], dtype=float)


class Trace(TimingModel):
    name = "trace"

    def __init__(self, workers: int, seed: int = 0, path: str | None = None):
        super().__init__(workers, seed)
        if not path:
            raise ConfigError("timing 'trace' needs a file: pass --timing-trace FILE")
        if not isinstance(path, str | os.PathLike):
            raise ConfigError(
                f"timing 'trace': the trace's path must be a file name (a string), got {path!r}"
            )
        self.path = str(path)
        self.durations = read_trace(path)
        self.position = [0] * workers

    def sample(self, worker: int) -> float:
        series = self.durations[worker % len(self.durations)]
        value = series[self.position[worker] % len(series)]
        self.position[worker] += 1
        return value

    def mean_time(self, worker: int) -> float:
        series = self.durations[worker % len(self.durations)]
        return math.fsum(series) / len(series)

    def params(self) -> dict[str, Any]:
        return {"path": self.path}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "position": list(self.position)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.position = [int(p) for p in state["position"]]


def relative_speeds(model: TimingModel) -> list[float]:
    """Each worker's speed relative to the fastest worker's, in ``(0, 1]``: the fastest
    worker's mean step time over this worker's (exactly 1.0 for every worker with the
    fastest mean, so equal speeds give 1.0 everywhere)."""
    means = [model.mean_time(i) for i in range(model.workers)]
    fastest = min(means)
    return [fastest / m for m in means]


def read_trace_rows(path: str | Path, what: str = "timing trace") -> list[list[str]]:
    """The rows of a ``worker,duration[,...]`` CSV (``step_times.csv``), its header first
    (checked); DataError naming ``what`` for a file that cannot be read or lacks it."""
    path = Path(path)
    try:
        with path.open(newline="") as f:
            rows = list(csv.reader(f))
    except OSError as e:
        raise DataError(f"{path}: cannot read the {what}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise DataError(f"{path}: the {what} is not a text (CSV) file") from None
    if not rows or [c.strip() for c in rows[0][:2]] != ["worker", "duration"]:
        raise DataError(f"{path}: a {what} must start with the header 'worker,duration'")
    return rows


def read_trace(path: str | Path) -> list[list[float]]:
    """Per-worker durations from a ``worker,duration`` CSV, workers renumbered 0..m-1."""
    path = Path(path)
    rows = read_trace_rows(path)
    series: dict[str, list[float]] = {}
    for line, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        try:
            worker, duration = row[0].strip(), float(row[1])
        except (IndexError, ValueError):
            raise DataError(f"{path}:{line}: expected 'worker,duration', got {row!r}") from None
        if not (math.isfinite(duration) and 0 < duration <= MAX_DURATION):
            raise DataError(
                f"{path}:{line}: duration must be a positive number at most {MAX_DURATION:g} "
                f"(sums of larger ones overflow the simulated clock; rescale the trace), "
                f"got {row[1]!r}"
            )
        series.setdefault(worker, []).append(duration)
    if not series:
        raise DataError(f"{path}: the timing trace has no rows")
    return [series[w] for w in sorted(series, key=_worker_key)]


def write_trace(
    path: str | Path,
    rows: list[tuple[int, float]],
    extra: dict[str, list[float]] | None = None,
) -> None:
    """Write ``(worker, duration)`` rows in the format :func:`read_trace` reads (at once:
    a kill leaves the old file or the new one); ``extra``: more columns by name, one value
    per row, after the two (``read_trace`` reads the first two)."""
    extra = extra or {}
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["worker", "duration", *extra])
    for n, (w, t) in enumerate(rows):
        writer.writerow([w, repr(float(t)), *(repr(float(v[n])) for v in extra.values())])
    write_text_atomic(path, buffer.getvalue())


def _worker_key(worker: str) -> tuple[int, str]:
    return (int(worker), "") if worker.isdigit() else (1 << 62, worker)


#: The longest step a timing model may give: the simulated clock sums durations, and a
#: run of 1e12 steps of this length still stays finite (1e308 would overflow to inf).
MAX_DURATION = 1e100


def _positive(name: str, value: float) -> float:
    if not (is_number(value) and 0 < value <= MAX_DURATION):
        raise ConfigError(
            f"timing parameter {name} must be a positive number at most {MAX_DURATION:g}, "
            f"got {value!r}"
        )
    return float(value)


TIMING_MODELS: dict[str, type[TimingModel]] = {
    cls.name: cls for cls in (Constant, Gamma, Lognormal, Pareto, Heterogeneous, Trace)
}


def build_timing(name: str, workers: int, seed: int = 0, **params: Any) -> TimingModel:
    """Build the timing model ``name`` for ``workers`` workers."""
    if name not in TIMING_MODELS:
        raise ConfigError(
            f"unknown timing model {name!r}; choose one of: {', '.join(TIMING_MODELS)}"
        )
    cls = TIMING_MODELS[name]
    accepted = [p for p in inspect.signature(cls.__init__).parameters][3:]
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ConfigError(
            f"timing {name!r} takes no parameter {', '.join(unknown)}; "
            f"it takes: {', '.join(accepted)}"
        )
    return cls(workers, seed, **params)
