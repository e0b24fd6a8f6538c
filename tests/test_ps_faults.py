"""Faults on a real local Ray: killed workers and shards, where Ray listens (a lost node:
tests/test_ps_nodes.py).

The session's one local Ray (conftest's ``local_ray``: started by dana itself,
:func:`dana.ps.cluster.ray_session`, bound to 127.0.0.1, no dashboard) with the machine's
2 CPUs, so that the runs' 5 or 7 actors are placed with fractional CPUs. Every run checks, per shard and per worker, that
every push was applied exactly once on every shard: the pushes applied equal the last
sequence number, on every shard alike, with no gap and no repeat.
"""

from __future__ import annotations

import json
import os
import random
import time
from typing import Any

import numpy as np
import pytest
import torch
from conftest import run_on_ray, tiny
from fault_injection import Direct, Faults, check_every_shard, run_with_faults

from dana.errors import DanaError, FaultError
from dana.ps.accounting import check_run
from dana.ps.head import HeadServer
from dana.ps.log import LogMerger, ShardLog
from dana.ps.protocol import Entry, Method, Pull, Push, Status
from dana.ps.recovery import RelayLog
from dana.ps.settings import server_settings
from dana.ps.shard import ShardServer
from dana.train.records.progress import Progress
from dana.train.records.rundir import RunDir

try:
    import ray
except ImportError:  # the units still run
    ray = None

APPLIED, DUPLICATE, NOT_HEAD = Status.APPLIED, Status.DUPLICATE, Status.NOT_HEAD
PARAMS, WAIT = Status.PARAMS, Status.WAIT

needs_ray = pytest.mark.skipif(ray is None, reason="needs Ray: pip install 'ray>=2.9'")


# -- units, no Ray ------------------------------------------------------------------------
def test_the_relay_log_keeps_calls_until_every_shard_has_a_snapshot():
    log = RelayLog(shards=3)  # receivers: the standby (0), shards 1 and 2
    for n in range(1, 6):
        piece = np.full(4, n, np.float32)
        log.add(
            Method.PUSH, [Push(0, n, piece), Push(0, n, piece, 0.0), Push(0, n, piece[:2], 0.0)]
        )
    assert log.bytes == 5 * (16 + 16 + 8)
    log.trim(1, 3)  # shard 2 and the standby have no snapshot yet: everything stays
    log.trim(0, 4)
    assert len(log.calls) == 5
    log.trim(2, 2)
    assert [n for n, *_ in log.calls] == [3, 4, 5] and log.bytes == 3 * 40
    got: list[tuple] = []

    class Recorder:
        relayed = type("M", (), {"remote": staticmethod(lambda *a: got.append(a))})

    assert log.replay(Recorder(), shard=1, covered=3) == 2
    calls = [a[0] for a in got]
    assert [c.number for c in calls] == [4, 5] and [c.method for c in calls] == ["push", "push"]
    assert [c.arg.seq for c in calls] == [4, 5] and len(calls[0].arg.message) == 4  # shard 1's
    with pytest.raises(RuntimeError, match="gone"):
        log.replay(Recorder(), shard=2, covered=1)  # trimmed: cannot be rebuilt from there
    assert log.peak == 5 and log.peak_bytes == 5 * 40
    # A standby's copy: the head's entries by number, a repeat logged once, a gap refused
    copy = RelayLog(shards=3)
    for entry in log.calls:
        copy.append(entry)
    copy.append(log.calls[-1])
    assert [n for n, *_ in copy.calls] == [3, 4, 5] and copy.count == 5
    with pytest.raises(RuntimeError, match="missing"):
        copy.append(Entry(7, Method.PULL, [Pull(0, False)] * 3))


