"""The Ray runtime (dana.ps): protocol units without Ray, then real runs on a local Ray.

The unit tests drive a :class:`HeadServer` (shard 0), a :class:`ShardServer` and a
:class:`LogMerger` directly. The tests marked ``ray`` use the session's local Ray, train
tiny models on synthetic data and check the results and the runtime's accounting: every
push a worker numbered is applied once or refused after the run's end, never twice,
none skipped.
"""

from __future__ import annotations

import heapq
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import check_accounting, run_on_ray, tiny

from dana import algorithms
from dana.errors import ConfigError
from dana.ps.head import HeadServer
from dana.ps.layout import Layout, shard_bounds
from dana.ps.log import LogMerger, ShardLog
from dana.ps.protocol import Push, Status
from dana.ps.settings import server_settings
from dana.ps.shard import ShardServer
from dana.train.config import TrainConfig
from dana.train.records.progress import Progress
from dana.train.records.rundir import RunDir
from dana.train.task.problem import Problem

try:
    import ray
except ImportError:  # the protocol units still run
    ray = None


# -- units, no Ray ------------------------------------------------------------------------
APPLIED, DUPLICATE, LOCAL = Status.APPLIED, Status.DUPLICATE, Status.LOCAL
PARAMS, STOP, WAIT = Status.PARAMS, Status.STOP, Status.WAIT


def make_server(
    config: TrainConfig, d: int = 6, batches_per_epoch: int = 100, **kw: Any
) -> HeadServer:
    options = dict(end=None, evals=[], checkpoints=[])
    options.update(kw)
    settings = server_settings(config, d, batches_per_epoch)[0]
    server = HeadServer(np.zeros(d, np.float32), **settings, **options)
    server.begin(time.time())
    return server


def test_shards_cover_the_vector():
    assert shard_bounds(10, 3) == [(0, 4), (4, 7), (7, 10)]
    layout = Layout(1000, 4, seed=1, probes=100)
    assert sum(len(p) for p in layout.probes) == 100
    assert all(len(p) == len(set(p.tolist())) for p in layout.probes)
    with pytest.raises(ValueError):
        shard_bounds(3, 4)


def test_push_is_idempotent_and_stops_at_the_end():
    server = make_server(tiny(workers=2, lr=0.5, warmup_epochs=0), end=3)
    status, params, lr, last_seq, joins = server.pull(0, join=True)
    assert (status, last_seq, joins, lr) == ("params", 0, 1, 0.5)
    g = np.ones(6, np.float32)
    assert server.push(Push(0, 1, g, loss=1.0)) == APPLIED
    assert server.push(Push(0, 1, g, loss=1.0)) == DUPLICATE  # the same push again: not applied
    np.testing.assert_allclose(server.master.theta.numpy(), -0.5)
    status, params, _ = server.exchange(Push(1, 1, g, loss=1.0))
    assert status == APPLIED and params is not None
    assert server.push(Push(1, 2, g)) == APPLIED  # the run's third and last step
    assert server.stopped and server.push(Push(0, 2, g)) == STOP
    assert server.pull(0)[0] == STOP
    counters = server.counters()
    assert counters["pushes"] == counters["updates"] == 3
    assert counters["applied"] == counters["last_seq"] == [1, 2]
    assert (counters["duplicates"], counters["rejected_after_stop"]) == (1, 1)


def test_staleness_and_gap_are_measured_at_the_server():
    server = make_server(tiny(workers=2, lr=1.0, warmup_epochs=0))
    server.pull(0, join=True)
    server.pull(1, join=True)
    g = np.full(6, 2.0, np.float32)
    server.push(Push(0, 1, g))
    server.push(Push(1, 1, g))  # computed before worker 0's push landed: staleness 1
    log = server.log.drain()
    assert log["staleness"].tolist() == [0, 1]
    gap = np.sqrt(log["gap_sq"] / log["gap_n"])
    np.testing.assert_allclose(gap, [0.0, 2.0])  # theta moved by lr*g = 2 per coordinate


