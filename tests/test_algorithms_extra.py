"""YellowFin (open and closed loop), EASGD, EAMSGD, DANA-EASGD and SA-ASGD.

Registry and validation, the one-worker reductions, YellowFin against an independent
numpy implementation of the paper's algorithm, short training runs, checkpoints.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

import dana.algorithms as A
from dana.algorithms.yellowfin import cubic_root, single_step
from dana.cli import main
from dana.errors import ConfigError
from dana.sim import Simulator
from dana.train.config import TrainConfig
from dana.train.task.batches import BatchStream

NEW = ("yellowfin", "yellowfin-cl", "easgd", "eamsgd", "dana-easgd", "sa-asgd")
F64 = torch.float64


def least_squares(n: int = 256, d: int = 10, seed: int = 0):
    """A noisy least-squares problem: ``gradient(p, rows)`` and the full loss."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g, dtype=F64)
    y = X @ torch.randn(d, generator=g, dtype=F64) + 0.1 * torch.randn(n, generator=g, dtype=F64)

    def gradient(p, rows):
        r = X[rows] @ p - y[rows]
        return X[rows].T @ r / len(rows), 0.5 * float(r @ r) / len(rows)

    def loss(p):
        return 0.5 * float(((X @ p - y) ** 2).mean())

    return gradient, loss, d, n


def simulator(name, workers=4, timing="gamma", lr=0.05, seed=0, gradient=None, **hparams):
    grad, _, d, n = least_squares() if gradient is None else gradient
    return Simulator(
        A.build(name, **hparams),
        torch.zeros(d, dtype=F64),
        grad,
        BatchStream(n, 16, seed=seed),
        workers,
        lr=lr,
        timing=timing,
        seed=seed,
        weight_decay=0.0,
    )


