"""What several test files share: small problems for the algorithm, simulator and claim
tests, and hand-made run directories for the report tests (:func:`fake_run`).

Everything is float64 and seeded, so equalities between algorithms can be asserted
to rounding and runs are reproducible.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import Tensor

import dana.algorithms as A
from dana.algorithms.base import Algorithm
from dana.sim import Simulator
from dana.train.batches import BatchStream

# The problems here are tiny: a second intra-op thread only adds synchronisation, and on
# a busy machine its spin-waiting makes each small op many times slower.
torch.set_num_threads(1)


@dataclass
class LeastSquares:
    """``0.5 * |X p - y|^2 / n`` on batches of rows, with the minimiser's loss known."""

    X: Tensor
    y: Tensor

    @property
    def d(self) -> int:
        return self.X.shape[1]

    @property
    def n(self) -> int:
        return self.X.shape[0]

    def gradient(self, p: Tensor, rows: Tensor) -> tuple[Tensor, float]:
        Xb = self.X[rows]
        r = Xb @ p - self.y[rows]
        return Xb.T @ r / len(rows), 0.5 * float(r @ r) / len(rows)

    def loss(self, p: Tensor) -> float:
        r = self.X @ p - self.y
        return 0.5 * float(r @ r) / self.n

    def optimum_loss(self) -> float:
        return self.loss(torch.linalg.lstsq(self.X, self.y).solution)


def make_least_squares(
    d: int = 10, n: int = 256, cond: float = 10.0, noise: float = 0.1, seed: int = 0
) -> LeastSquares:
    """Columns scaled from 1 down to ``1/cond`` (curvature ``cond**2``), noisy targets."""
    g = torch.Generator().manual_seed(seed)
    scales = torch.logspace(0, -math.log10(cond), d, dtype=torch.float64)
    X = torch.randn(n, d, generator=g, dtype=torch.float64) * scales
    w = torch.randn(d, generator=g, dtype=torch.float64)
    y = X @ w + noise * torch.randn(n, generator=g, dtype=torch.float64)
    return LeastSquares(X, y)


def make_simulator(
    algorithm: str | Algorithm,
    workers: int,
    problem: LeastSquares | None = None,
    *,
    lr: float | Callable[[float], float] = 0.01,
    batch_size: int = 8,
    timing: str = "gamma",
    timing_params: dict | None = None,
    seed: int = 0,
    weight_decay: float = 0.0,
    measure_gap: bool = True,
    **hparams,
) -> Simulator:
    """A simulator of ``algorithm`` (a name, or an Algorithm) on a least-squares problem.

    The parameters start at zero; ``hparams`` go to :func:`dana.algorithms.build`.
    """
    problem = problem or make_least_squares()
    if isinstance(algorithm, str):
        algorithm = A.build(algorithm, **hparams)
    return Simulator(
        algorithm,
        torch.zeros(problem.d, dtype=torch.float64),
        problem.gradient,
        BatchStream(problem.n, batch_size, seed=seed),
        workers,
        lr=lr,
        weight_decay=weight_decay,
        timing=timing,
        timing_params=timing_params,
        seed=seed,
        measure_gap=measure_gap,
    )


@pytest.fixture(scope="session")
def least_squares() -> Callable[..., LeastSquares]:
    """The factory :func:`make_least_squares`."""
    return make_least_squares


@pytest.fixture(scope="session")
def simulator() -> Callable[..., Simulator]:
    """The factory :func:`make_simulator`."""
    return make_simulator


def max_rel_diff(a: Tensor, b: Tensor) -> float:
    """``max|a - b|`` relative to the scale of ``b`` (at least 1)."""
    return float((a - b).abs().max()) / max(1.0, float(b.abs().max()))


@pytest.fixture(scope="session")
def rel_diff() -> Callable[[Tensor, Tensor], float]:
    """The function :func:`max_rel_diff`."""
    return max_rel_diff


def fake_run(
    root: Path,
    name: str,
    algorithm: str,
    k: int,
    seed: int,
    errors: list[float],
    *,
    diverged: bool = False,
    gap: float = 1e-3,
    time_scale: float = 1.0,
    summary_extra: dict | None = None,
    **settings,
) -> None:
    """A hand-made run directory under ``root/runs/name`` (what ``dana report`` reads):
    evaluation i at epoch i, 10 i updates, simulated time 100 i / k (times
    ``time_scale``) and test error ``errors[i]``; ``settings`` go into config.json,
    ``summary_extra`` into summary.json."""
    run = root / "runs" / name
    run.mkdir(parents=True)
    config = {"algorithm": algorithm, "workers": k, "seed": seed, "dataset": "synthetic"}
    (run / "config.json").write_text(json.dumps({**config, **settings}))
    lines = [
        "epoch,updates,sim_time,wall_seconds,lr,train_loss,test_loss,test_error,mean_gap,"
        "mean_staleness"
    ]
    for i, e in enumerate(errors):
        lines.append(f"{i},{10 * i},{100.0 * i * time_scale / k},0,0.1,1,1,{e},{gap},{k - 1}")
    (run / "metrics.csv").write_text("\n".join(lines) + "\n")
    summary = {
        "final_test_error": None if diverged else errors[-1],
        "diverged": diverged,
        "mean_gap": gap,
        **(summary_extra or {}),
    }
    (run / "summary.json").write_text(json.dumps(summary))
