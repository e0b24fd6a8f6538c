"""Bounded staleness (``--max-staleness``): workers wait so that no push is too stale."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import dana.algorithms as A
from dana.cli import build_parser, collect_options, main
from dana.errors import ConfigError
from dana.sim import Simulator
from dana.train.config import TrainConfig
from dana.train.task.batches import BatchStream

F64 = torch.float64
SPREAD = {"machine_cv": 0.6, "task_cv": 0.3}  # strongly heterogeneous workers


def gradient_fn(d: int = 8, n: int = 128):
    g = torch.Generator().manual_seed(0)
    X = torch.randn(n, d, generator=g, dtype=F64)
    y = X @ torch.randn(d, generator=g, dtype=F64)

    def gradient(p, rows):
        r = X[rows] @ p - y[rows]
        return X[rows].T @ r / len(rows), 0.5 * float(r @ r) / len(rows)

    return gradient, d, n


def simulator(name="dana-slim", workers=8, bound=None, timing="heterogeneous", seed=0, **kw):
    gradient, d, n = gradient_fn()
    return Simulator(
        A.build(name),
        torch.zeros(d, dtype=F64),
        gradient,
        BatchStream(n, 8, seed=seed),
        workers,
        lr=0.02,
        timing=timing,
        timing_params=SPREAD if timing == "heterogeneous" else None,
        seed=seed,
        max_staleness=bound,
        **kw,
        weight_decay=0.0,
    )


def invariant(sim: Simulator) -> bool:
    """The r-th oldest in-flight worker could still push within the bound."""
    s = sim.max_staleness
    return len(sim.bound.gate.inflight) <= s + 1 and all(
        sim.updates - sim.pulled_at[j] + rank - 1 <= s
        for rank, j in enumerate(sim.bound.gate.inflight, start=1)
    )


@pytest.mark.parametrize("workers", [2, 5, 12])
@pytest.mark.parametrize("bound", [0, 1, 3, 8])
def test_staleness_never_exceeds_the_bound(workers, bound):
    free = simulator(workers=workers)
    free.run(pushes=1500)
    natural = int(free.log.numpy()["staleness"].max())
    sim = simulator(workers=workers, bound=bound)
    sim.run(pushes=1500, callback=lambda s: not invariant(s))
    staleness = sim.log.numpy()["staleness"]
    assert invariant(sim) and sim.steps == 1500  # computations; held ones not pushed yet
    assert len(staleness) == sim.pushes == 1500 - len(sim.held)
    assert staleness.max() <= bound
    if natural > bound:  # the bound binds: workers waited, and that took simulated time
        assert sim.waits > 0 and sim.wait_time > 0
        assert sim.sim_time > free.sim_time
    else:
        assert sim.wait_time == 0
    assert free.wait_time == 0 and free.waits == 0


def test_zero_bound_runs_one_worker_at_a_time():
    sim = simulator(workers=6, bound=0, timing="constant")
    sim.run(pushes=60)
    log = sim.log.numpy()
    assert (log["staleness"] == 0).all()
    np.testing.assert_allclose(log["sim_time"], np.arange(1, 61))  # one unit per push
    assert list(log["worker"][:6]) == list(range(6))  # and they take turns


def test_a_loose_bound_changes_nothing():
    free, loose = simulator(), simulator(bound=10**6)
    free.run(pushes=800)
    loose.run(pushes=800)
    a, b = free.log.numpy(), loose.log.numpy()
    for column in a:
        np.testing.assert_array_equal(a[column], b[column])
    assert torch.equal(free.params(), loose.params()) and free.sim_time == loose.sim_time


@pytest.mark.parametrize("name", ["easgd", "yellowfin-cl", "sa-asgd", "dc-asgd", "dana-zero"])
def test_every_algorithm_keeps_the_bound(name):
    sim = simulator(name, workers=6, bound=2)
    sim.run(pushes=1200)
    assert sim.log.numpy()["staleness"].max() <= 2 and sim.wait_time > 0


def test_held_pushes_are_applied_later_and_logged_then():
    sim = simulator(workers=8, bound=2)
    sim.run(pushes=1500)
    log = sim.log.numpy()
    assert (np.diff(log["sim_time"]) >= 0).all()  # pushes are applied in time order
    assert sim.pushes == sim.updates == len(log["worker"]) == sim.steps - len(sim.held)


def test_synchronous_algorithms_ignore_the_bound():
    sim = simulator("ssgd", workers=4, bound=0)
    sim.run(pushes=40)
    assert (sim.log.numpy()["staleness"] == 0).all() and sim.wait_time == 0


def test_checkpoint_holds_the_waiting_workers():
    first = simulator(workers=8, bound=1)
    first.run(pushes=301)
    state = first.state_dict()
    assert state["held"] or state["idle"] or state["inflight"]
    first.run(pushes=700)
    second = simulator(workers=8, bound=1)
    second.load_state_dict(state)
    second.run(pushes=700)
    assert torch.equal(first.params(), second.params())
    assert np.array_equal(first.log.numpy()["sim_time"], second.log.numpy()["sim_time"])
    assert (first.wait_time, first.waits) == (second.wait_time, second.waits)


@pytest.mark.parametrize("bound", [0, 1, 3])
def test_dana_slim_rebuilds_dana_zeros_theta_while_pushes_are_held(bound):
    """A held worker makes its message when its push is applied: until then its momentum
    is not in the rebuilt theta, as dana-zero's master has not updated it either."""
    slim = simulator("dana-slim", workers=8, bound=bound)
    zero = simulator("dana-zero", workers=8, bound=bound)
    slim.run(pushes=600)
    zero.run(pushes=600)
    assert slim.waits > 50
    np.testing.assert_allclose(slim.log.numpy()["gap"], zero.log.numpy()["gap"], rtol=1e-9)
    torch.testing.assert_close(slim.sent, zero.sent, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", ["dana-slim", "eamsgd"])
def test_checkpoint_taken_while_pushes_are_held(name):
    """Held gradients (dana-slim) and held messages (eamsgd, which takes local steps)
    survive a checkpoint: the continued run is the uninterrupted one, gaps included."""
    first = simulator(name, workers=8, bound=1)
    while not first.held:
        first.step()
    state = first.state_dict()
    first.run(pushes=first.steps + 300)
    second = simulator(name, workers=8, bound=1)
    second.load_state_dict(state)
    second.run(pushes=first.steps)
    assert torch.equal(first.params(), second.params())
    for column in ("gap", "sim_time", "worker"):
        assert np.array_equal(first.log.numpy()[column], second.log.numpy()[column])


def test_held_messages_of_older_checkpoints_load():
    """Before held gradients, a checkpoint's held entries were messages, with 4 fields."""
    sim = simulator("eamsgd", workers=8, bound=1)
    while not sim.held:
        sim.step()
    state = sim.state_dict()
    assert all(entry[4] for entry in state["held"])  # eamsgd holds messages
    state["held"] = [entry[:4] for entry in state["held"]]
    again = simulator("eamsgd", workers=8, bound=1)
    again.load_state_dict(state)
    assert [work.is_message for _, work, _ in again.held] == [True] * len(sim.held)
    again.run(pushes=sim.steps + 100)
    sim.run(pushes=sim.steps + 100)
    assert torch.equal(sim.params(), again.params())


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_invalid_bounds_are_rejected(bad):
    with pytest.raises(ValueError, match=repr(bad).replace(".", r"\.")):
        simulator(bound=bad)
    with pytest.raises(ConfigError, match="max-staleness"):
        TrainConfig(max_staleness=bad).validate()


def test_the_command_line_option_reaches_the_run(tmp_path):
    args = build_parser().parse_args(["train", "--max-staleness", "3"])
    assert collect_options(args)["max_staleness"] == 3
    assert TrainConfig().max_staleness is None
    out = tmp_path / "run"
    argv = ["train", "--algorithm", "dana-slim", "--dataset", "synthetic", "--model", "linear"]
    argv += ["--workers", "6", "--epochs", "2", "--batch-size", "32", "--timing"]
    argv += ["heterogeneous", "--max-staleness", "1", "--quiet", "--out", str(out)]
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["max_staleness"] <= 1 and summary["wait_time"] > 0
