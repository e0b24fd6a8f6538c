"""``dana replay``: a Ray run's final parameters rebuilt without Ray from its record of
calls, bit for bit (:mod:`dana.ps.replay`, :mod:`dana.ps.calls`); and ``--grow-at``
admitted by every server at its step (:meth:`dana.ps.shard.ShardServer._reached`).

The runs are local-Ray runs of the small MLP on synthetic data (as in
``test_ps_runtime.py``), with faults injected as in ``test_ps_faults.py``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import needs_ray, run_on_ray, tiny
from fault_injection import Direct, Faults, run_with_faults

from dana.cli import main
from dana.errors import FaultError, Preempted
from dana.ps.calls import METHODS, REPLAY_FILE, CallBook, write_calls
from dana.ps.head import HeadServer
from dana.ps.protocol import Method, Push, Status
from dana.ps.replay import replay_run
from dana.ps.settings import server_settings
from dana.train.records import preempt
from dana.train.records.progress import Progress
from dana.train.records.rundir import RunDir
from dana.train.task.problem import Problem


def finished(runner: Any) -> Path:
    """The run's directory with its model saved, as ``dana train`` leaves it."""
    runner.problem.save_model(runner.run.path, runner.final_params())
    return runner.run.path


@pytest.fixture(scope="module")
def faulty_run(local_ray, tmp_path_factory) -> tuple[Any, Any]:
    """Two shards, topk with error feedback, a worker killed (restarted: a new process),
    shard 0 lost (its standby promoted), shard 1 lost (rebuilt from its snapshot and the
    relay log), one worker added at step 24 (``--grow-at``)."""
    config = tiny(
        algorithm="dana-slim", workers=2, max_workers=3, grow_at="24:1", servers=2,
        compress="topk:0.1", time_scale=0.002,
    )  # fmt: skip
    out = tmp_path_factory.mktemp("replay") / "run"
    runner, faults = run_with_faults(
        config, out, [(12, "worker:0"), (40, "shard:0"), (64, "shard:1")]
    )
    finished(runner)
    return runner, faults


@pytest.mark.ray
@needs_ray
def test_a_run_with_faults_growth_and_a_codec_is_replayed_exactly(faulty_run, capsys):
    runner, faults = faulty_run
    assert [what for _, what in faults.done] == ["worker:0", "shard:0", "shard:1"], faults.done
    assert runner.shards.spare.promotions, "shard 0's standby was not promoted"
    dist = json.loads((runner.run.path / "dist.json").read_text())
    assert [r["shard"] for r in dist["shards_rebuilt"]] == [1]
    verdict = replay_run(runner.run.path)
    assert verdict.max_diff == 0.0 and verdict.identical
    replayed = verdict.replayed
    assert replayed.pushes == runner.end == 3 * 32
    assert replayed.processes >= 2 + 1 + 1  # the first two, the one added, a restart
    # --grow-at 24:1: worker 2 is live from the 25th push on, whatever the driver's polls
    masks = runner.merger.members.tolist()
    assert [bool(m >> 2 & 1) for m in masks] == [False] * 24 + [True] * (len(masks) - 24)
    assert main(["replay", str(runner.run.path)]) == 0
    assert "identical" in capsys.readouterr().out


@pytest.mark.ray
@needs_ray
def test_a_record_that_is_not_the_runs_is_a_mismatch(faulty_run, tmp_path, capsys):
    """The replay can fail: worker 1's first process given another incarnation (another
    batch stream) replays to other parameters: exit status 1."""
    runner, _ = faulty_run
    copy = tmp_path / "run"
    copy.mkdir()
    for name in ("config.json", "model.safetensors"):
        (copy / name).write_bytes((runner.run.path / name).read_bytes())
    with np.load(runner.run.path / REPLAY_FILE) as saved:
        calls = {name: saved[name] for name in saved.files}
    pulls = np.flatnonzero((calls["method"] == METHODS.index(Method.PULL)) & (calls["worker"] == 1))
    calls["more"][pulls[calls["more"][pulls] == 1]] = 7
    np.savez_compressed(copy / REPLAY_FILE, **calls)
    verdict = replay_run(copy)
    assert verdict.max_diff > 0 and not verdict.identical
    assert main(["replay", str(copy)]) == 1
    assert "MISMATCH" in capsys.readouterr().out


@pytest.mark.ray
@needs_ray
@pytest.mark.parametrize("algorithm", ["dana-zero", "dc-asgd", "local-sgd", "easgd"])
def test_rules_with_their_own_pull_or_local_steps_are_replayed_exactly(
    local_ray, tmp_path, algorithm
):
    """Rules whose pull is more than a copy of theta (its state moves), that take local
    steps, or that average elastically: one shard, one epoch."""
    config = tiny(algorithm=algorithm, workers=2, epochs=1.0)
    verdict = replay_run(finished(run_on_ray(config, tmp_path / "run")))
    assert verdict.max_diff == 0.0


class Preempt(Progress):
    """As a SIGTERM would, asks the run to stop once it has passed ``at`` steps."""

    def __init__(self, runner: Any, at: int):
        super().__init__(enabled=False)
        self.at = at

    def update(self, steps: int, loss: float) -> None:
        if steps >= self.at and not preempt.requested():
            preempt._received.append("SIGTERM")


