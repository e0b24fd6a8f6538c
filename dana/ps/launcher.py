"""``dana train --backend ray``: the driver of a run on Ray.

:class:`RayRun` is a runner (:class:`dana.train.runners.Runner`: ``rows``,
``load_state_dict``, ``execute(progress) -> summary``) and writes the same run directory
as the simulator's: ``metrics.csv`` rows at the same points of the data stream
(:func:`dana.train.metrics.metrics_row`), the same ``summary.json`` keys
(:func:`dana.train.metrics.summarize`), checkpoints for ``--resume``; and also
``step_times.csv`` (every push's step time, for the simulator's ``trace`` timing) and
``dist.json`` (the runtime's counters).

The driver starts ``S`` :class:`~dana.ps.server.ShardServer` actors (the parameters
split into contiguous shards) and ``k`` :class:`~dana.ps.worker.Worker` actors; the
workers talk to the servers directly, and the driver only watches:

- asynchronous algorithms: each worker runs its loop until the servers, having applied
  the run's last step, answer ``stop``; a worker whose process dies is restarted by Ray
  and its loop started again (it rejoins with a fresh pull);
- ``ssgd`` (``Algorithm.synchronous``): real rounds: the driver starts one step on every
  worker and waits for all ``k`` pushes before the next round (a crashed worker is
  restarted and redoes its step; a push already applied is not applied twice).

Shard 0 (the head) relays every call to a standby replica of itself (waiting for it)
and to the other shards, so that a push is applied on all of them or on none and all
shards count alike; it keeps the calls it relayed, and a lost shard ``s >= 1`` or
standby is rebuilt from its latest snapshot (which the driver keeps) and those calls; a
lost head is replaced by its standby, promoted (:mod:`dana.ps.recovery`). Losing the
head and its standby at once raises :class:`~dana.errors.FaultError` (exit status 4:
``--resume``), and so does losing the head of a run without a standby
(``--no-standby``: ``config.standby`` false; its pushes cost less). A server lost
while the run starts (before the first push) is handled the same way
(:meth:`RayRun._lost_at_start`); an actor whose constructor raised is bad input.

``--max-staleness s`` (asynchronous algorithms; ``ssgd`` ignores it, as in the
simulator): shard 0 keeps the floor's start and push gates
(:mod:`dana.train.gate`, on its clock) and answers what they refuse with "wait". The summary's
``wait_time`` is the seconds workers spent waiting, summed over workers.

Every ``POLL_SECONDS`` (and after every ``ssgd`` round) the driver drains the servers'
logs and snapshots, evaluates each evaluation snapshot itself (the servers go on
meanwhile) and writes each checkpoint snapshot to ``checkpoint.pt``. Times in the log
(the ``sim_time`` column) are seconds of training, counted from when every worker was
ready (and carried over a resume).
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections import Counter
from typing import Any

import numpy as np
import torch

from dana.algorithms.base import Algorithm
from dana.atomic import write_text_atomic
from dana.errors import ConfigError, DanaError, FaultError
from dana.ps.checkpoint import build_state, check_state, to_numpy
from dana.ps.cluster import (
    WORKER_RESTARTS,
    import_ray,
    placement,
    ray_session,
    server_options,
    worker_gpus,
    worker_options,
)
from dana.ps.layout import Layout
from dana.ps.log import LogMerger
from dana.ps.server import ShardServer
from dana.ps.worker import Worker
from dana.train.config import TrainConfig
from dana.train.gate import bounds_staleness
from dana.train.metrics import Position, divergence_row, metrics_row, summarize
from dana.train.problem import Problem
from dana.train.progress import Progress
from dana.train.rundir import RunDir
from dana.train.runner import stop_points
from dana.train.timing import write_trace

#: Seconds between two looks of the driver at the servers.
POLL_SECONDS = 0.2

#: Seconds the actors have to start (build their problem) before the run gives up.
READY_SECONDS = 300.0


def _lost(ray: Any) -> tuple[type, ...]:
    """The errors that mean an actor (or the node holding its reply) is gone: its death,
    and the loss of an object it owned or stored (``OwnerDiedError``,
    ``ObjectReconstructionFailedError``: a lost node's replies)."""
    return (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError)


class RayRun:
    """One training run on Ray writing to one run directory."""

    def __init__(
        self,
        config: TrainConfig,
        run: RunDir,
        problem: Problem,
        algorithm: Algorithm | None = None,
    ):
        self.config, self.run, self.problem = config, run, problem
        # Built once (by train(), or here from the config): the actors get this object.
        self.algorithm = algorithm = (
            algorithm if algorithm is not None else config.build_algorithm()
        )
        self.k, self.S = config.workers, config.servers
        self.d = problem.flat.d
        if self.S > self.d:
            raise ConfigError(f"--servers {self.S} is more than the model's {self.d} parameters")
        self.batches_per_epoch = problem.dataset.train_size // config.batch_size
        self.synchronous = algorithm.synchronous
        # Bounded staleness (ssgd ignores it): shard 0 gates. Shard 0 relays every call to
        # its standby and the other shards, so a push is applied on all or on none.
        self.bounded = bounds_staleness(config.max_staleness, self.synchronous)
        self.relay = True
        self.with_standby = config.standby  # False: --no-standby
        self.standby: Any = None  # shard 0's standby (dana.ps.recovery)
        self.coming: tuple[Any, Any, float, dict[str, Any] | None] | None = None  # starting
        self.standbys = 0  # standbys built so far (their names' numbers)
        self.promotions: list[dict[str, Any]] = []  # one record per lost head
        self.standbys_rebuilt: list[dict[str, Any]] = []
        self.wait_time, self.waits = 0.0, 0
        self.rows: list[dict[str, float]] = []
        self.logged = 0  # pushes already summarised in a metrics row
        self.wall_before = 0.0  # training seconds before a resume
        self.diverged_at: int | None = None
        self.merger = LogMerger(self.S)
        self.saved_servers: list[dict[str, Any]] | None = None
        self.buffers: dict[str, np.ndarray] | None = None
        self.steps = self.updates = self.pushes = 0
        self.sim_time = 0.0
        self.failed_calls = [0] * self.k  # run() calls cut short by a worker's crash
        self.lost: list[int] = []  # workers out of restarts
        self.last_seq_sent = [0] * self.k  # from the workers' last completed run() calls
        self.worker_counts: Counter[str] = Counter()
        self.counters: dict[str, Any] = {}
        self.cpus = 1.0  # logical CPUs per actor (fewer when the cluster is short)
        self.placement: dict[str, dict[str, str]] = {}  # actor -> its node
        self.recovery: list[dict[str, Any] | None] = [None] * self.S  # latest snapshots
        self.rebuilt: list[dict[str, Any]] = []  # one record per shard rebuilt
        self.last_point = [-1] * self.S  # the last evaluation/checkpoint point received
        self.servers: list[Any] = []  # the actors, while the run executes
        self.workers: list[Any] = []
        self.snapshots: list[list[dict[str, Any]]] = [[] for _ in range(self.S)]
        self.checked = 0  # merged log entries checked for a non-finite loss
        self.diverged_index: int | None = None  # the first such entry
        self.diverged_steps = 0
        self.final_params: torch.Tensor | None = None

    @property
    def epoch(self) -> float:
        return self.steps / self.batches_per_epoch

    # -- state --------------------------------------------------------------------------
    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_state(state, self.S)
        self.saved_servers = to_numpy(state["servers"])
        self.merger.load_state_dict(state["log"])
        self.rows = [dict(r) for r in state["rows"]]
        self.logged = int(state["logged"])
        self.wall_before = float(state["wall_seconds"])
        self.buffers = to_numpy(state["buffers"]) or None
        first = self.saved_servers[0]
        self.steps, self.updates = int(first["steps"]), int(first["updates"])
        self.pushes = int(first["pushes"])
        self.checked = len(self.merger)

    # -- the run ------------------------------------------------------------------------
    def execute(self, progress: Progress) -> dict[str, Any]:
        points, evals, checkpoints = stop_points(self.config, self.batches_per_epoch)
        fresh = self.saved_servers is None
        self.pending = [p for p in points if p > self.steps or fresh]
        self.evals, self.checkpoints = evals, checkpoints
        self.end = points[-1]
        startup = time.time()
        with ray_session(self.config.address, self.actors):
            ray = import_ray()
            try:
                servers, workers = self._start_actors(ray)
                self.start = time.time()
                self._begin(ray)
                progress.start(self.end, self.steps)
                if self.synchronous:
                    self._run_rounds(ray, servers, workers, progress)
                else:
                    self._run_free(ray, servers, workers, progress)
                self._stop(ray, servers)
                self._settle(ray)
                self._poll(ray, servers)
                self.merger.finish()
                self._process_points(ray, servers, progress)
                self.counters = self._counters(ray, servers, self.start - startup)
            finally:
                progress.close()
                coming = [self.coming[0]] if self.coming is not None else []
                for actor in self.workers + self.servers + [self.standby, *coming]:
                    if actor is not None:
                        ray.kill(actor, no_restart=True)
        wall = self._wall()
        if self.diverged_at is not None:
            self.rows.append(self._divergence_row(wall))
            self.run.write_metrics(self.rows)
        write_trace(
            self.run.step_times,
            list(zip(self.merger.log.worker.tolist(), self.merger.durations.tolist())),
        )
        write_text_atomic(self.run.path / "dist.json", json.dumps(self.counters, indent=2) + "\n")
        end = Position(self.epoch, self.updates, self.pushes, self.sim_time)
        return summarize(
            self.config,
            self.rows,
            self.merger.log.numpy(),
            self.diverged_at,
            wall,
            end,
            self.wait_time,
        )

    @property
    def actors(self) -> int:
        """The run's actors: ``k`` workers, ``S`` shards and shard 0's standby (if any)."""
        return self.k + self.S + int(self.with_standby)

    def _wall(self) -> float:
        return self.wall_before + time.time() - self.start

    def _start_actors(self, ray: Any) -> tuple[list[Any], list[Any]]:
        config = self.config.to_dict()
        layout = Layout(self.d, self.S, self.config.seed)
        initial = self.problem.initial_params().cpu().numpy()
        self.prefix = f"dana-{uuid.uuid4().hex[:12]}"
        self.names = names = [f"{self.prefix}-shard{s}" for s in range(self.S)]
        checkpoints = sorted(self.checkpoints)
        self.cpus = cpus = placement(ray, self.actors)
        # What a shard is built from: again when a lost one is rebuilt (dana.ps.recovery)
        self.server_args = [
            (
                (config, s, initial[lo:hi]),
                dict(
                    d=self.d,
                    batches_per_epoch=self.batches_per_epoch,
                    end=None if self.synchronous else self.end,
                    evals=sorted(self.evals),
                    checkpoints=checkpoints,
                    state=None if self.saved_servers is None else self.saved_servers[s],
                    algorithm=self.algorithm,
                ),
            )
            for s, (lo, hi) in enumerate(layout.bounds)
        ]
        # Shard 0 orders the run and keeps the log to rebuild the others: on the driver's
        # node, whose loss would end the run anyway.
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
        self.servers = servers = [
            ray.remote(ShardServer)
            .options(
                name=names[s],
                **{**server_options(cpus), **({"scheduling_strategy": here} if s == 0 else {})},
            )
            .remote(
                *args,
                **kwargs,
                peers=names[1:] if s == 0 and self.S > 1 else None,
                replicated=s == 0 and self.with_standby,
            )
            for s, (args, kwargs) in enumerate(self.server_args)
        ]
        self.standby = self._new_standby(ray, None) if self.with_standby else None
        # A user's problem (dana.fit) goes to the workers once, through the object store;
        # its reference is held here for the run, so that a restarted worker finds it too
        # (Ray warns that restarts need the arguments in the object store: they are).
        spec = getattr(self.problem, "spec", None)
        self.spec_ref = None if spec is None else ray.put(spec)
        gpus = worker_gpus(ray, self.config.device, self.k)
        worker_cls = ray.remote(Worker).options(**worker_options(cpus, gpus))
        self.workers = workers = [
            worker_cls.remote(config, i, names, self.d, self.spec_ref, self.algorithm)
            for i in range(self.k)
        ]
        ready = {f"shard{s}": server.ready.remote() for s, server in enumerate(servers)}
        if self.standby is not None:
            ready["standby"] = self.standby.ready.remote()
        deadline = time.time() + READY_SECONDS
        # The servers first: a worker looks for shard 0 (or its standby) as it starts.
        self._lost_at_start(ray, self._ready(ray, ready, deadline))
        self._ready(ray, {f"worker{i}": w.ready.remote() for i, w in enumerate(workers)}, deadline)
        if self.standby is not None:
            try:
                ray.get(servers[0].attach_standby.remote(self.standby))
            except _lost(ray):  # (the head's error, or the standby's it passed on)
                gone = [n for n in ("shard0", "standby") if not self._alive(ray, n)]
                self._lost_at_start(ray, gone)
        return servers, workers

    def _ready(self, ray: Any, ready: dict[str, Any], deadline: float) -> list[str]:
        """Wait for the actors' ``ready`` replies (by name) and note where each started;
        the servers lost as they started (killed, their process or node lost). DanaError
        if one's constructor raised, a worker was lost, or they are not all up by
        ``deadline``."""
        done, _ = ray.wait(
            list(ready.values()), num_returns=len(ready), timeout=max(0.0, deadline - time.time())
        )
        if len(done) < len(ready):
            raise DanaError(
                f"the run's {self.actors} Ray actors ({self.S} server shards"
                f"{' and a standby' if self.with_standby else ''}, {self.k} workers, "
                f"{self.cpus:.3g} CPU each) did not all start within {READY_SECONDS:g} s; "
                f"the cluster has {ray.available_resources()} free of "
                f"{ray.cluster_resources()}: free CPUs (other jobs may hold them) or use "
                "fewer --workers"
            )
        lost = []
        for name, ref in ready.items():
            try:
                self.placement[name] = ray.get(ref)
            except ray.exceptions.RayActorError as e:
                if name.startswith("worker") or e.actor_init_failed:  # (its __init__ raised)
                    raise DanaError(f"the Ray actors could not start: {e}") from None
                lost.append(name)
            except ray.exceptions.RayError as e:
                raise DanaError(f"the Ray actors could not start: {e}") from None
        return lost

    def _begin(self, ray: Any) -> None:
        """Start every server's clock (training time counts from ``self.start``); a server
        lost meanwhile is handled as at the start (:meth:`_lost_at_start`), and the others
        are started again (a second ``begin`` changes nothing)."""
        while True:
            actors = {f"shard{s}": server for s, server in enumerate(self.servers)}
            if self.standby is not None:
                actors["standby"] = self.standby
            refs = {
                name: a.begin.remote(self.start - self.wall_before) for name, a in actors.items()
            }
            lost: list[str] = []
            for name, ref in refs.items():
                try:
                    ray.get(ref)
                except _lost(ray):
                    lost.append(name)
                except ray.exceptions.RayTaskError:  # (the head found a lost shard's name gone)
                    dead = [n for n in actors if n not in lost and not self._alive(ray, n)]
                    if not dead:
                        raise
                    lost += dead
            if not lost:
                return
            self._lost_at_start(ray, lost)

    def _alive(self, ray: Any, name: str) -> bool:
        """Whether server ``name`` (``shardS``, ``standby``) answers."""
        actor = self.standby if name == "standby" else self.servers[int(name[5:])]
        try:
            ray.get(actor.ready.remote(), timeout=READY_SECONDS)
            return True
        except (*_lost(ray), ray.exceptions.GetTimeoutError):
            return False

    def _lost_at_start(self, ray: Any, lost: list[str]) -> None:
        """Servers lost while the run started (before any worker's call): a lost shard 0
        is replaced by its standby as at any other time (:meth:`_promote`: it has run the
        same nothing), a lost standby rebuilt; without a standby, or with another shard
        lost, the run cannot go on (exit status 4)."""
        for name in lost:
            self.placement.pop(name, None)
        others = [name for name in lost if name not in ("shard0", "standby")]
        if others:
            self._unsurvivable(
                f"parameter-server shard {others[0][5:]} was lost while the run started"
            )
        if "shard0" in lost:
            if not self.with_standby:
                self._unsurvivable(
                    "shard 0 was lost while the run started, and this run has no standby "
                    "(--no-standby)"
                )
            if "standby" in lost:
                self._unsurvivable("shard 0 and its standby were both lost while the run started")
            where = self.placement.pop("standby", None)
            self._promote(ray)
            if where is not None:
                self.placement["shard0"] = where
        elif "standby" in lost:
            self.placement.pop("standby", None)
            self._replace_standby(ray)

    def _run_free(
        self, ray: Any, servers: list[Any], workers: list[Any], progress: Progress
    ) -> None:
        """Asynchronous algorithms: every worker loops until the servers say stop."""
        running = {w.run.remote(): i for i, w in enumerate(workers)}
        while running:
            done, _ = ray.wait(list(running), num_returns=len(running), timeout=POLL_SECONDS)
            for ref in done:
                i = running.pop(ref)
                if self._finished(ray, ref, i) is False and self.diverged_at is None:
                    running[workers[i].run.remote()] = i
            self._poll(ray, servers)
            self._process_points(ray, servers, progress)
            if self.diverged_at is not None:
                self._stop(ray, servers)
            self._show(progress)
        if self.steps < self.end and self.diverged_at is None:
            raise DanaError(
                f"every worker died for good after {self.steps} of {self.end} steps; "
                f"continue from the last checkpoint with `dana train --resume {self.run.path}`"
            )

    def _run_rounds(
        self, ray: Any, servers: list[Any], workers: list[Any], progress: Progress
    ) -> None:
        """``ssgd``: one step on every worker per round; the next round starts when all
        ``k`` pushes are in (the master has then moved once)."""
        round_index = self.steps // self.k
        while self.steps < self.end and self.diverged_at is None:
            running = {w.run.remote(round_index): i for i, w in enumerate(workers)}
            while running:
                done, _ = ray.wait(list(running), num_returns=len(running), timeout=POLL_SECONDS)
                if not done:  # (a lost head is noticed here, and its standby promoted)
                    self._poll(ray, servers)
                for ref in done:
                    i = running.pop(ref)
                    if self._finished(ray, ref, i) is False:
                        running[workers[i].run.remote(round_index)] = i
            round_index += 1
            self._poll(ray, servers)
            self._process_points(ray, servers, progress)
            self._show(progress)

    def _finished(self, ray: Any, ref: Any, i: int) -> bool | None:
        """Account for a worker's ``run`` call: True if it returned, False if its process
        died and Ray restarts it (call it again), None if it is gone for good."""
        try:
            result = ray.get(ref)
            self.last_seq_sent[i] = result.pop("seq")
            self.worker_counts.update(result)
            return True
        except ray.exceptions.ActorDiedError:  # out of restarts
            if self.synchronous:
                raise DanaError(
                    f"worker {i} died and cannot be restarted (max_restarts "
                    f"{WORKER_RESTARTS}); ssgd cannot go on without it. Continue from the "
                    f"last checkpoint with `dana train --resume {self.run.path}`"
                ) from None
            self.lost.append(i)
            if self.bounded:  # its records must not hold the others
                for server in (self.servers[0], self.standby):
                    if server is not None:
                        server.forget.remote(i)
            return None
        except _lost(ray):  # restarted, or restarting (its node lost): call it again
            self.failed_calls[i] += 1
            time.sleep(0.05)
            return False

    # -- what the servers report --------------------------------------------------------
    def _stop(self, ray: Any, servers: list[Any]) -> None:
        """Stop every shard (the head stops its standby and the others after what it
        relayed; a lost head's standby is promoted and stopped)."""
        while True:
            try:
                refs = ray.get(self.servers[0].stop.remote())
                break
            except _lost(ray):
                self._promote(ray)
        for ref in refs:
            try:
                ray.get(ref)
            except _lost(ray):  # the stop is in the log: replayed to whoever lacks it
                self._call_all(ray, "ready")  # rebuilds or promotes what was lost

    def _settle(self, ray: Any, timeout: float = READY_SECONDS) -> None:
        """Wait until the standby and every shard have run every call the head relayed to
        them (a rebuilt one runs the replayed ones first), so that the last poll has
        everything."""
        deadline = time.time() + timeout
        while True:
            count = self._relay_counters(ray)["relayed_calls"]
            shards = self._call_all(ray, "counters")[1:]
            if self.standby is not None:  # (one still starting is not waited for)
                shards.append(self._ask_standby(ray, "counters"))
            if all(c is not None and c["calls"] == count for c in shards):
                return
            if time.time() > deadline:
                ran = [None if c is None else c["calls"] for c in shards]
                raise FaultError(
                    f"the server shards did not all run the {count} calls shard 0 relayed "
                    f"within {timeout:g} s (shards 1.., then the standby, ran {ran}); "
                    "continue from the last checkpoint with "
                    f"`dana train --resume {self.run.path}`"
                )
            time.sleep(POLL_SECONDS / 4)

    def _relay_counters(self, ray: Any) -> dict[str, int]:
        while True:
            try:
                return ray.get(self.servers[0].relay_counters.remote())
            except _lost(ray):
                self._promote(ray)

    def _call_all(self, ray: Any, method: str) -> list[Any]:
        """Every shard's reply to ``method`` (None from a shard just rebuilt, whose replayed
        calls may not have run yet, or from a head just replaced by its standby); a lost
        shard ``s >= 1`` is rebuilt, a lost head replaced (:meth:`_promote`)."""
        refs = [getattr(server, method).remote() for server in self.servers]
        replies: list[Any] = []
        for s, ref in enumerate(refs):
            try:
                replies.append(ray.get(ref))
            except _lost(ray):
                if s == 0:
                    self._promote(ray)
                else:
                    self._rebuild(ray, s)
                replies.append(None)
        return replies

    def _ask_standby(self, ray: Any, method: str) -> Any:
        """The standby's reply to ``method``; None if there is none (a new one is on its
        way: attached here once it has started) or it was lost (a new one is started)."""
        if self.standby is None:
            self._attach_coming(ray)
            return None
        try:
            return ray.get(getattr(self.standby, method).remote())
        except _lost(ray):
            self._replace_standby(ray)
            return None

    def _promote(self, ray: Any) -> None:
        """The head (shard 0) was lost: its standby, which has run every call the head
        passed on, becomes the head; then a new standby is built (:mod:`dana.ps.recovery`)."""
        started = time.time()
        lost, standby = self.servers[0], self.standby
        ray.kill(lost, no_restart=True)  # (a lost reply need not mean a dead actor)
        if not self.with_standby:
            self._unsurvivable("shard 0 was lost, and this run has no standby (--no-standby)")
        if standby is None:
            self._unsurvivable("shard 0 was lost while its standby was being rebuilt")
        try:
            sent = ray.get(standby.promote.remote(self.servers[1:]), timeout=READY_SECONDS)
        except (*_lost(ray), ray.exceptions.GetTimeoutError):
            self._unsurvivable("shard 0 and its standby were both lost")
        self.servers[0], self.standby = standby, None
        self.promotions.append(
            {"steps": self.steps, "resent_calls": sent, "seconds": time.time() - started}
        )
        self._replace_standby(ray)

    def _unsurvivable(self, what: str) -> None:
        where = (
            "continue from the last checkpoint with"
            if self.run.checkpoint.exists()
            else "it has no checkpoint yet: start it again from the beginning with"
        )
        raise FaultError(
            f"{what}: the run cannot go on; {where} `dana train --resume {self.run.path}`"
        ) from None

    def _new_standby(self, ray: Any, saved: dict[str, Any] | None) -> Any:
        """A standby actor of shard 0, from its latest snapshot ``saved`` (None: from
        shard 0's starting arguments)."""
        args, kwargs = self.server_args[0]
        self.standbys += 1
        return (
            ray.remote(ShardServer)
            .options(name=f"{self.names[0]}-{self.standbys}", **server_options(self.cpus))
            .remote(
                *args,
                **kwargs,
                peers=self.names[1:] or None,
                standby=True,
                recovered=saved,
            )
        )

    def _replace_standby(self, ray: Any) -> None:
        """Start a new standby (the last one was lost or promoted); the run goes on
        meanwhile, without one, and :meth:`_attach_coming` attaches it once it is up."""
        if self.standby is not None:
            ray.kill(self.standby, no_restart=True)
        self.standby = None
        saved = self.recovery[0]
        actor = self._new_standby(ray, saved)
        self.coming = (actor, actor.ready.remote(), time.time(), saved)

    def _attach_coming(self, ray: Any) -> None:
        """Attach the standby under way to the head (which sends it its log) once it has
        started."""
        if self.coming is None:
            return
        actor, ready, started, saved = self.coming
        done, _ = ray.wait([ready], timeout=0)
        if not done:
            if time.time() - started > READY_SECONDS:
                self._unsurvivable(
                    f"shard 0's standby did not start within {READY_SECONDS:g} s (no room)"
                )
            return
        self.coming = None
        try:
            where = ray.get(ready)
        except ray.exceptions.RayError as e:
            self._unsurvivable(f"shard 0's standby could not be rebuilt ({e})")
        if saved is None:  # (built from the starting arguments: start its clock too)
            try:
                ray.get(actor.begin.remote(self.start - self.wall_before))
            except _lost(ray):  # (lost already: another one)
                ray.kill(actor, no_restart=True)
                self._replace_standby(ray)
                return
        try:
            covered = 0 if saved is None else saved["calls"]
            sent = ray.get(self.servers[0].attach_standby.remote(actor, covered))
        except _lost(ray):  # the head too, before its new standby had anything
            self._unsurvivable("shard 0 was lost while its standby was rebuilt")
        except ray.exceptions.RayTaskError as e:  # (a log trimmed too far: never expected)
            self._unsurvivable(f"shard 0's standby could not be rebuilt ({e})")
        self.standby = actor
        self.standbys_rebuilt.append(
            {
                "steps": self.steps,
                "snapshot_age": None if saved is None else started - saved["time"],
                "sent_calls": sent,
                "seconds": time.time() - started,
                "node": where,
            }
        )

    def _rebuild(self, ray: Any, s: int) -> None:
        """Rebuild lost shard ``s >= 1`` from its latest snapshot and the head's log of the
        calls since (:mod:`dana.ps.recovery`); the run goes on meanwhile."""
        started = time.time()
        saved = self.recovery[s]
        args, kwargs = self.server_args[s]
        name = f"{self.prefix}-shard{s}-rebuilt{len(self.rebuilt) + 1}"
        ray.kill(self.servers[s], no_restart=True)  # (a lost reply need not mean a dead actor)
        actor = (
            ray.remote(ShardServer)
            .options(name=name, **server_options(self.cpus))
            .remote(*args, **kwargs, recovered=saved)
        )
        covered = 0 if saved is None else saved["calls"]
        try:
            where = ray.get(actor.ready.remote(), timeout=READY_SECONDS)
        except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError) as e:
            self._unsurvivable(
                f"parameter-server shard {s} was lost and could not be rebuilt ({e})"
            )
        while True:
            try:
                replayed = ray.get(self.servers[0].rebind.remote(s, actor, covered))
                break
            except _lost(ray):
                self._promote(ray)  # (the new head relays to the old shard s: rebind again)
        self.servers[s] = actor
        self.rebuilt.append(
            {
                "shard": s,
                "steps": self.steps,
                "snapshot_age": None if saved is None else started - saved["time"],
                "replayed_calls": replayed,
                "seconds": time.time() - started,
                "node": where,
            }
        )

    def _poll(self, ray: Any, servers: list[Any]) -> None:
        # The standby first: what it has run, the head had run before (it waits for the
        # standby); so its log entries and snapshots are dropped, unless the head was
        # lost before its reply, when they stand for the head's (the merger drops repeats).
        spare = self._ask_standby(ray, "poll")
        if spare is not None and spare["recovery"] is not None:
            # (kept before a promotion below: the new standby is built from it)
            self._keep_snapshot(0, spare["recovery"])
        replies = self._call_all(ray, "poll")
        if replies[0] is None:
            replies[0] = spare
        for s, reply in enumerate(replies):
            if reply is None:
                continue
            if s > 0 and reply["recovery"] is not None:
                self._keep_snapshot(s, reply["recovery"])
            self.merger.add(s, reply["log"])
            # A rebuilt shard takes again the snapshots its lost self took after its
            # latest recovery snapshot: keep the first of each point.
            fresh = [snap for snap in reply["snapshots"] if snap["point"] > self.last_point[s]]
            if fresh:
                self.last_point[s] = fresh[-1]["point"]
            self.snapshots[s].extend(fresh)
        head = replies[0]
        if head is None:  # the head and then its standby lost in one poll: no news
            return
        self.steps, self.updates, self.pushes = head["steps"], head["updates"], head["pushes"]
        self.waits, self.wait_time = head["waits"], head["wait_time"]
        self._check_divergence()

    def _keep_snapshot(self, s: int, saved: dict[str, Any]) -> None:
        """Receiver ``s``'s (0: the standby's) latest snapshot: the head and the standby
        drop the calls it covers."""
        self.recovery[s] = saved
        for server in (self.servers[0], self.standby):
            if server is not None:
                server.trim.remote(s, saved["calls"])

    def _check_divergence(self) -> None:
        if self.diverged_at is not None:
            return
        losses = np.asarray(self.merger.log.loss[self.checked :])
        bad = np.flatnonzero(~np.isfinite(losses))
        if len(bad):
            self.diverged_index = self.checked + int(bad[0])
            self.diverged_at = int(self.merger.updates[self.diverged_index])
            self.diverged_steps = self.diverged_index + 1  # local steps aside
        self.checked = len(self.merger)

    def _process_points(self, ray: Any, servers: list[Any], progress: Progress) -> None:
        """Evaluate and checkpoint every point whose snapshots (and log) are all in."""
        while self.pending and all(self.snapshots):
            snaps = [queue[0] for queue in self.snapshots]
            if len(self.merger) < snaps[0]["pushes"]:
                return  # other shards' parts of these pushes are still on their way
            for queue in self.snapshots:
                queue.pop(0)
            point = self.pending.pop(0)
            if self.diverged_at is not None and snaps[0]["pushes"] > self.diverged_index:
                continue
            if snaps[0]["buffers"] is not None:
                self.buffers = snaps[0]["buffers"]
            if point in self.evals:
                row = self._evaluate(snaps)
                progress.row(row)
                if not math.isfinite(row["test_loss"]) and self.diverged_at is None:
                    self.diverged_at = snaps[0]["updates"]
                    self.diverged_index = snaps[0]["pushes"]
                    self.diverged_steps = snaps[0]["steps"]
                    self._stop(ray, servers)
                    continue
                self.run.write_metrics(self.rows)
                self.run.log_row(row)
            if point in self.checkpoints:
                n = snaps[0]["pushes"]
                state = build_state(
                    [snap["state"] for snap in snaps],
                    self.merger.state_dict(n),
                    self.rows,
                    self.logged,
                    snaps[0]["time"],
                    self.buffers,
                )
                self.run.save_checkpoint(state)

    def _evaluate(self, snaps: list[dict[str, Any]]) -> dict[str, float]:
        head = snaps[0]
        params = torch.from_numpy(np.concatenate([snap["params"] for snap in snaps]))
        if self.buffers:
            self.problem.flat.load_buffers_state(
                {k: torch.from_numpy(np.array(v)) for k, v in self.buffers.items()}
            )
        test_loss, test_error = self.problem.evaluate(params)
        self.final_params = params  # the last evaluated: the end of the run
        log = self.merger.log.numpy(self.logged, head["pushes"])
        self.logged = head["pushes"]
        at = Position(
            head["steps"] / self.batches_per_epoch,
            head["updates"],
            head["pushes"],
            head["time"],
            head["lr"],
        )
        row = metrics_row(at, self._wall(), log, test_loss, test_error)
        self.sim_time = head["time"]
        self.rows.append(row)
        return row

    def _divergence_row(self, wall: float) -> dict[str, float]:
        """The row that marks the divergence: at the first push with a non-finite loss
        (or at the evaluation that found a non-finite test loss)."""
        stop = self.diverged_index + 1 if self.diverged_index is not None else None
        log = self.merger.log.numpy(self.logged, stop)
        at = Position(
            self.diverged_steps / self.batches_per_epoch,
            self.diverged_at,
            self.pushes,
            float(log["sim_time"][-1]) if len(log["sim_time"]) else self.sim_time,
            float(log["lr"][-1]) if len(log["lr"]) else math.nan,
        )
        return divergence_row(at, wall, log)

    def _show(self, progress: Progress) -> None:
        loss = self.merger.log.loss[-1] if len(self.merger) else math.nan
        progress.update(self.steps, loss)

    def _counters(self, ray: Any, servers: list[Any], startup: float) -> dict[str, Any]:
        shards = self._call_all(ray, "counters")
        while None in shards:  # a shard lost at the very end: rebuilt, asked again
            self._settle(ray)
            shards = self._call_all(ray, "counters")
        relay = self._relay_counters(ray)
        standby = None if self.standby is None else self._ask_standby(ray, "counters")
        log_times = self.merger.log.sim_time
        if len(log_times):
            self.sim_time = max(self.sim_time, log_times[-1])
        return {
            "servers": self.S,
            "workers": self.k,
            "max_staleness": self.config.max_staleness if self.bounded else None,
            "relayed": self.relay,
            "with_standby": self.with_standby,
            "startup_seconds": startup,
            "cpus_per_actor": self.cpus,
            # where each actor started: its node's IP address and id
            "placement": self.placement,
            # Every push a worker numbered (its last seq): applied once, or answered
            # "stop" after the run's last step; a crashed worker renumbers from the
            # servers' last applied seq, so a push lost in flight is not counted.
            "pushes_sent": sum(self.last_seq_sent),
            "pushes_applied": shards[0]["pushes"],
            "local_steps": shards[0]["local_steps"],
            "rejected_after_stop": shards[0]["rejected_after_stop"],
            "duplicates": shards[0]["duplicates"],
            "waits": shards[0]["waits"],
            "wait_time": shards[0]["wait_time"],
            "failed_run_calls": self.failed_calls,
            "workers_lost": self.lost,
            # shards rebuilt after their loss (dana.ps.recovery), and shard 0's log
            "shards_rebuilt": self.rebuilt,
            # lost heads replaced by their standby, standbys built since the start
            "promotions": self.promotions,
            "standbys_rebuilt": self.standbys_rebuilt,
            "standby": standby,
            **relay,
            "worker_replies": dict(self.worker_counts),
            "shards": shards,
        }
