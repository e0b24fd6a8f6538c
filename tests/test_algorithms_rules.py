"""Master and worker rules: one-worker equivalences, the reductions, validation, state.

ALGORITHMS.md, "Master and worker rules": with one worker ``asgd`` is SGD,
``multi-asgd`` is ``SGD(momentum=m)``, ``nag-asgd`` and ``dana-zero`` send exactly the
parameters ``SGD(momentum=m, nesterov=True)`` holds, ``dana-slim`` *is* that optimizer,
and ``dana-dc``/``dc-asgd`` with ``lc = 0`` are ``dana-zero`` and momentum ASGD. The
references here are ``torch.optim.SGD`` on a tiny float64 MLP, driven through the three
events by hand, and hand-written rules for the rest.
"""

from __future__ import annotations

import copy
import math
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dana.algorithms as A
from dana.algorithms.base import Algorithm, MasterRule, MomentumAlgorithm
from dana.sim import Simulator
from dana.train.task.flat import FlatModel

LR, M, STEPS = 0.1, 0.9, 60
TOL = 1e-10  # relative, float64


# --------------------------------------------------------------------------------------
# A tiny float64 MLP, fixed batches, and torch.optim.SGD on it


class _Data:
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(128, 6, generator=g, dtype=torch.float64)
        self.y = torch.randint(0, 3, (128,), generator=g)
        self.batches = [torch.randperm(128, generator=g)[:16] for _ in range(STEPS)]
        with torch.random.fork_rng():
            torch.manual_seed(0)
            self.model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3)).double()


DATA = _Data()


class _FixedBatches:
    """A batch stream that replays ``DATA.batches`` (for the simulator)."""

    batches_per_epoch = STEPS

    def __init__(self) -> None:
        self.i = 0

    def next(self):
        b = DATA.batches[self.i % STEPS]
        self.i += 1
        return b

    def state_dict(self):
        return {"i": self.i}

    def load_state_dict(self, state):
        self.i = state["i"]


def sgd_trajectory(momentum: float = 0.0, nesterov: bool = False, wd: float = 0.0):
    """The parameters ``torch.optim.SGD`` holds before each step, and after the last."""
    model = copy.deepcopy(DATA.model)
    opt = torch.optim.SGD(
        model.parameters(), lr=LR, momentum=momentum, nesterov=nesterov, weight_decay=wd
    )
    out = [nn.utils.parameters_to_vector(model.parameters()).detach().clone()]
    for b in DATA.batches:
        opt.zero_grad()
        F.cross_entropy(model(DATA.x[b]), DATA.y[b]).backward()
        opt.step()
        out.append(nn.utils.parameters_to_vector(model.parameters()).detach().clone())
    return out


def drive_one_worker(algo: Algorithm, wd: float = 0.0):
    """Pull, gradient at the pulled parameters plus ``wd * p``, message, push: by hand.

    Returns the parameters pulled before each step and ``master.params()`` after it.
    """
    flat = FlatModel(copy.deepcopy(DATA.model))
    master = algo.master(flat.flat.clone(), 1)
    workers = algo.worker(1, flat.d, torch.float64)
    p = torch.empty(flat.d, dtype=torch.float64)
    pulled, params = [], []
    for b in DATA.batches:
        master.pull(0, LR, out=p)
        pulled.append(p.clone())
        at = workers.compute_at(0, p)
        g, _ = flat.gradient(at, DATA.x[b], DATA.y[b], F.cross_entropy)
        g = g.clone().add_(at, alpha=wd)
        assert master.push(0, workers.message(0, g), LR)
        params.append(master.params().clone())
    return pulled, params


def assert_trajectory(got, ref, what):
    assert len(got) == len(ref)
    for t, (a, b) in enumerate(zip(got, ref)):
        err = float((a - b).abs().max()) / float(b.abs().max())
        assert err <= TOL, f"{what}: step {t} differs by {err:.3g} (relative)"


SGD = {"momentum": 0.0, "nesterov": False}
HEAVY_BALL = {"momentum": M, "nesterov": False}
NESTEROV = {"momentum": M, "nesterov": True}