@pytest.mark.ray
@needs_ray
def test_a_run_resumed_twice_is_replayed_exactly(local_ray, tmp_path, monkeypatch):
    """Preempted (a checkpoint of the moment), resumed; then shard 0 and its standby lost
    together (exit 4), resumed from the last periodic checkpoint, whose calls after it
    the replay leaves out; then to the end: three parts, replayed exactly."""
    from dana.ps.driver import RayRun

    monkeypatch.setattr(preempt, "_received", [])
    config = tiny(
        algorithm="dana-slim", workers=2, servers=2, epochs=4.0, checkpoint_every=1.0,
        time_scale=0.002,
    )  # fmt: skip
    out = tmp_path / "run"
    with pytest.raises(Preempted):
        run_on_ray(config, out, lambda runner: Preempt(runner, 20))
    preempt._received.clear()
    run = RunDir(out)

    def resume(progress: Any) -> Any:
        runner = RayRun(config, run, Problem(config))
        runner.load_state_dict(run.load_checkpoint())
        runner.summary = runner.execute(progress(runner))
        return runner

    with pytest.raises(FaultError):
        resume(lambda runner: Faults(runner, [(80, "both:0")]))
    runner = resume(lambda runner: Progress(enabled=False))
    verdict = replay_run(finished(runner))
    assert verdict.max_diff == 0.0
    with np.load(out / REPLAY_FILE) as saved:
        cuts = saved["cuts"].tolist()
    assert len(cuts) == 3 and cuts[0] == -1 and cuts[1] in (32, 64) and cuts[2] == -1


def test_runs_that_cannot_be_replayed_exit_2(tmp_path, capsys):
    """Exit status 2 naming the problem: not a run, not a Ray run, a synchronous rule, a
    Ray run without its record."""
    cases = {
        "no run": (None, "holds no run"),
        "sim": (tiny(backend="sim"), "only a Ray run"),
        "ssgd": (tiny(algorithm="ssgd"), "synchronous"),
        "unrecorded": (tiny(), f"no {REPLAY_FILE}"),
        "resumed unrecorded": (tiny(), "a checkpoint that a dana without replay records"),
    }
    for name, (config, said) in cases.items():
        run = RunDir(tmp_path / name)
        run.path.mkdir()
        if config is not None:
            run.write_config(config.to_dict(), "test")
        if name == "resumed unrecorded":  # (its checkpoint had no book)
            book = CallBook()
            book.load_state_dict(None)
            write_calls(run.path / REPLAY_FILE, book)
            (run.path / "model.safetensors").write_bytes(b"")
        assert main(["replay", str(run.path)]) == 2, name
        assert said in capsys.readouterr().err, name


def test_the_replay_imports_no_ray():
    code = "import sys, dana.ps.replay; sys.exit('ray' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0


# -- deterministic growth, no Ray --------------------------------------------------------
def grown(grow_at: str, **kw: Any) -> tuple[HeadServer, HeadServer]:
    """A head of one shard, with its standby, of 2 workers growing by ``grow_at``."""
    config = tiny(algorithm="dana-slim", workers=2, max_workers=4, grow_at=grow_at)
    settings = server_settings(config, 6, 100)[0]
    options = dict(end=None, evals=[], checkpoints=[5], **kw)
    head = HeadServer(np.zeros(6, np.float32), **settings, **options, replicated=True)
    standby = HeadServer(np.zeros(6, np.float32), **settings, **options, standby=True)
    for server in (head, standby):
        server.begin(0.0)
    head.relay.standby = Direct(standby)
    return head, standby


def drive(head: HeadServer, arrivals: list[int]) -> None:
    """Workers push in the order ``arrivals`` (each pulls first once)."""
    seqs = dict.fromkeys(range(4), 0)
    for w in arrivals:
        if seqs[w] == 0:
            assert head.relay_pull(w, join=True).status is Status.PARAMS
        seqs[w] += 1
        g = np.full(6, 0.1 * (w + 1), np.float32)
        assert head.relay_exchange([Push(w, seqs[w], g)]).status is Status.APPLIED


def test_growth_joins_at_its_step_on_every_server():
    """``--grow-at 5:1,7:1``: workers 2 and 3 join within the 5th and the 7th push, on
    the head and its standby alike, before the snapshot of step 5; two runs with the
    same arrivals agree bit for bit; a server resumed at step 5 has 2 to add at 7."""
    arrivals = [0, 1, 0, 1, 1, 2, 0, 1, 0]
    head, standby = grown("5:1,7:1")
    drive(head, arrivals)
    masks = head.log.drain()["members"].tolist()
    assert masks == [0b11] * 5 + [0b111] * 2 + [0b1111] * 2
    assert standby.records.live == head.records.live == [True] * 4
    assert standby.started == head.started == 4 and standby.steps == 9
    (snap,) = head.poll()["snapshots"]
    assert snap["steps"] == 5 and snap["state"]["live"] == [True, True, True, False]
    again, _ = grown("5:1,7:1")
    drive(again, arrivals)
    assert again.master.theta.tolist() == head.master.theta.tolist()
    assert again.log.drain()["members"].tolist() == masks
    resumed, _ = grown("5:1,7:1", state=snap["state"])
    assert (resumed.started, resumed.grow) == (3, [(7, 1)])