def test_ssgd_rounds_and_snapshots():
    config = tiny(algorithm="ssgd", workers=2, momentum=0.0, lr=1.0, warmup_epochs=0)
    server = make_server(config, evals=[0, 3], checkpoints=[2])
    assert [s["point"] for s in server.poll()["snapshots"]] == [0]  # the start
    for seq in (1, 2):
        for w in (0, 1):
            server.pull(w)
            server.push(Push(w, seq, np.full(6, w + 1.0, np.float32)))
    snaps = server.poll()["snapshots"]
    # point 2 at the first round boundary, point 3 at the next (steps 4)
    assert [(s["point"], s["steps"], s["updates"]) for s in snaps] == [(2, 2, 1), (3, 4, 2)]
    assert "state" in snaps[0] and "params" in snaps[1]
    np.testing.assert_allclose(snaps[1]["params"], -3.0)  # two steps of mean(1, 2)
    restored = make_server(config, state=snaps[0]["state"])
    np.testing.assert_allclose(restored.master.theta.numpy(), -1.5)
    assert restored.counters()["last_seq"] == [1, 1]


def test_ssgd_server_applies_the_schedule_once_per_round():
    """Every push of a round is applied at the round's rate: the schedule at the round's
    start (update u: epoch u*k/batches_per_epoch), with the warm-up from lr/k."""
    k, bpe = 4, 10
    config = tiny(algorithm="ssgd", workers=k, momentum=0.0, lr=0.4, warmup_epochs=2)
    server = make_server(config, batches_per_epoch=bpe)
    for seq in range(1, 6):
        for w in range(k):
            status, _, lr, *_ = server.pull(w)
            assert status == PARAMS
            server.push(Push(w, seq, np.ones(6, np.float32)))
    log = server.poll()["log"]
    schedule = [0.1 + 0.3 * (u * k / bpe) / 2 for u in range(5)]
    np.testing.assert_allclose(log["lr"], np.repeat(schedule, k), rtol=1e-12)
    # theta moved by the applied rates, one step of mean(g) = 1 per round
    np.testing.assert_allclose(server.master.theta.numpy(), -sum(schedule), rtol=1e-6)


def test_log_merger_joins_shards_by_push():
    merger = LogMerger(servers=2)

    def entries(rows: list[tuple]) -> dict[str, np.ndarray]:
        log = ShardLog()
        for w, seq, stale, gap_sq, gap_n in rows:
            log.append(
                worker=w, seq=seq, staleness=stale, gap_sq=gap_sq, gap_n=gap_n, loss=0.5,
                lr=0.1, time=1.0, duration=0.2, compute=0.1, updates=seq, members=3,
            )  # fmt: skip
        return log.drain()

    merger.add(0, entries([(0, 1, 0, 1.0, 2), (1, 1, 1, 4.0, 2)]))
    assert len(merger) == 0  # shard 1's parts are not in yet
    merger.add(1, entries([(1, 1, 2, 4.0, 2), (0, 1, 0, 3.0, 2)]))
    assert len(merger) == 2
    log = merger.log.numpy()
    assert log["staleness"].tolist() == [0, 2]  # the stalest part
    np.testing.assert_allclose(log["gap"], [1.0, math.sqrt(2.0)])  # sqrt(4/4), sqrt(8/4)
    merger.add(0, entries([(0, 2, 0, 0.0, 2)]))
    merger.finish()  # shard 1 never applied it (the run ended): merged with what is there
    assert len(merger) == 3


def test_bounded_staleness_gates_at_the_server():
    """The simulator's start and push gates, answered "wait" at once (s = 1, k = 3)."""
    server = make_server(tiny(workers=3, max_staleness=1, lr=1.0, warmup_epochs=0))
    g = np.ones(6, np.float32)
    assert server.pull(0, join=True)[0] == server.pull(1, join=True)[0] == PARAMS
    assert server.pull(2, join=True)[:2] == (WAIT, None)  # s + 1 = 2 workers in flight
    status, params, _ = server.exchange(Push(1, 1, g))  # applied, but worker 2 starts first
    assert (status, params) == (APPLIED, None)
    assert server.pull(1)[0] == WAIT and server.pull(2)[0] == PARAMS
    # worker 2 pulled after 1 update; worker 0 (older) has staleness 1 already: holding
    # 2's push keeps room for 0's
    assert server.push(Push(2, 1, g)) == WAIT
    assert server.push(Push(2, 1, g)) == WAIT and server.records.last_seq[2] == 0  # not taken
    assert server.push(Push(0, 1, g)) == APPLIED  # the oldest is never held
    assert server.push(Push(2, 1, g)) == APPLIED
    assert server.push(Push(2, 1, g)) == DUPLICATE  # idempotent as ever
    assert server.log.drain()["staleness"].tolist() == [0, 1, 1]
    assert server.pull(1)[0] == PARAMS and server.pull(0)[0] == PARAMS  # in line
    assert server.pull(2)[0] == WAIT
    counters = server.counters()
    assert (counters["waits"], counters["held_pushes"], counters["held_starts"]) == (3, 1, 3)
    assert counters["wait_time"] > 0 and server.poll()["waits"] == 3
    # a worker that rejoins (a restart) drops its records: here worker 0 leaves the
    # flight, and worker 2, next in line, may start
    assert server.pull(0, join=True)[0] == WAIT
    assert server.gate.inflight == [1] and server.pull(2)[0] == PARAMS
    assert server.member(1, join=False) == APPLIED  # gone for good: holds no one
    assert server.gate.inflight == [2] and server.pull(0)[0] == PARAMS
    assert server.push(Push(0, 2, g)) == APPLIED  # worker 2, older, had room for one update
    assert server.push(Push(2, 2, g)) == APPLIED
    assert max(server.log.drain()["staleness"]) == 1
    server.stop()
    assert server.push(Push(0, 3, g)) == STOP and server.pull(1)[0] == STOP


