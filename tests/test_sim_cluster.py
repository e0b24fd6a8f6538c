"""The cluster in the clock: the model's pieces, the simulator's event loop on a cluster,
workers that leave and join (every rule's state), data per worker and the bias meter.

docs/ALGORITHMS.md, "The clock, exactly as simulated", states the model these tests
check; dana/sim/clock.py runs it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import make_least_squares, make_simulator

import dana.algorithms as A
from dana.errors import ConfigError
from dana.sim import Simulator
from dana.train.cluster.availability import Availability
from dana.train.cluster.classmeter import ClassMeter
from dana.train.cluster.model import is_trivial, resolve_cluster
from dana.train.cluster.network import Network
from dana.train.cluster.partition import partition
from dana.train.cluster.steptimes import StepTimes
from dana.train.cluster.timing import build_timing
from dana.train.task.batches import BatchStream, WorkerBatches

PROBLEM = make_least_squares()
LR = 0.01


def simulator(name, k, cluster=None, *, bound=None, lr=None, **options) -> Simulator:
    """:func:`conftest.make_simulator` of ``name`` on :data:`PROBLEM` on ``cluster``,
    staleness bounded by ``bound``, the rate warmed up from 0.2 LR over the first epoch
    (``lr``: another)."""
    if name in ("easgd", "eamsgd", "dana-easgd"):
        options.setdefault("workers", k)
    return make_simulator(
        name,
        k,
        PROBLEM,
        lr=lr or (lambda epoch: LR * min(1.0, 0.2 + epoch)),
        cluster=cluster,
        max_staleness=bound,
        **options,
    )


def same_run(a: Simulator, b: Simulator) -> None:
    la, lb = a.log.numpy(), b.log.numpy()
    for column in la:
        assert np.array_equal(la[column], lb[column], equal_nan=True), column
    assert torch.equal(a.params(), b.params())
    assert (a.sim_time, a.updates, a.steps, a.wait_time) == (
        b.sim_time,
        b.updates,
        b.steps,
        b.wait_time,
    )


# -- the zero cluster is today's clock --------------------------------------------------------
EQUIVALENT = [
    ("dana-slim", 5, "gamma", None, {}),
    ("dana-zero", 4, "constant", None, {}),
    ("ssgd", 4, "gamma", None, {}),
    ("ssgd", 3, "constant", None, {"nesterov": True}),
    ("asgd", 6, "heterogeneous", None, {}),
    ("dana-slim", 6, "gamma", 2, {}),
    ("nag-asgd", 5, "constant", 1, {}),
    ("gap-aware", 4, "gamma", None, {}),
    ("local-sgd", 4, "gamma", None, {"local_steps": 3}),
    ("easgd", 4, "gamma", 2, {"tau": 3}),
    ("local-dn", 5, "heterogeneous", None, {"local_steps": 2, "dynamic_steps": True}),
    ("dana-easgd", 4, "gamma", None, {"tau": 2}),
    ("diloco", 3, "gamma", None, {"local_steps": 4}),  # (240 pushes: whole rounds)
]


@pytest.mark.parametrize("name, k, timing, bound, hparams", EQUIVALENT)
def test_the_zero_cluster_runs_todays_clock_bit_for_bit(name, k, timing, bound, hparams):
    """A cluster without communication, drift or departures is today's run: the simulator
    takes its plain loop, and its event loop (forced) gives the same run bit for bit:
    the same log (worker, staleness, gap, loss, lr, time), parameters, waits."""
    today = simulator(name, k, timing=timing, bound=bound, **hparams)
    zero = {"name": "zero", "network": {"latency_ms": 0}}
    assert is_trivial(resolve_cluster(zero, timing))
    plain = simulator(name, k, zero, timing=timing, bound=bound, **hparams)
    clock = simulator(name, k, zero, timing=timing, bound=bound, always_clock=True, **hparams)
    assert plain.clock is None and clock.clock is not None
    for sim in (today, plain, clock):
        sim.run(pushes=240)
    same_run(today, plain)
    same_run(today, clock)


# -- a schedule computed by hand --------------------------------------------------------------
def transfer_cluster(compute_ms, server_gbps, workers_gbps=1.0, latency=1.0):
    """Constant steps; 10 values of 25,000 bytes (250,000 bytes a message): 2 ms on a
    link of 1 Gbit/s (125,000 bytes per ms), 4 ms on one of 0.5 Gbit/s."""
    return {
        "name": "hand",
        "compute": {"model": "constant", "duration": compute_ms},
        "network": {
            "latency_ms": latency,
            "bandwidth_gbps": workers_gbps,
            "server_bandwidth_gbps": server_gbps,
            "bytes_per_value": 25000,
        },
    }


def pushes(sim):
    log = sim.log.numpy()
    return list(zip(log["worker"].tolist(), log["sim_time"].tolist(), log["staleness"].tolist()))


def test_hand_computed_schedule_with_queueing_at_the_server():
    """3 workers, 1 ms steps, latency 1 ms, worker links 2 ms a message, the server's
    link 4 ms a message (FIFO, shared). By hand (a: first bit at the server's link):
    t=1 the 3 requests arrive; egress answers them at 1-5, 5-9, 9-13, so the workers have
    the parameters at 6, 10, 14 (+1 latency) and finish at 7, 11, 15. Worker 0's push
    reaches the link at a=8, crosses it 8-12: applied at 12; the answer queues behind
    worker 2's (egress busy until 13): 13-17, received 18, finished 19, a=20. Worker 1:
    a=12, ingress 12-16, applied 16, egress 17-21, finished 23, a=24. Worker 2: a=16,
    applied 20, egress 21-25, finished 27, a=28. Worker 0: a=20, applied 24 (egress
    25-29); worker 1: a=24, applied 28; worker 2: a=28, applied 32. The server's link is
    the bottleneck: a push every 4 ms, each 2 updates stale once under way."""
    sim = simulator("asgd", 3, transfer_cluster(1.0, 0.5), timing="constant")
    assert sim.clock.network.worker_ms == [2.0] * 3 and sim.clock.network.server_ms == 4.0
    sim.run(pushes=6)
    assert pushes(sim) == [
        (0, 12.0, 0),
        (1, 16.0, 1),
        (2, 20.0, 2),
        (0, 24.0, 2),
        (1, 28.0, 2),
        (2, 32.0, 2),
    ]


def test_hand_computed_schedule_of_ssgd_rounds():
    """ssgd, 2 workers, 10 ms steps, the same links as above (server 4 ms a message).
    Round 1: answers 1-5 and 5-9, received 6 and 10, finished 16 and 20; pushes reach the
    link at 17 and 21, cross it 17-21 and 21-25: the round ends at 25, both pushes
    applied then. Round 2: answers 25-29 and 29-33, received 30 and 34, finished 40 and
    44, pushes at 41-45 and 45-49: the round ends at 49."""
    sim = simulator("ssgd", 2, transfer_cluster(10.0, 0.5), timing="constant")
    sim.run(pushes=4)
    assert pushes(sim) == [(0, 25.0, 0), (1, 25.0, 0), (0, 49.0, 0), (1, 49.0, 0)]
    assert sim.updates == 2


def test_hand_computed_schedule_of_diloco_rounds():
    """diloco (H = 2) on ssgd's links above: each worker's two steps end 10 ms later
    than ssgd's one (26 and 30), its push crosses the server's link 27-31 and 31-35: the
    round ends at 35; round 2: answers 35-39 and 39-43, received 40 and 44, finished 60
    and 64, pushes 61-65 and 65-69: it ends at 69."""
    sim = simulator("diloco", 2, transfer_cluster(10.0, 0.5), timing="constant", local_steps=2)
    sim.run(pushes=8)  # (gradient computations: two rounds of two workers' two steps)
    assert pushes(sim) == [(0, 35.0, 0), (1, 35.0, 0), (0, 69.0, 0), (1, 69.0, 0)]
    assert sim.updates == 2 and sim.steps == 8


def test_hand_computed_schedule_with_two_servers():
    """The same 3 workers on 2 shards: each shard's part is 5 values (125,000 bytes, 2 ms
    at 0.5 Gbit/s) and the worker's link carries the whole message (2 ms). The egress
    answers 1-3, 3-5, 5-7: received 4, 6, 8, finished 5, 7, 9; the pushes reach the
    links at 6, 8, 10 and cross them in 2 ms each: applied at 8, 10, 12."""
    sim = simulator("asgd", 3, transfer_cluster(1.0, 0.5), timing="constant", servers=2)
    assert sim.clock.network.server_ms == 2.0
    sim.run(pushes=3)
    assert pushes(sim) == [(0, 8.0, 0), (1, 10.0, 1), (2, 12.0, 2)]


def test_network_transfer_rule():
    network = {
        "latency_ms": [1.0, 3.0],
        "bandwidth_gbps": [1.0, 0.25],
        "server_bandwidth_gbps": 2.0,
        "bytes_per_value": None,
    }
    net = Network(network, workers=2, servers=3, d=1000, value_bytes=125.0)
    # 125,000 bytes: 1 ms at 1 Gbit/s, 4 ms at 0.25; a part of ceil(1000/3) = 334 values
    # (41,750 bytes) crosses a 2 Gbit/s shard link in 0.167 ms
    assert net.worker_ms == [1.0, 4.0] and net.server_ms == pytest.approx(0.167)
    assert net.to_server(1, 10.0) == 14.0  # the slow worker's own link bounds it
    assert net.ingress_free == pytest.approx(10.167)
    assert net.from_server(0, 10.0) == 12.0  # max(egress, 10 + 1) + latency 1


# -- step times, availability, the cluster file -----------------------------------------------
def test_step_times_multiply_the_model_draw_by_the_factors():
    compute = resolve_cluster(
        {
            "name": "x",
            "compute": {
                "model": "gamma",
                "worker_factors": [1, 2],
                "periodic": {"amplitude": 0.5, "period_ms": 1000},
                "class_cost": [1.0, 3.0],
            },
        }
    )["compute"]
    labels = np.array([0, 0, 1, 1])
    times = StepTimes(compute, workers=2, seed=4, labels=labels)
    base = build_timing("gamma", 2, 4)
    t = 250.0  # a quarter period: sin(2 pi (1/4 + 1/2)) = -1 for worker 1
    got = times.duration(1, t, torch.tensor([0, 2]))
    expected = base.sample(1) * 2.0 * (1 + 0.5 * math.sin(2 * math.pi * (0.25 + 0.5))) * 2.0
    assert got == expected
    assert times.mean_time(1) == 2 * 128.0


def test_slow_episodes_are_per_worker_and_need_no_order():
    compute = resolve_cluster(
        {
            "compute": {
                "model": "constant",
                "slow_episodes": {"every_ms": 50, "length_ms": 20, "factor": 4},
            }
        }
    )["compute"]
    a, b = StepTimes(compute, 2, seed=1), StepTimes(compute, 2, seed=1)
    times = np.arange(0, 2000, 7.0)
    one = [a.duration(0, t, None) for t in times]
    for t in times:  # the other worker's queries in between change nothing for worker 0
        b.duration(1, t, None)
    assert one == [b.duration(0, t, None) for t in times]
    assert set(one) == {1.0, 4.0} and 0.15 < one.count(4.0) / len(one) < 0.45


def test_availability_spells():
    given = resolve_cluster(
        {
            "availability": {
                "preemptions": [
                    {"worker": 1, "leave_ms": 50, "rejoin_ms": 80},
                    {"worker": 1, "leave_ms": 10, "rejoin_ms": 20},
                    {"worker": 0, "leave_ms": 30},
                ]
            }
        }
    )["availability"]
    av = Availability(given, workers=3)
    assert av.next_spell(1, 0.0) == (10.0, 20.0)
    assert av.next_spell(1, 20.0) == (50.0, 80.0)
    assert av.next_spell(1, 80.0) is None
    assert av.next_spell(0, 0.0) == (30.0, None) and av.next_spell(2, 0.0) is None
    rand = resolve_cluster({"availability": {"random": {"mean_up_ms": 100, "mean_down_ms": 10}}})
    a, b = (
        Availability(rand["availability"], 2, seed=5),
        Availability(rand["availability"], 2, seed=5),
    )
    spells = [a.next_spell(0, t) for t in (0.0, 500.0)]
    b.next_spell(1, 0.0)  # another worker's draw changes nothing for worker 0
    assert spells == [b.next_spell(0, t) for t in (0.0, 500.0)]


@pytest.mark.parametrize(
    "cluster, fragments",
    [
        ({"network": {"latency": 1}}, ["network", "no field latency", "latency_ms"]),
        ({"network": {"latency_ms": -1}}, ["network.latency_ms", ">= 0"]),
        ({"network": {"bandwidth_gbps": [1, "x"]}}, ["network.bandwidth_gbps[1]"]),
        ({"compute": {"model": "weibull"}}, ["compute.model", "weibull", "lognormal"]),
        ({"compute": {"model": "pareto", "alpha": 1}}, ["compute", "alpha", "> 1"]),
        ({"compute": {"model": "gamma", "cv": 0.1}}, ["compute", "cv", "shape, scale"]),
        ({"compute": {"shape": 3}}, ["compute", "no model"]),
        ({"compute": {"periodic": {"amplitude": 0.2}}}, ["compute.periodic.period_ms"]),
        ({"compute": {"class_cost": []}}, ["compute.class_cost"]),
        ({"availability": {"preemptions": [{"worker": 0}]}}, ["preemptions[0].leave_ms"]),
        (
            {"availability": {"preemptions": [{"worker": 0, "leave_ms": 5, "rejoin_ms": 2}]}},
            ["preemptions[0].rejoin_ms", "> 5"],
        ),
        (
            {
                "availability": {
                    "preemptions": [
                        {"worker": 0, "leave_ms": 5, "rejoin_ms": 20},
                        {"worker": 0, "leave_ms": 10},
                    ]
                }
            },
            ["overlapping", "worker 0"],
        ),
        ({"wires": 3}, ["no field wires"]),
    ],
)
def test_bad_cluster_fields_are_named(cluster, fragments):
    with pytest.raises(ConfigError) as e:
        resolve_cluster({"name": "bad", **cluster})
    for fragment in fragments:
        assert fragment in str(e.value)


def test_a_cluster_takes_the_run_timing_unless_it_has_its_own():
    own = resolve_cluster({"name": "c"}, "constant", {"duration": 3.0})
    assert own["compute"]["model"] == "constant" and own["compute"]["duration"] == 3.0
    with pytest.raises(ConfigError, match="both set the step times"):
        resolve_cluster("datacenter", "constant", {}, timing_given=True)
    assert resolve_cluster("datacenter", "gamma", {}, timing_given=False)["compute"]["shape"] == 100


# -- workers that leave and join: every rule's state ------------------------------------------
def test_dana_zero_leave_keeps_S_the_sum_of_the_live_momenta_and_the_pull():
    master = A.build("dana-zero", momentum=0.9).master(torch.zeros(3, dtype=torch.float64), 3)
    g = torch.randn(3, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    for i in (0, 1, 2, 0, 1):
        master.push(i, g[i], lr=0.1)
    v1 = master.v[1].clone()
    before = master.pull(2, 0.1, torch.empty(3, dtype=torch.float64))
    theta = master.theta.clone()
    assert master.leave(1, 0.1) is False
    assert torch.equal(master.v[1], torch.zeros(3, dtype=torch.float64))
    assert torch.equal(master.S, master.v[0] + master.v[2])  # the live workers' sum, exactly
    assert torch.equal(master.theta, theta - 0.1 * 0.9 * v1)  # the promised look-ahead step
    after = master.pull(2, 0.1, torch.empty(3, dtype=torch.float64))
    assert torch.allclose(after, before, rtol=0, atol=1e-15)  # a pull sends the same
    master.join(1)
    master.push(1, g[1], lr=0.1)
    assert torch.equal(master.v[1], g[1])  # back with a zero momentum


@pytest.mark.parametrize("other", ["dana-zero", "dana-dc"])
def test_dana_slim_stays_dana_zero_across_leaves_and_joins(other):
    """With a constant lr, dana-slim (the momenta in the workers, lost with them) and
    dana-zero (the master's look-ahead step at a departure; dana-dc with lc = 0 is it)
    send every worker the same parameters, across departures and returns: the same
    events, gaps and parameters to rounding."""
    cluster = {
        "name": "churn",
        "network": {"latency_ms": 0.5},
        "availability": {
            "preemptions": [
                {"worker": 1, "leave_ms": 300, "rejoin_ms": 700},
                {"worker": 2, "leave_ms": 450, "rejoin_ms": 1200},
                {"worker": 1, "leave_ms": 1500},
            ]
        },
    }
    hp = {"lc": 0.0} if other == "dana-dc" else {}
    slim = simulator("dana-slim", 4, cluster, lr=lambda e: LR, seed=2)
    zero = simulator(other, 4, cluster, lr=lambda e: LR, seed=2, **hp)
    slim.run(pushes=150)
    zero.run(pushes=150)
    assert slim.clock.leaves == 3 and slim.clock.joins == 2 and slim.clock.lost >= 1
    a, b = slim.log.numpy(), zero.log.numpy()
    assert np.array_equal(a["worker"], b["worker"]) and np.array_equal(a["sim_time"], b["sim_time"])
    assert np.allclose(a["gap"], b["gap"], rtol=1e-9, atol=1e-14)
    assert torch.allclose(slim.sent, zero.sent, rtol=0, atol=1e-12)  # what each pulled
    theta = slim.worker_rule.true_params(
        slim.master.gap_reference(), LR, torch.empty_like(zero.params())
    )
    assert torch.allclose(theta, zero.params(), rtol=0, atol=1e-12)  # dana-slim's true theta


def test_dana_local_leave_keeps_the_pull_and_the_sum():
    master = A.build("dana-local").master(torch.zeros(2, dtype=torch.float64), 3)
    for i, delta in ((0, 1.0), (1, 2.0), (2, -1.0), (1, 0.5)):
        master.push(i, torch.full((2,), delta, dtype=torch.float64), lr=0.1)
    before = master.pull(0, 0.1, torch.empty(2, dtype=torch.float64))
    master.leave(1, 0.1)
    assert torch.equal(master.S, master.v[0] + master.v[2])
    assert torch.allclose(master.pull(0, 0.1, torch.empty(2, dtype=torch.float64)), before)


def test_remembered_pulls_are_dropped_and_renewed():
    for name in ("dc-asgd", "gap-aware", "dana-dc", "dana-ga"):
        master = A.build(name).master(torch.zeros(2, dtype=torch.float64), 2)
        out = torch.empty(2, dtype=torch.float64)
        master.push(0, torch.ones(2, dtype=torch.float64), 0.1)
        master.pull(1, 0.1, out)
        assert master.sent[1].abs().sum() > 0, name
        master.leave(1, 0.1)
        assert not master.sent[1].any(), name
        master.join(1)
        master.pull(1, 0.1, out)
        assert torch.equal(master.sent[1], out), name


def test_multi_asgd_drops_the_departed_momentum():
    master = A.build("multi-asgd").master(torch.zeros(2), 2)
    master.push(1, torch.ones(2), 0.1)
    master.leave(1, 0.1)
    assert not master.v[1].any()


def test_worker_state_is_lost_and_restarts_from_the_pull():
    for name, hp in (("local-sgd", {"local_steps": 3}), ("eamsgd", {"tau": 2, "workers": 2})):
        algo = A.build(name, **hp)
        workers = algo.worker(2, 3, torch.float64)
        workers.set_lr(0.1)
        pulled = torch.ones(3, dtype=torch.float64)
        for _ in range(2):
            workers.compute_at(1, pulled)
            workers.message(1, torch.ones(3, dtype=torch.float64))
        workers.leave(1)
        for key in workers.state_keys:
            value = getattr(workers, key)
            if isinstance(value, torch.Tensor):
                assert not value[1].any(), (name, key)
        workers.join(1)
        fresh = torch.full((3,), 7.0, dtype=torch.float64)
        assert torch.equal(workers.compute_at(1, fresh), fresh), name  # starts from its pull
    slim = A.build("dana-slim").worker(3, 2, torch.float64)
    for i in range(3):
        slim.message(i, torch.full((2,), float(i + 1), dtype=torch.float64))
    slim.leave(2)
    assert not slim.v[2].any() and torch.equal(slim.S, slim.v[0] + slim.v[1])


def test_ssgd_round_waits_for_the_live_workers_only():
    master = A.build("ssgd", momentum=0.0).master(torch.zeros(1, dtype=torch.float64), 3)
    assert master.push(0, torch.tensor([1.0], dtype=torch.float64), 0.1) is False
    assert master.leave(2, 0.1) is False  # still waiting for worker 1
    assert master.push(1, torch.tensor([3.0], dtype=torch.float64), 0.1) is True
    assert master.theta.item() == pytest.approx(-0.2)  # the mean of the 2 it got
    master.push(0, torch.tensor([1.0], dtype=torch.float64), 0.1)
    assert master.leave(1, 0.1) is True  # the departure completes the round
    assert master.theta.item() == pytest.approx(-0.3)
    master.join(1)
    assert master.push(0, torch.tensor([1.0], dtype=torch.float64), 0.1) is False  # waits for 1


def test_dana_easgd_mean_runs_over_the_live_workers():
    master = A.build("dana-easgd", alpha=0.5).master(torch.zeros(1, dtype=torch.float64), 3)
    out = torch.empty(1, dtype=torch.float64)
    for i in range(3):
        master.pull(i, 0.1, out)
    for i, e in ((1, 0.5), (2, 0.25), (0, 0.1)):
        master.push(i, torch.tensor([e], dtype=torch.float64), 0.1)
    master.leave(2, 0.1)
    assert torch.equal(master.position_sum, master.position[0] + master.position[1])
    assert not master.position[2].any() and int(master.cycle[2]) == 0
    master.leave(1, 0.1)
    assert torch.equal(master.pull(0, 0.1, out), master.theta)  # nobody else: the center
    master.join(2)
    assert torch.equal(master.position[2], master.theta)  # it starts at the center


def test_closed_loop_and_lwp_forget_the_departed():
    yf = A.build("yellowfin-cl").master(torch.zeros(2), 2)
    yf.pull(1, 0.1, torch.empty(2))
    yf.push(0, torch.ones(2), 0.1)
    yf.leave(1, 0.1)
    assert not bool(yf.pending[1]) and not yf.before[1].any() and not yf.after[1].any()
    lwp = A.build("lwp-asgd").master(torch.zeros(2), 2)
    lwp.pull(1, 0.1, torch.empty(2))
    lwp.push(0, torch.ones(2), 0.1)
    lwp.push(1, torch.ones(2), 0.1)
    assert int(lwp.last_delay[1]) == 1
    lwp.leave(1, 0.1)
    assert int(lwp.last_delay[1]) == 0


CHURN = {
    "name": "churn",
    "compute": {
        "model": "gamma",
        "slow_episodes": {"every_ms": 1500, "length_ms": 300, "factor": 3},
    },
    "network": {"latency_ms": [0.5, 2.0], "bandwidth_gbps": 1e-4, "server_bandwidth_gbps": 3e-4},
    "availability": {"random": {"mean_up_ms": 2500, "mean_down_ms": 600}},
}


@pytest.mark.parametrize("name", sorted(A.ALGORITHMS))
def test_every_rule_runs_with_churn_bounded_and_not(name):
    """Every algorithm through departures, returns and a congested network, with and
    without a staleness bound: it runs, loses work, and no applied push is staler than
    the bound."""
    for bound in (None, 2):
        sim = simulator(name, 4, CHURN, bound=bound, seed=1)
        sim.run(pushes=120)
        assert sim.clock.leaves > 0 and sim.clock.joins > 0
        assert np.isfinite(sim.log.numpy()["loss"]).all()
        if bound is not None and not sim.synchronous:
            assert sim.log.numpy()["staleness"].max() <= bound


@pytest.mark.parametrize(
    "name, bound, hparams",
    [
        ("dana-slim", None, {}),
        ("ssgd", None, {}),
        ("dana-zero", 2, {}),
        ("local-sgd", None, {"local_steps": 3}),
        ("easgd", 1, {"tau": 2}),
    ],
)
def test_resume_mid_run_on_a_cluster_is_exact(name, bound, hparams):
    """A simulation saved midway (events in flight, workers away, held pushes, messages
    on their way) and loaded into a fresh simulator continues exactly as the whole."""
    labels = torch.arange(PROBLEM.n) % 3
    whole = simulator(name, 4, CHURN, bound=bound, seed=3, labels=labels, **hparams)
    whole.run(pushes=160)
    first = simulator(name, 4, CHURN, bound=bound, seed=3, labels=labels, **hparams)
    first.run(pushes=77)
    state = first.state_dict()
    second = simulator(name, 4, CHURN, bound=bound, seed=3, labels=labels, **hparams)
    second.load_state_dict(state)
    second.run(pushes=160)
    same_run(whole, second)
    assert second.clock.counters() == whole.clock.counters()
    assert second.meter.applied_counts.tolist() == whole.meter.applied_counts.tolist()


def test_threaded_gradients_on_a_cluster_equal_one_at_a_time():
    """The threaded engine's look-ahead follows the clock's events and forgets a departed
    worker's gradient: bit for bit the sequential run (tests/test_sim_engines.py checks
    the same without a cluster)."""
    from dana.train.task.flat import FlatModel
    from dana.train.task.stacked import GradientSource

    torch.manual_seed(0)
    x = torch.randn(96, 6, dtype=torch.float64)
    y = (x[:, 0] > 0).long()
    runs = []
    for threads in (1, 3):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
        flat = FlatModel(model, torch.float64)

        def inputs(rows, x=x, y=y):
            return x[rows], y[rows]

        def gradient(p, rows, flat=flat):
            return flat.gradient(p, *inputs(rows), torch.nn.functional.cross_entropy)

        sim = Simulator(
            A.build("dana-slim"),
            flat.flat.clone(),
            gradient,
            BatchStream(96, 8, seed=0),
            4,
            lr=0.05,
            seed=0,
            cluster=CHURN,
            threads=threads,
            source=GradientSource(flat, torch.nn.functional.cross_entropy, inputs)
            if threads > 1
            else None,
            weight_decay=0.0,
        )
        sim.run(pushes=150)
        runs.append(sim)
    same_run(runs[0], runs[1])
    assert runs[1].clock.leaves > 0 and runs[1].engine.computed > 0


# -- data per worker and the bias meter -------------------------------------------------------
@pytest.mark.parametrize("spec", ["dirichlet:0.3", "dirichlet:50", "shards:2", "shards:1"])
def test_partitions_are_reproducible_disjoint_and_cover(spec):
    labels = np.random.default_rng(0).integers(0, 10, size=1000)
    parts = partition(labels, 6, seed=4, spec=spec, min_size=16)
    again = partition(labels, 6, seed=4, spec=spec, min_size=16)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    joined = np.concatenate(parts)
    assert len(joined) == len(labels) and np.array_equal(np.sort(joined), np.arange(1000))
    assert min(len(p) for p in parts) >= 16
    other = partition(labels, 6, seed=5, spec=spec, min_size=16)
    assert any(not np.array_equal(a, b) for a, b in zip(parts, other))


def test_partition_skew_follows_its_parameter():
    labels = np.repeat(np.arange(10), 100)

    def classes_per_worker(spec):
        parts = partition(labels, 5, seed=0, spec=spec, min_size=8)
        return np.mean([(np.bincount(labels[p], minlength=10) > 10).sum() for p in parts])

    assert classes_per_worker("shards:2") <= 2
    assert classes_per_worker("dirichlet:0.1") < 5 < classes_per_worker("dirichlet:100")
    assert partition(labels, 5, seed=0, spec="iid") is None
    with pytest.raises(ConfigError, match="dirichlet:ALPHA"):
        partition(labels, 5, seed=0, spec="dirichlet:-1")
    with pytest.raises(ConfigError, match="a batch"):
        partition(labels, 200, seed=0, spec="shards:1", min_size=8)


def test_each_worker_draws_from_its_own_part():
    labels = np.repeat(np.arange(4), 50)
    parts = partition(labels, 4, seed=1, spec="shards:1", min_size=8)
    batches = WorkerBatches(parts, 200, 8, seed=1)
    for i in range(4):
        for _ in range(10):
            assert set(batches.next_for(i).tolist()) <= set(parts[i].tolist())
    state = batches.state_dict()
    ahead = [batches.next_for(2) for _ in range(3)]
    batches.load_state_dict(state)
    assert all(torch.equal(a, batches.next_for(2)) for a in ahead)


def test_the_bias_meter_sees_fast_data_win():
    """Two workers, each holding half of the classes; the second half's examples cost
    three times as much: the first worker pushes about three times as often, and the
    applied updates hold about 3/4 of its classes, where the data holds 1/2."""
    labels = torch.arange(PROBLEM.n) % 4
    order = np.argsort(labels.numpy(), kind="stable")
    parts = [np.sort(order[: PROBLEM.n // 2]), np.sort(order[PROBLEM.n // 2 :])]
    cluster = {"name": "costly", "compute": {"model": "constant", "class_cost": [1, 1, 3, 3]}}
    sim = simulator(
        "asgd",
        2,
        cluster,
        timing="constant",
        labels=labels,
        batches=WorkerBatches(parts, PROBLEM.n, 8),
    )
    sim.run(pushes=400)
    applied, data = sim.meter.shares()
    assert data == [0.25] * 4
    assert applied[0] + applied[1] == pytest.approx(0.75, abs=0.01)
    iid = simulator("asgd", 2, None, timing="constant", labels=labels)
    iid.run(pushes=400)
    assert iid.meter.shares()[0][0] + iid.meter.shares()[0][1] == pytest.approx(0.5, abs=0.05)


def test_class_meter_counts_only_what_is_applied():
    meter = ClassMeter(np.array([0, 1, 1, 2]), workers=2)
    meter.computed(0, torch.tensor([0, 1]))
    meter.computed(0, (torch.tensor([2]), 7))  # a keyed batch
    meter.computed(1, torch.tensor([3]))
    meter.applied(0)
    meter.lost(1)
    assert meter.applied_counts.tolist() == [1, 2, 0]
    assert meter.pending.sum() == 0


def test_the_documented_cluster_file_runs():
    """The full example of docs/ALGORITHMS.md ("The clock, exactly as simulated") is a
    valid cluster: it resolves with every field and a simulation runs on it."""
    import re
    from pathlib import Path

    import yaml

    doc = (Path(__file__).resolve().parents[1] / "docs" / "ALGORITHMS.md").read_text()
    text = re.search(r"```yaml\n(name: mixed.*?)```", doc, re.S).group(1)
    cluster = resolve_cluster(yaml.safe_load(text))
    assert cluster["compute"]["worker_factors"] == [1.0, 1.0, 1.0, 2.0]
    assert len(cluster["availability"]["preemptions"]) == 2
    labels = torch.arange(PROBLEM.n) % 10
    sim = simulator("dana-slim", 4, cluster, labels=labels)
    sim.run(pushes=50)
    assert sim.sim_time > 0 and len(sim.log) == 50


def test_validate_leaves_the_config_as_it_is_and_returns_the_resolved_one():
    from dana.train.config import TrainConfig

    config = TrainConfig(cluster="geo", workers=4)
    before = config.to_dict()
    checked = config.validate()
    assert config.to_dict() == before and config.cluster == "geo"
    assert (
        checked.cluster["name"] == "geo" and checked.timing == checked.cluster["compute"]["model"]
    )
    assert checked.validate() == checked  # (a resolved config validates to itself)