# (algorithm, hyper-parameters, the SGD it is, compare pulled, compare master.params())
ONE_WORKER_CASES = [
    ("asgd", {}, SGD, True, True),
    ("multi-asgd", {"momentum": M}, HEAVY_BALL, True, True),
    ("nag-asgd", {"momentum": M}, NESTEROV, True, False),  # theta is the Sutskever form
    ("dana-zero", {"momentum": M}, NESTEROV, True, False),
    ("dana-slim", {"momentum": M}, NESTEROV, True, True),
    ("ssgd", {"momentum": M}, HEAVY_BALL, True, True),
    ("ssgd", {"momentum": M, "nesterov": True}, NESTEROV, True, False),
    ("dana-dc", {"momentum": M, "lc": 0.0}, NESTEROV, True, False),
    ("dc-asgd", {"momentum": M, "lc": 0.0}, HEAVY_BALL, True, True),
    ("dc-asgd", {"momentum": 0.0, "lc": 0.0}, SGD, True, True),
    # One worker computes at theta itself: nothing to compensate, whatever lc.
    ("dc-asgd", {"momentum": M, "lc": 0.5}, HEAVY_BALL, True, True),
    ("dc-asgd", {"momentum": M, "lc": 2.0, "adaptive": True}, HEAVY_BALL, True, True),
    # Without momentum one worker computes at theta: no gap, a penalty of exactly 1.
    ("gap-aware", {"momentum": 0.0}, SGD, True, True),
    ("dana-ga", {"momentum": 0.0}, SGD, True, True),
]


@pytest.mark.parametrize("wd", [0.0, 5e-3])
@pytest.mark.parametrize(
    "name, hparams, sgd, cmp_pulled, cmp_params",
    ONE_WORKER_CASES,
    ids=[f"{c[0]}-{'-'.join(f'{k}={v}' for k, v in c[1].items())}" for c in ONE_WORKER_CASES],
)
def test_one_worker_is_torch_sgd(name, hparams, sgd, cmp_pulled, cmp_params, wd):
    ref = sgd_trajectory(**sgd, wd=wd)
    pulled, params = drive_one_worker(A.build(name, **hparams), wd=wd)
    # The run moves: a test on parameters that stay put would prove nothing.
    assert float((ref[-1] - ref[0]).norm()) > 0.1
    if cmp_pulled:
        assert_trajectory(pulled, ref[:-1], f"{name} pulled")
    if cmp_params:
        assert_trajectory(params, ref[1:], f"{name} params")


def test_nag_asgd_theta_is_sutskever_form():
    """``nag-asgd``'s theta is the Nesterov iterate the look-ahead is taken from."""
    ref = sgd_trajectory(**NESTEROV)
    algo = A.build("nag-asgd", momentum=M)
    flat = FlatModel(copy.deepcopy(DATA.model))
    master = algo.master(flat.flat.clone(), 1)
    p = torch.empty(flat.d, dtype=torch.float64)
    for t, b in enumerate(DATA.batches):
        master.pull(0, LR, out=p)
        g, _ = flat.gradient(p, DATA.x[b], DATA.y[b], F.cross_entropy)
        master.push(0, g.clone(), LR)
        # SGD(nesterov) holds Theta = theta - lr*m*v.
        look_ahead = master.theta - LR * M * master.v
        assert_trajectory([look_ahead], [ref[t + 1]], "nag-asgd look-ahead")


@pytest.mark.parametrize("wd", [0.0, 5e-3])
def test_one_worker_simulator_is_torch_sgd(wd):
    """The simulator (one worker, constant timing) adds weight decay where SGD does."""
    ref = sgd_trajectory(**NESTEROV, wd=wd)
    flat = FlatModel(copy.deepcopy(DATA.model))

    def gradient(p, rows):
        return flat.gradient(p, DATA.x[rows], DATA.y[rows], F.cross_entropy)

    sim = Simulator(
        A.build("dana-slim", momentum=M),
        flat.flat.clone(),
        gradient,
        _FixedBatches(),
        1,
        lr=LR,
        weight_decay=wd,
        timing="constant",
    )
    params = []
    for _ in range(STEPS):
        sim.step()
        params.append(sim.params().clone())
    assert_trajectory(params, ref[1:], "simulated dana-slim")
    assert list(sim.log.staleness) == [0] * STEPS