def test_a_rebuilt_shard_is_the_lost_one():
    """Shard 1 rebuilt from a snapshot and shard 0's log equals its twin that was never
    lost: the same parameters and counters, bit for bit."""
    config = tiny(algorithm="dana-slim", workers=2, servers=2, lr=0.1, warmup_epochs=0)
    d, half = 8, 4
    settings = server_settings(config, d, 100)
    options = dict(end=40, evals=[], checkpoints=[])

    def shard(s: int, **kw: Any) -> ShardServer:
        server = HeadServer if s == 0 else ShardServer
        return server(np.zeros(half, np.float32), **settings[s], **options, **kw)

    lost, twin = shard(1), shard(1)
    head = shard(0, peers=["shard1"])
    head.relay.names = []  # (no Ray: the handles are set by hand)
    head.begin(0.0)

    class Both:  # shard 0 relays to the shard that will be lost and to its twin
        def __getattr__(self, name: str) -> Any:
            def call(*args: Any) -> None:
                getattr(lost, name)(*args)
                getattr(twin, name)(*args)

            return type("M", (), {"remote": staticmethod(call)})

    head.relay.peers = [Both()]
    rng = np.random.default_rng(0)

    def steps(seqs: range) -> None:
        for seq in seqs:
            for w in (0, 1):
                g = rng.standard_normal(d).astype(np.float32)
                head.relay_exchange([Push(w, seq, g[:half], 1.0), Push(w, seq, g[half:])])

    head.relay_pull(0, True)
    head.relay_pull(1, True)
    steps(range(1, 6))
    saved = lost.recovery_state()
    head.trim(1, saved["calls"])
    steps(range(6, 11))  # applied by the shard about to be lost, and logged
    rebuilt = shard(1, recovered=saved)
    head.relay.peers = [Direct(twin)]
    assert head.rebind(1, Direct(rebuilt), saved["calls"]) == 2 * 5 * 2  # pushes, pulls
    head.relay.peers = [Both()]
    lost = rebuilt  # from now on shard 0 relays to the rebuilt one (and the twin)
    steps(range(11, 16))
    head.stop()
    np.testing.assert_array_equal(rebuilt.master.theta.numpy(), twin.master.theta.numpy())
    assert rebuilt.counters() == twin.counters()
    assert rebuilt.counters()["applied"] == [15, 15] and rebuilt.stopped


def head_standby_and_shard_1(algorithm: str, seqs: int) -> tuple:
    """Shard 0 of two parameters' halves, its standby and shard 1, wired by hand (no Ray),
    for two workers; and ``step(server, w, seq)``: worker ``w``'s push ``seq`` (one of
    ``seqs`` fixed random gradients per worker) and its pull, through ``server``."""
    config = tiny(algorithm=algorithm, workers=2, servers=2, lr=0.1, warmup_epochs=0)
    d, half = 8, 4
    settings = server_settings(config, d, 100)
    options = dict(end=60, evals=[], checkpoints=[])

    def shard(s: int, **kw: Any) -> ShardServer:
        server = HeadServer if s == 0 else ShardServer
        return server(np.zeros(half, np.float32), **settings[s], **options, **kw)

    head, one = shard(0, peers=["shard1"], replicated=True), shard(1)
    standby = shard(0, peers=["shard1"], standby=True)
    head.relay.names = []  # (no Ray: the handles are set by hand)
    head.begin(0.0)
    head.relay.peers = [Direct(one)]
    head.relay.standby = Direct(standby)  # (attach() would wait on a Ray reference)
    rng = np.random.default_rng(0)
    grads = {
        (w, seq): rng.standard_normal(d).astype(np.float32)
        for w in (0, 1)
        for seq in range(1, seqs + 1)
    }

    def step(server: HeadServer, w: int, seq: int) -> tuple:
        g = grads[(w, seq)]
        return server.relay_exchange([Push(w, seq, g[:half], 1.0), Push(w, seq, g[half:])])

    return head, standby, one, step


def test_a_promoted_standby_is_its_head_and_takes_resent_pushes_once():
    """Shard 0's standby, fed every call by its head, equals the head bit for bit; once
    promoted, a push its lost head had applied is answered duplicate, and it relays to
    shard 1 (which skips the calls it has run already)."""
    head, standby, one, step = head_standby_and_shard_1("gap-aware", seqs=11)
    for w in (0, 1):
        head.relay_pull(w, True)
    assert standby.relay_pull(0)[0] == NOT_HEAD  # not promoted: it answers no worker
    for seq in range(1, 9):
        for w in (0, 1):
            step(head, w, seq)
    np.testing.assert_array_equal(standby.master.theta.numpy(), head.master.theta.numpy())
    np.testing.assert_array_equal(standby.master.sent.numpy(), head.master.sent.numpy())
    assert standby.counters()["applied"] == head.counters()["applied"] == [8, 8]
    assert standby.relay.log.count == head.relay.log.count == one.counts.calls
    # The head is lost after push (1, 8) reached its standby, before its reply: the worker
    # sends it again to the promoted standby, which relays its log to shard 1 first.
    assert standby.promote([Direct(one)]) == len(standby.relay.log.calls)
    assert one.counters()["repeats"] == len(standby.relay.log.calls)  # all run already
    assert step(standby, 1, 8)[0] == DUPLICATE
    for seq in range(9, 12):
        for w in (0, 1):
            assert step(standby, w, seq)[0] == APPLIED
    for server in (standby, one):
        counters = server.counters()
        assert counters["applied"] == counters["last_seq"] == [11, 11]
        assert counters["call_gaps"] == 0