def test_gate_docstring_example():
    import doctest

    from dana.train.rules import gate

    result = doctest.testmod(gate)
    assert result.failed == 0 and result.attempted > 0


def test_ssgd_ignores_the_staleness_bound():
    config = tiny(algorithm="ssgd", workers=2, momentum=0.0, max_staleness=0)
    server = make_server(config)
    assert server.gate is None
    assert server.pull(0)[0] == server.pull(1)[0] == PARAMS


def test_non_elementwise_algorithms_are_not_sharded():
    flat = sorted(name for name, cls in algorithms.ALGORITHMS.items() if not cls.elementwise)
    assert flat == ["dana-easgd", "yellowfin", "yellowfin-cl"]

    tiny(algorithm="dana-slim", servers=2).validate()
    tiny(algorithm="yellowfin", servers=1).validate()
    with pytest.raises(ConfigError, match="dana-easgd.*use --servers 1"):
        tiny(algorithm="dana-easgd", servers=2).validate()


def serve_as_the_simulator(
    name: str, workers: int, servers: int, steps: int, compress: str = "none"
) -> None:
    """Drive ``name`` through the parameter servers' path, one worker rule per worker as
    :class:`dana.ps.worker.Worker` holds it, in the event order the simulator takes (the
    same timing model, seed and batch stream as :func:`conftest.make_simulator`'s), and
    assert that every shard's parameters equal the simulator's after ``steps`` gradient
    computations. ``compress``: both through that codec, each worker encoding its
    shards' parts as :class:`dana.ps.worker.Worker` does, each shard decoding its own."""
    from conftest import make_least_squares, make_simulator

    from dana.ps.protocol import split
    from dana.train.cluster.timing import build_timing
    from dana.train.rules.codecs import Wire, build_codec
    from dana.train.rules.step import WorkerStep
    from dana.train.task.batches import BatchStream

    problem = make_least_squares(d=12, n=128)
    config = TrainConfig(
        algorithm=name, workers=workers, servers=servers, lr=0.01, warmup_epochs=0,
        lr_decay_epochs=[], weight_decay=1e-3, dataset="synthetic", backend="ray",
        compress=compress,
    ).validate()  # fmt: skip
    sim = make_simulator(config.build_algorithm(), workers, problem, lr=0.01, batch_size=8,
                         seed=3, weight_decay=1e-3, measure_gap=False, compress=compress,
                         servers=servers)  # fmt: skip
    sim.run(pushes=steps)

    algorithm = config.build_algorithm()
    bounds = Layout(problem.d, servers, 0).bounds
    settings = server_settings(config, problem.d, 16, algorithm)
    shards = [
        (HeadServer if s == 0 else ShardServer)(
            np.zeros(hi - lo), **settings[s], end=None, evals=[], checkpoints=[])
        for s, (lo, hi) in enumerate(bounds)
    ]  # fmt: skip
    rules = [algorithm.worker(1, problem.d, torch.float64) for _ in range(workers)]
    codec = build_codec(compress)
    wires = [Wire(codec, 1, problem.d, servers, torch.float64) for _ in range(workers)]
    layout = Layout(problem.d, servers, 0)
    steppers = [WorkerStep(rule, problem.gradient, 1e-3) for rule in rules]
    batches, timing = BatchStream(problem.n, 8, seed=3), build_timing("gamma", workers, seed=3)
    seq, lr = [0] * workers, [0.0] * workers

    def pull(i: int) -> tuple[torch.Tensor, Any]:
        replies = [shard.pull(i) for shard in shards]
        assert all(r[0] == PARAMS for r in replies), replies
        lr[i] = replies[0][2]
        return torch.from_numpy(np.concatenate([r[1] for r in replies])), batches.next()

    def compute(i: int, params: torch.Tensor, batch: Any) -> tuple[Any, float]:
        """Worker ``i``'s step: its message as it sends it (None: a local step), its loss."""
        grad, loss = steppers[i].gradient(0, params, batch)
        message = steppers[i].message(0, grad, lr[i])
        if message is not None:  # (the worker's Push: encoded with a codec, as it sends it)
            message = message.numpy() if codec.name == "none" else wires[i].encode(0, message)
        return message, loss

    def send(i: int, message: Any, loss: float) -> bool:
        """Worker ``i``'s push; False for a local step (no message, no pull)."""
        seq[i] += 1
        expected = LOCAL if message is None else APPLIED
        for shard, part in zip(shards, split(Push(i, seq[i], message, loss), layout)):
            assert shard.push(part) == expected
        return message is not None

    def push(i: int, params: torch.Tensor, batch: Any) -> bool:
        return send(i, *compute(i, params, batch))

    state = {}
    if algorithm.synchronous:  # dana.sim.schedules.Rounds: every worker's steps in time
        # order (a local step reported at once, the next on the next batch), the round's
        # pushes in worker order, then every worker pulls
        now = 0.0
        while shards[0].steps < steps:
            state = {i: pull(i) for i in range(workers)}
            queue = [(now + timing.sample(i), i) for i in range(workers)]
            heapq.heapify(queue)
            pushes = {}
            while queue:
                finish, i = heapq.heappop(queue)
                message, loss = compute(i, *state[i])
                if message is not None:
                    pushes[i], now = (message, loss), max(now, finish)
                    continue
                send(i, None, loss)
                state[i] = (state[i][0], batches.next())
                heapq.heappush(queue, (finish + timing.sample(i), i))
            for i in range(workers):
                send(i, *pushes[i])
    else:
        queue: list[tuple[float, int]] = []
        for i in range(workers):
            state[i] = pull(i)
            heapq.heappush(queue, (timing.sample(i), i))
        while shards[0].steps < steps:
            finish, i = heapq.heappop(queue)
            params, _ = state[i]
            state[i] = pull(i) if push(i, *state[i]) else (params, batches.next())
            heapq.heappush(queue, (finish + timing.sample(i), i))

    assert shards[0].steps == sim.steps and shards[0].updates == sim.updates
    for shard, (lo, hi) in zip(shards, bounds):
        assert shard.updates == sim.updates
        torch.testing.assert_close(shard.master.theta, sim.master.theta[lo:hi], rtol=0, atol=0)
    assert sim.master.theta.abs().sum() > 0  # it moved


