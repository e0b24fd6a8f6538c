"""``dana train --backend ray``: the driver of a run on Ray.

:class:`RayRun` is a runner (:class:`dana.train.runners.Runner`: ``rows``,
``load_state_dict``, ``execute(progress) -> summary``) and writes the same run directory
as the simulator's: ``metrics.csv`` rows at the same points of the data stream
(:func:`dana.train.records.metrics.metrics_row`), the same ``summary.json`` keys
(:func:`dana.train.records.metrics.summarize`), checkpoints for ``--resume``; and also
``step_times.csv`` (every push's cycle, the worker's step time within it and the time
it was applied: the simulator's ``trace`` timing replays the cycles, ``dana
fit-cluster`` fits a cluster model to them) and ``dist.json`` (the runtime's counters).

The driver starts ``S`` server shards (the parameters split into contiguous shards;
shard 0 the head, :mod:`dana.ps.head`, the others :mod:`dana.ps.shard`) and ``k``
:class:`~dana.ps.worker.Worker` actors; the workers talk to the servers directly, and
the driver only watches:

- asynchronous algorithms: each worker runs its loop until the servers, having applied
  the run's last step, answer ``stop``; a worker whose process dies is restarted by Ray
  and its loop started again (it rejoins with a fresh pull);
- synchronous algorithms (``Algorithm.synchronous``: ``ssgd``, ``diloco``): real
  rounds, as the simulator's: the driver starts a round on every worker (its ``H``
  steps, :attr:`~dana.algorithms.base.Algorithm.round_steps`: ``H - 1`` local steps, then its push) and
  waits for all ``k`` pushes before the next round, which every worker starts with a
  pull. A round is ``k*H`` steps, so round ``steps // (k*H)`` comes next (also after a
  resume). A crashed worker is restarted and redoes its round; a push already applied
  is not applied twice, nor a local step counted twice (:mod:`dana.ps.worker`).

A worker that stops answering (a paused process, a stuck node) for ``--server-timeout``
is killed (:mod:`dana.ps.watch`): an asynchronous run goes on without it, as without a
worker out of restarts; a synchronous one ends with a checkpoint of the moment
(:class:`~dana.errors.FaultError`, ``--resume``). Once the run's end is reached, the
workers' calls get ``--server-timeout`` more, then the run ends without them.

Shard 0 (the head) relays every call to a standby replica of itself (waiting for it)
and to the other shards, so that a push is applied on all of them or on none and all
shards count alike; it keeps the calls it relayed, and a lost shard ``s >= 1`` or
standby is rebuilt from its latest snapshot (which the driver keeps) and those calls; a
lost head is replaced by its standby, promoted (:mod:`dana.ps.recovery`). The driver's
:class:`~dana.ps.group.ShardGroup` starts, watches and repairs them. Losing the head
and its standby at once raises :class:`~dana.errors.FaultError` (exit status 4:
``--resume``), and so does losing the head of a run without a standby
(``--no-standby``: ``config.standby`` false; its pushes cost less). A server lost
while the run starts (before the first push) is handled the same way; an actor whose
constructor raised is bad input.

``--max-staleness s`` (asynchronous algorithms; synchronous ones ignore it, as in the
simulator): shard 0 keeps the floor's start and push gates
(:mod:`dana.train.rules.gate`, on its clock) and answers what they refuse with "wait". The summary's
``wait_time`` is the seconds workers spent waiting, summed over workers.

Every ``POLL_SECONDS`` (and after every synchronous round) the driver drains the servers'
logs and snapshots, evaluates each evaluation snapshot itself (the servers go on
meanwhile) and writes each checkpoint snapshot to ``checkpoint.pt``
(:mod:`dana.ps.points`). Times in the log (the ``sim_time`` column) are seconds of
training, counted from when every worker was ready (and carried over a resume).
"""

from __future__ import annotations

import json
import math
import sys
import time
from typing import Any

from torch import Tensor

