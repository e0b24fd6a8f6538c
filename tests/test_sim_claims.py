"""The paper's claims, on a problem cheap enough for the test suite.

Claim 1 (ALGORITHMS.md, "The paper's setting and claims"): with momentum and many
workers, NAG-ASGD and Multi-ASGD lose accuracy or diverge, while DANA stays close to the
single-worker baseline with the single-worker hyper-parameters. Claim 2: DANA's gap is
far smaller than theirs.

The problem: least squares, d = 50, n = 2000, batch 32, columns scaled from 1 to 0.1
(curvature spread 100), noisy targets (noise 0.1: the optimum's loss is about 0.0052);
k = 16 workers, momentum 0.9, gamma timing, 20 epochs, a constant lr. The baseline is
one-worker Nesterov SGD (``dana-slim`` with k = 1, which is
``torch.optim.SGD(nesterov=True)``).

Measured (seed 0), final full-data loss relative to the baseline:

============  ==========================  ==================  ===================
lr            baseline (k=1) / optimum    dana-zero, -slim    nag-asgd, multi-asgd
============  ==========================  ==================  ===================
0.01          0.00615 / 0.00517           0.95x, 0.94x        6e5x, 22x
0.02 (here)   0.00530 / 0.00517           0.99x, 0.99x        4e28x, 4.4e3x
0.05          0.00575                     1.8e4x, 6e4x        diverged, 1e11x
============  ==========================  ==================  ===================

At lr = 0.02 the statement holds for problem seeds 0-3 and condition numbers 1-100
(DANA within 0.88x-1.02x of the baseline; Multi-ASGD at least 450x, NAG-ASGD
diverged). At 0.05 DANA breaks down too: the claim is about a learning rate that suits
one worker, not any learning rate. The gap is compared at lr = 0.005, where all four
converge, so that a diverging run does not make the comparison trivial: NAG-ASGD's mean
gap is 3.3x DANA-Zero's and Multi-ASGD's 5.6x (seeds 0-2: 3.3-3.9x and 5.6-6.0x).
"""

from __future__ import annotations

import math

import pytest

K, MOMENTUM, EPOCHS, BATCH = 16, 0.9, 20, 32
LR = 0.02  # one-worker Nesterov converges here (see the module docstring)
GAP_LR = 0.005  # every algorithm converges here


@pytest.fixture(scope="module")
def problem(least_squares):
    return least_squares(d=50, n=2000, cond=10.0, noise=0.1, seed=0)


@pytest.fixture(scope="module")
def final(problem, simulator):
    """``final(name, workers, lr) -> (final full-data loss, simulator)``."""

    def run(name, workers, lr):
        sim = simulator(
            name, workers, problem, lr=lr, batch_size=BATCH, timing="gamma", momentum=MOMENTUM
        )
        sim.run(epochs=EPOCHS)
        return problem.loss(sim.params()), sim

    return run


@pytest.fixture(scope="module")
def losses(final):
    out = {"baseline": final("dana-slim", 1, LR)[0]}
    for name in ("dana-zero", "dana-slim", "nag-asgd", "multi-asgd"):
        out[name] = final(name, K, LR)[0]
    return out


def _diverged_or_worse(loss, baseline, factor):
    return not math.isfinite(loss) or loss >= factor * baseline


def test_one_worker_baseline_converges(problem, losses):
    optimum, initial = problem.optimum_loss(), problem.loss(problem.X.new_zeros(problem.d))
    assert initial > 1000 * optimum  # starting far away: converging means something
    assert losses["baseline"] < 1.1 * optimum, (losses["baseline"], optimum)


@pytest.mark.parametrize("name", ["dana-zero", "dana-slim"])
def test_dana_stays_at_the_baseline(losses, name):
    ratio = losses[name] / losses["baseline"]
    assert 0.9 < ratio < 1.1, f"{name}: {losses[name]:.4g} vs baseline {losses['baseline']:.4g}"


@pytest.mark.parametrize("name", ["nag-asgd", "multi-asgd"])
def test_momentum_asgd_breaks_down(losses, name):
    assert _diverged_or_worse(losses[name], losses["baseline"], 10.0), (
        f"{name}: {losses[name]:.4g} vs baseline {losses['baseline']:.4g}"
    )


def test_dana_gap_is_smaller(final):
    gaps, finals = {}, {}
    for name in ("dana-zero", "dana-slim", "nag-asgd", "multi-asgd"):
        finals[name], sim = final(name, K, GAP_LR)
        gaps[name] = float(sim.log.numpy()["gap"].mean())
    # Everybody converges at this lr: a small loss, no runaway.
    assert all(loss < 0.05 for loss in finals.values()), finals
    assert gaps["dana-slim"] == pytest.approx(gaps["dana-zero"], rel=1e-6)
    assert gaps["nag-asgd"] > 2.5 * gaps["dana-zero"], gaps
    assert gaps["multi-asgd"] > 4.0 * gaps["dana-zero"], gaps
