"""Elastic membership on the Ray runtime (dana.ps.membership): workers that leave for good
and workers added while the run goes on, told to the master rule through one relayed,
logged call (``relay_member``); and a cluster model emulated on Ray (dana.ps.emulation).

Units without Ray drive a head, its standby and a second shard by hand; the runs use the
session's local Ray (conftest's ``local_ray``) on the machine's 2 CPUs.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import torch
from conftest import needs_ray, run_on_ray, tiny
from fault_injection import Direct

from dana.errors import ConfigError
from dana.ps import accounting
from dana.ps.head import HeadServer
from dana.ps.membership import live_workers
from dana.ps.protocol import Push, Status
from dana.ps.settings import server_settings
from dana.ps.shard import ShardServer
from dana.train.config import TrainConfig
from dana.train.records.progress import Progress

try:
    import ray
except ImportError:  # the units still run
    ray = None

APPLIED, DUPLICATE, GONE = Status.APPLIED, Status.DUPLICATE, Status.GONE


def servers(algorithm: str, **kw: Any) -> tuple[HeadServer, HeadServer, ShardServer, Any]:
    """A head (shard 0 of 2), its standby and shard 1 of a run of 2 workers that may
    grow to 4, wired without Ray; and a maker of more shards 1."""
    config = tiny(algorithm=algorithm, workers=2, max_workers=4, servers=2, **kw)
    settings = server_settings(config, 8, 100)
    options = dict(end=None, evals=[], checkpoints=[])

    def shard(s: int, **more: Any) -> ShardServer:
        server = HeadServer if s == 0 else ShardServer
        return server(np.zeros(4, np.float32), **settings[s], **options, **more)

    head, one = shard(0, peers=["shard1"], replicated=True), shard(1)
    standby = shard(0, peers=["shard1"], standby=True)
    head.relay.names = []  # (no Ray: the handles are set by hand)
    for server in (head, standby, one):
        server.begin(0.0)
    head.relay.peers = [Direct(one)]
    head.relay.standby = Direct(standby)
    return head, standby, one, lambda: shard(1)


def drive(head: HeadServer) -> list[int]:
    """Workers 0, 1 start; 2 joins; 3 joins; 1 leaves; its later calls are refused. The
    workers that end the run."""
    rng = np.random.default_rng(0)
    seq = [0] * 4

    def step(w: int) -> Status:
        seq[w] += 1
        g = rng.standard_normal(8).astype(np.float32)
        return head.relay_exchange([Push(w, seq[w], g[:4], 1.0), Push(w, seq[w], g[4:])]).status

    for w in (0, 1):
        head.relay_pull(w, True)
    assert head.relay_pull(2, True).status is GONE  # not in the run yet
    for _ in range(3):
        for w in (0, 1):
            assert step(w) is APPLIED
    assert head.relay_member(2, True).status is APPLIED
    assert head.relay_member(2, True).status is DUPLICATE  # (a call sent again)
    head.relay_pull(2, True)
    for _ in range(3):
        for w in (0, 1, 2):
            assert step(w) is APPLIED
    head.relay_member(3, True)
    head.relay_pull(3, True)
    for _ in range(2):
        for w in (0, 1, 2, 3):
            assert step(w) is APPLIED
    assert head.relay_member(1, False).status is APPLIED
    assert step(1) is GONE
    seq[1] -= 1  # (refused: not applied, its number not taken)
    for _ in range(3):
        for w in (0, 2, 3):
            assert step(w) is APPLIED
    return [0, 2, 3]


@pytest.mark.parametrize("algorithm", ["dana-zero", "dana-slim", "multi-asgd", "dc-asgd"])
def test_members_join_and_leave_on_every_shard_and_the_standby(algorithm):
    """Every shard, the standby and a shard rebuilt from the head's log alone (replayed
    from the start) hold the same master state; DANA-Zero's ``S`` is the sum of the live
    workers' momenta (the one that left: 0); the per-push log records who was live."""
    head, standby, one, new_shard = servers(algorithm)
    live = drive(head)
    for a, b in ((head, standby),):
        for key, value in a.master.state_dict().items():
            if isinstance(value, torch.Tensor):
                torch.testing.assert_close(value, b.master.state_dict()[key], rtol=0, atol=0)
    rebuilt = new_shard()
    rebuilt.begin(0.0)
    assert head.relay.log.replay(Direct(rebuilt), 1, 0) == head.relay.log.count
    for key, value in one.master.state_dict().items():
        if isinstance(value, torch.Tensor):
            torch.testing.assert_close(value, rebuilt.master.state_dict()[key], rtol=0, atol=0)
    for server in (head, standby, one, rebuilt):
        counters = server.counters()
        assert counters["live"] == [True, False, True, True]
        assert counters["applied"] == counters["last_seq"] == [11, 8, 8, 5]
        assert counters["call_gaps"] == counters["seq_gaps"] == 0
        if algorithm == "dana-zero":
            v = server.master.v
            assert float(v[1].abs().max()) == 0.0  # its momentum dropped at leave
            torch.testing.assert_close(server.master.S, v[live].sum(0), rtol=1e-6, atol=1e-6)
    members = head.log.drain()["members"]
    assert live_workers(int(members[0])) == [0, 1]
    assert live_workers(int(members[-1])) == [0, 2, 3]
    assert {len(live_workers(int(m))) for m in members} == {2, 3, 4}


