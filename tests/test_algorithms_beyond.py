"""The methods since the paper: asynchronous Local-SGD (outer SGD, Nesterov, Delayed
Nesterov, DANA on the outer step), OrMo and OrMo-DA, SMEGA2, Ringmaster's cut-off,
delay-adaptive steps and linear weight prediction.

Per rule: its zero-delay or one-worker reduction, a hand-written (or independently
transcribed) check on a small problem, its validation errors, and a short simulator
run; Dynamic Local Updates (each worker's local steps from its speed): equal speeds are
the plain rule, a slow worker's steps and phase by hand; real Ray runs of the Local-SGD
rules (marked ``ray``).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import (
    check_accounting,
    make_least_squares,
    make_simulator,
    max_rel_diff,
    run_on_ray,
    tiny,
)

import dana.algorithms as A
from dana.sim import Simulator
from dana.train.task.batches import BatchStream

F64 = torch.float64
NEW = [
    "local-sgd",
    "local-nesterov",
    "local-dn",
    "dana-local",
    "ormo",
    "ormo-da",
    "ormo-push",
    "ormo-da-push",
    "smega2",
    "ringmaster-asgd",
    "delay-adaptive-asgd",
    "lwp-asgd",
]


def events(k: int, n_steps: int, n: int = 256, batch: int = 8, seed: int = 0):
    """A random event order (which worker computes next) and the batches, in order."""
    g = torch.Generator().manual_seed(seed)
    order = torch.randint(0, k, (n_steps,), generator=g).tolist()
    batches = [torch.randint(0, n, (batch,), generator=g) for _ in range(n_steps)]
    return order, batches


def drive(algo, k, problem, order, batches, lr=0.05, weight_decay=0.0):
    """Drive the three events by hand (no simulator): every worker pulls at the start;
    step ``t`` is a computation of worker ``order[t]`` on ``batches[t]``; a message is
    pushed and the worker pulls again. Returns the master, the worker rule and every
    pull's parameters (after the initial ones), and the parameters each step computed at.
    ``lr``: a rate, or a function of the step ``t`` (a schedule, as the runners read it:
    step ``t``'s message and push at ``lr(t)``, the pull after it at ``lr(t + 1)``).
    """
    rate = lr if callable(lr) else (lambda t: lr)
    master = algo.master(torch.zeros(problem.d, dtype=F64), k)
    workers = algo.worker(k, problem.d, F64)
    sent = torch.zeros(k, problem.d, dtype=F64)
    for i in range(k):
        master.pull(i, rate(0), sent[i])
    pulls, computed = [], []
    for t, (i, rows) in enumerate(zip(order, batches)):
        lr = rate(t)
        p = workers.compute_at(i, sent[i])
        computed.append(p.clone())
        grad = problem.gradient(p, rows)[0]
        if weight_decay:
            grad.add_(p, alpha=weight_decay)
        workers.set_lr(lr)
        message = workers.message(i, grad)
        if message is not None:
            master.push(i, message, lr)
            master.pull(i, rate(t + 1), sent[i])
            pulls.append(sent[i].clone())
    return master, workers, pulls, computed


def torch_run(optimizer_cls, problem, batches, l2=0.0, **options):
    """The parameters a torch optimizer computes each gradient at, one worker (``l2``
    added to the gradient, as the runners add the weight decay)."""
    param = torch.nn.Parameter(torch.zeros(problem.d, dtype=F64))
    opt = optimizer_cls([param], **options)
    seen = []
    for rows in batches:
        seen.append(param.detach().clone())
        param.grad = problem.gradient(param.detach(), rows)[0]
        if l2:
            param.grad.add_(param.detach(), alpha=l2)
        opt.step()
    return seen


def assert_same(a: list[torch.Tensor], b: list[torch.Tensor], tol: float = 1e-10):
    assert len(a) == len(b) > 0
    assert max(max_rel_diff(x, y) for x, y in zip(a, b)) <= tol


# -- the registry and the CLI ---------------------------------------------------------------
def test_every_new_method_is_listed_with_its_hparams():
    out = subprocess.run(
        [sys.executable, "-m", "dana.cli", "algorithms"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    lines = {line.split()[0]: line for line in out.stdout.splitlines() if line.strip()}
    for name in NEW:
        assert name in lines, name
        for hparam in A.hparam_names(name):
            assert hparam in lines[name], (name, hparam)
        assert A.get(name).elementwise  # every one may be sharded


@pytest.mark.parametrize(
    "name, hparams, match",
    [
        ("local-sgd", {"local_steps": 0}, "local_steps"),
        ("local-sgd", {"local_steps": 2.5}, "local_steps"),
        ("local-sgd", {"inner": "adam"}, "inner"),
        ("local-sgd", {"outer_lr": 0.0}, "outer_lr"),
        ("local-sgd", {"momentum": 1.0}, "momentum"),
        ("local-sgd", {"beta2": 1.0}, "beta2"),
        ("local-sgd", {"beta1": -0.1}, "beta1"),
        ("local-nesterov", {"inner_momentum": 1.0}, "inner_momentum"),
        ("local-sgd", {"inner_decay": -1.0}, "inner_decay"),
        ("local-nesterov", {"momentum": 1.0}, "momentum"),
        ("local-dn", {"period": 0}, "period"),
        ("local-dn", {"c": 1.5}, "c must"),
        ("dana-local", {"outer_lr": -0.1}, "outer_lr"),
        ("ormo", {"momentum": -0.5}, "momentum"),
        ("ormo-da", {"concurrency": 0}, "concurrency"),
        ("ormo", {"group": 0}, "group must"),
        ("ormo-da", {"group": 2.5}, "group must"),
        ("ormo-da-push", {"concurrency": 0}, "concurrency"),
        ("smega2", {"cycle": 0}, "cycle"),
        ("ringmaster-asgd", {"R": 0}, "R must"),
        ("ringmaster-asgd", {"R": True}, "R must"),
        ("delay-adaptive-asgd", {"concurrency": -2}, "concurrency"),
        ("lwp-asgd", {"horizon": -1}, "horizon"),
    ],
)
def test_bad_hyper_parameters_are_refused_by_name(name, hparams, match):
    with pytest.raises(ValueError, match=match):
        A.build(name, **hparams)


# -- asynchronous Local-SGD -----------------------------------------------------------------
@pytest.mark.parametrize("H", [1, 3])
def test_local_sgd_one_worker_outer_lr_one_is_its_inner_momentum_sgd(H):
    problem = make_least_squares()
    order, batches = events(1, 30)
    algo = A.build("local-sgd", momentum=0.9, local_steps=H, outer_lr=1.0)
    *_, computed = drive(algo, 1, problem, order, batches, weight_decay=1e-2)
    ref = torch_run(torch.optim.SGD, problem, batches, l2=1e-2, lr=0.05, momentum=0.9)
    assert_same(computed, ref)


def test_local_sgd_adamw_inner_is_torch_adamw():
    problem = make_least_squares()
    order, batches = events(1, 24)
    algo = A.build(
        "local-sgd",
        inner="adamw",
        beta1=0.8,
        beta2=0.99,
        local_steps=4,
        inner_decay=0.1,
        eps=1e-6,
        outer_lr=1.0,
    )
    *_, computed = drive(algo, 1, problem, order, batches)
    ref = torch_run(
        torch.optim.AdamW,
        problem,
        batches,
        lr=0.05,
        betas=(0.8, 0.99),
        eps=1e-6,
        weight_decay=0.1,
    )
    assert_same(computed, ref)


def test_local_sgd_pushes_the_difference_of_its_local_steps_by_hand():
    # f(x) = 0.5*h*x^2 per element, one worker, H = 2, inner momentum 0.5, lr 0.1.
    algo = A.build("local-sgd", momentum=0.5, local_steps=2, outer_lr=0.5)
    master, workers = algo.master(torch.tensor([1.0], dtype=F64), 1), algo.worker(1, 1, F64)
    pulled = master.pull(0, 0.1, torch.empty(1, dtype=F64))
    workers.set_lr(0.1)
    x = workers.compute_at(0, pulled)  # 1.0: g = 2, u = 2, x = 0.8
    assert workers.message(0, 2 * x.clone()) is None
    x = workers.compute_at(0, pulled)  # 0.8: g = 1.6, u = 2.6, x = 0.54
    delta = workers.message(0, 2 * x.clone())
    torch.testing.assert_close(delta, torch.tensor([0.46], dtype=F64))
    master.push(0, delta, 0.1)  # theta = 1 - 0.5*0.46
    torch.testing.assert_close(master.theta, torch.tensor([0.77], dtype=F64))
    pulled = master.pull(0, 0.1, pulled)
    assert float(workers.compute_at(0, pulled)) == pytest.approx(0.77)  # a new cycle
    assert int(workers.t[0]) == 0 and float(workers.u[0]) == pytest.approx(2.6)


def test_local_rules_with_one_local_step_are_their_single_step_rules():
    problem = make_least_squares()
    order, batches = events(3, 120, seed=6)
    for local, single in (("local-sgd", "multi-asgd"), ("local-nesterov", "nag-asgd")):
        algo = A.build(local, momentum=0.9, local_steps=1, outer_lr=1.0, outer_weight=1.0)
        a = drive(algo, 3, problem, order, batches)
        b = drive(A.build(single, momentum=0.9), 3, problem, order, batches)
        assert_same(a[2], b[2])


def warm_up(t: int) -> float:
    """A schedule as the studies': a linear warm-up over 40 steps, then x0.1 at 80."""
    return 0.05 * min(1.0, (t + 1) / 40) * (0.1 if t >= 80 else 1.0)


@pytest.mark.parametrize(
    "rule, hparams, counterpart",
    [
        ("local-nesterov", {"outer_lr": 1.0, "outer_weight": 1.0}, "nag-asgd"),
        ("dana-local", {"outer_lr": 1.0, "outer_weight": 1.0}, "dana-zero"),
    ],
)
def test_single_step_reductions_hold_with_a_constant_rate_only(rule, hparams, counterpart):
    """With H = 1 the outer gradient is lr*g, and the outer momentum sums the rates with
    the gradients (v = mu*v + lr_t*g) where the single-step rule scales the sum
    (lr_t*(mu*v + g)): the same parameters at a constant rate, and apart under a warm-up
    and a decay (docs/ALGORITHMS.md's reductions say so)."""
    problem = make_least_squares()
    order, batches = events(3, 120, seed=6)
    local = A.build(rule, momentum=0.9, local_steps=1, **hparams)
    single = A.build(counterpart, momentum=0.9)
    assert_same(
        drive(local, 3, problem, order, batches)[2], drive(single, 3, problem, order, batches)[2]
    )
    a = drive(local, 3, problem, order, batches, lr=warm_up)[2]
    b = drive(single, 3, problem, order, batches, lr=warm_up)[2]
    assert max(max_rel_diff(x, y) for x, y in zip(a, b)) > 0.05


def test_ormo_and_smega2_reductions_hold_with_a_constant_rate_only():
    """OrMo keeps the rate inside its momentum (u += lr*g) where torch's SGD scales the
    buffer (p -= lr*buf), and SMEGA2 with N = 1 estimates at the last push's rate where
    NAG-ASGD pulls at the next update's: equal at a constant rate, apart under a
    schedule."""
    problem = make_least_squares()
    order, batches = events(1, 120)
    ormo = drive(A.build("ormo", momentum=0.9), 1, problem, order, batches, lr=warm_up)[3]
    param = torch.nn.Parameter(torch.zeros(problem.d, dtype=F64))
    opt = torch.optim.SGD([param], lr=1.0, momentum=0.9)
    ref = []
    for t, rows in enumerate(batches):
        ref.append(param.detach().clone())
        for group in opt.param_groups:
            group["lr"] = warm_up(t)
        param.grad = problem.gradient(param.detach(), rows)[0]
        opt.step()
    assert max(max_rel_diff(x, y) for x, y in zip(ormo, ref)) > 0.05
    order, batches = events(3, 120, seed=4)
    smega2 = drive(A.build("smega2", momentum=0.9, cycle=1), 3, problem, order, batches, lr=warm_up)
    nag = drive(A.build("nag-asgd", momentum=0.9), 3, problem, order, batches, lr=warm_up)
    assert max(max_rel_diff(x, y) for x, y in zip(smega2[2], nag[2])) > 1e-3


def test_local_nesterov_is_delayed_nesterov_with_period_one_and_torch_nesterov():
    problem = make_least_squares()
    order, batches = events(3, 90)
    a = drive(A.build("local-nesterov", local_steps=3), 3, problem, order, batches)
    # local-nesterov's defaults (0.07, w = sqrt(k)/k) on Delayed Nesterov with N = 1
    dn = A.build("local-dn", local_steps=3, period=1, c=0.7, outer_lr=0.07, outer_weight=None)
    b = drive(dn, 3, problem, order, batches)
    assert_same(a[2], b[2], tol=0)
    # H = 1, no inner momentum, one worker: outer Nesterov on lr*g is Nesterov SGD
    order, batches = events(1, 30)
    algo = A.build("local-nesterov", momentum=0.8, local_steps=1, outer_lr=0.7)
    *_, computed = drive(algo, 1, problem, order, batches)
    ref = torch_run(torch.optim.SGD, problem, batches, lr=0.05 * 0.7, momentum=0.8, nesterov=True)
    assert_same(computed, ref)


def delayed_nesterov_numpy(grads, lr, beta, c, N):
    """The Delayed Nesterov update (Liu et al. 2024), transcribed from its pseudo-code."""
    p, m, delta = np.zeros_like(grads[0]), np.zeros_like(grads[0]), np.zeros_like(grads[0])
    out = []
    for t, g in enumerate(grads):
        delta = delta + g
        if (t + 1) % N == 0:
            m = beta * m + delta / N
            p = p - lr * ((1 - c * N + c) * beta * m + g / N)
            delta = np.zeros_like(delta)
        else:
            p = p - lr * (c * beta * m + g / N)
        out.append(p)
    return out


@pytest.mark.parametrize("N, c", [(3, 0.0), (3, 0.2), (4, 1 / 3)])
def test_delayed_nesterov_master_matches_its_transcription(N, c):
    g = torch.Generator().manual_seed(1)
    grads = [torch.randn(5, generator=g, dtype=F64) for _ in range(11)]
    algo = A.build("local-dn", outer_lr=0.7, momentum=0.9, period=N, c=c)
    master = algo.master(torch.zeros(5, dtype=F64), 2)
    ref = delayed_nesterov_numpy([x.numpy() for x in grads], 0.7, 0.9, c, N)
    for i, (x, want) in enumerate(zip(grads, ref)):
        assert master.push(i % 2, x, lr=123.0)  # the runner's lr is the inner rate
        np.testing.assert_allclose(master.theta.numpy(), want, rtol=1e-13, atol=1e-15)


def test_local_dn_refuses_a_c_that_makes_the_nth_push_weight_negative():
    """The N-th push weighs the momentum by 1 - c*N + c: negative for c > 1/(N - 1)."""
    A.build("local-dn", period=4, c=1 / 3).master(torch.zeros(2), workers=2)  # weight 0
    with pytest.raises(ValueError, match=r"c must be at most 1/\(N - 1\) = 0.333333"):
        A.build("local-dn", period=4, c=0.34).master(torch.zeros(2), workers=2)
    with pytest.raises(ValueError, match="N = 16"):  # N defaults to k
        A.build("local-dn", c=0.1).master(torch.zeros(2), workers=16)


def test_local_dn_period_defaults_to_k():
    master = A.build("local-dn").master(torch.zeros(2), workers=5)
    assert master.period == 5 and master.acc is not None


@pytest.mark.parametrize("k", [1, 4, 16, 64])
def test_the_outer_steps_are_the_reference_codes(k):
    """Each rule's outer rate per outer gradient: the asynchronous Local-SGD notebook's
    (outer SGD 0.7, outer Nesterov 0.07 at momentum 0.9, each Delta weighted sqrt(k)/k;
    dana-local as local-nesterov) and halos' Delayed Nesterov (0.05*N, N = k)."""
    zeros = torch.zeros(3)
    w = k**0.5 / k
    assert A.build("local-sgd").master(zeros, k).rate == pytest.approx(0.7 * w)
    assert A.build("local-nesterov").master(zeros, k).rate == pytest.approx(0.07 * w)
    assert A.build("dana-local").master(zeros, k).rate == pytest.approx(0.07 * w)
    assert A.build("local-dn").master(zeros, k).rate == pytest.approx(0.05 * k)
    assert A.build("local-dn", period=32).master(zeros, k).rate == pytest.approx(0.05 * 32)
    # over a run, one outer gradient moves the master by rate/(1 - mu) (Nesterov) or
    # rate/N/(1 - mu) (Delayed Nesterov: 0.5 whatever N)
    dn = A.build("local-dn").master(zeros, k)
    assert dn.rate / dn.period / (1 - 0.9) == pytest.approx(0.5)


def test_dana_local_with_one_local_step_is_dana_zero():
    problem = make_least_squares()
    order, batches = events(4, 200, seed=3)
    local = A.build("dana-local", momentum=0.9, local_steps=1, outer_lr=1.0, outer_weight=1.0)
    _, _, pulls, computed = drive(local, 4, problem, order, batches)
    _, _, ref_pulls, ref_computed = drive(
        A.build("dana-zero", momentum=0.9), 4, problem, order, batches
    )
    assert_same(pulls, ref_pulls)
    assert_same(computed, ref_computed)
    assert max_rel_diff(pulls[-1], torch.zeros_like(pulls[-1])) > 0.1  # it moved


def test_dana_local_pulls_where_the_outer_momenta_take_the_master():
    algo = A.build("dana-local", momentum=0.5, local_steps=2, outer_lr=0.5, outer_weight=1.0)
    master = algo.master(torch.zeros(1, dtype=F64), 2)
    master.push(0, torch.tensor([1.0], dtype=F64), 0.1)  # v0 = 1, theta = -0.5
    master.push(1, torch.tensor([2.0], dtype=F64), 0.1)  # v1 = 2, theta = -1.5
    master.push(0, torch.tensor([1.0], dtype=F64), 0.1)  # v0 = 1.5, theta = -2.25
    out = master.pull(1, 0.1, torch.empty(1, dtype=F64))  # -2.25 - 0.5*0.5*3.5
    torch.testing.assert_close(out, torch.tensor([-3.125], dtype=F64))
    torch.testing.assert_close(master.S, master.v.sum(0))


# -- OrMo ----------------------------------------------------------------------------------
def test_ormo_one_worker_is_momentum_sgd():
    problem = make_least_squares()
    order, batches = events(1, 40)
    for name in ("ormo", "ormo-da", "ormo-push", "ormo-da-push"):
        *_, computed = drive(A.build(name, momentum=0.9), 1, problem, order, batches)
        ref = torch_run(torch.optim.SGD, problem, batches, lr=0.05, momentum=0.9)
        assert_same(computed, ref)


@pytest.mark.parametrize("name", ["ormo", "ormo-da"])
def test_ormo_with_a_group_of_one_is_the_per_push_rule_bit_for_bit(name):
    """K = 1: the grouped rule's arithmetic is the per-push rule's, under a schedule and
    with pushes delayed beyond the concurrency."""
    problem = make_least_squares()
    order, batches = events(4, 150, seed=3)
    extra = {"concurrency": 2} if name == "ormo-da" else {}
    grouped = drive(
        A.build(name, momentum=0.9, group=1, **extra), 4, problem, order, batches, lr=warm_up
    )
    push = drive(
        A.build(f"{name}-push", momentum=0.9, **extra), 4, problem, order, batches, lr=warm_up
    )
    assert all(torch.equal(x, y) for x, y in zip(grouped[2], push[2], strict=True))
    assert torch.equal(grouped[0].theta, push[0].theta) and torch.equal(grouped[0].u, push[0].u)
    default = drive(A.build(name, momentum=0.9, **extra), 4, problem, order, batches, lr=warm_up)
    assert max(max_rel_diff(x, y) for x, y in zip(default[2], push[2])) > 1e-3  # K = 4 differs


@pytest.mark.parametrize("name, K", [("ormo-push", 1), ("ormo", 1), ("ormo", 3), ("ormo", 4)])
def test_ormo_gives_each_gradient_its_weight_by_iteration_index(name, K):
    """After ``N`` pushes a gradient of iteration (group) ``j`` has moved theta by
    ``-lr * g * (1 - m**(c - j + 1)) / (1 - m)``, ``c = (N - 1) // K`` the group of the
    last push, whenever it arrived (momentum SGD's weights in iteration order; per push,
    ``K = 1``): checked against that closed form with random delays."""
    m, lr, k, d = 0.7, 0.1, 4, 3
    g = torch.Generator().manual_seed(2)
    hparams = {} if name == "ormo-push" else {"group": K}
    master = A.build(name, momentum=m, **hparams).master(torch.zeros(d, dtype=F64), k)
    out = torch.empty(d, dtype=F64)
    index = [0] * k
    for i in range(k):
        master.pull(i, lr, out)
    arrived = []  # (iteration index, gradient)
    for N in range(1, 40):
        i = int(torch.randint(0, k, (1,), generator=g))
        grad = torch.randn(d, generator=g, dtype=F64)
        master.push(i, grad, lr)
        arrived.append((index[i], grad))
        master.pull(i, lr, out)
        index[i] = N // K
        c = (N - 1) // K
        want = -lr * sum(x * (1 - m ** (c - j + 1)) / (1 - m) for j, x in arrived)
        torch.testing.assert_close(master.theta, want, rtol=1e-12, atol=1e-14)


def ordered_momentum_reference(order, k, K, m, lr, grad, d):
    """OrMo as read from the paper, in plain floats, recomputed from scratch at every
    push (not incrementally, as the rule is): iterations are groups of ``K`` pushes; a
    gradient belongs to the group in progress at its worker's pull (``j``); momentum
    SGD in iteration order moves theta by ``m**(i - j) * lr * g`` at each group step
    ``i >= j``, a group's step landing at its first push and each gradient's own share on
    arrival; the momentum at group ``c`` is ``sum m**(c - j) * lr * g`` over the arrived
    gradients (Figure 1's ``u10``). Returns theta and that momentum after each push."""
    pulled = [(0, [0.0] * d)] * k
    arrived, thetas, momenta = [], [], []
    for n, i in enumerate(order, start=1):
        j, p = pulled[i]
        arrived.append((j, grad(n - 1, p)))
        c = (n - 1) // K  # this push's group
        theta = [
            -sum(lr * g[x] * sum(m ** (t - j) for t in range(j, c + 1)) for j, g in arrived)
            for x in range(d)
        ]
        momenta.append([sum(m ** (c - j) * lr * g[x] for j, g in arrived) for x in range(d)])
        pulled[i] = (n // K, theta)
        thetas.append(theta)
    return thetas, momenta


def test_ormo_matches_the_reference_with_delays():
    """k = K = 4, a fixed arrival order in which worker 3 is slow (group delays 0, 1 and
    2), gradients of a quadratic at the parameters each worker pulled."""
    k, m, lr, d = 4, 0.7, 0.1, 2
    order = [0, 1, 0, 2, 0, 1, 0, 2, 1, 0, 3, 1, 2, 0, 1, 3, 0, 2, 1, 0, 2, 3, 1, 0]
    rng = np.random.default_rng(5)
    a, b = [1.0, 3.0], rng.normal(size=(len(order), d)).tolist()

    def grad(n, p):
        return [a[x] * p[x] - b[n][x] for x in range(d)]

    want, momenta = ordered_momentum_reference(order, k, k, m, lr, grad, d)
    master = A.build("ormo", momentum=m).master(torch.zeros(d, dtype=F64), k)
    sent = torch.zeros(k, d, dtype=F64)
    for i in range(k):
        master.pull(i, lr, sent[i])
    delays = set()
    for n, i in enumerate(order):
        delays.add(n // k - int(master.pulled_at[i]) // k)
        master.push(i, torch.tensor(grad(n, sent[i].tolist()), dtype=F64), lr)
        master.pull(i, lr, sent[i])
        torch.testing.assert_close(sent[i], torch.tensor(want[n], dtype=F64), rtol=1e-12, atol=0)
        u = torch.tensor(momenta[n], dtype=F64) * (m if n % k == k - 1 else 1.0)  # decayed
        torch.testing.assert_close(master.u, u, rtol=1e-12, atol=1e-15)
    assert delays == {0, 1, 2}


def test_ormo_momentum_is_figure_1s_in_synchronous_rounds():
    """K = 4 workers in rounds (all push, then all pull): after 10 pushes the momentum is
    m**2 * (group 0) + m * (group 1) + (2 gradients of group 2), the paper's Figure 1, and
    theta is synchronous heavy-ball momentum SGD on the sum of each round's gradients."""
    k, m, lr = 4, 0.5, 0.1
    master = A.build("ormo", momentum=m).master(torch.zeros(1, dtype=F64), k)
    out = torch.empty(1, dtype=F64)
    grads = [float(n + 1) for n in range(10)]
    theta, v = 0.0, 0.0  # heavy ball: v = m*v + lr*G; theta -= v
    for r in range(3):
        for i in range(k):
            master.pull(i, lr, out)
        for i in range(k if r < 2 else 2):
            master.push(i, torch.tensor([grads[4 * r + i]], dtype=F64), lr)
        if r < 2:
            v = m * v + lr * sum(grads[4 * r : 4 * r + 4])
            theta -= v
            assert float(master.theta) == pytest.approx(theta, rel=1e-14)
    u10 = lr * (m**2 * sum(grads[0:4]) + m * sum(grads[4:8]) + sum(grads[8:10]))
    assert float(master.u) == pytest.approx(u10, rel=1e-14)


def test_ormo_da_scales_a_push_delayed_beyond_the_concurrency():
    for name in ("ormo", "ormo-push"):
        ormo = A.build(name, momentum=0.0).master(torch.zeros(1, dtype=F64), 3)
        da = A.build(name.replace("ormo", "ormo-da"), momentum=0.0, concurrency=1)
        da = da.master(torch.zeros(1, dtype=F64), 3)
        out = torch.empty(1, dtype=F64)
        for master in (ormo, da):
            for i in range(3):
                master.pull(i, 1.0, out)
            for i in range(3):  # delays 0, 1, 2 pushes
                master.push(i, torch.tensor([1.0], dtype=F64), 1.0)
        # m = 0: a gradient's only weight is at its own iteration, caught up: ASGD ...
        assert float(ormo.theta) == pytest.approx(-3.0)
        # ... at the rate lr*min(1, C/tau): delay 2 with C = 1 moves half as far
        assert float(da.theta) == pytest.approx(-2.5)


@pytest.mark.parametrize("name", ["ormo", "ormo-push"])
def test_ormo_da_with_constant_timing_is_ormo(name):
    a = make_simulator(name, 4, timing="constant")
    b = make_simulator(name.replace("ormo", "ormo-da"), 4, timing="constant")
    a.run(pushes=200)
    b.run(pushes=200)
    assert torch.equal(a.params(), b.params())


# -- SMEGA2 --------------------------------------------------------------------------------
@pytest.mark.parametrize("k, cycle", [(1, None), (3, 1)])
def test_smega2_with_a_cycle_of_one_is_nag_asgd(k, cycle):
    problem = make_least_squares()
    order, batches = events(k, 60, seed=4)
    a = drive(A.build("smega2", momentum=0.9, cycle=cycle), k, problem, order, batches)
    b = drive(A.build("nag-asgd", momentum=0.9), k, problem, order, batches)
    assert_same(a[2], b[2], tol=1e-12)


def smega2_numpy(grads, lr, m, N, advanced):
    """SMEGA2 (Cohen et al. 2022), transcribed from the authors' ``step`` and ``estimate``:
    the parameters and the estimate after each push."""
    p, v, b, c = np.zeros_like(grads[0]), np.zeros_like(grads[0]), np.zeros_like(grads[0]), 0
    out = []
    for g in grads:
        c = (c + 1) % N
        b = b + g
        d = g + m * v
        if c == 0:
            v = m * v + b / N
            b = np.zeros_like(b)
        p = p - lr * d
        mf, gf = N, 0.0
        if advanced:
            mf, gf = mf + c * (m - 1), gf + c / N
        out.append((p, p - lr * m * gf * b - lr * m * mf * v))
    return out


@pytest.mark.parametrize("advanced", [True, False])
def test_smega2_matches_the_reference_step_and_estimate(advanced):
    g = torch.Generator().manual_seed(5)
    grads = [torch.randn(4, generator=g, dtype=F64) for _ in range(10)]
    master = A.build("smega2", momentum=0.9, advanced=advanced).master(torch.zeros(4, dtype=F64), 3)
    ref = smega2_numpy([x.numpy() for x in grads], 0.1, 0.9, 3, advanced)
    out = torch.empty(4, dtype=F64)
    for i, (x, (p, estimate)) in enumerate(zip(grads, ref)):
        master.push(i % 3, x, 0.1)
        np.testing.assert_allclose(master.theta.numpy(), p, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(
            master.pull(i % 3, 0.1, out).numpy(), estimate, rtol=1e-12, atol=1e-14
        )


def test_smega2_estimates_at_the_last_steps_rate_as_the_authors_code():
    """The authors' trainer calls ``optimizer.step()`` then ``optimizer.estimate()``,
    which reads the rate of the step just taken: under a schedule the pull uses the
    last push's rate, not the next update's (the rate the runner passes to the pull)."""
    m, N = 0.9, 2
    master = A.build("smega2", momentum=m, advanced=False).master(torch.zeros(1, dtype=F64), N)
    out = torch.empty(1, dtype=F64)
    master.push(0, torch.tensor([1.0], dtype=F64), lr=0.1)
    master.push(1, torch.tensor([1.0], dtype=F64), lr=0.2)  # v = 1 at the cycle's end
    theta = float(master.theta)
    estimate = float(master.pull(0, lr=5.0, out=out))  # 5.0: the next update's, unused
    assert estimate == pytest.approx(theta - 0.2 * m * N * 1.0)


# -- the delay cut-off and delay-adaptive steps ---------------------------------------------
def test_ringmaster_with_a_high_threshold_is_asgd_and_drops_by_hand():
    a = make_simulator("ringmaster-asgd", 4, R=100)
    b = make_simulator("asgd", 4)
    a.run(pushes=200)
    b.run(pushes=200)
    assert torch.equal(a.params(), b.params()) and a.master.dropped == 0
    master = A.build("ringmaster-asgd", R=2).master(torch.zeros(1, dtype=F64), 3)
    out = torch.empty(1, dtype=F64)
    for i in range(3):
        master.pull(i, 0.1, out)
    moved = [master.push(i, torch.tensor([1.0], dtype=F64), 0.1) for i in range(3)]
    assert moved == [True, True, False] and master.dropped == 1  # delays 0, 1, 2
    assert float(master.theta) == pytest.approx(-0.2) and master.updates == 2


def test_ringmaster_default_threshold_is_2k_and_drops_in_a_skewed_run():
    sim = make_simulator(
        "ringmaster-asgd", 4, timing="heterogeneous", timing_params={"machine_cv": 1.0}
    )
    assert sim.master.R == 8
    sim.run(pushes=400)
    log = sim.log.numpy()
    assert sim.master.dropped == int((log["staleness"] >= 8).sum()) > 0
    assert sim.updates == sim.pushes - sim.master.dropped


def test_the_class_meter_counts_only_the_pushes_ringmaster_applies():
    from dana.train.cluster.classmeter import ClassMeter

    sim = make_simulator(
        "ringmaster-asgd", 4, timing="heterogeneous", timing_params={"machine_cv": 1.0}
    )
    sim.meter = ClassMeter(np.zeros(256, dtype=np.int64), 4)  # one class, 256 rows
    sim.run(pushes=400)
    assert sim.master.dropped > 0
    assert int(sim.meter.applied_counts.sum()) == 8 * sim.updates  # batch 8 per applied push


def test_delay_adaptive_asgd_is_asgd_within_the_concurrency():
    a = make_simulator("delay-adaptive-asgd", 4, timing="constant")
    b = make_simulator("asgd", 4, timing="constant")
    a.run(pushes=200)
    b.run(pushes=200)
    assert torch.equal(a.params(), b.params())
    master = A.build("delay-adaptive-asgd", concurrency=1).master(torch.zeros(1, dtype=F64), 4)
    out = torch.empty(1, dtype=F64)
    for i in range(4):
        master.pull(i, 0.1, out)
    for i in range(4):  # delays 0, 1, 2, 3: factors 1, 1, 1/2, 1/3
        master.push(i, torch.tensor([1.0], dtype=F64), 0.1)
    assert float(master.theta) == pytest.approx(-0.1 * (1 + 1 + 0.5 + 1 / 3))


# -- linear weight prediction -------------------------------------------------------------
def test_lwp_one_worker_is_momentum_sgd_and_pulls_the_linear_prediction():
    problem = make_least_squares()
    order, batches = events(1, 40)
    *_, computed = drive(A.build("lwp-asgd", momentum=0.9), 1, problem, order, batches)
    assert_same(computed, torch_run(torch.optim.SGD, problem, batches, lr=0.05, momentum=0.9))
    master = A.build("lwp-asgd", momentum=0.5).master(torch.zeros(1, dtype=F64), 3)
    out = torch.empty(1, dtype=F64)
    for i in range(3):
        master.pull(i, 0.1, out)
    master.push(0, torch.tensor([1.0], dtype=F64), 0.1)  # v = 1, theta = -0.1
    master.push(1, torch.tensor([1.0], dtype=F64), 0.1)  # delay 1: v = 1.5, theta = -0.25
    assert float(master.pull(0, 0.1, out)) == pytest.approx(-0.25)  # its delay was 0
    assert float(master.pull(1, 0.1, out)) == pytest.approx(-0.25 - 0.1 * 1 * 1.5)


# -- Dynamic Local Updates ------------------------------------------------------------------
def write_trace_file(path, durations):
    """A ``trace`` timing file in which worker ``i`` always takes ``durations[i]``."""
    from dana.train.cluster.timing import write_trace

    write_trace(path, [(i, t) for i, t in enumerate(durations) for _ in range(3)])
    return str(path)


def test_dynamic_local_steps_by_hand():
    from dana.algorithms.local_sgd import dynamic_local_steps

    assert [dynamic_local_steps(10, s) for s in (1.0, 0.5, 0.7, 0.34, 0.05)] == [10, 5, 7, 3, 1]
    assert dynamic_local_steps(10, 0.7) == 7  # 10*0.7 = 6.999999999999999 in binary
    workers = A.build("local-sgd", local_steps=10, dynamic_steps=True).worker(3, 1)
    for i, speed in enumerate((1.0, 0.5, 1 / 32)):
        workers.set_speed(i, speed)
    assert workers.steps == [10, 5, 1]  # H_i >= 1 however slow the worker
    plain = A.build("local-sgd", local_steps=10).worker(2, 1)
    plain.set_speed(1, 0.5)  # the option off: the speed is ignored
    assert plain.steps == [10, 10] and not A.build("local-sgd").uses_speed
    for bad in (0.0, 1.5, float("nan"), -1.0):
        with pytest.raises(ValueError, match="relative speed"):
            workers.set_speed(0, bad)
    with pytest.raises(ValueError, match="dynamic_steps"):
        A.build("local-dn", dynamic_steps=1)


def test_relative_speeds_of_every_timing_model(tmp_path):
    from dana.train.cluster.timing import build_timing, relative_speeds

    assert relative_speeds(build_timing("constant", 3)) == [1.0, 1.0, 1.0]
    assert relative_speeds(build_timing("gamma", 4, seed=3)) == [1.0] * 4
    het = build_timing("heterogeneous", 5, seed=1)
    means = het.worker_means
    assert relative_speeds(het) == pytest.approx(list(means.min() / means))
    path = write_trace_file(tmp_path / "t.csv", [1.0, 2.0, 4.0])
    assert relative_speeds(build_timing("trace", 4, path=path)) == [1.0, 0.5, 0.25, 1.0]


@pytest.mark.parametrize("name", ["local-sgd", "local-dn", "dana-local"])
def test_dynamic_local_updates_with_equal_speeds_are_the_plain_rule_bit_for_bit(name):
    problem = make_least_squares()
    runs = []
    for dynamic in (False, True):
        sim = make_simulator(name, 4, problem, lr=0.005, local_steps=4, dynamic_steps=dynamic)
        sim.run(pushes=300)
        runs.append((sim.params().clone(), sim.log.numpy(), sim.pushes))
    (a, log_a, n_a), (b, log_b, n_b) = runs
    assert torch.equal(a, b) and n_a == n_b
    for key in ("worker", "loss", "sim_time", "staleness"):
        assert np.array_equal(log_a[key], log_b[key]), key


def test_a_worker_twice_as_slow_takes_half_the_local_steps_and_ends_with_the_fast(tmp_path):
    """Trace timing: workers take 1, 2 and 4 time units per step, H = 8: they take 8, 4
    and 2 local steps per push, and every local phase lasts 8 units (each worker pushes
    at 8, 16, 24, ...), where without the option the slow ones' phases last 16 and 32."""
    problem = make_least_squares()
    path = write_trace_file(tmp_path / "t.csv", [1.0, 2.0, 4.0])
    for dynamic, phases in ((True, [8.0, 8.0, 8.0]), (False, [8.0, 16.0, 32.0])):
        sim = make_simulator(
            "local-dn",
            3,
            problem,
            lr=0.005,
            timing="trace",
            timing_params={"path": path},
            local_steps=8,
            dynamic_steps=dynamic,
        )
        sim.run(pushes=8 * 3 * 10)  # 240 computations
        log = sim.log.numpy()
        for i in range(3):
            times = log["sim_time"][log["worker"] == i]
            assert np.allclose(np.diff(times), phases[i]) and times[0] == phases[i], (i, times)
        if dynamic:
            assert sim.worker_rule.steps == [8, 4, 2]
            # the same number of pushes each (to within the one under way when the run
            # stopped), of 8, 4 and 2 computations: 240 = 8n + 4n + 2n + what is under way
            pushes = np.bincount(log["worker"], minlength=3)
            assert pushes.max() - pushes.min() <= 1
            assert 14 * pushes.min() <= sim.steps <= 14 * (pushes.max() + 1)


def test_dynamic_local_phases_end_together_under_heterogeneous_timing():
    """Each worker's mean time per push is about ``H`` steps of the fastest worker (its
    ``H_i`` rounded down: at most one of its own steps short); without the option the
    slowest worker's phase is the longest by its speed ratio."""
    problem = make_least_squares()
    timing = {"machine_cv": 0.4, "task_cv": 0.05}
    H = 10
    phase = {}
    for dynamic in (False, True):
        sim = make_simulator(
            "dana-local",
            6,
            problem,
            lr=0.005,
            timing="heterogeneous",
            timing_params=timing,
            seed=2,
            local_steps=H,
            dynamic_steps=dynamic,
        )
        sim.run(pushes=6000)
        log = sim.log.numpy()
        phase[dynamic] = np.array(
            [np.diff(log["sim_time"][log["worker"] == i]).mean() for i in range(6)]
        )
        assert problem.loss(sim.params()) < 0.2 * problem.loss(torch.zeros(problem.d, dtype=F64))
    means = sim.timing.worker_means
    fastest = H * means.min()
    assert (phase[True] <= 1.05 * fastest).all()
    assert (phase[True] >= fastest - 1.05 * means).all()  # short by under one own step
    assert phase[True].max() / phase[True].min() < 1.3
    assert phase[False].max() / phase[False].min() > 1.5  # the speeds do differ
    assert sim.worker_rule.steps != [H] * 6


def test_dynamic_local_updates_resume_exactly():
    """The speeds are the runner's, not state: a resumed simulator sets them again."""

    def build():
        return make_simulator(
            "local-sgd",
            4,
            problem,
            lr=0.005,
            timing="heterogeneous",
            timing_params={"machine_cv": 0.5},
            local_steps=6,
            dynamic_steps=True,
        )

    problem = make_least_squares()
    whole, part = build(), build()
    whole.run(pushes=400)
    part.run(pushes=150)
    resumed = build()
    resumed.load_state_dict(part.state_dict())
    resumed.run(pushes=400)
    assert resumed.worker_rule.steps == whole.worker_rule.steps != [6] * 4
    assert torch.equal(resumed.params(), whole.params())


def test_dynamic_local_updates_on_ray_need_emulated_speeds():
    from dana.errors import ConfigError
    from dana.train.config import TrainConfig

    params = {"local_steps": 4, "dynamic_steps": True}
    with pytest.raises(ConfigError, match="--time-scale"):
        TrainConfig(algorithm="local-dn", backend="ray", algorithm_params=params).validate()
    TrainConfig(algorithm="local-dn", algorithm_params=params).validate()  # the simulator
    TrainConfig(
        algorithm="local-dn", backend="ray", time_scale=0.001, algorithm_params=params
    ).validate()


# -- every rule in the simulator ------------------------------------------------------------
@pytest.mark.parametrize("name", NEW)
def test_every_new_rule_trains_in_the_simulator(name):
    problem = make_least_squares()
    hparams = {"local_steps": 4} if A.hparam_names(name)[1:2] == ["local_steps"] else {}
    # the same step size: 0.005 under a momentum of 0.9, else 0.05 (the outer-momentum
    # Local-SGD rules take plain inner SGD steps)
    plain_inner = "inner_momentum" in A.hparam_names(name)
    lr = 0.005 if "momentum" in A.hparam_names(name) and not plain_inner else 0.05
    sim = make_simulator(name, 4, problem, lr=lr, **hparams)
    start = problem.loss(sim.params())
    sim.run(pushes=800)
    assert problem.loss(sim.params()) < 0.2 * start, name
    if hparams:  # a push carries 4 gradient computations and 4 batches
        assert sim.steps == 800 and 800 / 4 - 4 <= sim.pushes <= 800 / 4
        assert len(sim.log) == sim.pushes
    else:
        assert sim.pushes == sim.steps


def test_local_sgd_under_a_staleness_bound_keeps_it():
    problem = make_least_squares()
    runs = {}
    for bound in (None, 1):
        sim = Simulator(
            A.build("dana-local", local_steps=3),
            torch.zeros(problem.d, dtype=F64),
            problem.gradient,
            BatchStream(problem.n, 8),
            4,
            lr=0.01,
            timing="gamma",
            max_staleness=bound,
            weight_decay=0.0,
        )
        sim.run(pushes=300)
        runs[bound] = sim.log.numpy()["staleness"].max()
    assert runs[1] <= 1 < runs[None]


# -- one real Ray run -----------------------------------------------------------------------
@pytest.mark.ray
def test_local_sgd_trains_on_ray_with_two_shards(local_ray, tmp_path):

    config = tiny(
        algorithm="dana-local",
        workers=2,
        servers=2,
        epochs=2.0,
        # the rate of the single-step rules (the references' outer steps move the master
        # 0.7/sqrt(k) outer gradients: slower than this test's two epochs need)
        algorithm_params={"local_steps": 4, "outer_lr": 1.0, "outer_weight": 1.0},
    )
    runner = run_on_ray(config, tmp_path / "run")
    dist = check_accounting(runner)
    first = dist["shards"][0]
    # every push carried 4 computations: 3 local steps per push, to within one cycle a worker
    assert 3 * first["pushes"] - 2 * 3 <= first["local_steps"] <= 3 * first["pushes"] + 2 * 3
    assert runner.rows[-1]["test_loss"] < 0.9 * runner.rows[0]["test_loss"]


@pytest.mark.ray
def test_dynamic_local_updates_on_ray_size_each_workers_phase_by_its_emulated_speed(
    local_ray, tmp_path
):
    """Two Ray workers emulating 1 and 2 time units per step (trace timing, 5 ms a unit),
    H = 4: the slow one takes 2 local steps per push, the fast one 4, so that the slow one
    pushes about as often as the fast one."""

    path = write_trace_file(tmp_path / "t.csv", [1.0, 2.0])
    config = tiny(
        algorithm="local-dn",
        workers=2,
        epochs=2.0,
        timing="trace",
        timing_params={"path": path},
        time_scale=0.005,
        algorithm_params={
            "local_steps": 4, "dynamic_steps": True, "outer_lr": 1.0, "outer_weight": 1.0
        },
    )  # fmt: skip
    runner = run_on_ray(config, tmp_path / "run")
    first = check_accounting(runner)["shards"][0]
    computations, pushes = first["last_seq"], first["applied"]
    for i, H_i in enumerate((4, 2)):  # to within the cycle under way at the end
        assert H_i * pushes[i] <= computations[i] <= H_i * (pushes[i] + 1), (i, first)
    # without the option the slow worker would push half as often (measured: 13 and 9
    # pushes; each of the fast worker's local steps also pays a round trip to the server)
    assert pushes[1] >= 0.75 * pushes[0]
    assert runner.rows[-1]["test_loss"] < 0.9 * runner.rows[0]["test_loss"]