# --------------------------------------------------------------------------------------
# lc = 0 reductions for k > 1, whole trajectories through the simulator


class _MomentumAsgdMaster(MasterRule):
    """Momentum ASGD written out: ``v = m*v + g; theta -= lr*v``, one ``v``, pull theta."""

    state_keys = ("theta", "v")

    def __init__(self, params, workers, momentum):
        super().__init__(params, workers)
        self.momentum = momentum
        self.v = torch.zeros_like(self.theta)

    def push(self, worker, message, lr):
        self.v = self.momentum * self.v + message
        self.theta = self.theta - lr * self.v
        return True


class _MomentumAsgd(MomentumAlgorithm):
    name = "test-momentum-asgd"
    summary = "momentum ASGD, the reference for dc-asgd with lc = 0"
    master_rule = _MomentumAsgdMaster


def _lockstep(sim_a, sim_b, steps, tol):
    """Step two simulators together; the parameters every worker holds agree throughout."""
    worst = 0.0
    for _ in range(steps):
        sim_a.step()
        sim_b.step()
        for a, b in ((sim_a.sent, sim_b.sent), (sim_a.params(), sim_b.params())):
            err = float((a - b).abs().max()) / max(1.0, float(b.abs().max()))
            worst = max(worst, err)
    assert worst <= tol, f"trajectories differ by {worst:.3g}"
    assert list(sim_a.log.worker) == list(sim_b.log.worker)


@pytest.mark.parametrize("k", [1, 5])
def test_dana_dc_with_lc_zero_is_dana_zero(simulator, k):
    a = simulator("dana-dc", k, momentum=M, lc=0.0, weight_decay=1e-3)
    b = simulator("dana-zero", k, momentum=M, weight_decay=1e-3)
    _lockstep(a, b, 300, tol=0.0)  # g + 0*g*g*(theta - p_i) is g, bit for bit


@pytest.mark.parametrize("k", [1, 5])
@pytest.mark.parametrize("m", [0.0, M])
@pytest.mark.parametrize("adaptive", [False, True])
def test_dc_asgd_with_lc_zero_is_momentum_asgd(simulator, k, m, adaptive):
    a = simulator("dc-asgd", k, momentum=m, lc=0.0, adaptive=adaptive, weight_decay=1e-3)
    b = simulator(_MomentumAsgd(momentum=m), k, weight_decay=1e-3)
    _lockstep(a, b, 300, tol=1e-12)


def test_dc_asgd_without_momentum_is_asgd(simulator):
    a = simulator("dc-asgd", 5, momentum=0.0, lc=0.0)
    b = simulator("asgd", 5)
    _lockstep(a, b, 300, tol=0.0)


def test_dc_asgd_compensates_with_the_gap():
    """``g~ = g + lc*g*g*(theta - p_i)``, computed by hand for a stale push."""
    master = A.build("dc-asgd", momentum=0.5, lc=0.3).master(
        torch.tensor([1.0, -2.0], dtype=torch.float64), 2
    )
    p = torch.empty(2, dtype=torch.float64)
    master.pull(0, 0.1, p)
    master.pull(1, 0.1, p)  # both at theta0
    g0, g1 = torch.tensor([0.5, -1.0]).double(), torch.tensor([2.0, 0.25]).double()
    master.push(0, g0, 0.1)
    theta1 = torch.tensor([1.0, -2.0]).double() - 0.1 * g0
    torch.testing.assert_close(master.theta, theta1, rtol=0, atol=1e-15)
    master.push(1, g1, 0.1)
    gt = g1 + 0.3 * g1 * g1 * (theta1 - torch.tensor([1.0, -2.0]).double())
    v = 0.5 * g0 + gt
    torch.testing.assert_close(master.theta, theta1 - 0.1 * v, rtol=0, atol=1e-15)


