"""The event-driven simulator: DANA-Slim == DANA-Zero, staleness, gap, determinism, resume.

Also the learning-rate schedule it follows (warm-up from ``lr/k``, step decay).
"""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch

import dana.algorithms as A
from dana.sim import Simulator
from dana.train.rules.schedule import LRSchedule
from dana.train.task.batches import BatchStream

M = 0.9


# --------------------------------------------------------------------------------------
# DANA-Slim and DANA-Zero send every worker the same parameters (constant lr)


@pytest.mark.parametrize("k", [2, 7, 32])
@pytest.mark.parametrize("timing", ["gamma", "heterogeneous"])
def test_dana_slim_sends_what_dana_zero_sends(simulator, least_squares, rel_diff, k, timing):
    problem = least_squares(d=20, n=512)
    kw = dict(lr=0.01, timing=timing, seed=k, weight_decay=1e-3, momentum=M)
    slim, zero = simulator("dana-slim", k, problem, **kw), simulator("dana-zero", k, problem, **kw)
    assert torch.equal(slim.sent, zero.sent)
    worst_sent = worst_theta = 0.0
    for _ in range(400):
        slim.step()
        zero.step()
        worst_sent = max(worst_sent, rel_diff(slim.sent, zero.sent))
        # Slim's master holds Theta; theta = Theta + lr*m*sum_j v_j is DANA-Zero's theta.
        theta = slim.master.gap_reference() + slim.worker_rule.theta_offset(0.01)
        worst_theta = max(worst_theta, rel_diff(theta, zero.master.params()))
    assert list(slim.log.worker) == list(zero.log.worker)
    assert len(set(slim.log.worker)) == k  # every worker took part
    assert worst_sent <= 1e-9, worst_sent
    assert worst_theta <= 1e-9, worst_theta
    # The run moved far enough for the comparison to mean something.
    assert float(zero.master.params().norm()) > 0.5
    # The gap measured on the rebuilt theta is DANA-Zero's gap.
    gs, gz = slim.log.numpy()["gap"], zero.log.numpy()["gap"]
    np.testing.assert_allclose(gs, gz, rtol=1e-6, atol=1e-12)
    assert gz[k:].min() > 0


def test_dana_slim_and_zero_differ_under_a_changing_lr(simulator, least_squares, rel_diff):
    """The equivalence needs a constant lr: with a warm-up they part (a sanity check)."""
    problem = least_squares(d=20, n=512)
    schedule = LRSchedule(0.01, workers=8, warmup_epochs=2)
    kw = dict(lr=schedule, timing="gamma", momentum=M)
    slim, zero = simulator("dana-slim", 8, problem, **kw), simulator("dana-zero", 8, problem, **kw)
    slim.run(pushes=100)
    zero.run(pushes=100)
    assert rel_diff(slim.sent, zero.sent) > 1e-6


# --------------------------------------------------------------------------------------
# Staleness and gap


