"""What several test files share: small problems for the algorithm, simulator and claim
tests, hand-made run directories for the report tests (:func:`fake_run`), and for the
Ray runtime's tests one local Ray for the session (:func:`local_ray`), tiny runs
(:func:`tiny`, :func:`run_on_ray`), their accounting (:func:`check_accounting`) and the
processes they leave (:func:`descendants`, :func:`kill_tree`).

Everything is float64 and seeded, so equalities between algorithms can be asserted
to rounding and runs are reproducible.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor

import dana.algorithms as A
from dana.algorithms.base import Algorithm
from dana.sim import Simulator
from dana.train.cluster.timing import read_trace
from dana.train.config import TrainConfig
from dana.train.records.progress import Progress
from dana.train.records.rundir import METRICS_COLUMNS, RunDir
from dana.train.task.batches import BatchStream
from dana.train.task.problem import Problem

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


#: The Simulator's keyword-only arguments: :func:`make_simulator` passes these on to it.
SIMULATOR_OPTIONS = {
    name
    for name, p in inspect.signature(Simulator.__init__).parameters.items()
    if p.kind is p.KEYWORD_ONLY
}


def make_simulator(
    algorithm: str | Algorithm,
    workers: int,
    problem: LeastSquares | None = None,
    /,
    *,
    lr: float | Callable[[float], float] = 0.01,
    batch_size: int = 8,
    batches: Any = None,
    seed: int = 0,
    weight_decay: float = 0.0,
    **options: Any,
) -> Simulator:
    """A simulator of ``algorithm`` (a name, or an Algorithm) on a least-squares problem.

    The parameters start at zero; the batches are ``batches`` (default: a stream of
    ``batch_size`` seeded ``seed``); ``options`` that name a Simulator argument
    (:data:`SIMULATOR_OPTIONS`: ``timing``, ``compress``, ``servers``, ``cluster``...)
    go to it, the others to :func:`dana.algorithms.build` (``workers`` too: the
    elastic-averaging rules take it).
    """
    problem = problem or make_least_squares()
    hparams = {k: v for k, v in options.items() if k not in SIMULATOR_OPTIONS}
    if isinstance(algorithm, str):
        algorithm = A.build(algorithm, **hparams)
    return Simulator(
        algorithm,
        torch.zeros(problem.d, dtype=torch.float64),
        problem.gradient,
        BatchStream(problem.n, batch_size, seed=seed) if batches is None else batches,
        workers,
        lr=lr,
        weight_decay=weight_decay,
        seed=seed,
        **{k: v for k, v in options.items() if k in SIMULATOR_OPTIONS},
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
        "sim_time": 100.0 * (len(errors) - 1) * time_scale / k,
        **(summary_extra or {}),
    }
    (run / "summary.json").write_text(json.dumps(summary))


# -- the Ray runtime's tests: one local Ray, tiny runs, their accounting, processes ------
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests marked ``ray`` run in two groups (pytest-xdist's ``--dist loadgroup``,
    pyproject's addopts), each in one process, one test after another on that process's
    one Ray: :data:`RAY_SECOND_GROUP_MODULES` and the others. The processes
    take the rest meanwhile: the Ray tests, which wait much of their time (deadlines,
    modelled compute), overlap each other and the single-threaded ones."""
    for item in items:
        if item.get_closest_marker("ray") is not None:
            module = Path(str(item.fspath)).name
            group = "ray-2" if module in RAY_SECOND_GROUP_MODULES else "ray"
            item.add_marker(pytest.mark.xdist_group(group))


#: The Ray test modules of the second group (:func:`pytest_collection_modifyitems`): the
#: fault tests, and the benchmarks' Ray smoke runs so that both groups take about as long.
RAY_SECOND_GROUP_MODULES = {
    "test_ps_faults.py", "test_ps_nodes.py", "test_ps_ray_job.py", "test_ps_membership.py",
    "test_ps_emulation.py", "test_bench_smoke.py", "test_ps_replay.py",
}  # fmt: skip