def test_a_head_taken_for_lost_that_runs_on_is_deposed_and_passes_nothing_on():
    """The driver promotes the standby of a head that was only slow (a reply past the
    deadline) and runs on until its kill lands: the promoted standby refuses its calls,
    so it passes nothing on to shard 1 (which would take its calls for the new head's
    of the same numbers) and answers its workers "not-head"; they go to the new head.
    Before, shard 1 ran the old head's call and skipped the new head's one of that number:
    a push lost on shard 1, another applied there alone (the chaos soak's failure)."""
    head, standby, one, step = head_standby_and_shard_1("dana-slim", seqs=3)
    for w in (0, 1):
        head.relay_pull(w, True)
    for w in (0, 1):
        step(head, w, 1)
    standby.promote([Direct(one)])  # the head is taken for lost, and runs on:
    assert step(head, 0, 2)[0] == NOT_HEAD
    assert head.relay_pull(1)[0] == NOT_HEAD
    assert one.counters()["calls"] == standby.relay.log.count  # nothing from the old head
    for seq in (2, 3):  # its workers go to the new head (worker 0 sends seq 2 again)
        for w in (0, 1):
            assert step(standby, w, seq)[0] == APPLIED
    for server in (standby, one):
        counters = server.counters()
        assert counters["applied"] == counters["last_seq"] == [3, 3]
        assert counters["call_gaps"] == counters["seq_gaps"] == 0


def head_server(bound: int, workers: int, **kw: Any) -> HeadServer:
    """Shard 0 of a ``dana-slim`` run of 4 parameters with ``--max-staleness bound``."""
    config = tiny(algorithm="dana-slim", workers=workers, max_staleness=bound)
    options = dict(server_settings(config, 4, 100)[0], end=60, evals=[], checkpoints=[])
    return HeadServer(np.zeros(4, np.float32), **options, **kw)


def pair(bound: int, workers: int) -> tuple[HeadServer, HeadServer]:
    """A head and its standby, attached."""
    head = head_server(bound, workers, replicated=True)
    standby = head_server(bound, workers, standby=True)
    head.begin(0.0)
    standby.begin(0.0)
    head.attach_standby(Direct(standby))
    return head, standby


def test_a_promoted_standby_keeps_the_workers_waiting_for_the_staleness_bound():
    """Bounded staleness: the workers the head's gate refused (waiting in line to start,
    or with a held push) are the standby's too, so that once promoted it lets them go in
    the head's order and times their waits from their first refusal."""
    g = np.ones(4, np.float32)

    def exchange(server: HeadServer, w: int, seq: int) -> tuple:
        return server.relay_exchange([Push(w, seq, g, 1.0)])

    # The line to start, s = 0: worker 0 computes, 1 and 2 wait (in that order); 0 pushes
    # and must wait behind them; then the head is lost.
    head, standby = pair(bound=0, workers=3)
    assert [head.relay_pull(w, True)[0] for w in (0, 1, 2)] == [PARAMS, WAIT, WAIT]
    assert exchange(head, 0, 1)[:2] == (APPLIED, None)  # applied; its pull must wait
    assert [w for w, _ in head.gate.idle] == [1, 2, 0]
    assert standby.gate.idle == head.gate.idle  # (before: empty)
    standby.promote([])
    assert standby.relay_pull(2)[0] == WAIT  # 1 came first (before: 2 went first)
    assert standby.relay_pull(0)[0] == WAIT
    assert standby.relay_pull(1)[0] == PARAMS
    counters = standby.counters()
    assert counters["held_starts"] == head.counters()["held_starts"] == 3
    assert counters["waits"] == 1 and counters["wait_time"] > 0  # 1's, from its refusal

    # A held push, s = 1: workers 0 and 1 compute, 1 pushes and computes again; its next
    # push is held (0 is the oldest and 2 updates behind); then the head is lost.
    head, standby = pair(bound=1, workers=2)
    assert [head.relay_pull(w, True)[0] for w in (0, 1)] == [PARAMS, PARAMS]
    assert exchange(head, 1, 1)[0] == APPLIED
    assert exchange(head, 1, 2)[0] == WAIT
    assert list(standby.gate.held) == list(head.gate.held) == [1]
    standby.promote([])
    assert exchange(standby, 1, 2)[0] == WAIT  # still held: the bound holds it
    assert exchange(standby, 0, 1)[0] == APPLIED  # the oldest is never held
    assert exchange(standby, 1, 2)[0] == APPLIED
    counters = standby.counters()
    assert counters["held_pushes"] == 1 and counters["waits"] == 1
    assert counters["applied"] == counters["last_seq"] == [1, 2]