@pytest.mark.parametrize("k", [1, 2, 5, 16])
@pytest.mark.parametrize("name", ["asgd", "dana-slim", "nag-asgd"])
def test_constant_timing_staleness_is_k_minus_1(simulator, name, k):
    sim = simulator(name, k, timing="constant")
    sim.run(pushes=10 * k)
    log = sim.log.numpy()
    assert list(log["staleness"][:k]) == list(range(k))  # the first round fills up
    assert (log["staleness"][k:] == k - 1).all()
    assert list(log["worker"]) == list(range(k)) * 10  # round robin
    assert list(log["sim_time"]) == [1.0 + j // k for j in range(10 * k)]


@pytest.mark.parametrize("k", [1, 4])
def test_ssgd_has_no_staleness_and_no_gap(simulator, k):
    sim = simulator("ssgd", k, timing="gamma")
    sim.run(pushes=20 * k)
    log = sim.log.numpy()
    assert sim.updates == 20 and len(log["worker"]) == 20 * k
    assert (log["staleness"] == 0).all()
    assert (log["gap"] == 0).all()
    assert sorted(log["worker"][:k]) == list(range(k))
    # A round costs its slowest computation: times grow by at least the mean, ~128.
    rounds = log["sim_time"][::k]
    assert (np.diff(rounds) > 100).all()
    # Nesterov SSGD computes at the look-ahead: a gap, but still no staleness.
    nag = simulator("ssgd", k, timing="gamma", nesterov=True)
    nag.run(pushes=20 * k)
    assert (nag.log.numpy()["staleness"] == 0).all()
    assert nag.log.numpy()["gap"][k:].min() > 0


def test_gap_is_rms_of_theta_minus_pulled(simulator):
    """The recorded gap is ``||theta_now - p_i|| / sqrt(d)``, recomputed by hand."""
    sim = simulator("multi-asgd", 4, momentum=M)
    sim.run(pushes=20)
    for _ in range(10):
        i = sim.schedule.queue[0][1]  # the worker whose push comes next
        expected = float((sim.master.theta - sim.sent[i]).norm()) / math.sqrt(sim.master.d)
        sim.step()
        assert sim.log.gap[-1] == pytest.approx(expected, rel=1e-12)
        assert sim.log.worker[-1] == i


def test_measure_gap_off_records_nan(simulator):
    sim = simulator("dana-slim", 3, measure_gap=False)
    sim.run(pushes=10)
    assert np.isnan(sim.log.numpy()["gap"]).all()


# --------------------------------------------------------------------------------------
# Determinism


def _run(simulator, problem, seed, name="dana-slim", timing="gamma", pushes=200):
    sim = simulator(name, 6, problem, timing=timing, seed=seed, momentum=M)
    sim.run(pushes=pushes)
    return sim


@pytest.mark.parametrize("timing", ["constant", "gamma", "heterogeneous"])
def test_same_seed_same_run(simulator, least_squares, timing):
    problem = least_squares()
    a, b = _run(simulator, problem, 3, timing=timing), _run(simulator, problem, 3, timing=timing)
    la, lb = a.log.numpy(), b.log.numpy()
    for col in la:
        assert np.array_equal(la[col], lb[col]), col
    assert torch.equal(a.params(), b.params())
    assert torch.equal(a.sent, b.sent)
    assert a.sim_time == b.sim_time


@pytest.mark.parametrize("timing", ["gamma", "heterogeneous"])
def test_other_seed_other_run(simulator, least_squares, timing):
    problem = least_squares()
    a, b = _run(simulator, problem, 3, timing=timing), _run(simulator, problem, 4, timing=timing)
    assert not np.array_equal(a.log.numpy()["sim_time"], b.log.numpy()["sim_time"])
    assert not np.array_equal(a.log.numpy()["worker"], b.log.numpy()["worker"])
    assert not torch.equal(a.params(), b.params())


def test_trace_timing_drives_the_order(simulator, tmp_path):
    """Worker 0 takes 1, worker 1 takes 3: worker 0 pushes three times per push of 1."""
    path = tmp_path / "times.csv"
    path.write_text("worker,duration\n0,1.0\n1,3.0\n")
    sim = simulator("asgd", 2, timing="trace", timing_params={"path": str(path)})
    sim.run(pushes=12)
    log = sim.log.numpy()
    # Times 1,2,3,3(w1),4,5,6,6(w1),...: ties go to the lower worker index.
    assert list(log["worker"]) == [0, 0, 0, 1] * 3
    assert list(log["sim_time"]) == [1, 2, 3, 3, 4, 5, 6, 6, 7, 8, 9, 9]


# --------------------------------------------------------------------------------------
# Save and resume: bit-identical continuation

RESUME_CASES = [
    ("dana-slim", {"momentum": M}, "gamma"),
    ("dana-zero", {"momentum": M}, "heterogeneous"),
    ("gap-aware", {"momentum": M}, "gamma"),
    ("ssgd", {"momentum": M}, "gamma"),
    ("dc-asgd", {"momentum": M, "adaptive": True, "lc": 2.0}, "heterogeneous"),
    ("dana-ga", {"momentum": M}, "trace"),
]


@pytest.mark.parametrize("name, hparams, timing", RESUME_CASES, ids=[c[0] for c in RESUME_CASES])
def test_resume_is_bit_identical(least_squares, tmp_path, name, hparams, timing):
    problem = least_squares(d=8, n=100)  # 12 batches an epoch: the stream reshuffles
    trace = tmp_path / "t.csv"
    trace.write_text("worker,duration\n0,5\n0,7\n1,3\n2,11\n2,2\n")
    timing_params = {"path": str(trace)} if timing == "trace" else None
    schedule = LRSchedule(0.02, workers=4, warmup_epochs=1, decay_epochs=(4,))

    def make():
        return Simulator(
            A.build(name, **hparams),
            torch.zeros(problem.d, dtype=torch.float64),
            problem.gradient,
            BatchStream(problem.n, 8, seed=5),
            4,
            lr=schedule,
            weight_decay=1e-3,
            timing=timing,
            timing_params=timing_params,
            seed=9,
        )

    n, total = 37, 37 + 41
    full = make()
    full.run(pushes=n)
    saved, saved_steps = full.state_dict(), full.steps
    buffer = io.BytesIO()
    torch.save(saved, buffer)  # a checkpoint goes through a file
    full.run(pushes=total)
    assert full.epoch > 4  # warm-up and a decay happened across the save

    resumed = make()
    buffer.seek(0)
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    assert resumed.steps == saved_steps >= n  # ssgd steps a round of 4 at a time
    resumed.run(pushes=total)

    assert torch.equal(resumed.params(), full.params())
    assert torch.equal(resumed.sent, full.sent)
    assert resumed.sim_time == full.sim_time
    la, lb = resumed.log.numpy(), full.log.numpy()
    for col in la:
        assert np.array_equal(la[col], lb[col], equal_nan=True), col
    assert len(lb["worker"]) == full.pushes


def test_resume_rejects_another_shape(simulator, least_squares):
    a = simulator("dana-slim", 4, least_squares(d=8))
    b = simulator("dana-slim", 3, least_squares(d=8))
    with pytest.raises(ValueError, match="workers, d"):
        b.load_state_dict(a.state_dict())


# --------------------------------------------------------------------------------------
# Validation


@pytest.mark.parametrize("wd", [-1e-4, -1, math.nan])
def test_negative_weight_decay(simulator, wd):
    with pytest.raises(ValueError, match="weight_decay"):
        simulator("asgd", 2, weight_decay=wd)


@pytest.mark.parametrize("workers", [0, -1, 2.5])
def test_simulator_rejects_bad_workers(simulator, workers):
    with pytest.raises(ValueError, match=str(workers)):
        simulator("asgd", workers)


@pytest.mark.parametrize("lr", [0, -0.1, math.nan, math.inf])
def test_bad_constant_lr(simulator, lr):
    with pytest.raises(ValueError, match="lr"):
        simulator("asgd", 2, lr=lr)


def test_run_needs_exactly_one_budget(simulator):
    sim = simulator("asgd", 2)
    with pytest.raises(ValueError, match="exactly one"):
        sim.run()
    with pytest.raises(ValueError, match="exactly one"):
        sim.run(pushes=3, epochs=1)


def test_run_by_epochs_and_callback(simulator, least_squares):
    problem = least_squares(n=256)  # 32 batches of 8 an epoch
    sim = simulator("dana-slim", 3, problem)
    sim.run(epochs=1.5)
    assert sim.steps == 48 and sim.epoch == 1.5
    sim.run(pushes=1000, callback=lambda s: s.steps >= 60)
    assert sim.steps == 60


# --------------------------------------------------------------------------------------
# The learning-rate schedule


def test_schedule_warmup_is_linear_from_lr_over_k():
    s = LRSchedule(0.4, workers=8, warmup_epochs=5)
    assert s(0.0) == pytest.approx(0.05)
    assert s(5.0) == 0.4 and s(100.0) == 0.4
    xs = np.linspace(0, 5, 11, endpoint=False)
    ys = np.array([s(x) for x in xs])
    np.testing.assert_allclose(ys, 0.05 + (0.4 - 0.05) * xs / 5, rtol=1e-14)
    assert (np.diff(ys) > 0).all()
    # One worker: no warm-up to speak of.
    assert LRSchedule(0.4, workers=1, warmup_epochs=5)(0.0) == 0.4


def test_schedule_step_decay():
    s = LRSchedule(0.1, workers=4, warmup_epochs=0, decay_epochs=(80, 120))
    assert s(0) == 0.1 and s(79.999) == 0.1
    assert s(80) == pytest.approx(0.01) and s(119.9) == pytest.approx(0.01)
    assert s(120) == pytest.approx(0.001) and s(160) == pytest.approx(0.001)
    s = LRSchedule(0.1, decay_epochs=[2], decay_factor=0.5)
    assert s(1) == 0.1 and s(2) == 0.05


@pytest.mark.parametrize("lr", [0, -0.1, math.nan, math.inf])
def test_schedule_rejects_bad_lr(lr):
    with pytest.raises(ValueError, match="lr"):
        LRSchedule(lr)


def test_schedule_rejects_bad_settings():
    with pytest.raises(ValueError, match="warmup_epochs"):
        LRSchedule(0.1, warmup_epochs=-1)
    with pytest.raises(ValueError, match="decay_factor"):
        LRSchedule(0.1, decay_factor=0)
    with pytest.raises(ValueError, match="decay_epochs"):
        LRSchedule(0.1, decay_epochs=(120, 80))
    with pytest.raises(ValueError, match="decay_epochs"):
        LRSchedule(0.1, decay_epochs=(0,))


def test_simulator_follows_the_schedule_per_push(simulator, least_squares):
    problem = least_squares(n=80)  # 10 batches an epoch
    schedule = LRSchedule(0.02, workers=5, warmup_epochs=2, decay_epochs=(3,))
    sim = simulator("dana-zero", 5, problem, lr=schedule, momentum=M)
    sim.run(pushes=40)
    lrs = sim.log.numpy()["lr"]
    # Push j is processed after j earlier gradient computations: epoch j / 10.
    np.testing.assert_allclose(lrs, [schedule(j / 10) for j in range(40)], rtol=0, atol=0)
    assert lrs[0] == pytest.approx(0.004) and lrs[25] == 0.02 and lrs[35] == pytest.approx(0.002)


@pytest.mark.parametrize("k", [2, 4])
def test_ssgd_applies_the_schedule_once_per_round(simulator, least_squares, k):
    """A round is one update: the rate the master applies at update u is the schedule at
    the round's start (epoch u*k/10), and every push of the round logs that rate."""
    problem = least_squares(n=80)  # 10 batches an epoch
    schedule = LRSchedule(0.02, workers=k, warmup_epochs=2, decay_epochs=(3,))
    sim = simulator("ssgd", k, problem, lr=schedule, momentum=M)
    applied = []
    push = sim.master.push

    def recording_push(worker, message, lr):
        moved = push(worker, message, lr)
        if moved:
            applied.append(lr)
        return moved

    sim.master.push = recording_push
    rounds = 40 // k
    sim.run(pushes=rounds * k)
    expected = [schedule(u * k / 10) for u in range(rounds)]
    assert applied == expected
    np.testing.assert_array_equal(sim.log.numpy()["lr"], np.repeat(expected, k))
    assert applied[0] == pytest.approx(0.02 / k)  # the warm-up starts at lr / k