from dana.algorithms.base import Algorithm
from dana.atomic import write_text_atomic
from dana.errors import ConfigError, FaultError, WriteError
from dana.ps.accounting import WorkerCalls, dist_counters
from dana.ps.calls import REPLAY_FILE, CallBook, write_calls
from dana.ps.checkpoint import build_state, check_state, to_numpy
from dana.ps.cluster import (
    READY_SECONDS,
    WORKER_RESTARTS,
    import_ray,
    placement,
    ray_session,
    worker_gpus,
    worker_options,
)
from dana.ps.group import POLL_SECONDS, ShardGroup
from dana.ps.log import LogMerger
from dana.ps.membership import Membership, write_members
from dana.ps.points import Points
from dana.ps.settings import server_args
from dana.ps.watch import WATCH_GROUPS, WorkerWatch
from dana.ps.worker import Worker
from dana.train.cluster.timing import write_trace
from dana.train.config import TrainConfig
from dana.train.records import preempt
from dana.train.records.metrics import Position, summarize
from dana.train.records.progress import Progress
from dana.train.records.pushlog import PushLog
from dana.train.records.rundir import RunDir
from dana.train.rules.codecs import push_bytes
from dana.train.rules.gate import bounds_staleness
from dana.train.task.problem import TrainingProblem
from dana.train.training import stop_points


