"""dana.optim: the rules as torch optimizers in a user's own loop."""

import copy
import threading

import pytest
import torch

import dana.optim


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
