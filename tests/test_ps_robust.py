"""The Ray runtime's robustness on a real local Ray: a SIGTERMed run checkpoints and
exits 75 (dana/train/records/preempt.py), a killed driver leaves no Ray process behind
(dana/ps/reaper.py) and its run resumes from the checkpoint, and a hung server (SIGSTOP)
past ``--server-timeout`` is lost as a dead one is (dana/ps/group.py), and so is a hung
worker (dana/ps/watch.py): the run goes on with every push applied once, or ends with
exit status 4 and a message, never a silent hang."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from clirun import start, wait_for, wait_rows
from conftest import check_accounting, command, descendants, needs_ray, run_on_ray, tiny
from fault_injection import Faults, check_every_shard, run_with_faults

from dana.errors import EXIT_PREEMPTED, FaultError
from dana.ps.accounting import check_run
from dana.ps.watch import WATCH
from dana.train.records.rundir import RunDir

try:
    import ray
except ImportError:
    ray = None

#: A ``dana train`` on Ray whose steps are paced (``--time-scale``) to about 2.2 s an epoch,
#: so that a signal after its first rows or its first checkpoint lands mid-run (a loaded
#: machine only slows it); 0.004 paced it to 9 s an epoch, most of these tests' time.
RUN = ["train", "--backend", "ray", "--algorithm", "asgd", "--workers", "2", "--servers", "2",
       "--dataset", "synthetic", "--model", "mlp", "--train-size", "1024", "--test-size", "256",
       "--batch-size", "32", "--lr", "0.2", "--warmup-epochs", "0.5", "--eval-every", "0.5",
       "--time-scale", "0.001", "--quiet"]  # fmt: skip


def ray_processes() -> dict[int, tuple[int, int, str]]:
    """Ray's processes on this machine: pid -> (parent pid, process group, name)."""
    out = subprocess.run(["ps", "-eo", "pid=,ppid=,pgid=,comm="], capture_output=True, text=True)
    names = ("ray::", "raylet", "gcs_server", "dashboard", "log_monitor", "monitor.py")
    procs = {}
    for line in out.stdout.splitlines():
        pid, ppid, pgid, comm = line.split(None, 3)
        if any(n in comm for n in names):
            procs[int(pid)] = (int(ppid), int(pgid), comm)
    return procs


