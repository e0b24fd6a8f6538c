"""A parameter-server shard: the master rule on a slice of the parameters, one call at a time.

A :class:`ShardServer` owns the master rule of an algorithm built on the contiguous shard
``params[lo:hi]`` (for an ``elementwise`` algorithm a rule on a shard is the rule; the
configuration refuses to shard the others; a synchronous rule's round of ``k`` pushes
completes on every shard with the same pushes). It runs as a Ray actor that executes one
method at a time, so a push is applied whole before the next call is looked at, and no
call ever waits for a worker: a slow worker only delays its own next call. Shard 0, the head, is a
:class:`~dana.ps.head.HeadServer`: this class with the staleness gate and the relay.

Calls (:mod:`dana.ps.protocol`; the workers make them through the head, which relays
them here as numbered :class:`~dana.ps.protocol.Call` s, :meth:`relayed`):

- ``pull(worker, join) -> Pulled``: the parameters ``worker`` computes at
  (``master.pull`` at the current learning rate ``lr``, which the worker rule also gets
  through ``set_lr`` for its step), or ``"stop"`` and no parameters once the run is
  over. ``join=True`` marks the first pull of a worker process (a start, a restart
  after a crash, a resume); the reply tells it the sequence number of its last push
  this server applied and how often it has joined.
- ``push(push) -> Status``: apply the message (``master.push`` at the current learning
  rate; an encoded one decoded first: ``--compress``, :mod:`dana.train.rules.codecs`).
  Pushes are idempotent: a push whose ``seq`` is not above the last one applied
  for that worker is acknowledged as ``"duplicate"`` and not applied again. After the
  run's last step every push is answered ``"stop"`` and not applied. ``message=None`` is
  a local step: counted as a step, nothing applied. ``offset`` (the worker rule's
  ``theta_offset(1.0)`` on the probe coordinates) measures the gap against the true
  ``theta``; ``buffers`` (the model's BatchNorm statistics) are kept for evaluation.
- ``exchange(push) -> Exchanged``: a push followed by a pull, one round trip per
  asynchronous step.
- ``poll() -> dict``: the log entries and snapshots since the last poll, counters, and
  once every :data:`~dana.ps.recovery.SNAPSHOT_SECONDS` a :meth:`recovery_state`.

Counters (:class:`~dana.ps.records.Counts`): ``steps`` (gradient computations, local ones
included: the simulator's ``steps``; epochs are ``steps / batches_per_epoch``),
``pushes`` (messages applied) and ``updates`` (times the master's parameters moved: one
per push, or one per round of ``k`` pushes for a synchronous rule, ``ssgd`` or
``diloco``, whose round is ``k*H`` steps with ``diloco``'s ``H - 1`` local steps per
worker). The staleness of a push is ``updates`` now minus ``updates`` at the worker's
pull. At every evaluation or checkpoint point (a number of steps; for a synchronous rule
the first round boundary at or after it) the server snapshots the parameters to
evaluate, and at checkpoint points its whole state, without stopping.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dana.algorithms.base import Algorithm, MasterRule
from dana.ps.log import ShardLog
from dana.ps.protocol import Call, Exchanged, Pulled, Push, Role, Status, apply, message_tensor
from dana.ps.records import Counts, GapProbes, WorkerRecords
from dana.ps.recovery import SNAPSHOT_SECONDS
from dana.ps.snapshots import Snapshots
from dana.train.rules.schedule import next_rate

# Arrays from Ray's object store are read-only; the rules only read messages.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


class ShardServer:
    """The master rule on one shard of the parameters, with the run's counters.

    Args (the run's settings, :func:`~dana.ps.settings.server_settings`, and the shard's):
        params: the shard's initial parameters.
        algorithm: the run's algorithm, built once by the driver.
        schedule: the learning-rate schedule (:func:`~dana.train.rules.schedule.next_rate`
            reads it).
        workers, k_max: the workers at the start, and the most the run may hold.
        probes: the shard's gap probes (:class:`~dana.ps.layout.Layout`).
        batches_per_epoch: ``train_size // batch_size``.
        end: stop after this many steps (asynchronous runs); ``None``: the driver ends
            the run (a synchronous rule's rounds).
        evals, checkpoints: the step counts at which to snapshot for an evaluation, and
            for a checkpoint.
        state: a checkpointed :meth:`state` to continue from.
        recovered: a server rebuilt after its loss: its latest :meth:`recovery_state`.
        grow: ``--grow-at``'s ``(step, n)`` points: ``n`` workers join once ``step``
            steps are applied (:meth:`_reached`).
    """

    role = Role.SHARD

    def __init__(
        self,
        params: np.ndarray,
        *,
        algorithm: Algorithm,
        schedule: Callable[[float], float],
        workers: int,
        k_max: int,
        probes: np.ndarray,
        batches_per_epoch: int,
        end: int | None,
        evals: list[int],
        checkpoints: list[int],
        state: dict[str, Any] | None = None,
        recovered: dict[str, Any] | None = None,
        grow: list[tuple[int, int]] | None = None,
    ):
        torch.set_num_threads(1)
        self.k, self.k_max = workers, k_max  # (k_max: the rules' size, dana.train.rules.members)
        self.synchronous = algorithm.synchronous
        self.round_steps = algorithm.round_steps
        self.master = algorithm.master(torch.from_numpy(params), k_max)  # (a copy)
        self._plain_pull = type(self.master).pull is MasterRule.pull  # pull == copy theta
        self._out = None if self._plain_pull else torch.empty_like(self.master.theta)
        self._decoded: Tensor | None = None
        self.schedule, self.batches_per_epoch, self.end = schedule, batches_per_epoch, end
        self.clock_zero = time.time()  # reset by begin()
        self.snapshot_at = -math.inf  # when the last recovery snapshot was taken
        self.counts = Counts()
        self.records = WorkerRecords(k_max, self.k)
        self.probes = GapProbes(probes, k_max, self.master.theta.dtype)
        self.stopped = False
        self.buffers: dict[str, np.ndarray] | None = None
        self.log = ShardLog()
        self.grow = list(grow or [])  # the growth still to come
        self.started = self.k  # worker indices handed out: the workers ever in the run
        if state is not None:
            self.load_state(state)
        else:  # the workers k .. k_max-1 start outside the run (nothing of theirs to drop)
            for worker in range(self.k, k_max):
                self.master.leave(worker, self.lr())
        self.snapshots = Snapshots(evals, checkpoints, self.steps, fresh=state is None)
        if end is not None and self.steps >= end:
            self.stopped = True
        if recovered is not None:
            self.load_recovery(recovered)
        elif state is None:
            self._reached(self.steps)  # (--grow-at 0:N)

    @property
    def steps(self) -> int:
        return self.counts.steps

    @property
    def updates(self) -> int:
        return self.counts.updates

    @property
    def pushes(self) -> int:
        return self.counts.pushes

    # -- the calls ----------------------------------------------------------------------
    def ready(self) -> dict[str, str]:
        from dana.ps.cluster import node_of

        return node_of()

    def begin(self, clock_zero: float) -> None:
        """Start the clock: log times are ``time.time() - clock_zero`` (the driver's
        start of training, earlier by the training time before a resume)."""
        self.clock_zero = clock_zero
        self.records.restart_clocks()
        self._after_step(moved=True)  # the snapshot of point 0, if due

    def pull(self, worker: int, join: bool = False) -> Pulled:
        self.counts.calls += 1
        records = self.records
        if join:
            records.joins[worker] += 1
        seen = records.last_seq[worker], records.joins[worker]
        if self.stopped:
            return Pulled(Status.STOP, None, math.nan, *seen)
        if not self._admit(worker, join):
            return Pulled(Status.WAIT, None, math.nan, *seen)
        return Pulled(Status.PARAMS, self._serve(worker, join), self.lr(), *seen)

    def push(self, push: Push) -> Status:
        counts, records, worker = self.counts, self.records, push.worker
        counts.calls += 1
        if push.seq <= records.last_seq[worker]:
            counts.duplicates += 1
            return Status.DUPLICATE
        if self.stopped:
            counts.rejected += 1
            return Status.STOP
        now = time.time()
        # (a local step is never held: its worker stays in flight)
        if push.message is not None and not self._may_push(worker, now):
            return Status.WAIT  # held: not applied, its seq not taken; sent again later
        if push.seq != records.last_seq[worker] + 1:
            counts.seq_gaps += 1
        records.last_seq[worker] = push.seq
        if push.message is None:
            counts.steps += 1
            counts.local_steps += 1
            self._after_step(moved=False)
            return Status.LOCAL
        lr = self.lr()
        staleness = counts.updates - records.pulled_at[worker]
        gap_sq = self.probes.gap_sq(worker, self.master.gap_reference(), lr)
        if self._decoded is None and not isinstance(push.message, np.ndarray):
            self._decoded = torch.empty_like(self.master.theta)  # (encoded pushes' values)
        moved = self.master.push(worker, message_tensor(push.message, self._decoded), lr)
        counts.updates += moved
        counts.pushes += 1
        counts.steps += 1
        records.applied[worker] += 1
        if push.offset is not None:
            self.probes.set_offset(worker, push.offset)
        if push.buffers is not None:
            self.buffers = push.buffers
        duration = now - records.cycle_start[worker]
        if not self.synchronous:
            records.cycle_start[worker] = now
        self.log.append(
            worker=worker,
            seq=push.seq,
            staleness=staleness,
            gap_sq=gap_sq,
            gap_n=self.probes.n,
            loss=push.loss,
            lr=lr,
            time=now - self.clock_zero,
            duration=duration,
            compute=push.compute,
            updates=counts.updates,
            members=records.members,
        )
        self._after_step(moved)
        return Status.APPLIED

    def exchange(self, push: Push) -> Exchanged:
        status = self.push(push)
        if self.stopped:  # this push may have been the run's last one: status says
            return Exchanged(status, None, math.nan)
        if status is Status.WAIT or not self._admit(push.worker, join=False):
            return Exchanged(status, None, self.lr())  # held, or the pull must wait
        return Exchanged(status, self._serve(push.worker, join=False), self.lr())

    def relayed(self, call: Call) -> Any:
        """Run relayed ``call`` if it is the next one in the head's order; a call run
        already (a replay, a promotion's resend) is skipped."""
        if call.number <= self.counts.calls:
            self.counts.repeats += 1
            return None
        if call.number != self.counts.calls + 1:
            self.counts.call_gaps += 1  # (never expected: counted, for the tests to check)
        return apply(self, call)

    def member(self, worker: int, join: bool) -> Status:
        """Worker ``worker`` joins the run (``master.join``) or leaves it
        (``master.leave`` at the rate a push would have now: a move of the parameters
        is an update). ``"duplicate"`` if it already was in (out of) the run, ``"stop"``
        once the run is over (nothing changes then)."""
        self.counts.calls += 1
        if self.stopped:  # (the head relays only what it applied: a receiver never is)
            return Status.STOP
        return self._change(worker, join)

    def _change(self, worker: int, join: bool) -> Status:
        """:meth:`member`'s change, not counted as a call."""
        records = self.records
        if records.live[worker] == join:
            return Status.DUPLICATE
        records.live[worker] = join
        if join:
            self.master.join(worker)
            self.started = max(self.started, worker + 1)
            return Status.APPLIED
        self.counts.updates += bool(self.master.leave(worker, self.lr()))
        self.probes.clear_offset(worker)  # its rule's state is lost with it
        self._after_step(moved=True)  # (synchronous: a departure may complete the round)
        return Status.APPLIED

    def halt(self) -> None:
        """The run is over: answer every later push and pull with ``"stop"``."""
        self.counts.calls += 1
        self.stopped = True

    # -- the driver's calls -------------------------------------------------------------
    def poll(self) -> dict[str, Any]:
        snapshots = self.snapshots.drain()
        waits, wait_time = self._waits()
        recovery = None
        if self._keeps_recovery() and time.time() - self.snapshot_at >= SNAPSHOT_SECONDS:
            self.snapshot_at = time.time()
            recovery = self.recovery_state()
        return {
            "recovery": recovery,
            "log": self.log.drain(),
            "snapshots": snapshots,
            "steps": self.steps,
            "updates": self.updates,
            "pushes": self.pushes,
            "stopped": self.stopped,
            "waits": waits,
            "wait_time": wait_time,
            "started": self.started,
        }

    def counters(self) -> dict[str, Any]:
        counts, records = self.counts, self.records
        waits, wait_time = self._waits()
        return {
            "waits": waits,
            "wait_time": wait_time,
            "steps": counts.steps,
            "updates": counts.updates,
            "pushes": counts.pushes,
            "local_steps": counts.local_steps,
            "duplicates": counts.duplicates,
            "rejected_after_stop": counts.rejected,
            "seq_gaps": counts.seq_gaps,
            "last_seq": list(records.last_seq),
            "applied": list(records.applied),
            "joins": list(records.joins),
            "live": list(records.live),
            "calls": counts.calls,
            "repeats": counts.repeats,
            "call_gaps": counts.call_gaps,
            "role": self.role,
        }

    # -- state --------------------------------------------------------------------------
    def lr(self) -> float:
        """The rate of the next update (synchronous: of the round under way)."""
        return next_rate(
            self.schedule,
            self.steps,
            self.updates,
            self.k,
            self.batches_per_epoch,
            self.synchronous,
            self.round_steps,
        )

    def state(self) -> dict[str, Any]:
        """The server's state for a checkpoint: numpy arrays and plain values."""
        counters = self.counters()
        return {"master": _master_state(self.master), **{k: counters[k] for k in _CHECKPOINTED}}

    def load_state(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint's :meth:`state`."""
        _load_master(self.master, state["master"])
        self.counts.resume(state)
        self.records.resume(state)
        self._plan_growth()

    def recovery_state(self) -> dict[str, Any]:
        """Everything a rebuilt server needs to continue as this one
        (:mod:`dana.ps.recovery`): its master state, every part's state, the snapshot
        points still to come and, for the driver, the relayed calls run (``calls``)."""
        return {
            "master": _master_state(self.master),
            "counts": self.counts.state_dict(),
            "records": self.records.state_dict(),
            "probes": self.probes.state_dict(),
            "snapshots": self.snapshots.state_dict(),
            "stopped": self.stopped,
            "clock_zero": self.clock_zero,
            "calls": self.counts.calls,
            "time": time.time(),
        }

    def load_recovery(self, saved: dict[str, Any]) -> None:
        """Become the server that :meth:`recovery_state` saved."""
        _load_master(self.master, saved["master"])
        self.counts.load_state_dict(saved["counts"])
        self.records.load_state_dict(saved["records"])
        self.probes.load_state_dict(saved["probes"])
        self.snapshots.load_state_dict(saved["snapshots"])
        self.stopped = bool(saved["stopped"])
        self.clock_zero = float(saved["clock_zero"])
        self._plan_growth()

    # -- what the head adds (dana.ps.head) ------------------------------------------------
    def _admit(self, worker: int, join: bool) -> bool:
        """Whether ``worker`` may pull now (the head's start gate; here always)."""
        return True

    def _may_push(self, worker: int, now: float) -> bool:
        """Whether ``worker``'s push may be applied now (the head's push gate; here always)."""
        return True

    def _waits(self) -> tuple[int, float]:
        """Waits for the staleness bound and their seconds, over the whole run."""
        return self.counts.waits_before, self.counts.wait_before

    def _reached(self, steps: int) -> None:
        """``--grow-at``: the workers planned at ``steps`` join now (``master.join`` of
        the next indices), within the call that applied the step and before its
        snapshot. Every shard and the standby do so at the same place in the head's
        order of calls, so growth is a function of that order alone, not of the
        driver's polls (which then start the workers' actors)."""
        while self.grow and self.grow[0][0] <= steps and not self.stopped:
            for _ in range(min(self.grow.pop(0)[1], self.k_max - self.started)):
                self._change(self.started, True)

    def _plan_growth(self) -> None:
        """The indices handed out and the growth still to come, from a loaded state:
        a point at or before its steps is done (:meth:`_reached`)."""
        records = self.records
        used = [i + 1 for i in range(self.k_max) if records.live[i] or records.joins[i] > 0]
        self.started = max([self.k, *used])
        self.grow = [(at, n) for at, n in self.grow if at > self.steps]

    def _keeps_recovery(self) -> bool:
        """Whether this server's polls carry recovery snapshots (a receiver of relayed
        calls, which the driver rebuilds from them)."""
        return True

    # -- internals ----------------------------------------------------------------------
    def _serve(self, worker: int, join: bool) -> np.ndarray:
        if self._plain_pull:  # Ray copies the returned array once, into its object store
            out = self.master.theta
        else:
            out = self.master.pull(worker, self.lr(), self._out)
        self.probes.record_pull(worker, out)
        self.records.pulled_at[worker] = self.updates
        if join or self.synchronous:
            self.records.cycle_start[worker] = time.time()
        return out.numpy()

    def _after_step(self, moved: bool) -> None:
        """Snapshot at the points passed (synchronous: once the round is complete, never
        at a local step), after what the step brings (:meth:`_reached`); stop at the end."""
        self._reached(self.steps)
        for point in self.snapshots.due(self.steps, moved, self.synchronous):
            self._snapshot(point)
        if self.end is not None and self.steps >= self.end:
            self.stopped = True

    def _snapshot(self, point: int) -> None:
        snap: dict[str, Any] = {
            "point": point,
            "steps": self.steps,
            "updates": self.updates,
            "pushes": self.pushes,
            "time": time.time() - self.clock_zero,
            "lr": self.lr(),
            "buffers": self.buffers,
        }
        if point in self.snapshots.evals:
            snap["params"] = self.master.params().numpy().copy()
        if point in self.snapshots.checkpoints:
            snap["state"] = self.state()
        self.snapshots.add(snap)


def _master_state(master: MasterRule) -> dict[str, Any]:
    """The master rule's state with numpy arrays for tensors (to cross Ray and a checkpoint)."""
    return {k: v.numpy() if isinstance(v, Tensor) else v for k, v in master.state_dict().items()}


def _load_master(master: MasterRule, state: dict[str, Any]) -> None:
    master.load_state_dict(
        {
            k: torch.as_tensor(np.asarray(v)) if isinstance(v, np.ndarray | Tensor) else v
            for k, v in state.items()
        }
    )


#: What a checkpoint keeps of a server's counters (besides its master state).
_CHECKPOINTED = (
    "steps",
    "updates",
    "pushes",
    "local_steps",
    "last_seq",
    "applied",
    "joins",
    "live",
    "waits",
    "wait_time",
)