@pytest.mark.parametrize("name", sorted(algorithms.ALGORITHMS))
def test_every_algorithm_on_the_servers_is_the_simulator(name):
    """docs/DISTRIBUTED.md: the servers and the workers apply the registry's rules, the
    simulator's; in the same order of events they are the same run, bit for bit, and an
    element-wise rule is the same run on two shards."""
    serve_as_the_simulator(name, workers=3, servers=1, steps=120)
    if algorithms.ALGORITHMS[name].elementwise:
        serve_as_the_simulator(name, workers=3, servers=2, steps=120)


@pytest.mark.parametrize("compress", ["fp16", "bf16", "int8", "topk:0.3"])
@pytest.mark.parametrize("name", ["asgd", "dana-slim", "local-sgd", "ssgd"])
def test_a_codec_on_the_servers_is_the_simulators(name, compress):
    """docs/DISTRIBUTED.md, "Compressed pushes": the workers encode each shard's part of
    their messages and the shards decode them, as the simulator does on one machine: in
    the same order of events the same run, bit for bit, on one shard and on two (topk's
    residual included: each worker's, kept across its pushes)."""
    serve_as_the_simulator(name, workers=3, servers=1, steps=120, compress=compress)
    serve_as_the_simulator(name, workers=3, servers=2, steps=120, compress=compress)


# -- real runs on a local Ray -------------------------------------------------------------
requires_ray = pytest.mark.skipif(ray is None, reason="needs Ray: pip install 'ray>=2.9'")