def leaked(before: dict[int, Any], group: int) -> dict[int, Any]:
    """New Ray processes in ``group`` or orphaned (not in ``before``)."""
    for _ in range(40):
        left = {
            pid: p
            for pid, p in ray_processes().items()
            if pid not in before and (p[1] == group or p[0] == 1)
        }
        if not left:
            break
        time.sleep(0.25)
    return left


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.ray
@needs_ray
def test_a_sigtermed_ray_run_checkpoints_exits_75_and_resumes_exactly(tmp_path):
    out = tmp_path / "run"
    proc = start(*RUN, "--epochs", "3", "--out", str(out))
    wait_rows(out, 2, proc)  # epochs 0 and 0.5 evaluated: mid-run
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == EXIT_PREEMPTED, err
    assert "Traceback" not in err, err
    (line,) = [x for x in err.splitlines() if x.startswith("dana:")]
    assert "preempted by SIGTERM: checkpoint written at step" in line, err
    assert f"dana train --resume {out}" in line
    assert (out / "checkpoint.pt").exists() and not (out / "summary.json").exists()
    stopped = int(line.split("at step ")[1].split(";")[0])
    assert 0 < stopped < 3 * 32, line

    resumed = start("train", "--resume", str(out), "--quiet")
    said, err = resumed.communicate(timeout=400)
    assert resumed.returncode == 0, err
    dist = json.loads((out / "dist.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    rate = summary["pushes"] / summary["sim_time"]  # (a Ray run's time: wall seconds)
    assert f", {rate:.1f} pushes/s. Results in" in said.splitlines()[-1]
    problems = check_run(dist, summary, 3 * 32)  # every push applied once on both shards
    assert not problems, problems
    assert all(shard["duplicates"] == 0 for shard in dist["shards"])  # none redone


def started(proc: subprocess.Popen, names: tuple[str, ...]) -> Callable[[], bool]:
    """Whether a process under ``proc`` has a name beginning with one of ``names``."""

    def name(pid: int) -> str:
        try:
            return Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            return ""

    def seen() -> bool:
        return any(name(pid).startswith(names) for pid in descendants(proc.pid) - {proc.pid})

    return seen


@pytest.mark.ray
@needs_ray
@pytest.mark.parametrize(
    "moment, names",
    [("ray.init", ("gcs_server",)), ("the actors", ("ray::HeadServer", "ray::ShardServe"))],
    ids=["in-ray-init", "actors-starting"],
)
def test_a_sigterm_while_the_run_starts_exits_75_and_leaves_a_run_to_resume(
    tmp_path, moment, names
):
    """While ``ray.init`` starts the node (its GCS is up) or the servers' actors start,
    SIGTERM ends the start at once: status 75 and the one preemption line (Ray's own
    handler would exit 15 without a word), no checkpoint, no Ray process left, the run
    directory holding its config.json alone; ``--resume`` then runs it from the start."""
    out = tmp_path / "run"
    proc = start(*RUN, "--epochs", "1", "--out", str(out))
    wait_for(started(proc, names), proc, f"{moment} under way", timeout=120)
    ours = descendants(proc.pid) - {proc.pid}
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == EXIT_PREEMPTED, err
    assert "Traceback" not in err, err
    (line,) = [x for x in err.splitlines() if x.startswith("dana:")]
    assert "preempted by SIGTERM while the run was starting: no checkpoint written" in line
    assert f"from the beginning (no checkpoint yet) with `dana train --resume {out}`" in line
    assert sorted(p.name for p in out.iterdir()) == ["config.json"]
    deadline = time.time() + 10
    while time.time() < deadline and any(alive(pid) for pid in ours):
        time.sleep(0.2)
    assert not {pid: command(pid) for pid in ours if alive(pid)}, "Ray processes left behind"
    if moment == "ray.init":
        resumed = start("train", "--resume", str(out), "--quiet")
        _, err = resumed.communicate(timeout=400)
        assert resumed.returncode == 0, err
        summary = json.loads((out / "summary.json").read_text())
        assert summary["pushes"] == 32 and not summary["diverged"]


@pytest.mark.ray
@needs_ray
def test_a_killed_driver_leaves_no_ray_process_behind_and_resumes_from_its_checkpoint(tmp_path):
    """SIGKILL on the driver alone, after its first checkpoint: its reaper kills every Ray
    process it started (the GCS, the node manager, agents, servers, workers, standby)
    within seconds; ``--resume`` then finishes the run from the checkpoint, its earlier
    metrics rows unchanged and every push applied once on both shards."""
    out = tmp_path / "run"
    proc = start(*RUN, "--epochs", "4", "--checkpoint-every", "1", "--out", str(out))
    wait_for((out / "checkpoint.pt").exists, proc, "checkpoint")
    time.sleep(1.0)  # (the reaper notes the processes every 0.5 s)
    before = descendants(proc.pid) - {proc.pid}
    assert len(before) > 5, before  # GCS, raylet, agents, 2 workers, 2 shards, standby...
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 10
    while time.time() < deadline and any(alive(pid) for pid in before):
        time.sleep(0.2)
    left = {pid: command(pid) for pid in before if alive(pid)}
    assert not left, left
    assert not (out / "summary.json").exists(), "the run ended before it was killed"

    saved = torch.load(out / "checkpoint.pt", weights_only=True)
    running = ray_processes()
    resumed = start("train", "--resume", str(out), "--quiet")
    _, err = resumed.communicate(timeout=400)
    assert resumed.returncode == 0, err
    assert not leaked(running, resumed.pid), "the resumed run left Ray processes behind"
    rows = RunDir(out).read_metrics()
    assert [r["epoch"] for r in rows] == [0.5 * i for i in range(9)]
    assert rows[: len(saved["rows"])] == [pytest.approx(r, nan_ok=True) for r in saved["rows"]]
    assert rows[-1]["test_loss"] < 0.75 * rows[0]["test_loss"]
    dist = json.loads((out / "dist.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["pushes"] == summary["updates"] == 4 * 32
    problems = check_run(dist, summary, 4 * 32)  # every push applied once on both shards
    assert not problems, problems


class Pauses(Faults):
    """:class:`fault_injection.Faults` with pauses: ``"pause:shard:S"``, ``"pause:standby:0"``
    (SIGSTOP, never continued: the driver kills it past the deadline) and
    ``"blink:shard:S"`` (SIGSTOP, SIGCONT ``BLINK`` s later: shorter than the deadline)."""

    BLINK = 1.0

    def update(self, steps: int, loss: float) -> None:
        while self.actions and steps >= self.actions[0][0]:
            how, kind, index = (self.actions[0][1].split(":") + ["", ""])[:3]
            if how not in ("pause", "blink"):
                return super().update(steps, loss)
            if self.runner.shards.standby is None and (kind == "standby" or index == "0"):
                return  # (shard 0 or the standby once a standby is in place again)
            at, what = self.actions.pop(0)
            shards = self.runner.shards
            actor = shards.standby if kind == "standby" else shards.servers[int(index)]
            pid = ray.get(actor.__ray_call__.remote(lambda self: os.getpid()))
            os.kill(pid, signal.SIGSTOP)
            if how == "blink":
                threading.Timer(self.BLINK, os.kill, (pid, signal.SIGCONT)).start()
            self.done.append((steps, what))
            return


@pytest.mark.ray
@needs_ray
def test_hung_servers_past_the_deadline_are_lost_and_replaced(local_ray, tmp_path):
    """Shard 1 paused (SIGSTOP) for 1 s, then the standby, shard 1 and shard 0 for good,
    with ``--server-timeout 5``: the short pause changes nothing; each long one is
    noticed within the deadline and repaired as a death is (the standby rebuilt, shard
    1 rebuilt, the standby promoted); every push applied once on every shard."""
    # (5 s, not less: on two loaded cores a rebuilt shard's first replies, or the blinked
    # one's after its SIGCONT, can take 3 s, and a slow reply past the deadline is a loss)
    config = tiny(workers=3, servers=2, epochs=8.0, time_scale=0.002, server_timeout=5.0)
    actions = [(8, "blink:shard:1"), (16, "pause:standby:0"), (40, "pause:shard:1"),
               (64, "pause:shard:0")]  # fmt: skip
    runner, done = run_with_faults(config, tmp_path / "run", actions, Pauses)
    assert [what for _, what in done.done] == [what for _, what in actions], done.done
    dist = check_every_shard(runner, steps=8 * 32, resent=True)
    repairs = json.dumps({k: dist[k] for k in ("shards_rebuilt", "promotions", "standbys_rebuilt")})
    print(repairs)
    assert [r["shard"] for r in dist["shards_rebuilt"]] == [1], repairs
    assert len(dist["promotions"]) == 1, repairs
    assert dist["standbys_rebuilt"], repairs  # (1 or 2: the run may end first)


@pytest.mark.ray
@needs_ray
def test_a_hung_head_without_a_standby_ends_the_run_with_exit_4(local_ray, tmp_path):
    config = tiny(workers=2, servers=1, epochs=4.0, time_scale=0.002, server_timeout=3.0,
                  standby=False)  # fmt: skip

    class Pause(Pauses):
        def update(self, steps: int, loss: float) -> None:
            if self.actions and steps >= self.actions[0][0]:
                self.actions.pop(0)
                head = self.runner.shards.servers[0]
                pid = ray.get(head.__ray_call__.remote(lambda self: os.getpid()))
                os.kill(pid, signal.SIGSTOP)
                self.done.append((steps, "pause:shard:0"))

    started = time.time()
    with pytest.raises(FaultError, match="shard 0 was lost.*no standby.*--resume"):
        run_on_ray(config, tmp_path / "run", lambda runner: Pause(runner, [(20, "pause")]))
    assert time.time() - started < 120


@pytest.mark.ray
@needs_ray
def test_a_hung_worker_is_dropped_past_the_deadline_and_the_run_ends_normally(
    local_ray, tmp_path, capfd
):
    """Worker 1 paused (SIGSTOP, never continued) mid-run, with ``--server-timeout 4``:
    it no longer answers the driver's questions (dana/ps/watch.py), so it is killed and
    dropped within the deadline (plus a margin), named on stderr; the other two finish
    the run, which returns normally with every push applied exactly once."""
    deadline = 4.0
    config = tiny(workers=3, servers=2, epochs=4.0, time_scale=0.002, server_timeout=deadline)
    paused: list[float] = []

    class PauseWorker(Faults):
        def update(self, steps: int, loss: float) -> None:
            if not paused and steps >= 40:
                worker = self.runner.worker_actors[1]
                # (asked on its side thread: its run() call holds the main one)
                ask = worker.__ray_call__.options(concurrency_group=WATCH)
                os.kill(ray.get(ask.remote(lambda self: os.getpid())), signal.SIGSTOP)
                paused.append(time.time())

    # (without the deadline the run waits for ever: a SIGTERM then checkpoints it, a failure)
    guard = threading.Timer(120.0, os.kill, (os.getpid(), signal.SIGTERM))
    guard.start()
    try:
        runner = run_on_ray(config, tmp_path / "run", lambda runner: PauseWorker(runner, []))
    finally:
        guard.cancel()
    assert paused, "the run ended before the pause"
    err = capfd.readouterr().err
    assert "worker 1 did not answer within 4 s" in err and "dropped from the run" in err, err
    dist = check_accounting(runner)  # every push applied exactly once, the summary's too
    assert runner.summary["pushes"] == 4 * 32
    assert dist["workers_lost"] == [1]
    (left,) = [e for e in dist["membership"] if e["event"] == "leave"]
    assert left["worker"] == 1 and left["why"] == "did not answer"
    assert left["time"] - paused[0] < deadline + 3.0, left["time"] - paused[0]
    assert left["steps"] < 4 * 32  # dropped mid-run: the two others went on