# -- registry and validation ---------------------------------------------------------------
def test_registered_and_listed(capsys):
    for name in NEW:
        assert name in A.ALGORITHMS
        assert A.build(name).name == name
    assert main(["algorithms"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert set(NEW) <= set(listed)


@pytest.mark.parametrize(
    "name, hparams, bad",
    [
        ("yellowfin", {"beta": 1.0}, "1.0"),
        ("yellowfin", {"beta": -0.1}, "-0.1"),
        ("yellowfin", {"window": 0}, "0"),
        ("yellowfin", {"window": 2.5}, "2.5"),
        ("yellowfin-cl", {"gamma": 0.0}, "0.0"),
        ("yellowfin-cl", {"gamma": float("nan")}, "nan"),
        ("easgd", {"tau": 0}, "0"),
        ("easgd", {"tau": True}, "True"),
        ("easgd", {"beta": -1.0}, "-1.0"),
        ("easgd", {"alpha": 1.5}, "1.5"),
        ("easgd", {"alpha": -0.1}, "-0.1"),
        ("easgd", {"workers": 0}, "0"),
        ("easgd", {"beta": 3.0, "workers": 2}, "3.0/2"),
        ("eamsgd", {"momentum": 1.0}, "1.0"),
        ("dana-easgd", {"momentum": -0.5}, "-0.5"),
        ("sa-asgd", {"momentum": 1.5}, "1.5"),
    ],
)
def test_validation_names_the_bad_value(name, hparams, bad):
    with pytest.raises(ValueError, match=bad.replace(".", r"\.")):
        A.build(name, **hparams)


def test_unknown_hyper_parameter():
    with pytest.raises(ValueError, match="lc"):
        A.build("yellowfin", lc=1.0)


def test_elastic_alpha_is_beta_over_k():
    assert A.build("easgd").worker(4, 3).alpha == pytest.approx(0.9 / 4)
    assert A.build("easgd", workers=8).worker(1, 3).alpha == pytest.approx(0.9 / 8)
    assert A.build("easgd", alpha=0.3, workers=8).worker(1, 3).alpha == 0.3
    with pytest.raises(ValueError, match="workers=8, not 3"):
        A.build("eamsgd", workers=8).master(torch.zeros(2), 3)
    with pytest.raises(ValueError, match="4.5/4"):  # beta/k checked against the real k
        A.build("easgd", beta=0.9 * 5).master(torch.zeros(2), 4)


def test_config_passes_workers_to_elastic_algorithms():
    config = TrainConfig(algorithm="easgd", workers=6, algorithm_params={"workers": 2})
    assert config.algorithm_hparams()["workers"] == 6
    assert "workers" not in TrainConfig(algorithm="sa-asgd").algorithm_hparams()
    with pytest.raises(ConfigError, match="easgd"):
        TrainConfig(algorithm="easgd", workers=2, algorithm_params={"beta": 5.0}).validate()


# -- YellowFin against an independent implementation of the paper ------------------------------
def yellowfin_reference(x0, gradients, lr, beta, window, steps, gamma=None):
    """The paper's Algorithms 1-4 (and 5 at staleness 0) in numpy, step by step.

    Heavy ball ``x_{t+1} = x_t - alpha*g_t + mu*(x_t - x_{t-1})`` with the alpha and mu
    tuned after the previous gradient; zero-debiased moving averages; SingleStep's cubic
    solved with Vieta's substitution, as in the authors' code; alpha and mu smoothed
    with beta from the second gradient on.
    """
    x, x_prev = x0.copy(), x0.copy()
    mu, alpha, mu_alg = 0.0, lr, 0.0
    h_seen, g_avg = [], np.zeros_like(x0)
    hmin = hmax = sq = norm = dist = 0.0
    trace = []
    for t in range(1, steps + 1):
        g = gradients(x)
        used_mu, used_alpha = (mu if gamma is None else mu_alg), alpha
        x_new = x - used_alpha * g + used_mu * (x - x_prev)
        h = float(g @ g)  # CurvatureRange
        h_seen.append(h)
        hmin = beta * hmin + (1 - beta) * min(h_seen[-window:])
        hmax = beta * hmax + (1 - beta) * max(h_seen[-window:])
        sq = beta * sq + (1 - beta) * h  # Variance
        g_avg = beta * g_avg + (1 - beta) * g
        norm = beta * norm + (1 - beta) * math.sqrt(h)  # Distance
        debias = 1 - beta**t
        dist = beta * dist + (1 - beta) * (norm / debias) / (sq / debias)
        if t >= 2:
            h_min, h_max = hmin / debias, hmax / debias
            C = sq / debias - float((g_avg / debias) @ (g_avg / debias))
            D = dist / debias
            p = D**2 * h_min**2 / (2 * C)
            w3 = (-math.sqrt(p**2 + 4 / 27 * p**3) - p) / 2
            w = math.copysign(abs(w3) ** (1 / 3), w3)
            root = w - p / (3 * w) + 1
            dr = h_max / h_min
            mu_t = max(root**2, ((math.sqrt(dr) - 1) / (math.sqrt(dr) + 1)) ** 2)
            alpha_t = (1 - math.sqrt(mu_t)) ** 2 / h_min
            mu = beta * mu + (1 - beta) * mu_t
            alpha = beta * alpha + (1 - beta) * alpha_t
        if gamma is not None:  # total momentum measured at staleness 0, then the loop
            before, after = x - x_prev, x_new - x
            ratio = np.sort(
                (after[before != 0] + used_alpha * g[before != 0]) / before[before != 0]
            )
            if len(ratio):
                mu_total = ratio[(len(ratio) - 1) // 2]
                mu_alg = min(max(mu_alg + gamma * (mu - mu_total), -0.999), 0.999)
        x_prev, x = x, x_new
        trace.append((x.copy(), mu, alpha, mu_alg))
    return trace


CURVATURE = np.array([0.5, 1.0, 2.0, 4.0, 8.0])
NOISE = 0.3 * np.random.default_rng(0).standard_normal((50, 5))


def noisy_quadratic():
    """Gradients of ``0.5 * sum(h_j x_j^2)`` plus a fixed noise sequence."""
    calls = [0]

    def gradient(x):
        calls[0] += 1
        return CURVATURE * x + NOISE[calls[0] - 1]

    return gradient


def test_cubic_root_and_single_step():
    for p in (1e-6, 0.3, 1.0, 7.0, 1e4, 1e9):
        x = cubic_root(p)
        assert 0 <= x <= 1
        assert (1 - x) ** 3 == pytest.approx(p * x, rel=1e-9, abs=1e-12)
    mu, alpha = single_step(h_min=2.0, h_max=2.0, variance=1e-3, distance=0.1)
    x = cubic_root(0.1**2 * 2.0**2 / 2e-3)
    assert (mu, alpha) == pytest.approx((x * x, (1 - x) ** 2 / 2.0))


@pytest.mark.parametrize("name, gamma", [("yellowfin", None), ("yellowfin-cl", 0.2)])
def test_yellowfin_one_worker_matches_the_paper_step_by_step(name, gamma):
    steps, beta, window, lr = 12, 0.5, 3, 0.1
    x0 = np.ones(5)
    expected = yellowfin_reference(x0, noisy_quadratic(), lr, beta, window, steps, gamma)
    hparams = {"beta": beta, "window": window} | ({} if gamma is None else {"gamma": gamma})
    master = A.build(name, **hparams).master(torch.tensor(x0), workers=1)
    gradient, p = noisy_quadratic(), torch.empty(5, dtype=F64)
    for x, mu, alpha, mu_alg in expected:
        master.pull(0, lr, p)
        master.push(0, torch.from_numpy(gradient(p.numpy())), lr)
        np.testing.assert_allclose(master.theta.numpy(), x, rtol=1e-12, atol=1e-14)
        assert (master.mu, master.alpha, master.mu_alg) == pytest.approx((mu, alpha, mu_alg))
    # Hand-checkable anchors: the first step is SGD at the lr given; the tuner moved.
    np.testing.assert_allclose(expected[0][0], x0 - lr * (CURVATURE + NOISE[0]))
    assert expected[-1][1] > 0.05 and expected[-1][2] != pytest.approx(lr)
    if gamma is not None:
        assert 0 < expected[-1][3] < expected[-1][1]  # the loop lags its target


def test_yellowfin_one_worker_in_the_simulator_is_the_open_loop_tuner():
    gradient = noisy_quadratic()
    sim = Simulator(
        A.build("yellowfin", beta=0.5, window=3),
        torch.ones(5, dtype=F64),
        lambda p, rows: (torch.from_numpy(gradient(p.numpy())), 0.0),
        BatchStream(64, 8),
        1,
        lr=0.1,
        timing="constant",
        weight_decay=0.0,
    )
    sim.run(pushes=10)
    expected = yellowfin_reference(np.ones(5), noisy_quadratic(), 0.1, 0.5, 3, 10)
    np.testing.assert_allclose(sim.params().numpy(), expected[-1][0], rtol=1e-12)


def test_total_momentum_is_measured_from_the_pull_and_the_step_after_it():
    master = A.build("yellowfin-cl").master(torch.zeros(3, dtype=F64), workers=2)
    out = torch.empty(3, dtype=F64)
    master.pull(0, 0.1, out)
    master.push(0, torch.tensor([1.0, 2.0, 3.0], dtype=F64), 0.1)  # x_1 - x_0 = -0.1*g
    master.pull(0, 0.1, out)
    master.pull(1, 0.1, out)  # both pulled x_1
    master.push(0, torch.tensor([1.0, 1.0, 1.0], dtype=F64), 0.1)  # x_2, the step after x_1
    step, alpha = master.after[1].clone(), float(master.after_alpha[1])
    g = torch.tensor([0.5, -1.0, 2.0], dtype=F64)  # worker 1's gradient at x_1 lands late
    expected = float(((step + alpha * g) / master.before[1]).median())
    assert master.total_momentum(1, g) == pytest.approx(expected)
    torch.testing.assert_close(master.before[1], torch.tensor([-0.1, -0.2, -0.3], dtype=F64))


def test_closed_loop_lowers_the_applied_momentum_under_asynchrony():
    sim = simulator("yellowfin-cl", workers=8, timing="constant")
    sim.run(pushes=1500)
    master = sim.master
    assert master.mu_alg < master.mu - 0.1  # staleness supplies the rest of the momentum


# -- EASGD, EAMSGD, DANA-EASGD -----------------------------------------------------------------
def recording(problem):
    """Wrap a gradient function to record the parameters it is called at."""
    gradient, *_ = problem
    calls = []

    def wrapped(p, rows):
        calls.append((p.data_ptr(), p.clone(), rows.clone()))
        return gradient(p, rows)

    return wrapped, calls


def test_easgd_with_alpha_zero_is_independent_local_sgd():
    problem = least_squares()
    wrapped, calls = recording(problem)
    sim = simulator(
        "easgd",
        workers=3,
        timing="heterogeneous",
        gradient=(wrapped, *problem[1:]),
        alpha=0.0,
        tau=4,
    )
    sim.run(pushes=300)
    assert torch.equal(sim.params(), torch.zeros(problem[2], dtype=F64))  # the center stays
    last = {}
    for ptr, p, rows in calls:
        if ptr in last:
            q, q_rows = last[ptr]
            torch.testing.assert_close(p, q - 0.05 * problem[0](q, q_rows)[0], rtol=1e-13, atol=0)
        last[ptr] = (p, rows)
    assert len(last) == 3


def test_eamsgd_one_worker_alpha_zero_is_torch_nesterov_sgd():
    problem = least_squares()
    wrapped, calls = recording(problem)
    grad, _, d, n = problem
    sim = Simulator(
        A.build("eamsgd", momentum=0.9, alpha=0.0, tau=3),
        torch.zeros(d, dtype=F64),
        wrapped,
        BatchStream(n, 16),
        1,
        lr=0.05,
        weight_decay=1e-2,
        timing="constant",
    )
    sim.run(pushes=60)
    param = torch.nn.Parameter(torch.zeros(d, dtype=F64))
    sgd = torch.optim.SGD([param], lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-2)
    for _, p, rows in calls:
        torch.testing.assert_close(p, param.detach(), rtol=1e-12, atol=1e-13)
        param.grad = grad(param.detach(), rows)[0]
        sgd.step()


def test_dana_easgd_with_one_worker_is_eamsgd():
    runs = []
    for name in ("eamsgd", "dana-easgd"):
        sim = simulator(name, workers=1, tau=3, momentum=0.9)  # alpha = 0.9/1
        sim.run(pushes=200)
        runs.append(sim)
    a, b = runs
    assert a.pushes == b.pushes > 60
    assert torch.equal(a.params(), b.params())
    assert torch.equal(a.worker_rule.x, b.worker_rule.x)
    assert np.array_equal(a.log.numpy()["loss"], b.log.numpy()["loss"])
    assert not torch.equal(a.params(), torch.zeros_like(a.params()))


@pytest.mark.parametrize("workers, tau", [(8, 1), (16, 10)])
def test_dana_easgd_estimates_the_landing_center_better(workers, tau):
    """The simulator's gap is RMS(center at landing - center pulled): the estimate's error."""
    gaps = {}
    for name in ("eamsgd", "dana-easgd"):
        sim = simulator(name, workers=workers, tau=tau)
        sim.run(pushes=3000)
        gap = sim.log.numpy()["gap"]
        gaps[name] = gap[len(gap) // 2 :].mean()
    assert gaps["dana-easgd"] < 0.7 * gaps["eamsgd"]


def test_dana_easgd_measures_positions_and_persistence():
    master = A.build("dana-easgd", alpha=0.5).master(torch.zeros(2, dtype=F64), workers=3)
    out = torch.empty(2, dtype=F64)
    for i in range(3):
        master.pull(i, 0.1, out)
    master.push(1, torch.tensor([0.5, -0.5], dtype=F64), 0.1)  # x_1 = (1, -1) before
    torch.testing.assert_close(master.position[1], torch.tensor([0.5, -0.5], dtype=F64))
    torch.testing.assert_close(master.position_sum, master.position.sum(0))
    master.pull(1, 0.1, out)
    master.push(1, torch.tensor([0.1, 0.1], dtype=F64), 0.1)
    assert master.persistence() == 0.0 or master.variance > 0
    torch.testing.assert_close(master.displacement_sum, master.displacement.sum(0))
    torch.testing.assert_close(master.position_sum, master.position.sum(0))
    assert int(master.cycle[1]) == 0


def test_elastic_exchange_follows_the_paper():
    """One worker, tau=2: exchanges at local steps 0, 2, 4 with the center read at its pull."""
    algo = A.build("easgd", tau=2, alpha=0.5)
    master, workers = algo.master(torch.zeros(1, dtype=F64), 1), algo.worker(1, 1, F64)
    center, x, c = master.pull(0, 0.1, torch.empty(1, dtype=F64)), 0.0, 0.0
    workers.set_lr(0.1)
    for t in range(6):
        at = float(workers.compute_at(0, center))
        assert at == pytest.approx(x)
        g = 2.0 * at + 1.0
        e = workers.message(0, torch.tensor([g], dtype=F64))
        if t % 2 == 0:
            diff = 0.5 * (x - c)
            x, c = x - diff - 0.1 * g, c + diff
            master.push(0, e, 0.1)
            master.pull(0, 0.1, center)
        else:
            assert e is None
            x -= 0.1 * g
        assert float(workers.x[0]) == pytest.approx(x) and float(master.theta) == pytest.approx(c)


def test_elastic_workers_need_the_learning_rate():
    workers = A.build("easgd").worker(1, 2, F64)
    workers.compute_at(0, torch.zeros(2, dtype=F64))
    with pytest.raises(RuntimeError, match="set_lr"):
        workers.message(0, torch.ones(2, dtype=F64))


# -- SA-ASGD -----------------------------------------------------------------------------------
def constant_gradient(d=3):
    return (lambda p, rows: (torch.ones(d, dtype=F64), 0.0)), (lambda p: 0.0), d, 64


@pytest.mark.parametrize("k", [2, 4, 7])
def test_sa_asgd_uses_lr_over_k_minus_one_once_all_have_pushed(k):
    thetas = []
    sim = simulator(
        "sa-asgd", workers=k, timing="constant", lr=0.1, momentum=0.0, gradient=constant_gradient()
    )
    sim.run(pushes=5 * k, callback=lambda s: thetas.append(float(s.params()[0])))
    steps = -np.diff([0.0, *thetas])
    staleness = sim.log.numpy()["staleness"]
    assert list(staleness[:k]) == list(range(k))
    assert (staleness[k:] == k - 1).all()
    np.testing.assert_allclose(steps[:k], 0.1 / np.maximum(np.arange(k), 1))
    np.testing.assert_allclose(steps[k:], 0.1 / max(k - 1, 1))


def test_sa_asgd_momentum_divides_each_gradient_by_its_staleness():
    sim = simulator(
        "sa-asgd",
        workers=5,
        timing="heterogeneous",
        lr=0.1,
        momentum=0.9,
        gradient=constant_gradient(),
    )
    sim.run(pushes=40)
    v, theta = 0.0, 0.0
    for s in sim.log.numpy()["staleness"]:
        v = 0.9 * v + 1.0 / max(s, 1)
        theta -= 0.1 * v
    assert float(sim.params()[0]) == pytest.approx(theta)


# -- training and checkpoints --------------------------------------------------------------------
@pytest.mark.parametrize("name", NEW)
def test_short_run_reaches_a_loss_well_below_the_initial_one(name):
    problem = least_squares()
    # Open-loop YellowFin ignores the momentum asynchrony adds (see the next test).
    sim = simulator(name, workers=1 if name == "yellowfin" else 4, gradient=problem)
    initial, losses = problem[1](sim.params()), []
    for pushes in range(100, 1501, 100):
        sim.run(pushes=pushes)
        losses.append(problem[1](sim.params()))
    if name == "yellowfin":
        # The paper's tuner, without its authors' later safeguards: at the noise floor
        # ||g||^2 (its curvature proxy) shrinks, alpha ~ 1/||g||^2 grows until a spike
        # raises h_min again. It trains, with spikes (one is at push 1500 here).
        assert min(losses) < 0.05 * initial and np.median(losses) < 0.05 * initial
    else:
        assert losses[-1] < 0.05 * initial


def test_closed_loop_converges_where_the_open_loop_diverges():
    problem = least_squares()
    final = {}
    for name in ("yellowfin", "yellowfin-cl"):
        sim = simulator(name, workers=4, gradient=problem)
        sim.run(pushes=1500)
        final[name] = problem[1](sim.params())
    assert not final["yellowfin"] < 1.0  # diverged (or NaN): asynchrony's extra momentum
    assert final["yellowfin-cl"] < 0.05


@pytest.mark.parametrize("name", NEW)
@pytest.mark.parametrize("bound", [None, 1])
def test_checkpoint_round_trip_continues_exactly(name, bound):
    def build():
        grad, _, d, n = least_squares()
        return Simulator(
            A.build(name),
            torch.zeros(d, dtype=F64),
            grad,
            BatchStream(n, 16),
            4,
            lr=0.05,
            timing="heterogeneous",
            max_staleness=bound,
            weight_decay=0.0,
        )

    first = build()
    first.run(pushes=137)
    state = first.state_dict()
    first.run(pushes=300)
    second = build()
    second.load_state_dict(state)
    second.run(pushes=300)
    assert torch.equal(first.params(), second.params())
    assert np.array_equal(first.log.numpy()["loss"], second.log.numpy()["loss"])
    assert first.wait_time == second.wait_time


@pytest.mark.parametrize("name", NEW)
def test_rule_state_dicts_round_trip(name):
    algo = A.build(name)
    sim = simulator(name, workers=3)
    sim.run(pushes=50)
    master, workers = algo.master(torch.zeros(10, dtype=F64), 3), algo.worker(3, 10, F64)
    master.load_state_dict(sim.master.state_dict())
    workers.load_state_dict(sim.worker_rule.state_dict())
    for key, value in sim.master.state_dict().items():
        got = master.state_dict()[key]
        assert torch.equal(got, value) if isinstance(value, torch.Tensor) else got == value
    for key, value in sim.worker_rule.state_dict().items():
        assert torch.equal(workers.state_dict()[key], value)
    with pytest.raises(ValueError, match="expected"):
        master.load_state_dict({})


@pytest.mark.parametrize("name", ["eamsgd", "yellowfin-cl"])
def test_dana_train_synthetic_linear(tmp_path, name):
    out = tmp_path / name
    code = main(
        [
            "train",
            "--algorithm",
            name,
            "--dataset",
            "synthetic",
            "--model",
            "linear",
            "--workers",
            "4",
            "--epochs",
            "3",
            "--batch-size",
            "32",
            "--lr",
            "0.05",
            "--timing",
            "heterogeneous",
            "--max-staleness",
            "2",
            "--quiet",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    config = json.loads((out / "config.json").read_text())
    assert config["max_staleness"] == 2 and config["workers"] == 4
    assert summary["max_staleness"] <= 2 and summary["wait_time"] > 0
    assert summary["final_test_error"] < 0.5  # 10 classes: chance is 0.9