class InProcessLink:
    """A worker's link to an in-process head (no Ray): the same calls and replies as
    :class:`dana.ps.link.ServerLink` with one shard."""

    def __init__(self, head: HeadServer):
        self.head = head

    def pull(self, join: bool = False):
        from dana.ps.link import Reply

        r = self.head.relay_pull(0, join)
        params = None if r.params is None else torch.from_numpy(r.params)
        return Reply(r.status, r.status is STOP, params, r.lr, r.last_seq, r.joins)

    def push(self, push: Push):
        from dana.ps.link import Reply

        r = self.head.relay_push([push])
        return Reply(r.status, r.status is STOP, lr=r.lr)

    def exchange(self, push: Push):
        from dana.ps.link import Reply

        r = self.head.relay_exchange([push])
        params = None if r.params is None else torch.from_numpy(r.params)
        return Reply(r.status, r.status is STOP, params, r.lr)


@requires_ray
@pytest.mark.parametrize("name", ["local-sgd", "local-dn"])
def test_a_ray_worker_takes_each_local_step_at_the_simulators_rate(name, monkeypatch):
    """Under a warm-up and two decays in the middle of local cycles (H = 3), the Ray
    worker (dana.ps.worker.Worker, with the head in this process) gives its rule the
    rate of every step the simulator gives it: the pulled rate for a cycle's first step,
    then the head's answer to each local step (one worker: the same step counts)."""
    import dana.ps.worker as worker_module
    from dana.sim.driver import SimRun

    config = tiny(
        algorithm=name, workers=1, epochs=1.0, warmup_epochs=0.2, lr_decay_epochs=[0.41, 0.7],
        algorithm_params={"local_steps": 3}, eval_every=1.0,
    )  # fmt: skip
    seen: dict[str, list[float]] = {"sim": [], "ray": []}

    def recording(key: str, rule: Any) -> None:
        set_lr = rule.set_lr

        def record(lr: float) -> None:
            seen[key].append(lr)
            set_lr(lr)

        rule.set_lr = record

    sim_config = TrainConfig(**{**config.to_dict(), "backend": "sim"})
    run = RunDir(Path(os.environ.get("TMPDIR", "/tmp")) / f"inner-rate-{os.getpid()}-{name}")
    sim = SimRun(sim_config, run, Problem(sim_config))
    recording("sim", sim.sim.worker_rule)
    sim.sim.run(epochs=1.0)

    problem = Problem(config)
    end = round(config.epochs * problem.dataset.train_size // config.batch_size)
    head = make_server(
        config, d=problem.flat.d, batches_per_epoch=problem.dataset.train_size // config.batch_size,
        end=end,
    )  # fmt: skip
    head.master.theta.copy_(problem.initial_params())
    monkeypatch.setattr(worker_module, "ServerLink", lambda *args: InProcessLink(head))
    worker = worker_module.Worker(config.to_dict(), 0, ["head"], problem.flat.d)
    recording("ray", worker.rule)
    worker.run()
    # (one step more: computed, pushed and answered "stop" at the end)
    assert head.steps == end == len(seen["ray"]) - 1 and len(seen["sim"]) >= end
    assert len(set(seen["sim"][:end])) == 3  # the peak rate and the two decays
    assert seen["ray"][:end] == seen["sim"][:end]


@pytest.fixture(scope="module")
def ray_run(local_ray, tmp_path_factory):
    """``ray_run(**options)``: the RayRun of ``tiny(**options)``, run once per module."""
    done: dict[tuple, Any] = {}

    def get(**overrides: Any) -> Any:
        key = tuple(sorted(overrides.items()))
        if key not in done:
            done[key] = run_on_ray(tiny(**overrides), tmp_path_factory.mktemp("run") / "run")
        return done[key]

    return get


@pytest.fixture(scope="module")
def sim_summary_keys(tmp_path_factory) -> set[str]:
    """The keys of a simulated run's summary.json."""
    from dana.train.training import train

    out = tmp_path_factory.mktemp("sim") / "run"
    keys = set(train(tiny(backend="sim", epochs=0.25), out, progress=False))
    # (the simulator's bias meter: a Ray run does not count the classes it applies)
    return keys - {"applied_class_counts", "data_class_counts"}


@pytest.mark.ray
@requires_ray
@pytest.mark.parametrize(
    "algorithm, workers", [("asgd", 2), ("dana-slim", 3), ("ssgd", 4)], ids=str
)
def test_runs_complete_and_learn(ray_run, sim_summary_keys, algorithm, workers):
    """One shard (without a standby: the two-shard runs below have one, the fault tests
    promote it)."""
    runner = ray_run(algorithm=algorithm, workers=workers, standby=False)
    config, summary, rows = runner.config, runner.summary, runner.rows
    assert [r["epoch"] for r in rows][0] == 0 and rows[-1]["epoch"] >= config.epochs
    assert rows[-1]["test_loss"] < 0.75 * rows[0]["test_loss"]
    assert rows[-1]["train_loss"] < 0.75 * rows[1]["train_loss"]
    assert not summary["diverged"]
    check_accounting(runner)
    if algorithm == "ssgd":
        rounds = math.ceil(round(config.epochs * 1024 / 32) / workers)
        assert summary["updates"] == rounds and summary["pushes"] == rounds * workers
        assert summary["max_staleness"] == 0
    else:
        assert summary["pushes"] == summary["updates"] == round(config.epochs * 1024 / 32)
        assert 0 < summary["mean_staleness"] < 2 * workers
        assert summary["mean_gap"] > 0
    assert set(summary) == sim_summary_keys


class KillWorker(Progress):
    """Kills worker 0's process once the run has passed ``at`` steps (Ray restarts it)."""

    def __init__(self, runner: Any, at: int):
        super().__init__(enabled=False)
        self.runner, self.at, self.killed_at = runner, at, None

    def update(self, steps: int, loss: float) -> None:
        if self.killed_at is None and steps >= self.at:
            self.killed_at = steps
            ray.kill(self.runner.worker_actors[0], no_restart=False)


@pytest.mark.ray
@requires_ray
def test_a_killed_worker_is_restarted_and_rejoins_within_the_staleness_bound(local_ray, tmp_path):
    """Worker 0's process killed mid-run: Ray restarts it, it pulls again (its join
    replaces its records at the gate), every push is applied once, the bound holds
    throughout and the run learns."""
    config = tiny(algorithm="dana-slim", workers=3, epochs=4.0, max_staleness=1,
                  time_scale=0.0005, standby=False)  # fmt: skip
    made: dict[str, KillWorker] = {}

    def killer_for(runner: Any) -> KillWorker:
        made["killer"] = KillWorker(runner, at=16)
        return made["killer"]

    runner = run_on_ray(config, tmp_path / "run", killer_for)
    killer = made["killer"]
    assert killer.killed_at is not None and killer.killed_at < 4 * 32
    dist = check_accounting(runner)
    assert dist["shards"][0]["joins"][0] == 2  # worker 0 pulled again after its restart
    assert runner.summary["pushes"] == runner.summary["updates"] == 4 * 32
    assert runner.merger.log.numpy()["staleness"].max() <= 1
    assert runner.rows[-1]["test_loss"] < 0.75 * runner.rows[0]["test_loss"]


class RayStreams:
    """The Ray workers' own batch streams (of their first processes), for the simulator:
    worker ``i``'s next batch is the one Ray worker ``i`` draws."""

    per_worker = True

    def __init__(self, problem: Problem, config: TrainConfig):
        from dana.ps.worker import stream_seed

        self.streams = [
            Problem.batches(problem, stream_seed(config.seed, i, 1), worker=i)
            for i in range(config.workers)
        ]
        self.batch_size = config.batch_size
        self.batches_per_epoch = problem.dataset.train_size // config.batch_size

    def next_for(self, worker: int) -> Any:
        return self.streams[worker].next()


def diloco(**overrides: Any) -> TrainConfig:
    """A tiny diloco run on Ray: k = 2, H = 3 (a round is 6 steps), the paper's outer
    step, an inner AdamW rate at which it learns steadily, no standby."""
    options = dict(algorithm="diloco", workers=2, lr=0.0005, standby=False,
                   algorithm_params={"local_steps": 3})  # fmt: skip
    return tiny(**{**options, **overrides})


@pytest.mark.ray
@requires_ray
def test_diloco_on_ray_is_the_simulators_run(local_ray, tmp_path):
    """diloco on Ray runs the simulator's rounds (dana.sim.schedules.Rounds): every
    worker's H steps from the round's parameters (H - 1 local steps, reported to the
    servers), its push, then every worker pulls once all k are in. Given the Ray
    workers' batch streams, the simulator's run is the Ray run: the same rows at the
    same points (the first round boundary at or after each: 36 and 66 steps for the
    epochs' 32 and 64), the same losses and parameters to the ssgd tests' tolerance
    (bit for bit here: with k = 2 a round's sum is the same in either order of arrival)."""
    from dana.sim.driver import SimRun

    config = diloco()
    k, H = config.workers, config.algorithm_params["local_steps"]
    on_ray = run_on_ray(config, tmp_path / "ray")

    sim_config = TrainConfig(**{**config.to_dict(), "backend": "sim"})
    problem = Problem(sim_config)
    problem.batches = lambda seed, worker=None: RayStreams(problem, sim_config)
    run = RunDir(tmp_path / "sim")
    run.path.mkdir()
    sim_run = SimRun(sim_config, run, problem)
    sim_summary = sim_run.execute(Progress(enabled=False))

    rounds = math.ceil(3 * 32 / (k * H))
    dist = check_accounting(on_ray)
    assert (dist["pushes_applied"], dist["local_steps"]) == (rounds * k, rounds * k * (H - 1))
    for key in ("updates", "pushes", "epochs"):
        assert on_ray.summary[key] == sim_summary[key], key
    assert on_ray.summary["updates"] == rounds
    assert [r["epoch"] * 32 for r in on_ray.rows] == [0, 36, 66, 96]
    for ours, theirs in zip(on_ray.rows, sim_run.rows, strict=True):
        for key in ("epoch", "updates", "lr"):
            assert ours[key] == theirs[key], key
        for key in ("train_loss", "test_loss", "test_error"):
            assert ours[key] == pytest.approx(theirs[key], rel=1e-4, nan_ok=True), key
    torch.testing.assert_close(on_ray.final_params(), sim_run.final_params(), rtol=1e-4, atol=1e-6)
    assert on_ray.rows[-1]["test_loss"] < 0.75 * on_ray.rows[0]["test_loss"]


@pytest.mark.ray
@requires_ray
def test_a_diloco_worker_killed_mid_round_redoes_it_and_every_step_counts_once(
    local_ray, tmp_path, monkeypatch
):
    """Worker 0's process killed after it reported a local step of a round (steps
    emulated at about 128 ms: the driver's poll 0.2 s into a round finds it there): Ray
    restarts it, it joins and redoes the round from the round's parameters. The local
    steps its lost process reported come again and are answered "duplicate": every round
    is k*H steps and k pushes on the servers, every worker's calls numbered r*H + 1 ..
    (r + 1)*H, each applied or counted once."""
    from dana.ps.driver import RayRun

    config = diloco(epochs=1.0, time_scale=0.001)
    k, H = config.workers, config.algorithm_params["local_steps"]
    poll, killed = RayRun._poll, []

    def poll_then_kill(self: Any) -> None:
        poll(self)
        if not killed and self.steps > k * H and self.steps % (k * H):  # a round under way
            last_seq = ray.get(self.shards.servers[0].counters.remote())["last_seq"][0]
            if last_seq % H:  # worker 0 has reported a local step of it, not its push
                ray.kill(self.worker_actors[0], no_restart=False)
                killed.append(last_seq)

    monkeypatch.setattr(RayRun, "_poll", poll_then_kill)
    runner = run_on_ray(config, tmp_path / "run")
    rounds = math.ceil(32 / (k * H))
    assert killed and killed[0] < (rounds - 1) * H, killed  # mid-round, before the last
    dist = json.loads((runner.run.path / "dist.json").read_text())
    head = dist["shards"][0]
    assert head["joins"][0] == 2 and dist["failed_run_calls"][0] >= 1  # restarted, rejoined
    assert head["applied"] == [rounds] * k and head["last_seq"] == [rounds * H] * k
    assert (head["steps"], head["local_steps"]) == (rounds * k * H, rounds * k * (H - 1))
    assert head["seq_gaps"] == 0 and head["rejected_after_stop"] == 0
    assert runner.summary["updates"] == rounds and runner.summary["pushes"] == rounds * k
    # the lost process's local steps of the round, sent again by its restart
    assert head["duplicates"] == dist["worker_replies"]["duplicate"] == killed[0] % H
    # a push comes H steps (about 128 ms each) after its round's pull, not one
    assert min(runner.merger.durations) > (H - 1) * 0.128
    assert runner.rows[-1]["test_loss"] < runner.rows[0]["test_loss"]


@pytest.mark.ray
@requires_ray
@pytest.mark.parametrize("algorithm", ["dana-slim", "ssgd"])
def test_two_server_shards(ray_run, algorithm):
    workers = {"dana-slim": 3, "ssgd": 4}[algorithm]  # the runs of the test above
    one = ray_run(algorithm=algorithm, workers=workers, standby=False)
    two = ray_run(algorithm=algorithm, workers=workers, servers=2)  # and a standby
    dist = check_accounting(two)
    assert len(dist["shards"]) == 2
    assert two.rows[-1]["test_loss"] < 0.75 * two.rows[0]["test_loss"]
    assert two.summary["pushes"] == one.summary["pushes"]
    if algorithm == "ssgd":  # a round averages the same k gradients: the same run
        for a, b in zip(one.rows, two.rows):
            assert b["test_loss"] == pytest.approx(a["test_loss"], rel=1e-4)
    else:
        assert abs(two.summary["mean_staleness"] - one.summary["mean_staleness"]) < 2
        assert two.rows[-1]["test_loss"] < 1.5 * one.rows[-1]["test_loss"]


@pytest.mark.ray
@requires_ray
def test_compressed_pushes_on_two_shards(ray_run):
    """topk with error feedback over two shards on Ray: the payloads cross Ray and the
    relay (shard 0 keeps copies for its standby), every push is applied once, the run
    learns, and the summary records the codec and the bytes of a push."""
    run = ray_run(algorithm="dana-slim", workers=3, servers=2, compress="topk:0.1")
    dist = check_accounting(run)
    assert len(dist["shards"]) == 2
    assert run.rows[-1]["test_loss"] < 0.75 * run.rows[0]["test_loss"]
    assert run.summary["compress"] == "topk:0.1"
    d = run.d  # (ceil(0.1 * n_s) of each shard's n_s values: 4 bytes of index, 4 of value)
    assert run.summary["push_bytes"] == sum(8 * math.ceil(0.1 * (hi - lo)) for lo, hi in
                                            shard_bounds(d, 2))  # fmt: skip


@pytest.mark.ray
@requires_ray
def test_bounded_staleness_on_ray(ray_run, sim_summary_keys):
    """The strictest bound, 0 (one worker computes at a time); a bound of 1 with two
    shards: the test below."""
    bound = 0
    runner = ray_run(workers=4, max_staleness=bound, standby=False)
    summary, rows = runner.summary, runner.rows
    dist = check_accounting(runner)
    staleness = runner.merger.log.numpy()["staleness"]  # every applied push's
    assert len(staleness) == summary["pushes"] == round(3.0 * 1024 / 32)
    assert staleness.max() <= bound and summary["max_staleness"] <= bound
    assert dist["pushes_sent"] == dist["pushes_applied"] + dist["rejected_after_stop"]
    assert dist["max_staleness"] == bound and dist["waits"] > 0  # 4 workers, s + 1 < 4
    assert summary["wait_time"] == pytest.approx(dist["wait_time"]) and summary["wait_time"] > 0
    assert rows[-1]["test_loss"] < 0.75 * rows[0]["test_loss"]
    assert rows[-1]["train_loss"] < 0.75 * rows[1]["train_loss"]
    assert set(summary) == sim_summary_keys


@pytest.mark.ray
@requires_ray
def test_bounded_staleness_with_two_shards(ray_run):
    runner = ray_run(algorithm="dana-slim", workers=3, servers=2, max_staleness=1)
    dist = check_accounting(runner)
    first, second = dist["shards"]
    assert dist["relayed"] and second["seq_gaps"] == 0
    # shard 0 relayed every push and pull, in its order: shard 1 counted alike
    for key in ("steps", "pushes", "updates", "applied", "last_seq"):
        assert second[key] == first[key], key
    assert runner.merger.log.numpy()["staleness"].max() <= 1
    assert dist["max_staleness"] == 1 and dist["waits"] > 0  # 3 workers, s + 1 < 3
    assert runner.summary["wait_time"] == pytest.approx(dist["wait_time"])
    assert runner.summary["wait_time"] > 0
    assert runner.rows[-1]["test_loss"] < 0.75 * runner.rows[0]["test_loss"]


@pytest.mark.ray
@requires_ray
def test_the_cli_refuses_to_shard_yellowfin(tmp_path, capsys):
    from dana.cli import main

    out = tmp_path / "run"
    options = [
        "train", "--backend", "ray", "--servers", "2", "--algorithm", "yellowfin",
        "--dataset", "synthetic", "--model", "mlp", "--train-size", "64",
        "--test-size", "32", "--batch-size", "16", "--quiet", "--out", str(out),
    ]  # fmt: skip
    assert main(options) == 2
    err = capsys.readouterr().err
    assert "yellowfin" in err and "use --servers 1" in err
    assert not out.exists()  # refused before anything started
