"""A chaos soak of the Ray runtime: random faults of every kind it claims to survive.

For ``--minutes`` the script runs episodes back to back, each a real ``dana-slim`` run on
a private local Ray (3 workers, 2 shards and shard 0's standby, the test MLP on
synthetic data, ``--server-timeout`` short), and injects faults at random moments,
one at a time (a long pause's next fault waits past its deadline; shard 0, the
standby and the pauses only while a standby is in place: losing shard 0 without one is
not survived):

- ``worker``: a worker's process killed (Ray restarts it; each worker at most half its
  ``WORKER_RESTARTS`` per episode: one out of restarts is gone for good);
- ``shard``: shard 1 killed (rebuilt from its snapshot and shard 0's log);
- ``head``: shard 0 killed (its standby promoted, a new one built);
- ``standby``: the standby killed (a new one built);
- ``pause-short``: a server (shard 0, shard 1 or the standby) stopped with SIGSTOP for a
  third of the deadline, then continued (nothing to repair);
- ``pause-long``: a server stopped for good (past the deadline: lost, killed and
  replaced as a dead one is);
- ``worker-stop``: a worker's process stopped with SIGSTOP for good (at most one an
  episode): the driver's watch finds it hung past the deadline, kills it and drops it
  from the run, which the other workers finish;
- ``driver``: every third episode (the second, fifth, ...) runs ``dana train`` as a process of its own, kills
  it with SIGKILL once it has a checkpoint, checks that its Ray processes are gone
  (the reaper: seconds counted), then ``dana train --resume`` completes it.

Shard 0's relay log is bounded small (``--relay-log-bytes``, 1 MiB: two or three of the
MLP's pushes), so that most calls go through its spill files and trimming frees them;
an episode whose log spilled nothing counts as failed.

After each episode it checks the accounting (:func:`dana.ps.accounting.check_run`:
every push applied once on every shard and the standby, the log whole, the metrics rows
at every evaluation point) and prints the figures: faults by kind, survived (their
episode completed and its accounting holds), pushes lost and doubled.

Run: ``nice python bench/chaos_soak.py --minutes 10`` (``--smoke``: one short episode
with six faults, :data:`SMOKE_FAULTS`, to check the script runs). The last line:

    chaos soak: F faults, S survived, lost L, doubled D
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from dana.ps.accounting import check_run, lost_and_doubled  # noqa: E402
from dana.ps.cluster import WORKER_RESTARTS  # noqa: E402
from dana.ps.reaper import ray_descendants  # noqa: E402
from dana.ps.watch import WATCH  # noqa: E402
from dana.train.config import TrainConfig  # noqa: E402
from dana.train.records.progress import Progress  # noqa: E402
from dana.train.records.rundir import RunDir  # noqa: E402
from dana.train.task.problem import Problem  # noqa: E402

KINDS = ("worker", "shard", "head", "standby", "pause-short", "pause-long", "worker-stop")
#: The smoke run's faults, in order, and no other.
SMOKE_FAULTS = ["pause-short", "shard", "head", "worker", "worker-stop", "pause-long"]
#: Shard 0's relay log bound (``--relay-log-bytes``): two or three of the MLP's pushes.
RELAY_LOG_BYTES = 2**20


def settings(seed: int, epochs: float, timeout: float, log_bytes: int) -> dict[str, Any]:
    return dict(
        algorithm="dana-slim", workers=3, servers=2, dataset="synthetic", model="mlp",
        train_size=1024, test_size=256, epochs=epochs, batch_size=32, lr=0.05,
        warmup_epochs=0.5, backend="ray", time_scale=0.002, checkpoint_every=1.0,
        server_timeout=timeout, seed=seed, relay_log_bytes=log_bytes,
    )  # fmt: skip


class Chaos(Progress):
    """Injects one random fault at a time into a running :class:`~dana.ps.driver.RayRun`
    (``runner``), from its progress reports; ``forced``: kinds to inject first, in order
    (``only_forced``: and no other)."""

    def __init__(
        self, runner: Any, rng: random.Random, gap: float, forced: list[str], only_forced: bool
    ):
        super().__init__(enabled=False)
        self.runner, self.rng, self.gap, self.forced = runner, rng, gap, list(forced)
        self.only_forced = only_forced
        self.timeout = runner.config.server_timeout
        self.next_at = time.time() + gap
        self.done: list[str] = []
        self.paused: list[int] = []
        self.kills = [0] * runner.k  # per worker
        self.stopped: int | None = None  # the worker stopped for good (one an episode)

    def update(self, steps: int, loss: float) -> None:
        shards = self.runner.shards
        if time.time() < self.next_at or steps > self.runner.end - 16:
            return
        if self.only_forced and not self.forced:
            return
        kind = self.forced[0] if self.forced else self.rng.choice(KINDS)
        if shards.standby is None and kind not in ("worker", "shard", "worker-stop"):
            return  # (shard 0 and the standby only while a standby is in place)
        if self.forced:
            self.forced.pop(0)
        import ray

        if kind == "worker":  # (each within its restarts: a worker out of them is gone)
            able = [
                i
                for i, n in enumerate(self.kills)
                if n < WORKER_RESTARTS // 2 and i != self.stopped
            ]
            if not able:
                return
            i = self.rng.choice(able)
            self.kills[i] += 1
            ray.kill(self.runner.worker_actors[i], no_restart=False)
        elif kind == "worker-stop":  # (its watch's question is answered on a side thread)
            if self.stopped is not None:
                return
            i = self.rng.randrange(self.runner.k)
            actor = self.runner.worker_actors[i].__ray_call__.options(concurrency_group=WATCH)
            try:
                pid = ray.get(actor.remote(lambda self: os.getpid()), timeout=5)
            except ray.exceptions.RayError:
                return  # (restarting: another time)
            os.kill(pid, signal.SIGSTOP)
            self.paused.append(pid)
            self.stopped = i
        elif kind == "shard":
            ray.kill(shards.servers[1], no_restart=True)
        elif kind == "head":
            ray.kill(shards.servers[0], no_restart=True)
        elif kind == "standby":
            ray.kill(shards.standby, no_restart=True)
        else:
            actor = self.rng.choice([shards.servers[0], shards.servers[1], shards.standby])
            try:
                pid = ray.get(actor.__ray_call__.remote(lambda self: os.getpid()), timeout=5)
            except ray.exceptions.RayError:
                return  # (busy or gone: another time)
            os.kill(pid, signal.SIGSTOP)
            self.paused.append(pid)
            if kind == "pause-short":
                threading.Timer(self.timeout / 3, _continue, (pid,)).start()
        self.done.append(kind)
        wait = self.timeout + 2 if kind in ("pause-long", "worker-stop") else 1.0
        self.next_at = time.time() + wait + self.rng.expovariate(1 / self.gap)


def _continue(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGCONT)
    except OSError:
        pass


def in_process(out: Path, seed: int, args: argparse.Namespace, forced: list[str]) -> dict:
    """One episode in this process; what happened."""
    from dana.errors import DanaError, FaultError
    from dana.ps.driver import RayRun

    values = settings(seed, args.epochs, args.timeout, args.relay_log_bytes)
    config = TrainConfig(**values).validate()
    run = RunDir(out)
    run.path.mkdir(parents=True)
    run.write_config(config.to_dict(), "chaos")
    runner = RayRun(config, run, Problem(config))
    chaos = Chaos(runner, random.Random(seed), args.gap, forced, only_forced=args.smoke)
    try:
        summary = runner.execute(chaos)
    except DanaError as e:
        if "could not start or join" in str(e):  # (the machine, not a fault)
            return {"faults": [], "problems": [], "skipped": str(e), "lost": 0, "doubled": 0}
        return {"faults": chaos.done, "problems": [str(e)], "lost": 0, "doubled": 0}
    except FaultError as e:  # (not expected: one fault at a time is survivable)
        return {"faults": chaos.done, "problems": [f"not survived: {e}"], "lost": 0, "doubled": 0}
    finally:
        for pid in chaos.paused:
            _continue(pid)
    run.write_summary(summary)
    result = account(out, summary, runner.end, chaos.done, config)
    if chaos.forced:  # (the run ended first: the smoke run checked less than it says)
        result["problems"].append(f"faults not injected before the run's end: {chaos.forced}")
    if chaos.stopped is not None and chaos.stopped not in runner.calls.lost:
        result["problems"].append(f"worker {chaos.stopped}, stopped for good, was not dropped")
    return result


def account(out: Path, summary: dict, pushes: int, faults: list[str], config) -> dict:
    dist = json.loads((out / "dist.json").read_text())
    problems = check_run(dist, summary, pushes)
    rows = RunDir(out).read_metrics()
    expected = [float(e) for e in range(int(config.epochs) + 1)]
    if [r["epoch"] for r in rows] != expected:
        problems.append(f"metrics rows at epochs {[r['epoch'] for r in rows]}, not {expected}")
    if dist["log_spilled_calls"] == 0:
        problems.append(f"shard 0's relay log spilled nothing (bound {config.relay_log_bytes})")
    lost, doubled = lost_and_doubled(dist)
    spilled = dist["log_spilled_calls"], dist["log_peak_spilled_bytes"]
    return {
        "faults": faults, "problems": problems, "lost": lost, "doubled": doubled,
        "spilled": spilled,
    }  # fmt: skip


def flags(values: dict[str, Any]) -> list[str]:
    return [f"--{k.replace('_', '-')}={v}" for k, v in values.items()]


def driver_killed(out: Path, seed: int, args: argparse.Namespace) -> dict:
    """One episode as ``dana train`` processes: SIGKILL once checkpointed, the Ray
    processes reaped, ``--resume`` to the end."""
    values = settings(seed, args.epochs, args.timeout, args.relay_log_bytes)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "dana.cli", "train"]
    proc = subprocess.Popen(
        [*command, *flags(values), "--quiet", "--out", str(out)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    deadline = time.time() + 600
    while not (out / "checkpoint.pt").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(random.Random(seed).uniform(0, 2))
    ray_processes = ray_descendants(proc.pid, -1)
    proc.kill()
    proc.wait()
    killed_at = time.time()
    while any(_alive(pid) for pid in ray_processes) and time.time() - killed_at < 30:
        time.sleep(0.1)
    reaped = time.time() - killed_at
    left = [pid for pid in ray_processes if _alive(pid)]
    resumed = subprocess.run(
        [*command, "--resume", str(out), "--quiet"], env=env, capture_output=True, text=True
    )
    if resumed.returncode != 0:
        problems = [f"--resume exited {resumed.returncode}: {resumed.stderr[-300:]}"]
        return {"faults": ["driver"], "problems": problems, "lost": 0, "doubled": 0}
    summary = json.loads((out / "summary.json").read_text())
    pushes = round(args.epochs * (1024 // 32))
    result = account(out, summary, pushes, ["driver"], TrainConfig(**values))
    if left:
        result["problems"].append(f"{len(left)} Ray processes left 30 s after the driver's kill")
    result["reaped_seconds"] = reaped
    return result


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--smoke", action="store_true", help="one short episode")
    parser.add_argument("--epochs", type=float, default=8.0, help="per episode")
    parser.add_argument("--timeout", type=float, default=4.0, help="--server-timeout")
    parser.add_argument("--gap", type=float, default=4.0, help="mean seconds between faults")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--relay-log-bytes", type=int, default=RELAY_LOG_BYTES, help="shard 0's log bound"
    )
    args = parser.parse_args()
    if args.smoke:
        args.epochs, args.timeout, args.gap = 6.0, 3.0, 0.5
    tally: Counter[str] = Counter()
    survived: Counter[str] = Counter()
    lost = doubled = episodes = failed = 0
    reaped: list[float] = []
    spilled_calls = spilled_peak = 0
    started = time.time()
    with TemporaryDirectory(prefix="dana-chaos-") as tmp:
        while episodes == 0 or (not args.smoke and time.time() - started < 60 * args.minutes):
            seed = args.seed + episodes
            out = Path(tmp) / f"episode{episodes}"
            if not args.smoke and episodes % 3 == 1:
                result = driver_killed(out, seed, args)
            else:
                forced = SMOKE_FAULTS if args.smoke else []
                result = in_process(out, seed, args, forced)
            episodes += 1
            tally.update(result["faults"])
            if result["problems"] or (args.smoke and "skipped" in result):
                failed += 1  # (a smoke run that ran nothing checked nothing)
            else:
                survived.update(result["faults"])
            lost, doubled = lost + result["lost"], doubled + result["doubled"]
            reaped += [result["reaped_seconds"]] if "reaped_seconds" in result else []
            calls, peak = result.get("spilled", (0, 0))
            spilled_calls, spilled_peak = spilled_calls + calls, max(spilled_peak, peak)
            outcome = result.get("skipped") or result["problems"] or "ok"
            print(f"episode {episodes}: faults {result['faults']}, {outcome}", flush=True)
    minutes = (time.time() - started) / 60
    print(f"\n{episodes} episodes ({failed} failed) in {minutes:.1f} min")
    print("| fault | injected | survived |\n|---|---|---|")
    for kind in (*KINDS, "driver"):
        print(f"| {kind} | {tally[kind]} | {survived[kind]} |")
    if reaped:
        print(f"driver killed: Ray processes gone {min(reaped):.1f} to {max(reaped):.1f} s later")
    print(
        f"relay log (bound {args.relay_log_bytes:,} bytes): {spilled_calls:,} calls spilled, "
        f"at most {spilled_peak / 2**20:.1f} MiB on disk at once"
    )
    total, ok = sum(tally.values()), sum(survived.values())
    print(f"chaos soak: {total} faults, {ok} survived, lost {lost}, doubled {doubled}")
    return 0 if failed == 0 and lost == doubled == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
