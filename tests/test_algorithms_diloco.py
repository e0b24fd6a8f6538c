"""Synchronous DiLoCo (Douillard et al. 2023, Algorithm 1) against an independent
transcription: one ``torch.optim.AdamW`` per worker for the inner steps, and
``torch.optim.SGD(nesterov=True)`` on the mean outer gradient for the outer step."""

from __future__ import annotations

import pytest
import torch
from conftest import make_least_squares, make_simulator, max_rel_diff
from test_algorithms_beyond import write_trace_file

import dana.algorithms as A
from dana.train.task.batches import BatchStream

F64 = torch.float64
INNER = dict(lr=0.02, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def diloco_reference(problem, k: int, H: int, rounds: int, stream: BatchStream):
    """The parameters after ``rounds`` rounds of Algorithm 1, the batches drawn from
    ``stream`` in the simulator's order with equal step times: each worker's first batch
    at the pulls that start a round (workers in order), then, step by step, the next
    batch of each worker in turn."""
    theta = torch.nn.Parameter(torch.zeros(problem.d, dtype=F64))
    outer = torch.optim.SGD([theta], lr=0.7, momentum=0.9, nesterov=True)
    xs = [torch.nn.Parameter(torch.zeros(problem.d, dtype=F64)) for _ in range(k)]
    inner = [torch.optim.AdamW([x], **INNER) for x in xs]
    for _ in range(rounds):
        rows = [stream.next() for _ in range(k)]
        for x in xs:
            with torch.no_grad():
                x.copy_(theta)
        for h in range(H):
            for i in range(k):
                if h:
                    rows[i] = stream.next()
                xs[i].grad = problem.gradient(xs[i].detach(), rows[i])[0]
                inner[i].step()
        theta.grad = torch.stack([theta.detach() - x.detach() for x in xs]).mean(0)
        outer.step()
    return theta.detach()


@pytest.mark.parametrize("k,H", [(1, 1), (3, 4), (4, 1)])
def test_diloco_in_the_simulator_is_algorithm_1(k, H):
    problem = make_least_squares()
    sim = make_simulator(
        "diloco",
        k,
        problem,
        lr=INNER["lr"],
        local_steps=H,
        beta1=0.9,
        beta2=0.95,
        inner_decay=0.1,
        timing="constant",
    )
    rounds = 6
    for _ in range(rounds):
        sim.step()
    assert sim.updates == rounds and sim.steps == rounds * k * H
    ref = diloco_reference(problem, k, H, rounds, BatchStream(problem.n, 8, seed=0))
    assert max_rel_diff(sim.params(), ref) <= 1e-12


def test_a_diloco_round_costs_its_slowest_workers_h_steps(tmp_path):
    # workers of 1, 2 and 5 ms a step: a round of H = 4 steps lasts 20 ms, and the fast
    # workers' local steps draw their batches as their steps end, before the slow one's
    trace = write_trace_file(tmp_path / "t.csv", [1.0, 2.0, 5.0])
    sim = make_simulator("diloco", 3, local_steps=4, timing="trace", timing_params={"path": trace})
    sim.step()
    sim.step()
    assert sim.sim_time == 40.0 and sim.steps == 24 and sim.updates == 2


def test_diloco_refuses_what_does_not_apply():
    with pytest.raises(ValueError, match="synchronous.*Dynamic Local Updates"):
        A.build("diloco", dynamic_steps=True)
    with pytest.raises(ValueError, match="averages.*scale outer_lr"):
        A.build("diloco", outer_weight=0.5)
    assert A.build("diloco").synchronous


def test_a_diloco_round_reads_the_schedule_at_the_data_consumed_before_it():
    # 256 rows in batches of 8: 32 computations an epoch; k = 2, H = 4: a round is 8
    # of them, a quarter epoch; every step of round r carries the rate at epoch r/4
    seen = []
    sim = make_simulator("diloco", 2, local_steps=4, lr=lambda epoch: seen.append(epoch) or 0.01)
    for _ in range(3):
        sim.step()
    assert sim.lr() == 0.01 and seen[-1] == 3 * 2 * 4 / 32
    assert set(seen) == {0.0, 0.25, 0.5, 0.75}