class RayRun:
    """One training run on Ray writing to one run directory."""

    def __init__(
        self,
        config: TrainConfig,
        run: RunDir,
        problem: TrainingProblem,
        algorithm: Algorithm | None = None,
        *,
        threads: int = 1,  # (the work runs in the actors, one thread each)
    ):
        self.config, self.run, self.problem = config, run, problem
        # Built once (by train(), or here from the config): the actors get this object.
        self.algorithm = algorithm = (
            algorithm if algorithm is not None else config.build_algorithm()
        )
        self.k, self.S = config.workers, config.servers
        self.d = problem.flat.d
        self.batches_per_epoch = problem.dataset.train_size // config.batch_size
        self.synchronous = algorithm.synchronous
        self.round_steps = algorithm.round_steps  # H: a worker's steps per synchronous round
        # Bounded staleness (synchronous rules ignore it): shard 0 gates. Shard 0 relays
        # every call to its standby and the other shards, so a push is applied on all or
        # on none.
        self.bounded = bounds_staleness(config.max_staleness, self.synchronous)
        self.with_standby = config.standby  # False: --no-standby
        self.ray: Any = None  # the ray module, while the run executes
        self.shards: ShardGroup | None = None  # the servers, once started
        self.worker_actors: list[Any] = []
        self.merger = LogMerger(self.S)
        self.points = Points(run, problem, self.merger, self.S, self.batches_per_epoch, self._wall)
        self.saved_servers: list[dict[str, Any]] | None = None
        self.wall_before = 0.0  # training seconds before a resume
        self.steps = self.updates = self.pushes = 0
        self.wait_time = 0.0
        self.members = Membership(config, run.path)  # who is in the run (dana.ps.membership)
        self.calls = WorkerCalls.of(self.members.k_max)  # the workers' run() calls
        self.book = CallBook()  # the calls the head passed on (dana.ps.calls: dana replay)
        self.points.book = self.book
        self.admitted = self.members.started  # worker indices the head has handed out
        self.cpus = 1.0  # logical CPUs per actor (fewer when the cluster is short)

    @property
    def rows(self) -> list[dict[str, float]]:
        return self.points.rows

    @classmethod
    def check(cls, config: TrainConfig, problem: TrainingProblem) -> None:
        """Ray must be importable (:func:`~dana.ps.cluster.import_ray` says how to get
        it); the shards must not outnumber the parameters."""
        import_ray()
        if config.servers > problem.flat.d:
            raise ConfigError(
                f"--servers {config.servers} is more than the model's {problem.flat.d} parameters"
            )

    @property
    def log(self) -> PushLog:
        return self.merger.log

    def final_params(self) -> Tensor:
        """The parameters of the last evaluation (the end of the run; the initial ones
        when no evaluation came back)."""
        final = self.points.final_params
        return self.problem.initial_params() if final is None else final

    @property
    def epoch(self) -> float:
        return self.steps / self.batches_per_epoch

    @property
    def actors(self) -> int:
        """The run's actors: ``k_max`` workers (the most it grows to), ``S`` shards and
        shard 0's standby (if any)."""
        return self.members.k_max + self.S + int(self.with_standby)

    # -- state --------------------------------------------------------------------------
    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_state(state, self.S)
        self.saved_servers = to_numpy(state["servers"])
        self.merger.load_state_dict(state["log"])
        self.points.load_state_dict(state, to_numpy(state["buffers"]) or None)
        self.wall_before = float(state["wall_seconds"])
        first = self.saved_servers[0]
        self.steps, self.updates = int(first["steps"]), int(first["updates"])
        self.pushes = int(first["pushes"])
        self.members.resume(first)
        self.book.load_state_dict(state.get("calls"))  # (absent before dana replay)

    # -- the run ------------------------------------------------------------------------
    def execute(self, progress: Progress) -> dict[str, Any]:
        points, evals, checkpoints = stop_points(self.config, self.batches_per_epoch)
        fresh = self.saved_servers is None
        self.points.pending = [p for p in points if p > self.steps or fresh]
        self.points.evals, self.points.checkpoints = evals, checkpoints
        self.end = points[-1]
        startup = time.time()
        with ray_session(self.config.address, self.actors):
            self.ray = ray = import_ray()
            preempt.install()  # (in case ray.init replaced the SIGTERM handler with its own)
            if preempt.requested():  # (while Ray started: dana.ps.cluster.ray_session)
                raise preempt.preempted_at_start(str(self.run.path), self.run.checkpoint.is_file())
            try:
                self._start_actors()
                self.start = time.time()
                self.shards.begin(self.clock_zero)
                progress.start(self.end, self.steps)
                if self.synchronous:
                    self._run_rounds(progress)
                else:
                    self._run_free(progress)
                self.shards.stop()
                self.shards.settle()
                self._poll()
                self.merger.finish()
                self.points.process(progress, stop=self.shards.stop)
                counters = dist_counters(  # dist.json
                    self.config,
                    bounded=self.bounded,
                    startup_seconds=self.start - startup,
                    cpus_per_actor=self.cpus,
                    servers=self.shards.counters(),
                    calls=self.calls,
                    members=self.members.counters(),
                )
            finally:
                progress.close()
                for actor in self.worker_actors:
                    ray.kill(actor, no_restart=True)
                if self.shards is not None:
                    self.shards.kill()
        wall = self._wall()
        log_times = self.merger.log.sim_time
        sim_time = (
            max(self.points.sim_time, log_times[-1]) if len(log_times) else self.points.sim_time
        )
        if self.points.diverged_at is not None:
            self.rows.append(self.points.divergence_row(wall, self.pushes, sim_time))
            self.run.write_metrics(self.rows)
        log = self.merger.log
        write_trace(
            self.run.step_times,
            list(zip(log.worker.tolist(), self.merger.durations.tolist())),
            {"compute": self.merger.computes.tolist(), "time": log.sim_time.tolist()},
        )
        write_text_atomic(self.run.path / "dist.json", json.dumps(counters, indent=2) + "\n")
        write_members(
            self.run.path / "members.csv",
            self.merger.log.worker.tolist(),
            self.merger.members.tolist(),
        )
        write_calls(self.run.path / REPLAY_FILE, self.book)
        end = Position(self.epoch, self.updates, self.pushes, sim_time)
        return summarize(
            self.config,
            self.rows,
            self.merger.log.numpy(),
            self.points.diverged_at,
            wall,
            end,
            self.wait_time,
            {
                "push_bytes": push_bytes(self.config.compress, self.d, self.S, self._value_bytes()),
                "workers_at_end": len(self.members.live),  # (a run that grew or lost some)
            },
        )

    @property
    def clock_zero(self) -> float:
        """The servers' time 0 of training (earlier by the training time before a
        resume): an emulated cluster's model time 0."""
        return self.start - self.wall_before

    def _value_bytes(self) -> int:
        """Bytes of one parameter of the run's dtype (a push's values, uncompressed)."""
        return 8 if self.config.dtype == "float64" else 4

    def _wall(self) -> float:
        return self.wall_before + time.time() - self.start

    def _start_actors(self) -> None:
        """Start the servers (:class:`~dana.ps.group.ShardGroup`) and the workers, and
        wait for them: the servers first (a worker looks for shard 0, or its standby,
        as it starts)."""
        ray = self.ray
        self.cpus = cpus = placement(ray, self.actors)
        # What a shard is built from: again when a lost one is rebuilt (dana.ps.recovery)
        built_from = server_args(
            self.config,
            self.algorithm,
            self.problem.initial_params().cpu().numpy(),
            self.batches_per_epoch,
            end=None if self.synchronous else self.end,
            evals=self.points.evals,
            checkpoints=self.points.checkpoints,
            states=self.saved_servers,
        )
        self.shards = ShardGroup(
            ray,
            self.run,
            built_from,
            standby=self.with_standby,
            cpus=cpus,
            workers=self.k,
            steps_now=lambda: self.steps,
            timeout=self.config.server_timeout,
        )
        self.shards.create()
        # A user's problem (dana.fit) goes to the workers through the object store, its
        # reference held here for the run and sent with every call that may be a new
        # process's first (never a constructor argument: dana.ps.worker.Worker)
        spec = self.problem.spec
        self.source = None if spec is None else [ray.put(spec)]
        gpus = worker_gpus(ray, self.config.device, self.members.k_max)
        # (a side thread answers the driver's questions: dana.ps.watch)
        self.worker_cls = ray.remote(concurrency_groups=WATCH_GROUPS)(Worker).options(
            **worker_options(cpus, gpus)
        )
        self.watch = WorkerWatch(ray, self.config.server_timeout)
        # (a resumed run starts every worker it had started; those gone answer "gone")
        self.worker_actors = workers = [self._worker(i) for i in range(self.members.started)]
        deadline = time.time() + READY_SECONDS
        self.shards.start(deadline)
        self.shards.wait_ready(
            {f"worker{i}": w.setup.remote(self.source) for i, w in enumerate(workers)}, deadline
        )
        self.shards.attach_standby()

    def _worker(self, i: int) -> Any:
        """Worker ``i``'s actor (created: it starts meanwhile)."""
        args = (self.config.to_dict(), i, self.shards.names, self.d, self.algorithm)
        return self.worker_cls.remote(*args)

    def _loop(self, i: int, round_index: int | None = None) -> Any:
        """Worker ``i``'s ``run`` call: its loop, or synchronous round ``round_index``;
        with the problem's source (the call may be a restarted process's first)."""
        worker = self.worker_actors[i]
        if round_index is None:
            return worker.run.remote(clock_zero=self.clock_zero, source=self.source)
        return worker.run.remote(round_index, source=self.source)

    def _grow(self, running: dict[Any, int]) -> None:
        """Start the workers the head has admitted (``--grow-at``, at its step), after
        asking it to admit those requested now (:meth:`Membership.due`): each has joined
        the run on the servers (``master.join``); its actor starts and runs."""
        n = self.members.due()
        if n:
            admitted = self.shards.on_head(lambda head: head.relay_admit.remote(n))
            self.admitted = max(self.admitted, admitted)
        while self.members.started < self.admitted:
            i = self.members.next_index()
            self.members.joined(i, self.steps, "added")
            self.worker_actors.append(self._worker(i))
            self.watch.started(i)
            running[self._loop(i)] = i

    def _run_free(self, progress: Progress) -> None:
        """Asynchronous algorithms: every worker loops until the servers say stop (or
        that it is not in the run: ``"gone"``); workers are added as they are due."""
        ray, workers = self.ray, self.worker_actors
        running = {self._loop(i): i for i in range(len(workers))}
        while running:
            if preempt.requested():
                self._preempt(progress, list(running))
            done, _ = ray.wait(list(running), num_returns=len(running), timeout=POLL_SECONDS)
            for ref in done:
                i = running.pop(ref)
                finished = self._finished(ref, i)
                if finished is None:
                    self._drop(i, "out of restarts")
                elif finished is False and self.points.diverged_at is None:
                    running[self._loop(i)] = i
            self._poll()
            if self.shards.log_full is not None:
                self._full_disk(progress, list(running))
            if self.points.diverged_at is None and self.steps < self.end:  # (none after the end)
                self._grow(running)
            self.points.process(progress, stop=self.shards.stop)
            if self.points.diverged_at is not None:
                self.shards.stop()
            self._show(progress)
            ended = self.steps >= self.end or self.points.diverged_at is not None
            for i in self._hung(running, past_end=self.watch.past_end(ended)):
                self._drop(i, "did not answer")
        if self.steps < self.end and self.points.diverged_at is None:
            raise FaultError(
                f"every worker died for good after {self.steps} of {self.end} steps; "
                f"continue from the last checkpoint with `dana train --resume {self.run.path}`"
            )

    def _run_rounds(self, progress: Progress) -> None:
        """Synchronous algorithms: ``H`` steps on every worker per round (``H - 1``
        local, then its push); the next round starts when all ``k`` pushes are in (the
        master has then moved once). Evaluations and checkpoints fall between rounds."""
        ray, workers = self.ray, self.worker_actors
        round_index = self.steps // (self.k * self.round_steps)
        while self.steps < self.end and self.points.diverged_at is None:
            if preempt.requested():  # (between rounds: a checkpoint holds whole rounds)
                self._preempt(progress, [])
            running = {self._loop(i, round_index): i for i in range(len(workers))}
            while running:
                done, _ = ray.wait(list(running), num_returns=len(running), timeout=POLL_SECONDS)
                if not done:  # (a lost head is noticed here, and its standby promoted)
                    self._poll()
                for ref in done:
                    i = running.pop(ref)
                    finished = self._finished(ref, i)
                    if finished is None:
                        why = f"died and cannot be restarted (max_restarts {WORKER_RESTARTS})"
                        self._cannot_go_on(i, why, progress, list(running))
                    if finished is False:
                        running[self._loop(i, round_index)] = i
                for i in self._hung(running):
                    self._cannot_go_on(i, "did not answer", progress, list(running))
            round_index += 1
            self._poll()
            if self.shards.log_full is not None:
                self._full_disk(progress, [])
            self.points.process(progress, stop=self.shards.stop)
            self._show(progress)

    def _preempt(self, progress: Progress, running: list[Any]) -> None:
        """SIGTERM or SIGINT (:mod:`dana.train.records.preempt`): checkpoint this moment
        (:meth:`_checkpoint_now`) and raise :class:`~dana.errors.Preempted`."""
        steps = self._checkpoint_now(progress, running)
        raise preempt.preempted(str(self.run.path), f"at step {steps}")

    def _cannot_go_on(self, i: int, why: str, progress: Progress, running: list[Any]) -> None:
        """A synchronous rule lost worker ``i`` (``why``): its rounds cannot go on.
        Checkpoint this moment (:meth:`_checkpoint_now`; the open round's pushes are in
        it, and on ``--resume`` the workers whose push is not redo their part of the
        round) and raise :class:`~dana.errors.FaultError` (exit status 4)."""
        steps = self._checkpoint_now(progress, running)
        raise FaultError(
            f"worker {i} {why}; {self.config.algorithm} cannot go on without it: "
            f"checkpoint written at step {steps}; continue with "
            f"`dana train --resume {self.run.path}`"
        )

    def _full_disk(self, progress: Progress, running: list[Any]) -> None:
        """Shard 0's relay log (or its standby's) could not spill: its disk is full
        (:class:`~dana.ps.recovery.RelayLog`; the head takes no more calls). Checkpoint
        this moment (:meth:`_checkpoint_now`) and raise :class:`~dana.errors.WriteError`
        (exit status 2) with the fixes; a checkpoint that cannot be written either leaves
        the previous one as it was, and the message says so."""
        full, resume = self.shards.log_full, f"`dana train --resume {self.run.path}`"
        try:
            steps = self._checkpoint_now(progress, running)
        except WriteError as e:  # (its text: the previous checkpoint kept, and --resume)
            raise WriteError(
                f"{full}; the run stopped, and its checkpoint could not be written either: "
                f"{e.strerror or e}"
            ) from None
        raise WriteError(
            f"{full}; the run stopped with a checkpoint at step {steps}: once there is "
            f"space, continue with {resume}"
        )

    def _checkpoint_now(self, progress: Progress, running: list[Any]) -> int:
        """Stop the servers (the workers' loops end with their next call), wait at most
        ``--server-timeout`` for the ``running`` calls and until every shard has run
        every call the head relayed, take what they report, save every shard's state
        with the merged log as the checkpoint; its step. Every push applied is in the
        checkpoint on every shard: ``--resume`` redoes none."""
        shards = self.shards
        shards.stop()
        self.ray.wait(running, num_returns=len(running), timeout=shards.timeout)
        shards.settle()
        self._poll()
        self.merger.finish()
        self.points.process(progress, stop=shards.stop)
        states = shards.each(lambda server: server.state.remote())
        while None in states:  # a shard lost meanwhile: rebuilt, asked again
            shards.settle()
            states = shards.each(lambda server: server.state.remote())
        pushes = int(states[0]["pushes"])
        state = build_state(
            states,
            self.merger.state_dict(pushes),
            self.points.rows,
            self.points.logged,
            self._wall(),
            self.points.buffers,
        )
        state["calls"] = self.book.state_dict(cut=-1)
        self.run.save_checkpoint(state)
        progress.close()
        return int(states[0]["steps"])

    def _finished(self, ref: Any, i: int) -> bool | None:
        """Account for a worker's ``run`` call: True if it returned, False if its process
        died and Ray restarts it (call it again), None if it is out of restarts."""
        ray = self.ray
        try:
            self.calls.returned(i, ray.get(ref))
            return True
        except ray.exceptions.ActorDiedError:  # out of restarts
            return None
        except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError):
            # restarted, or restarting (its node lost): call it again
            self.calls.failed[i] += 1
            self.watch.started(i)
            time.sleep(0.05)
            return False

    def _hung(self, running: dict[Any, int], past_end: bool = False) -> list[int]:
        """The workers of the ``running`` calls (reference: worker) that have not answered
        within the deadline (:mod:`dana.ps.watch`), or all of them once the run's end was
        reached more than the deadline ago (``past_end``): each taken out of
        ``running``, its actor killed (never restarted) and named on stderr."""
        if past_end:
            late = set(running.values())
        else:
            late = set(self.watch.hung({i: self.worker_actors[i] for i in running.values()}))
        when = " after the run ended" if past_end else ""
        then = "the run cannot go on without it" if self.synchronous else "dropped from the run"
        for ref in [ref for ref, i in running.items() if i in late]:
            i = running.pop(ref)
            self.ray.kill(self.worker_actors[i], no_restart=True)
            print(
                f"dana: worker {i} did not answer within {self.watch.deadline:g} s{when} "
                f"(--server-timeout): killed; {then}",
                file=sys.stderr,
            )
        return sorted(late)

    def _drop(self, i: int, why: str) -> None:
        """Worker ``i`` is gone for good (``why``; asynchronous rules): unless the run is
        over, the master rule is told (its state for ``i`` dropped or folded; the
        staleness gate forgets it); the run does not wait for it."""
        self.calls.lost.append(i)
        if self.steps < self.end and self.points.diverged_at is None:
            self.shards.on_head(lambda head: head.relay_member.remote(i, False))
        self.members.left(i, self.steps, why)

    # -- what the servers report --------------------------------------------------------
    def _poll(self) -> None:
        """Drain the servers' logs and snapshots (:meth:`ShardGroup.poll`)."""
        replies = self.shards.poll()
        for s, reply in enumerate(replies):
            if reply is not None:
                self.merger.add(s, reply["log"])
                self.points.take(s, reply["snapshots"])
        head = replies[0]
        self.book.add(self.shards.standby_calls)
        if head is None:  # the head and then its standby lost in one poll: no news
            return
        self.book.add(head["calls"])
        self.admitted = max(self.admitted, head["started"])
        self.steps, self.updates, self.pushes = head["steps"], head["updates"], head["pushes"]
        self.wait_time = head["wait_time"]
        self.points.check_divergence()

    def _show(self, progress: Progress) -> None:
        loss = self.merger.log.loss[-1] if len(self.merger) else math.nan
        progress.update(self.steps, loss)