# --------------------------------------------------------------------------------------
# Gap-Aware and DANA-GA against a plain transcription of the rule in ALGORITHMS.md


class _GapAwareReference:
    """Gap-Aware on NAG-ASGD (``dana=False``) or on DANA-Zero (``dana=True``), in numpy."""

    def __init__(self, theta, k, m, dana, decay=0.999, eps=1e-8):
        self.theta, self.m, self.dana, self.decay, self.eps = theta.copy(), m, dana, decay, eps
        self.v = np.zeros((k, len(theta))) if dana else np.zeros(len(theta))
        self.sent = np.zeros((k, len(theta)))
        self.ema, self.steps, self.lr_max = np.zeros(len(theta)), 0, 0.0
        self.penalised = 0  # pushes with a penalty above 1.01 somewhere

    def lookahead(self, lr):
        momentum = self.v.sum(0) if self.dana else self.v
        return self.theta - lr * self.m * momentum

    def pull(self, i, lr):
        self.sent[i] = self.lookahead(lr)
        return self.sent[i].copy()

    def push(self, i, g, lr):
        self.lr_max = max(self.lr_max, lr)
        if self.steps:
            C = self.lr_max * (np.sqrt(self.ema / (1 - self.decay**self.steps)) + self.eps)
            # the gap between what the master would send worker i now and what it sent
            G = 1 + np.abs(self.lookahead(lr) - self.sent[i]) / C
            self.penalised += bool(G.max() > 1.01)
            g = g / G
        if self.dana:
            self.v[i] = self.m * self.v[i] + g
            direction = self.v[i]
        else:
            self.v = self.m * self.v + g
            direction = self.v if self.m > 0 else g
        self.theta = self.theta - lr * direction
        self.ema = self.decay * self.ema + (1 - self.decay) * direction**2
        self.steps += 1