try:
    import ray
except ImportError:  # the tests that need it skip
    ray = None

#: Skip where Ray is not installed.
needs_ray = pytest.mark.skipif(ray is None, reason="needs Ray: pip install 'ray>=2.9'")


@pytest.fixture(scope="session")
def local_ray():
    """One local Ray for every in-process Ray test of the session, as ``dana train``
    starts it (:func:`dana.ps.cluster.ray_session`: loopback only, no dashboard, the
    machine's CPUs, its actors at the driver's priority). A run in the tests finds it
    initialised and uses it; nothing in a test shuts it down."""
    if ray is None:
        pytest.skip("needs Ray: pip install 'ray>=2.9'")
    from dana.ps.cluster import ray_session

    with ray_session(None, actors=2):
        yield


def tiny(**overrides: Any) -> TrainConfig:
    """A run of a few seconds: an MLP on 1024 synthetic 16x16 images.

    The rate suits each rule: ``asgd`` (no momentum) 0.2; ``ssgd`` 0.1, one step along
    the mean of ``k`` gradients per round (at the schedule's rate of that round); the
    asynchronous momentum rules 0.05, one step per push."""
    algorithm = overrides.get("algorithm", "asgd")
    values: dict[str, Any] = dict(
        algorithm="asgd",
        workers=2,
        dataset="synthetic",
        model="mlp",
        train_size=1024,
        test_size=256,
        epochs=3.0,
        batch_size=32,
        lr={"asgd": 0.2, "ssgd": 0.1}.get(algorithm, 0.05),
        warmup_epochs=0.5,
        backend="ray",
    )
    values.update(overrides)
    return TrainConfig(**values).validate()


def run_on_ray(config: TrainConfig, out: Path, progress: Callable[[Any], Progress] | None = None):
    """Train ``config`` with a RayRun in this process (Ray already up); the RayRun.

    ``progress(runner)`` makes the progress reporter (default: a silent one).
    """
    from dana.ps.driver import RayRun

    run = RunDir(out)
    run.path.mkdir(parents=True)
    run.write_config(config.to_dict(), "test")
    runner = RayRun(config, run, Problem(config))
    reporter = progress(runner) if progress else Progress(enabled=False)
    runner.summary = runner.execute(reporter)
    run.write_summary(runner.summary)
    return runner


def check_accounting(runner: Any) -> dict[str, Any]:
    """Every numbered push applied exactly once on every shard, or refused after the end."""
    out = runner.run.path
    dist = json.loads((out / "dist.json").read_text())
    summary = runner.summary
    for shard in dist["shards"]:
        assert shard["seq_gaps"] == 0 and shard["duplicates"] == 0
        assert sum(shard["applied"]) == shard["pushes"]
        assert sum(shard["last_seq"]) == shard["pushes"] + shard["local_steps"]
    first = dist["shards"][0]
    assert dist["pushes_sent"] == sum(first["last_seq"]) + first["rejected_after_stop"]
    assert summary["pushes"] == first["pushes"] == len(runner.merger.log)
    trace = read_trace(out / "step_times.csv")
    assert sum(map(len, trace)) == summary["pushes"]
    assert list(RunDir(out).read_metrics()[0]) == list(METRICS_COLUMNS)
    return dist


def descendants(root: int) -> set[int]:
    """``root`` and every process under it."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, []))
    return found


def command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kill_tree(tag: str) -> int:
    """SIGKILL every process whose command line holds ``tag``, and their descendants
    (never this process); how many."""
    roots = [
        int(p)
        for p in os.listdir("/proc")
        if p.isdigit() and int(p) != os.getpid() and tag in command(int(p))
    ]
    victims = set().union(*(descendants(r) for r in roots)) - {os.getpid()} if roots else set()
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return len(victims)
