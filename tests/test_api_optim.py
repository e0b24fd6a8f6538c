"""dana.optim: the rules as torch optimizers in a user's own loop."""

import copy
import threading

import pytest
import torch
from conftest import make_least_squares

import dana.optim
from dana import algorithms
from dana.sim import Simulator
from dana.train.rules.schedule import LRSchedule
from dana.train.task.batches import BatchStream


def _net(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)
    ).double()


def _data(n=64, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g, dtype=torch.float64)
    return x, (x[:, :3].sum(1) > 0).long() + (x[:, 3] > 1).long()


def _groups(model, wd):
    first, second = model[0], model[2]
    return [
        {"params": list(first.parameters()), "weight_decay": wd},
        {"params": list(second.parameters())},
    ]


def _steps(model, opt, scheduler, x, y, steps=12):
    for i in range(steps):
        rows = slice(8 * (i % 8), 8 * (i % 8) + 8)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[rows]), y[rows]).backward()
        opt.step()
        scheduler.step()


@pytest.mark.parametrize(
    "algorithm, gamma", [("dana-slim", 0.3), ("dana-zero", 1.0), ("nag-asgd", 1.0)]
)
def test_one_worker_is_nesterov_sgd(algorithm, gamma):
    """With one worker the replica's parameters are torch.optim.SGD(nesterov=True)'s at
    every step: float64, several tensors in two parameter groups, weight decay on one,
    and (DANA-Slim) an lr_scheduler changing the rate. DANA-Zero and NAG-ASGD send the
    parameters SGD holds at a constant rate (their look-ahead is taken at the current
    rate: docs/ALGORITHMS.md)."""
    x, y = _data()
    reference, ours = _net(), _net()
    sgd = torch.optim.SGD(
        _groups(reference, 1e-2), lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3
    )
    master = dana.optim.Master(ours.parameters(), algorithm=algorithm, workers=1, momentum=0.9)
    worker = dana.optim.Worker(_groups(ours, 1e-2), master, lr=0.1, weight_decay=1e-3)
    rates = [
        torch.optim.lr_scheduler.MultiStepLR(o, milestones=[4, 8], gamma=gamma)
        for o in (sgd, worker)
    ]
    for _ in range(3):
        _steps(reference, sgd, rates[0], x, y, steps=4)
        _steps(ours, worker, rates[1], x, y, steps=4)
        for a, b in zip(reference.parameters(), ours.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
    assert worker.param_groups[0]["lr"] == pytest.approx(0.1 * gamma**2)
    if algorithm == "dana-slim":  # the master holds SGD's parameters, too
        flat = torch.cat([p.detach().reshape(-1) for p in reference.parameters()])
        torch.testing.assert_close(master.params(), flat, rtol=1e-12, atol=1e-14)


def test_state_dict_round_trip_in_torch_format():
    x, y = _data()
    model = _net()
    master = dana.optim.Master(model.parameters(), workers=1, momentum=0.9)
    worker = dana.optim.Worker(model.parameters(), master, lr=0.05, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.StepLR(worker, 5, 0.5)
    _steps(model, worker, sched, x, y, steps=6)
    state = worker.state_dict()
    # torch's format: per-parameter entries by index, DANA-Slim's v as SGD's buffer
    assert sorted(state) == ["param_groups", "state"]
    assert sorted(state["state"]) == [0, 1, 2, 3]
    assert state["state"][0]["momentum_buffer"].shape == model[0].weight.shape
    assert state["param_groups"][0]["params"] == [0, 1, 2, 3]
    saved = copy.deepcopy((model.state_dict(), state, master.state_dict(), sched.state_dict()))

    _steps(model, worker, sched, x, y, steps=5)  # the run continued

    again = _net(seed=5)
    again.load_state_dict(saved[0])
    master2 = dana.optim.Master(again.parameters(), workers=1, momentum=0.9)
    master2.load_state_dict(saved[2])
    worker2 = dana.optim.Worker(again.parameters(), master2, lr=0.05, weight_decay=1e-4)
    worker2.load_state_dict(saved[1])
    sched2 = torch.optim.lr_scheduler.StepLR(worker2, 5, 0.5)
    sched2.load_state_dict(saved[3])
    _steps(again, worker2, sched2, x, y, steps=5)  # the run resumed
    for a, b in zip(model.parameters(), again.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # an SGD(nesterov=True) state loads too: the same keys
    sgd = torch.optim.SGD(_net().parameters(), lr=0.05, momentum=0.9, nesterov=True)
    sgd.load_state_dict(worker.state_dict())


def test_parameters_are_views_of_one_flat_vector():
    model = _net()
    master = dana.optim.Master(model.parameters(), workers=2, momentum=0.9)
    worker = dana.optim.Worker(model.parameters(), master, rank=1, lr=0.1)
    flat = worker._flat
    for p in model.parameters():
        assert p.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()
        assert p.grad.untyped_storage().data_ptr() == worker._grad.untyped_storage().data_ptr()
    x, y = _data()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    worker.step()
    worker.zero_grad()
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())


def test_local_sgd_takes_local_steps():
    """local-sgd with outer_lr 1 and one worker is its inner optimizer,
    torch.optim.SGD(momentum=m), for any H (docs/ALGORITHMS.md)."""
    x, y = _data()
    reference, ours = _net(), _net()
    sgd = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    master = dana.optim.Master(
        ours.parameters(),
        algorithm="local-sgd",
        workers=1,
        momentum=0.9,
        local_steps=3,
        outer_lr=1.0,
    )
    worker = dana.optim.Worker(ours.parameters(), master, lr=0.1, weight_decay=0.0)
    rates = [torch.optim.lr_scheduler.LambdaLR(o, lambda e: 1.0) for o in (sgd, worker)]
    _steps(reference, sgd, rates[0], x, y, steps=9)
    _steps(ours, worker, rates[1], x, y, steps=9)
    for a, b in zip(reference.parameters(), ours.parameters()):
        torch.testing.assert_close(a, b)


def test_worker_threads_train_with_one_master():
    torch.manual_seed(0)
    x = torch.randn(2048, 10)
    y = (x[:, :2].sum(1) > 0).long()
    model = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    k = 4
    master = dana.optim.Master(model.parameters(), algorithm="dana-slim", workers=k, momentum=0.9)

    def work(rank):
        replica = copy.deepcopy(model)
        opt = dana.optim.Worker(replica.parameters(), master, rank=rank, lr=0.05)
        xs, ys = x[rank::k], y[rank::k]
        for _ in range(3):
            for start in range(0, len(xs), 32):
                opt.zero_grad()
                loss = torch.nn.functional.cross_entropy(
                    replica(xs[start : start + 32]), ys[start : start + 32]
                )
                loss.backward()
                opt.step()

    threads = [threading.Thread(target=work, args=(r,)) for r in range(k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    master.load_into(model.parameters())
    error = (model(x).argmax(1) != y).float().mean().item()
    assert error < 0.08


def test_bad_uses_are_refused_with_a_message():
    model = _net()
    with pytest.raises(ValueError, match="synchronous"):
        dana.optim.Master(model.parameters(), algorithm="ssgd", workers=2)
    with pytest.raises(ValueError, match=r"did you mean 'dana-slim'\?"):
        dana.optim.Master(model.parameters(), algorithm="dana-slm")
    master = dana.optim.Master(model.parameters(), workers=2)
    with pytest.raises(ValueError, match="rank"):
        dana.optim.Worker(model.parameters(), master, rank=2)
    worker = dana.optim.Worker(_groups(model, 0.0), master, lr=0.1)
    worker.param_groups[1]["lr"] = 0.2
    with pytest.raises(ValueError, match="same lr"):
        worker.step()
    with pytest.raises(ValueError, match="parameters"):
        dana.optim.Worker(torch.nn.Linear(2, 2).parameters(), master)
    with pytest.raises(ValueError, match="fixed at construction"):
        worker.add_param_group({"params": [torch.zeros(2, requires_grad=True)]})
    # EASGD's alpha = beta/k: the Master's k reaches each Worker; a link's rule needs it
    elastic = dana.optim.Master(model.parameters(), algorithm="easgd", workers=4)
    assert dana.optim.Worker(model.parameters(), elastic).rule.alpha == 0.9 / 4
    with pytest.raises(ValueError, match=r"workers=k"):
        dana.optim.Worker(model.parameters(), elastic, algorithm=algorithms.build("easgd"))


# -- dana.optim is the simulator ----------------------------------------------------------
#: Every registered asynchronous rule.
ASYNC = [name for name, cls in algorithms.ALGORITHMS.items() if not cls.synchronous]
K, STEPS, WD = 3, 60, 1e-3
PROBLEM = make_least_squares(d=6, n=48, seed=2)
SHAPES = [(2, 2), (2,)]  # the replicas' two tensors, the flat parameters' 4 + 2


def _hparams(name):
    """Short cycles, so that 60 computations make several: 3 local steps per push."""
    names = algorithms.hparam_names(name)
    return {key: 3 for key in ("local_steps", "tau") if key in names}


def _rates(scheduled):
    """A constant rate, or one that warms up over 24 computations and then decays."""
    return LRSchedule(0.1, workers=K, warmup_epochs=2, decay_epochs=(3,)) if scheduled else 0.1


class _Recorded(Simulator):
    """The simulator, recording its events in order: ``("pull", i, rate, None)`` and
    ``("step", i, rate, batch)`` (a computation, pushed or a local step)."""

    def pull(self, i):
        self.__dict__.setdefault("events", []).append(("pull", i, self.lr(), None))
        super().pull(i)

    def push(self, i, work=None):
        self.events.append(("step", i, self.lr(), self.batch[i].clone()))
        return super().push(i, work)


def _simulate(name, scheduled):
    algorithm = algorithms.build(name, **_hparams(name))
    sim = _Recorded(
        algorithm,
        torch.zeros(PROBLEM.d, dtype=torch.float64),
        PROBLEM.gradient,
        BatchStream(PROBLEM.n, 4),
        K,
        lr=_rates(scheduled),
        weight_decay=WD,
        timing="gamma",
        seed=1,
        measure_gap=False,
    )
    sim.run(pushes=STEPS)
    return sim


class _Run:
    """dana.optim in a user's loop: a Master and K Workers over replicas of two tensors,
    built at the simulator's first pulls (each at its rate)."""

    def __init__(self, name, first_rates, init=0.0):
        model = [torch.full(shape, init, dtype=torch.float64) for shape in SHAPES]
        self.master = dana.optim.Master(model, name, workers=K, **_hparams(name))
        self.replicas = [[torch.nn.Parameter(t.clone()) for t in model] for _ in range(K)]
        self.workers = [
            dana.optim.Worker(replica, self.master, rank=i, lr=rate, weight_decay=WD)
            for i, (replica, rate) in enumerate(zip(self.replicas, first_rates))
        ]

    def apply(self, event, repull=True):
        """A step of worker ``i`` on the simulator's batch at its rate, or (the rate of
        the next step set, as a scheduler would) its pull again at that rate."""
        kind, i, rate, batch = event
        worker, replica = self.workers[i], self.replicas[i]
        for group in worker.param_groups:
            group["lr"] = rate
        if kind == "pull":
            if repull:
                worker.repull()
            return
        flat = torch.cat([p.detach().reshape(-1) for p in replica])
        grad, _ = PROBLEM.gradient(flat, batch)
        for p, g in zip(replica, grad.split([p.numel() for p in replica])):
            p.grad = g.view_as(p)
        worker.step()


def _start(name, sim, **kw):
    first = sim.events[:K]
    assert [(kind, i) for kind, i, _, _ in first] == [("pull", i) for i in range(K)]
    return _Run(name, [rate for _, _, rate, _ in first], **kw), sim.events[K:]


@pytest.mark.parametrize("scheduled", [False, True], ids=["constant", "scheduled"])
@pytest.mark.parametrize("name", ASYNC)
def test_every_rule_gives_the_simulators_parameters(name, scheduled):
    """Fed the simulator's gradients in its order (3 workers, gamma timing, weight decay,
    local steps), a Master and its Workers end at the simulator's parameters bit for
    bit, the k-dependent defaults taken for k = 3 (EASGD's alpha = beta/k), under a
    warm-up and decay schedule too (each pull again at the next step's rate)."""
    sim = _simulate(name, scheduled)
    run, events = _start(name, sim)
    for event in events:
        run.apply(event)
    assert torch.equal(run.master.params(), sim.params())


@pytest.mark.parametrize("name", ["nag-asgd", "dana-zero"])
def test_a_schedule_needs_the_pull_again_at_the_next_rate(name):
    """Without Worker.repull() the look-ahead rules pull at the rate of the step just
    taken, not of the next one: under the warm-up they end measurably off (the size
    docs/USAGE.md gives)."""
    sim = _simulate(name, scheduled=True)
    run, events = _start(name, sim)
    for event in events:
        run.apply(event, repull=False)
    assert (run.master.params() - sim.params()).abs().max() > 1e-3


@pytest.mark.parametrize("name", ASYNC)
def test_state_round_trip_resumes_exactly(name):
    """The run saved after half its events (some workers in the middle of a cycle of
    local steps, one between its step and its pull again), loaded into a new Master and
    Workers built from other parameters, and resumed: the simulator's parameters, bit
    for bit. The Master's state is loaded after the Workers are built (their first pull
    is an event of the master)."""
    sim = _simulate(name, scheduled=True)
    run, events = _start(name, sim)
    half = next(n for n in range(len(events) // 2, len(events)) if events[n][0] == "pull")
    for event in events[:half]:
        run.apply(event)
    saved = copy.deepcopy((run.master.state_dict(), [w.state_dict() for w in run.workers]))
    if name == "local-sgd":  # a worker in the middle of its cycle
        assert any(state["state"][0]["rule.t"] > 0 for state in saved[1])

    resumed = _Run(name, [1.0] * K, init=0.5)
    resumed.master.load_state_dict(saved[0])
    for worker, state in zip(resumed.workers, saved[1]):
        worker.load_state_dict(state)
    for event in events[half:]:
        resumed.apply(event)
    assert torch.equal(resumed.master.params(), sim.params())