def test_growth_is_checked():
    base = dict(workers=2, dataset="synthetic", model="mlp")
    with pytest.raises(ConfigError, match="raise --max-workers to 4"):
        TrainConfig(**base, backend="ray", grow_at="10:2").validate()
    with pytest.raises(ConfigError, match="cannot; use --backend ray"):
        TrainConfig(**base, max_workers=4, grow_at="10:2").validate()
    with pytest.raises(ConfigError, match="is not STEP:N"):
        TrainConfig(**base, backend="ray", max_workers=4, grow_at="10").validate()
    with pytest.raises(ConfigError, match="pass --time-scale S > 0"):
        TrainConfig(**base, backend="ray", cluster="cloud").validate()


@needs_ray
def test_growth_past_the_runs_end_is_refused(tmp_path):
    """A growth step the run never reaches (known once the data are: 1 epoch of 256 // 32
    = 8 steps) is refused before anything is written or started, by ``dana train`` and
    by ``dana.fit`` (each naming the option its way)."""
    import dana
    from dana.train.training import train

    config = TrainConfig(
        workers=2, max_workers=4, grow_at="4:1,999999999:1", dataset="synthetic", model="mlp",
        train_size=256, test_size=64, batch_size=32, epochs=1.0, backend="ray",
    )  # fmt: skip
    with pytest.raises(ConfigError, match=r"--grow-at 4:1,999999999:1: step 999999999 .* 8 steps"):
        train(config, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()
    x, y = torch.randn(64, 4), torch.randint(0, 2, (64,))
    with pytest.raises(ConfigError, match=r"grow_at 8:1: step 8 is not before the run's end"):
        dana.fit(torch.nn.Linear(4, 2), (x, y), workers=2, max_workers=3, grow_at="8:1",
                 batch_size=16, epochs=2, backend="ray", out=tmp_path / "fit")  # fmt: skip
    assert not (tmp_path / "fit").exists()


def test_a_request_that_is_not_text_is_reported_and_ignored(tmp_path, capsys):
    """``RUN/add-workers`` holding bytes that are not UTF-8 (or a number of 5,000 digits)
    is reported on stderr, removed and ignored, as any text that is no number; the next
    request is read as usual."""
    from dana.ps.membership import Membership

    members = Membership(tiny(algorithm="dana-zero", workers=2, max_workers=4), tmp_path)
    request = tmp_path / "add-workers"
    for junk in (b"\xff\xfe2\x00", b"9" * 5000):
        request.write_bytes(junk)
        assert members._requested() == 0 and not request.exists()
        assert "not a number of workers to add: ignored" in capsys.readouterr().err
    request.write_bytes(b"1\n")
    assert members.due() == 1


class KillAt(Progress):
    """Kills worker ``worker`` for good (no restart) once the run has passed ``steps``."""

    def __init__(self, runner: Any, steps: int, worker: int):
        super().__init__(enabled=False)
        self.runner, self.at, self.worker, self.done = runner, steps, worker, False

    def update(self, steps: int, loss: float) -> None:
        if not self.done and steps >= self.at:
            ray.kill(self.runner.worker_actors[self.worker], no_restart=True)
            self.done = True


def every_push_once(runner: Any, workers: int) -> dict[str, Any]:
    """Every push applied exactly once on every shard and on the standby
    (:func:`~dana.ps.accounting.check_run`: per worker the pushes applied equal its last
    seq, alike everywhere, no gap, no relayed call missed, as many as the merged log
    holds); besides, no repeat, the same workers live everywhere."""
    dist = json.loads((runner.run.path / "dist.json").read_text())
    assert dist["standby"] is not None
    problems = accounting.check_run(dist, runner.summary, len(runner.merger.log))
    assert not problems, problems
    first = dist["shards"][0]
    for s, shard in enumerate(accounting.servers(dist)):
        assert shard["duplicates"] == 0, f"shard {s}"
        assert shard["live"] == first["live"], f"shard {s}"
    assert len(first["applied"]) == workers
    assert sum(first["applied"]) == first["pushes"]
    return dist


@pytest.mark.ray
@needs_ray
def test_a_run_grows_from_2_to_4_workers_and_shrinks_to_3(local_ray, tmp_path, capfd):
    """DANA-Zero, 2 shards: workers 2 and 3 are added at steps 16 and 32, worker 1 is
    killed for good at step 64 (declared gone: ``master.leave``). Exact accounting; at
    the end (the checkpoint of the last step) each shard's ``S`` is the sum of the live
    workers' momenta and worker 1's momentum is 0; ``members.csv`` says who was live at
    each push."""
    config = tiny(
        algorithm="dana-zero",
        workers=2,
        max_workers=4,
        grow_at="16:1,32:1",
        servers=2,
        epochs=4.0,
        checkpoint_every=4.0,
        time_scale=0.0005,
    )
    made: dict[str, KillAt] = {}

    def progress(runner: Any) -> KillAt:
        made["kill"] = KillAt(runner, 64, 1)
        return made["kill"]

    runner = run_on_ray(config, tmp_path / "run", progress)
    assert made["kill"].done
    dist = every_push_once(runner, workers=4)
    assert dist["live"] == [0, 2, 3] and dist["workers_lost"] == [1]
    assert [(e["worker"], e["event"], e["live"]) for e in dist["membership"]] == [
        (2, "join", 3),
        (3, "join", 4),
        (1, "leave", 3),
    ]
    assert sum(dist["shards"][0]["joins"]) == 4  # each process joined once
    assert runner.summary["workers"] == 2 and runner.summary["workers_at_end"] == 3
    err = capfd.readouterr().err  # each join said on screen
    assert "worker 2 joined at step" in err and "worker 3 joined at step" in err
    state = torch.load(runner.run.checkpoint, weights_only=True)
    for server in state["servers"]:
        v, S = torch.as_tensor(server["master"]["v"]), torch.as_tensor(server["master"]["S"])
        assert float(v[1].abs().max()) == 0.0
        torch.testing.assert_close(S, v[[0, 2, 3]].sum(0), rtol=1e-5, atol=1e-6)
    rows = (runner.run.path / "members.csv").read_text().splitlines()[1:]
    assert len(rows) == runner.summary["pushes"]
    counts = [int(r.split(",")[2]) for r in rows]
    assert counts[0] == 2 and counts[-1] == 3 and max(counts) == 4
    assert counts == sorted(counts[: counts.index(4)]) + counts[counts.index(4) :]
    for row in rows:  # a push comes from a live worker
        _, w, _, members = row.split(",")
        assert w in members.split()


def test_the_driver_adds_requested_workers_within_k_max(tmp_path, capsys):
    """``RUN/add-workers`` when written (read once, removed), never beyond
    ``--max-workers`` (said on stderr); a resumed run starts every worker it had
    started. (``--grow-at`` is the head's: ``test_ps_replay.py``.)"""
    from dana.ps.membership import Membership

    config = tiny(algorithm="dana-zero", workers=2, max_workers=5, grow_at="10:1,30:1")
    members = Membership(config, tmp_path)
    assert members.due() == 0
    (tmp_path / "add-workers").write_text("2\n")
    assert members.due() == 2 and not (tmp_path / "add-workers").exists()
    assert [members.next_index() for _ in range(3)] == [2, 3, 4]
    (tmp_path / "add-workers").write_text("1\n")
    assert members.due() == 0 and "room for 0" in capsys.readouterr().err
    (tmp_path / "add-workers").write_text("many")
    assert members.due() == 0 and "not a number" in capsys.readouterr().err
    resumed = Membership(config, tmp_path)
    resumed.resume(
        {"live": [True, False, True, False, False], "joins": [1, 1, 1, 0, 0], "steps": 20}
    )
    assert resumed.started == 3 and resumed.live == {0, 2}


def test_an_elastic_averaging_rule_is_built_for_the_most_workers_a_run_may_hold():
    # (it was built for the starting k, and the Ray run died after starting: "easgd was
    # built for workers=2, not 3")
    from dana.train.config import TrainConfig

    for name in ("easgd", "eamsgd", "dana-easgd"):
        config = TrainConfig(algorithm=name, workers=2, max_workers=3, backend="ray")
        algorithm = config.validate().build_algorithm()
        assert algorithm.workers == 3
        algorithm.master(torch.zeros(4), 3)  # the size the servers build its rule for
        assert TrainConfig(algorithm=name, workers=2).build_algorithm().workers == 2