@pytest.mark.parametrize("name", ["gap-aware", "dana-ga"])
@pytest.mark.parametrize("m", [0.0, M])
def test_gap_penalty_matches_the_rule(name, m):
    rng = np.random.default_rng(3)
    k, d = 3, 5
    theta0 = rng.standard_normal(d)
    ref = _GapAwareReference(theta0, k, m, dana=(name == "dana-ga"))
    master = A.build(name, momentum=m).master(torch.from_numpy(theta0), k)
    out = torch.empty(d, dtype=torch.float64)
    for i in range(k):
        torch.testing.assert_close(master.pull(i, 0.1, out).numpy(), ref.pull(i, 0.1))
    for _ in range(200):
        i = int(rng.integers(k))
        lr = float(rng.uniform(0.02, 0.1))  # a changing lr exercises lr_max
        g = ref.sent[i] - 1.0 + 0.1 * rng.standard_normal(d)
        ref.push(i, g, lr)
        master.push(i, torch.from_numpy(g), lr)
        np.testing.assert_allclose(master.theta.numpy(), ref.theta, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(master.pull(i, lr, out).numpy(), ref.pull(i, lr), atol=1e-12)
    assert master.ema_steps == 200 and master.lr_max == ref.lr_max
    assert ref.penalised > 50  # the penalty was at work, not 1 throughout


@pytest.mark.parametrize(("name", "plain"), [("gap-aware", "nag-asgd"), ("dana-ga", "dana-zero")])
def test_one_worker_gap_penalty_is_the_plain_rule(name, plain):
    """One worker never pushes stale: Gap-Aware is NAG-ASGD, DANA-GA is DANA-Zero, with
    momentum and a changing lr (the look-ahead moves with lr; the penalty must not)."""
    rng = np.random.default_rng(5)
    d = 7
    theta0 = torch.from_numpy(rng.standard_normal(d))
    penalised = A.build(name, momentum=M).master(theta0, 1)
    reference = A.build(plain, momentum=M).master(theta0, 1)
    a, b = torch.empty(d, dtype=torch.float64), torch.empty(d, dtype=torch.float64)
    for step in range(60):
        lr = 0.1 if step < 30 else 0.01
        penalised.pull(0, lr, a)
        reference.pull(0, lr, b)
        torch.testing.assert_close(a, b, rtol=0, atol=1e-13)
        g = a - 1.0 + 0.1 * torch.from_numpy(rng.standard_normal(d))
        penalised.push(0, g.clone(), lr)
        reference.push(0, g.clone(), lr)
    torch.testing.assert_close(penalised.theta, reference.theta, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["gap-aware", "dana-ga"])
def test_fresh_push_is_not_penalised_with_many_workers(name):
    """k = 4, momentum 0.9: a worker that pulls and pushes before anyone else lands its
    gradient unchanged (staleness 0), whatever the momentum the master holds."""
    rng = np.random.default_rng(6)
    k, d, lr = 4, 6, 0.05
    master = A.build(name, momentum=M).master(torch.from_numpy(rng.standard_normal(d)), k)
    out = torch.empty(d, dtype=torch.float64)
    for i in range(k):
        master.pull(i, lr, out)
    for step in range(40):  # stale pushes: momentum and the EMA build up
        i = step % k
        master.push(i, torch.from_numpy(rng.standard_normal(d)), lr)
        master.pull(i, lr, out)
    i = 2
    master.pull(i, lr, out)
    g = torch.from_numpy(rng.standard_normal(d))
    expected = A.build("nag-asgd" if name == "gap-aware" else "dana-zero", momentum=M).master(
        master.theta.clone(), k
    )
    expected.load_state_dict({key: master.state_dict()[key] for key in expected.state_keys})
    master.push(i, g.clone(), lr)
    expected.push(i, g.clone(), lr)
    torch.testing.assert_close(master.theta, expected.theta, rtol=0, atol=1e-14)


def test_gap_penalty_is_one_without_gap_and_damps_a_stale_push():
    """By hand: the first push is not penalised, a push at theta neither, a stale one is."""
    lr, m = 0.1, 0.0
    master = A.build("gap-aware", momentum=m).master(torch.zeros(2, dtype=torch.float64), 2)
    out = torch.empty(2, dtype=torch.float64)
    master.pull(0, lr, out)
    master.pull(1, lr, out)
    g0 = torch.tensor([1.0, -2.0], dtype=torch.float64)
    master.push(0, g0, lr)  # no scale yet: no penalty
    torch.testing.assert_close(master.theta, -lr * g0, rtol=1e-15, atol=0)
    # Worker 1 computed at theta0 = 0; theta moved by -lr*g0 since. ema = g0^2 after
    # bias correction, so C = lr*|g0| and G = 1 + lr*|g0| / (lr*(|g0| + eps)) ~ 2.
    g1 = torch.tensor([3.0, 5.0], dtype=torch.float64)
    G = 1 + (lr * g0.abs()) / (lr * (g0.abs() + 1e-8))
    expected = -lr * g0 - lr * g1 / G
    master.push(1, g1, lr)
    torch.testing.assert_close(master.theta, expected, rtol=1e-14, atol=0)
    assert torch.all((G - 2).abs() < 1e-7)
    # Worker 0 pulls the current theta and pushes at once: no gap, no penalty.
    master.pull(0, lr, out)
    before = master.theta.clone()
    g2 = torch.tensor([0.3, 0.7], dtype=torch.float64)
    master.push(0, g2, lr)
    torch.testing.assert_close(master.theta, before - lr * g2, rtol=1e-15, atol=0)


# --------------------------------------------------------------------------------------
# dana-zero keeps S current, and dana-slim's workers do too


def test_dana_zero_keeps_S_equal_to_the_sum_of_momenta(simulator):
    sim = simulator("dana-zero", 7, momentum=M)
    sim.run(pushes=300)
    torch.testing.assert_close(sim.master.S, sim.master.v.sum(0), rtol=1e-10, atol=1e-12)
    slim = simulator("dana-slim", 7, momentum=M)
    slim.run(pushes=300)
    torch.testing.assert_close(
        slim.worker_rule.S, slim.worker_rule.v.sum(0), rtol=1e-10, atol=1e-12
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dana_slim_message_by_blocks_is_the_rule_exactly(dtype):
    """The message is computed a cache-sized block at a time; over several blocks (and a
    ragged last one) it equals the rule's three whole-vector passes bit for bit."""
    from dana.algorithms.base import BLOCK

    k, d = 3, 2 * BLOCK + 17
    g = torch.Generator().manual_seed(0)
    workers = A.build("dana-slim", momentum=M).worker(k, d, dtype)
    v = torch.zeros(k, d, dtype=dtype)
    S = torch.zeros(d, dtype=dtype)
    for i in (0, 2, 0, 1, 2):
        grad = torch.randn(d, generator=g).to(dtype)
        S_ref = S.add(v[i], alpha=M - 1).add_(grad)
        v_ref = torch.add(grad, v[i], alpha=M)
        u_ref = torch.add(grad, v_ref, alpha=M)
        S, v[i] = S_ref, v_ref
        u = workers.message(i, grad)
        assert u is grad  # written over the gradient: no d-sized copy
        assert torch.equal(u, u_ref)
        assert torch.equal(workers.v, v) and torch.equal(workers.S, S)


def test_dana_zero_push_by_blocks_is_the_rule_exactly():
    """The master's push is computed by blocks too; bit for bit the whole-vector rule."""
    from dana.algorithms.base import BLOCK

    k, d, lr = 3, 2 * BLOCK + 17, 0.1
    g = torch.Generator().manual_seed(0)
    params = torch.randn(d, generator=g)
    master = A.build("dana-zero", momentum=M).master(params, k)
    theta, v, S = params.clone(), torch.zeros(k, d), torch.zeros(d)
    for i in (0, 2, 0, 1, 2):
        message = torch.randn(d, generator=g)
        S.add_(v[i], alpha=M - 1).add_(message)
        torch.add(message, v[i], alpha=M, out=v[i])
        theta.add_(v[i], alpha=-lr)
        master.push(i, message, lr)
        assert torch.equal(master.theta, theta)
        assert torch.equal(master.v, v) and torch.equal(master.S, S)


def test_dana_slim_worker_state_from_older_checkpoints_loads():
    """Older checkpoints also saved the message buffer ``u``; it is ignored."""
    workers = A.build("dana-slim", momentum=M).worker(2, 4)
    workers.message(1, torch.ones(4))
    state = {**workers.state_dict(), "u": torch.zeros(4)}
    fresh = A.build("dana-slim", momentum=M).worker(2, 4)
    fresh.load_state_dict(state)
    assert torch.equal(fresh.v, workers.v) and torch.equal(fresh.S, workers.S)


# --------------------------------------------------------------------------------------
# Validation: ValueError that names the bad value


@pytest.mark.parametrize("name", ["nag-asgd", "multi-asgd", "dana-zero", "dana-slim", "ssgd"])
@pytest.mark.parametrize("momentum", [1.0, -0.1, 1.5, math.nan])
def test_momentum_out_of_range(name, momentum):
    with pytest.raises(ValueError, match=re.escape(repr(momentum))):
        A.build(name, momentum=momentum)


@pytest.mark.parametrize("name", ["gap-aware", "dana-ga", "dana-dc", "dc-asgd"])
def test_momentum_out_of_range_everywhere(name):
    with pytest.raises(ValueError, match="momentum.*1.0"):
        A.build(name, momentum=1.0)


@pytest.mark.parametrize("name", ["dana-dc", "dc-asgd"])
def test_negative_lc(name):
    with pytest.raises(ValueError, match=r"lc.*-0\.5"):
        A.build(name, lc=-0.5)


def test_unknown_hparam_and_algorithm():
    with pytest.raises(ValueError, match="'momentun'"):
        A.build("dana-slim", momentun=0.9)
    with pytest.raises(ValueError, match="'momentum'"):
        A.build("asgd", momentum=0.9)  # plain ASGD takes none
    with pytest.raises(ValueError, match="'dana-fat'"):
        A.build("dana-fat")
    with pytest.raises(ValueError, match="'dana-fat'"):
        A.get("dana-fat")


def test_other_hparams_validated():
    with pytest.raises(ValueError, match="ema_decay.*1.0"):
        A.build("gap-aware", ema_decay=1.0)
    with pytest.raises(ValueError, match="eps.*0"):
        A.build("dana-ga", eps=0.0)
    with pytest.raises(ValueError, match="ms_decay.*-0.5"):
        A.build("dc-asgd", ms_decay=-0.5)


@pytest.mark.parametrize("name", sorted(A.ALGORITHMS))
@pytest.mark.parametrize("workers", [0, -1, 2.5, True])
def test_master_rejects_bad_workers(name, workers):
    with pytest.raises(ValueError, match=re.escape(repr(workers))):
        A.build(name).master(torch.zeros(3), workers)
    with pytest.raises(ValueError, match=re.escape(repr(workers))):
        A.build(name).worker(workers, 3)


def test_master_rejects_non_flat_params():
    with pytest.raises(ValueError, match="flat"):
        A.build("asgd").master(torch.zeros(2, 3), 2)
    with pytest.raises(ValueError, match="floating"):
        A.build("asgd").master(torch.zeros(3, dtype=torch.long), 2)


def test_registry():
    # The paper's algorithms and baselines (more may join the registry).
    assert set(A.ALGORITHMS) >= {
        "asgd",
        "nag-asgd",
        "multi-asgd",
        "dana-zero",
        "dana-slim",
        "dana-dc",
        "dc-asgd",
        "ssgd",
        "gap-aware",
        "dana-ga",
    }
    assert A.build("dana-dc").lc == 2.0 and A.build("dc-asgd").lc == 0.04
    for name, cls in A.ALGORITHMS.items():
        assert cls.name == name and cls.summary
        assert set(A.hparam_names(name)) == set(A.build(name).hparams())
    with pytest.raises(ValueError, match="already registered"):
        A.register(type("Other", (A.Algorithm,), {"name": "asgd"}))


# --------------------------------------------------------------------------------------
# Every algorithm: builds with defaults, runs, round-trips its state


@pytest.mark.parametrize("name", sorted(A.ALGORITHMS))
def test_every_algorithm_runs_and_round_trips_its_state(simulator, least_squares, name):
    problem = least_squares(d=6, n=64)
    sim = simulator(name, 3, problem, lr=0.01)
    sim.run(pushes=100)  # enough for local-step methods (EASGD's tau = 10) to exchange
    assert sim.steps >= 100 and len(sim.log) == sim.pushes
    assert torch.isfinite(sim.params()).all()
    assert problem.loss(sim.params()) < problem.loss(torch.zeros(problem.d, dtype=torch.float64))

    algo = A.build(name)
    master = algo.master(torch.zeros(problem.d, dtype=torch.float64), 3)
    master.load_state_dict(sim.master.state_dict())
    _assert_same_state(master.state_dict(), sim.master.state_dict())
    torch.testing.assert_close(master.params(), sim.params(), rtol=0, atol=0)
    workers = algo.worker(3, problem.d, torch.float64)
    workers.load_state_dict(sim.worker_rule.state_dict())
    _assert_same_state(workers.state_dict(), sim.worker_rule.state_dict())

    # The state is a snapshot, not a view of the live rule.
    state = sim.master.state_dict()
    sim.run(pushes=sim.steps + 100)
    assert not torch.equal(state["theta"], sim.master.theta)

    with pytest.raises(ValueError, match="keys"):
        master.load_state_dict({**master.state_dict(), "bogus": 1})
    bad = master.state_dict()
    bad["theta"] = torch.zeros(problem.d + 1, dtype=torch.float64)
    with pytest.raises(ValueError, match="shape"):
        master.load_state_dict(bad)


def _assert_same_state(a, b):
    assert set(a) == set(b)
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key


def test_rules_pass_over_cache_blocks_on_the_cpu_and_whole_vectors_elsewhere():
    from dana.algorithms.base import BLOCK, blocks

    assert [len(b) for b in blocks(torch.empty(2 * BLOCK + 5))] == [BLOCK, BLOCK, 5]
    assert [len(b) for b in blocks(torch.empty(2 * BLOCK + 5, device="meta"))] == [2 * BLOCK + 5]