def test_a_rebuilt_standby_counts_the_waits_once():
    """A standby rebuilt from its snapshot has its waits for the staleness bound once
    (its gate's, and those before a resume apart). Before, a rebuilt standby counted the
    gate's waits twice: the snapshot's totals again, on top of its gate's."""
    head, standby = pair(bound=0, workers=3)
    assert [head.relay_pull(w, True)[0] for w in (0, 1, 2)] == [PARAMS, WAIT, WAIT]
    time.sleep(0.01)
    assert head.relay_exchange([Push(0, 1, np.ones(4, np.float32), 1.0)])[0] == APPLIED
    assert head.relay_pull(1)[0] == PARAMS  # worker 1 waited: the standby counts it too
    rebuilt = head_server(0, 3, standby=True, recovered=standby.recovery_state())
    for key in ("waits", "wait_time", "held_starts", "held_pushes", "applied", "calls"):
        assert rebuilt.counters()[key] == standby.counters()[key], key
    assert standby.counters()["waits"] == 1


def test_without_a_standby_the_log_holds_the_other_shards_parts_only():
    """``--no-standby``: the head copies no part of its own into its log, which the other
    shards' snapshots alone trim; with one shard there is no log at all."""
    config = tiny(algorithm="dana-slim", workers=2, servers=2, standby=False)
    settings = server_settings(config, 8, 100)
    options = dict(end=60, evals=[], checkpoints=[])
    head = HeadServer(np.zeros(4, np.float32), **settings[0], **options, peers=["s1"])
    one = ShardServer(np.zeros(4, np.float32), **settings[1], **options)
    head.relay.names = []  # (no Ray: the handles are set by hand)
    head.begin(0.0)
    head.relay.peers = [Direct(one)]
    head.relay_pull(0, True)
    g = np.ones(8, np.float32)
    for seq in (1, 2, 3):
        assert head.relay_exchange([Push(0, seq, g[:4], 1.0), Push(0, seq, g[4:])])[0] == APPLIED
    log = head.relay.log
    assert [method for _, method, _ in log.calls] == ["pull"] + ["push", "pull"] * 3
    assert all(args[0] is None for _, method, args in log.calls if method == "push")
    assert log.bytes == 3 * 16  # shard 1's slices only
    head.trim(1, one.counts.calls)  # shard 1's snapshot covers everything: nothing is kept
    assert not log.calls and log.bytes == 0
    assert one.counters()["applied"] == head.counters()["applied"] == [3, 0]
    alone = tiny(algorithm="dana-slim", workers=2, servers=1, standby=False)
    only = HeadServer(np.zeros(8, np.float32), **server_settings(alone, 8, 100)[0], **options)
    assert only.relay.log is None


def test_the_log_merger_drops_what_a_rebuilt_shard_reports_again():
    merger = LogMerger(servers=2)

    def entries(seqs: list[int]) -> dict[str, np.ndarray]:
        log = ShardLog()
        for seq in seqs:
            log.append(
                worker=0, seq=seq, staleness=0, gap_sq=1.0, gap_n=1, loss=0.5, lr=0.1,
                time=1.0, duration=0.1, compute=0.05, updates=seq, members=3,
            )  # fmt: skip
        return log.drain()

    merger.add(0, entries([1, 2, 3, 4]))
    merger.add(1, entries([1, 2, 3]))  # then lost; its snapshot covered push 1
    merger.add(1, entries([2, 3, 4]))  # the rebuilt shard replays 2 and 3
    assert len(merger) == 4
    np.testing.assert_allclose(merger.log.numpy()["gap"], 1.0)  # each part counted once


