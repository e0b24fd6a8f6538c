"""What the Ray runtime's tests share: an actor handle stand-in for the units without Ray
(:class:`Direct`), a progress reporter that kills workers and shards as a run goes on
(:class:`Faults`, :func:`run_with_faults`) and the check that every push was applied once
on every shard (:func:`check_every_shard`)."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
from pathlib import Path
from typing import Any, TypeVar

from conftest import command, descendants, run_on_ray

from dana.ps.accounting import check_run, servers
from dana.train.config import TrainConfig
from dana.train.records.progress import Progress

try:
    import ray
except ImportError:  # the units still run
    ray = None


class Direct:
    """An actor handle stand-in: ``handle.method.remote(...)`` calls ``target.method``."""

    def __init__(self, target: Any):
        self.target = target

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.target, name)
        return type("Method", (), {"remote": staticmethod(method)})


class Faults(Progress):
    """Runs ``actions`` (``(steps, what)``, ``what``: ``"worker:i"``, ``"shard:s"`` (shard 0:
    the head of the moment), ``"standby:0"`` or ``"both:0"`` (the head and its standby)) once
    the run has passed ``steps``; a shard or standby is killed for good, a worker restarts. A
    fault on shard 0 waits for a standby in place, and the workers are stopped (SIGSTOP) while
    it waits, so that a slow rebuild on a loaded machine cannot let the run end first. Records
    the sockets Ray's processes listen on, and its actors' nice values, at the first update."""

    def __init__(self, runner: Any, actions: list[tuple[int, str]]):
        super().__init__(enabled=False)
        self.runner, self.actions, self.done = runner, sorted(actions), []
        self.sockets: list[tuple[str, int, int]] | None = None
        self.actor_nice: dict[str, int] = {}
        self.held: list[int] = []  # the workers' processes stopped meanwhile

    def update(self, steps: int, loss: float) -> None:
        if self.sockets is None:
            processes = descendants(os.getpid())
            self.sockets = listening(processes)
            for pid in processes:
                name = command(pid)
                if name.startswith(("ray::ShardServer", "ray::HeadServer", "ray::Worker")):
                    self.actor_nice[f"{name.split()[0]} {pid}"] = os.getpriority(
                        os.PRIO_PROCESS, pid
                    )
        while self.actions and steps >= self.actions[0][0]:
            kind, index = self.actions[0][1].split(":")
            if (
                kind in ("shard", "standby", "both")
                and index == "0"
                and self.runner.shards.standby is None
            ):
                self._hold_workers()
                break  # a head (or standby) lost again only once a new standby is in place
            self._release_workers()
            at, what = self.actions.pop(0)
            if kind == "worker":
                ray.kill(self.runner.worker_actors[int(index)], no_restart=False)
            elif kind == "standby":
                ray.kill(self.runner.shards.standby, no_restart=True)
            elif kind == "both":  # shard 0 and its standby at once
                ray.kill(self.runner.shards.standby, no_restart=True)
                ray.kill(self.runner.shards.servers[0], no_restart=True)
            else:
                ray.kill(self.runner.shards.servers[int(index)], no_restart=True)
            self.done.append((steps, what))
            if what == "shard:0":
                break  # (the driver notices, and starts a new standby, before the next)

    def _hold_workers(self) -> None:
        if not self.held:
            for pid in descendants(os.getpid()):
                if command(pid).startswith("ray::Worker"):
                    os.kill(pid, signal.SIGSTOP)
                    self.held.append(pid)

    def _release_workers(self) -> None:
        for pid in self.held:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        self.held = []


F = TypeVar("F", bound=Faults)


def run_with_faults(
    config: TrainConfig, out: Path, actions: list[tuple[int, str]], kind: type[F] = Faults
) -> tuple[Any, F]:
    """Train ``config`` into ``out`` on the session's Ray with ``kind(runner, actions)``
    (:class:`Faults`, or a kind of it) as the progress reporter: the runner and it."""
    made: list[F] = []

    def faults_for(runner: Any) -> F:
        made.append(kind(runner, actions))
        return made[-1]

    runner = run_on_ray(config, out, faults_for)
    return runner, made[0]


def check_every_shard(runner: Any, steps: int, resent: bool = False) -> dict[str, Any]:
    """Every push applied exactly once on every shard (and on shard 0's standby):
    :func:`~dana.ps.accounting.check_run` (per worker, the pushes applied equal its last
    seq, the same on every shard; no gap; no relayed call missed; the totals match);
    besides, no repeat (``resent``: pushes sent again to a promoted standby are answered
    duplicate, not applied), every push an update, each push once in the merged log."""
    dist = json.loads((runner.run.path / "dist.json").read_text())
    problems = check_run(dist, runner.summary, steps)
    assert not problems, problems
    first = dist["shards"][0]
    for s, shard in enumerate(servers(dist)):
        assert resent or shard["duplicates"] == 0, f"shard {s}"
        assert shard["updates"] == steps, f"shard {s}"
    # (a lost head's count of the pushes it refused after the end is lost with it: then
    # the workers' count of "stop" replies stands in)
    refused = first["rejected_after_stop"]
    if resent:
        refused = max(refused, dist["worker_replies"].get("stopped", 0))
    assert dist["pushes_sent"] <= sum(first["last_seq"]) + refused
    assert len(runner.merger.log) == steps
    assert runner.rows[-1]["test_loss"] < 0.75 * runner.rows[0]["test_loss"]
    return dist


def listening(pids: set[int]) -> list[tuple[str, int, int]]:
    """(address, port, pid) of every TCP socket in LISTEN state the processes hold."""
    inodes: dict[str, int] = {}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes[target[8:-1]] = pid
    found = []
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                continue
            hexaddr, port = fields[1].split(":")
            raw = bytes.fromhex(hexaddr)
            # /proc prints each 32-bit word in host (little-endian) order
            raw = b"".join(struct.pack("<I", w) for w in struct.unpack(f">{len(raw) // 4}I", raw))
            found.append((socket.inet_ntop(family, raw), int(port, 16), inodes[fields[9]]))
    return found