def test_cpus_per_actor():
    import doctest

    from dana.ps import cluster

    result = doctest.testmod(cluster)
    assert result.failed == 0 and result.attempted > 0
    from dana.ps.cluster import cpus_per_actor

    assert cpus_per_actor([3.0, 1.0], 5) == 0.5
    with pytest.raises(DanaError, match="no CPUs"):
        cpus_per_actor([0.0], 2)


# -- real runs on a local Ray -------------------------------------------------------------


@pytest.mark.ray
@needs_ray
def test_workers_killed_repeatedly_every_shard_applies_every_push_once(local_ray, tmp_path):
    """Four shards (two: the test below, which kills workers too)."""
    config = tiny(algorithm="dana-slim", workers=3, servers=4, time_scale=0.0005)
    rng = random.Random(4)
    actions = [(at, f"worker:{rng.randrange(3)}") for at in (8, 22, 36, 50, 64)]
    runner, faults = run_with_faults(config, tmp_path / "run", actions)
    assert len(faults.done) == 5, faults.done
    dist = check_every_shard(runner, steps=3 * 32)
    # killed workers rejoined (one killed again while restarting, or at the end, may not)
    assert 3 < sum(dist["shards"][0]["joins"]) <= 3 + 5
    assert dist["cpus_per_actor"] < 1  # 3 workers + S shards on 2 CPUs: shared


@pytest.mark.ray
@needs_ray
def test_faults_at_random_moments(local_ray, tmp_path):
    """Workers and shard 1 killed at random moments, several times in one run: shard 1
    is rebuilt twice while the run goes on, from its snapshot and shard 0's log."""
    rng = random.Random(14)
    moments = sorted(rng.sample(range(6, 110), 6))
    actions = [(at, f"worker:{rng.randrange(3)}") for at in moments[:4]]
    actions += [(moments[4], "shard:1"), (moments[5], "shard:1")]
    config = tiny(algorithm="asgd", workers=3, servers=2, epochs=4.0, time_scale=0.0005)
    runner, faults = run_with_faults(config, tmp_path / "run", actions)
    assert len(faults.done) == 6, faults.done
    assert [what for _, what in faults.done][-2:] == ["shard:1", "shard:1"]
    dist = check_every_shard(runner, steps=4 * 32)
    rebuilt = dist["shards_rebuilt"]
    assert [r["shard"] for r in rebuilt] == [1, 1]
    assert all(r["seconds"] < 30 for r in rebuilt)
    assert dist["log_peak_calls"] > 0
    assert 3 < sum(dist["shards"][0]["joins"]) <= 3 + 4  # the killed workers rejoined
    print(json.dumps({k: dist[k] for k in ("shards_rebuilt", "log_peak_calls", "log_peak_bytes")}))


def check_shard_0_survived(runner: Any, faults: Faults) -> None:
    """Shard 0 lost twice (the second time once its new standby was up), mid-run; each
    time its standby promoted; printed: the figures of docs/DISTRIBUTED.md."""
    kills = [(at, what) for at, what in faults.done if what == "shard:0"][:2]
    assert len(kills) == 2 and kills[1][0] < runner.end - 10, faults.done  # mid-run
    promotions, standbys_rebuilt = runner.shards.spare.promotions, runner.shards.spare.rebuilt
    assert len(promotions) >= 2 and standbys_rebuilt
    assert all(p["seconds"] < 30 for p in promotions)
    log = runner.merger.log.numpy()
    print(
        json.dumps(
            {
                "longest_pause": float(np.diff(log["sim_time"]).max()),
                "promotions": promotions,
                "standbys_rebuilt": standbys_rebuilt,
            }
        )
    )


@pytest.mark.ray
@needs_ray
def test_shard_0_lost_twice_survived_then_with_its_standby_a_fault_resumed_exactly(
    local_ray, tmp_path
):
    """The head (shard 0 of two) killed twice mid-run: each time its standby is promoted
    and a new standby built, nothing lost or applied twice on either shard; then the
    head and its standby killed at once: exit status 4 (a FaultError), and ``--resume``
    completes the run exactly. (One shard's promotions: the start-up and
    bounded-staleness tests below.)"""
    from dana.ps.driver import RayRun
    from dana.train.task.problem import Problem

    config = tiny(
        algorithm="dana-slim", workers=3, servers=2, epochs=6.0, checkpoint_every=1.0,
        time_scale=0.002,
    )  # fmt: skip
    out = tmp_path / "run"
    made: dict[str, Faults] = {}

    def faults_for(runner: Any) -> Faults:
        made["faults"] = Faults(runner, [(15, "shard:0"), (30, "shard:0"), (40, "both:0")])
        return made["faults"]

    with pytest.raises(FaultError, match="shard 0 .*--resume"):
        run_on_ray(config, out, faults_for)
    faults = made["faults"]
    assert [what for _, what in faults.done] == ["shard:0", "shard:0", "both:0"], faults.done
    check_shard_0_survived(faults.runner, faults)
    assert len(faults.runner.shards.spare.promotions) == 2  # (the third loss: not survived)
    run = RunDir(out)
    saved = run.load_checkpoint()
    assert saved is not None and 32 <= saved["servers"][0]["steps"] <= faults.done[-1][0]
    runner = RayRun(config, run, Problem(config))
    runner.load_state_dict(saved)
    runner.summary = runner.execute(Progress(enabled=False))
    run.write_summary(runner.summary)
    assert runner.rows[: len(saved["rows"])] == saved["rows"]
    dist = check_every_shard(runner, steps=6 * 32)
    assert len(dist["shards"]) == 2 and dist["shards"][0]["role"] == "head"


@pytest.mark.ray
@needs_ray
def test_without_a_standby_a_run_completes_exactly_listening_on_loopback_only(local_ray, tmp_path):
    """``standby=False`` (``--no-standby``): no standby actor; every push applied once on
    both shards. A local run's Ray listens on loopback only, serves no dashboard, and runs
    its actors at the driver's priority (not Ray's nice 15)."""
    config = tiny(algorithm="dana-slim", workers=3, servers=2, standby=False)
    runner, faults = run_with_faults(config, tmp_path / "run", [])
    assert len(faults.actor_nice) == 3 + 2, faults.actor_nice
    assert set(faults.actor_nice.values()) == {os.nice(0)}, faults.actor_nice
    assert faults.sockets, "no listening socket found"
    outward = [s for s in faults.sockets if not is_loopback(s[0])]
    assert not outward, f"Ray listens beyond loopback: {outward}"
    # No dashboard: nothing listens on its port. (Ray keeps a minimal dashboard process
    # for internal APIs; with ray[default] installed it holds a loopback gRPC socket,
    # which the loopback check above covers: it serves no web page.)
    assert all(s[1] != 8265 for s in faults.sockets), "the dashboard serves on 8265"
    dist = check_every_shard(runner, steps=3 * 32)
    assert dist["with_standby"] is False and dist["standby"] is None
    assert "standby" not in dist["placement"] and len(dist["placement"]) == 3 + 2
    assert dist["promotions"] == dist["standbys_rebuilt"] == [] and runner.shards.spare.built == 0
    assert "standby_lost" in dist and dist["standby_lost"] == 0


@pytest.mark.ray
@needs_ray
def test_without_a_standby_the_loss_of_shard_0_exits_4_then_resumes_exactly(
    local_ray, tmp_path, monkeypatch, capsys
):
    """``dana train --no-standby`` with one shard: killing it ends the run with exit
    status 4 and the way to go on; ``--resume`` then completes the run exactly."""
    from dana.cli import main
    from dana.ps.driver import RayRun

    poll, killed = RayRun._poll, []

    def poll_then_kill(self: Any) -> None:
        poll(self)
        if not killed and self.steps >= 48:  # (past the first checkpoint, at 32)
            killed.append(self.steps)
            ray.kill(self.shards.servers[0], no_restart=True)

    monkeypatch.setattr(RayRun, "_poll", poll_then_kill)
    out = tmp_path / "run"
    options = [
        "train", "--backend", "ray", "--no-standby", "--algorithm", "dana-slim",
        "--workers", "3", "--dataset", "synthetic", "--model", "mlp", "--train-size", "1024",
        "--test-size", "256", "--epochs", "4", "--batch-size", "32", "--lr", "0.05",
        "--warmup-epochs", "0.5", "--checkpoint-every", "1", "--time-scale", "0.001",
        "--quiet", "--out", str(out),
    ]  # fmt: skip
    assert main(options) == 4
    err = capsys.readouterr().err
    assert "shard 0 was lost, and this run has no standby (--no-standby)" in err, err
    assert f"dana train --resume {out}" in err and "Traceback" not in err
    assert killed and killed[0] < 4 * 32 - 10, killed  # mid-run
    assert not (out / "summary.json").exists()
    assert json.loads((out / "config.json").read_text())["standby"] is False
    saved = torch.load(out / "checkpoint.pt", weights_only=True)
    assert 32 <= saved["servers"][0]["steps"] <= killed[0]
    monkeypatch.undo()
    assert main(["train", "--resume", str(out), "--quiet"]) == 0
    dist = json.loads((out / "dist.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    (shard,) = dist["shards"]
    assert dist["with_standby"] is False and dist["standby"] is None
    problems = check_run(dist, summary, 4 * 32)
    assert not problems, problems
    assert shard["duplicates"] == 0 and shard["updates"] == 4 * 32
    assert dist["log_peak_calls"] == 0  # one shard, no standby: nothing logged
    rows = RunDir(out).read_metrics()
    assert [r["epoch"] for r in rows] == [0, 1, 2, 3, 4]
    assert rows[-1]["test_loss"] < 0.75 * rows[0]["test_loss"]


@pytest.mark.ray
@needs_ray
def test_bounded_staleness_across_a_promotion(local_ray, tmp_path):
    """``--max-staleness 0`` with 3 workers (one computes at a time, two always wait):
    shard 0 killed mid-run; the promoted standby, which knows who waits, lets them go
    and keeps the bound; the run completes, every push applied once."""
    config = tiny(algorithm="dana-slim", workers=3, servers=1, max_staleness=0, time_scale=0.0005)
    runner, faults = run_with_faults(config, tmp_path / "run", [(15, "shard:0")])
    assert [what for _, what in faults.done] == ["shard:0"]
    assert len(runner.shards.spare.promotions) == 1
    dist = check_every_shard(runner, steps=3 * 32, resent=True)
    assert int(runner.merger.log.numpy()["staleness"].max()) == 0
    head = dist["shards"][0]
    # Every push's worker waits behind the other two (a refused start per push): counted
    # over the whole run, also those the lost head refused (before: only the standby's
    # own since its promotion, at least 15 fewer).
    assert head["held_starts"] >= 3 * 32 - 8
    print(json.dumps({k: head[k] for k in ("waits", "wait_time", "held_starts")}))


def wait_dead(runner: Any, name: str, timeout: float = 60.0) -> None:
    """Return once the run's killed server ``name`` no longer answers, by the driver's own
    test (:meth:`ShardGroup.alive`), within ``timeout`` s."""
    deadline = time.time() + timeout
    while runner.shards.alive(name):
        assert time.time() < deadline, f"the killed {name} still answers after {timeout:g} s"
        time.sleep(0.05)


def kill_shard_0_at_start(monkeypatch: Any, when: str, shard: int = 0) -> list[str]:
    """Kill shard 0 for good as early in a run's start-up as the driver lets a test reach
    it: ``"created"``, right after the servers' actors are created (before they have
    started, and before the workers exist); ``"started"``, once every actor has started,
    before the clocks start and any worker calls (``shard``: kill that one instead). The
    kills done (their ``when``)."""
    from dana.ps import driver
    from dana.ps.driver import RayRun

    done: list[str] = []
    if when == "created":  # (the workers' GPUs are looked up right after the servers start)
        runs: list[Any] = []
        start_actors, worker_gpus = RayRun._start_actors, driver.worker_gpus

        def start_noted(self: Any) -> Any:
            runs.append(self)
            return start_actors(self)

        def kill_then_gpus(*args: Any) -> Any:
            if not done:
                done.append(when)
                ray.kill(runs[-1].shards.servers[0], no_restart=True)
            return worker_gpus(*args)

        monkeypatch.setattr(RayRun, "_start_actors", start_noted)
        monkeypatch.setattr(driver, "worker_gpus", kill_then_gpus)
    else:
        start_actors = RayRun._start_actors

        def start_then_kill(self: Any) -> Any:
            actors = start_actors(self)
            done.append(when)
            ray.kill(self.shards.servers[shard], no_restart=True)
            wait_dead(self, f"shard{shard}")  # (ray.kill returns before the actor is gone)
            return actors

        monkeypatch.setattr(RayRun, "_start_actors", start_then_kill)
    return done


@pytest.mark.ray
@needs_ray
@pytest.mark.parametrize("when, servers", [("created", 2), ("started", 1)])
def test_shard_0_lost_as_the_run_starts_its_standby_takes_over(
    local_ray, tmp_path, monkeypatch, when, servers
):
    """Shard 0 killed during the run's start-up, before the first push: its standby is
    promoted (a new one built) and the run completes, every push applied once."""
    done = kill_shard_0_at_start(monkeypatch, when)
    config = tiny(algorithm="dana-slim", workers=3, servers=servers, time_scale=0.001)
    runner = run_on_ray(config, tmp_path / "run")
    assert done == [when]
    promotions = runner.shards.spare.promotions
    assert len(promotions) == 1 and promotions[0]["steps"] == 0
    dist = check_every_shard(runner, steps=3 * 32, resent=True)
    assert dist["shards"][0]["role"] == "head"
    print(json.dumps({k: dist[k] for k in ("promotions", "standbys_rebuilt", "placement")}))


@pytest.mark.ray
@needs_ray
@pytest.mark.parametrize("when", ["created", "started"])
def test_without_a_standby_shard_0_lost_as_the_run_starts_exits_4(
    local_ray, tmp_path, monkeypatch, capsys, when
):
    """``--no-standby``, shard 0 killed as the run starts: exit status 4 at once (the
    workers, which look for shard 0 as they start, are not waited for) and a message, no
    traceback; ``--resume`` then runs it from the start, exactly."""
    from dana.cli import main

    done = kill_shard_0_at_start(monkeypatch, when)
    out = tmp_path / "run"
    options = [
        "train", "--backend", "ray", "--no-standby", "--algorithm", "dana-slim",
        "--workers", "2", "--dataset", "synthetic", "--model", "mlp", "--train-size", "1024",
        "--test-size", "256", "--epochs", "2", "--batch-size", "32", "--lr", "0.05",
        "--warmup-epochs", "0.5", "--quiet", "--out", str(out),
    ]  # fmt: skip
    started = time.time()
    assert main(options) == 4
    assert time.time() - started < 120  # (a worker looks for shard 0 for 300 s)
    err = capsys.readouterr().err
    assert done == [when]
    assert "shard 0 was lost while the run started, and this run has no standby" in err, err
    assert "it has no checkpoint yet: start it again from the beginning with" in err
    assert f"dana train --resume {out}" in err and "Traceback" not in err
    if when == "created":
        return  # (the resume is the same as after the other kill)
    monkeypatch.undo()
    assert main(["train", "--resume", str(out), "--quiet"]) == 0
    dist = json.loads((out / "dist.json").read_text())
    assert len(dist["shards"]) == 1
    problems = check_run(dist, json.loads((out / "summary.json").read_text()), 2 * 32)
    assert not problems, problems


@pytest.mark.ray
@needs_ray
def test_shard_1_lost_as_the_run_starts_ends_it_with_a_fault(local_ray, tmp_path, monkeypatch):
    """Shard 1 killed once every actor has started, before the clocks start: a
    FaultError (exit status 4) that says so, not a traceback."""
    done = kill_shard_0_at_start(monkeypatch, "started", shard=1)
    config = tiny(algorithm="dana-slim", workers=2, servers=2)
    with pytest.raises(FaultError, match="shard 1 was lost while the run started.*--resume"):
        run_on_ray(config, tmp_path / "run")
    assert done == ["started"]


def test_token_mode_without_a_token_is_a_clear_error(monkeypatch, tmp_path):
    from dana.ps.auth import check_token

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    for name in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(DanaError, match="no Ray token was found.*RAY_AUTH_MODE=token"):
        check_token("127.0.0.1:1")


# -- sockets and processes ----------------------------------------------------------------


def is_loopback(address: str) -> bool:
    return (
        address.startswith("127.")
        or address in ("::1", "localhost")
        or address.startswith("::ffff:127.")
    )


# -- two Ray nodes on this machine --------------------------------------------------------
