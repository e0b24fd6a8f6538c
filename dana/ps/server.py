"""The parameter server of one shard: the master rule, served to workers one call at a time.

A :class:`ShardServer` owns the master rule of an algorithm built on the contiguous shard
``params[lo:hi]`` (for an ``elementwise`` algorithm a rule on a shard is the rule; the
launcher refuses to shard the others; ``ssgd``'s round of ``k`` pushes completes on every
shard with the same pushes). It runs as a Ray actor that executes one method at a time,
so a push is applied whole before the next call is looked at, and no call ever waits
for a worker: a slow worker only delays its own next call.

Protocol (all arguments and results are numpy arrays and plain values, and the relayed
calls' Ray object references, below):

- ``pull(worker, join) -> (status, params, lr, last_seq, joins)``: the parameters
  ``worker`` computes at (``master.pull`` at the current learning rate ``lr``, which the
  worker rule also gets through ``set_lr`` for its step), or ``status == "stop"`` and no
  parameters once the run is over (``"wait"``: bounded staleness, below).
  ``join=True`` marks the first pull of a worker process (a start, a restart after a
  crash, a resume); the reply tells it the sequence number of its last push this server
  applied and how often it has joined.
- ``push(worker, seq, message, loss, offset, buffers) -> status``: apply the message
  (``master.push`` at the current learning rate). Pushes are idempotent: each worker
  numbers its pushes 1, 2, 3, ... and a push whose ``seq`` is not above the last one
  applied for that worker is acknowledged as ``"duplicate"`` and not applied again.
  After the run's last step every push is answered ``"stop"`` and not applied.
  ``message=None`` is a local step (the worker rule sent nothing): counted as a step,
  nothing applied. ``offset`` is the worker rule's ``theta_offset(1.0)`` on the probe
  coordinates (``dana-slim``: ``m * v_i``), used to measure the gap against the true
  ``theta``; ``buffers`` are the worker model's buffers (BatchNorm statistics), kept
  for evaluation (the latest worker's).
- ``exchange(...) -> (status, params, lr)``: a push followed by a pull, one round trip
  per asynchronous step.
- ``poll() -> dict``: the log entries and snapshots since the last poll, and counters.
- ``stop()``: answer every later push and pull with ``"stop"``.
- ``forget(worker)``: drop the bounded-staleness records of a worker gone for good.

Bounded staleness (``max_staleness`` set, an asynchronous algorithm): shard 0 keeps the
:class:`~dana.train.gate.StalenessGate` (on its clock). A pull the start gate refuses is answered
``status == "wait"`` (no parameters); a push the push gate holds is answered ``"wait"``
and not applied, its sequence number not taken: the worker sends it again (the same
``seq``) a moment later. ``exchange`` whose push is applied but whose pull must wait
answers with the push's status and no parameters; the worker then pulls.

Several shards (``S > 1``): shard 0 relays (:mod:`dana.ps.relay`). The workers call
only shard 0 (``relay_pull``, ``relay_push``, ``relay_exchange``, which carry the other
shards' slices of the message), and shard 0, once it has applied a push or served a
pull, makes the same call on every other shard itself, sending each its slice from
shard 0's own copy. Ray runs the calls of one caller on an actor in the order they were
made, so every shard applies the same pushes and serves the same pulls in the same
order: its counts, and so its staleness, are shard 0's; and a push is applied on all
shards or on none, also when its worker dies during the call (a worker that rejoins
numbers on from shard 0's last seq, which is every shard's). ``relay_pull`` and
``relay_exchange`` add to their reply the references of the other shards' replies,
which the worker fetches directly (pulled parameters do not pass through shard 0).
Shard 0 logs the calls it relays, so that the driver can rebuild a lost shard
``s >= 1`` (:mod:`dana.ps.recovery`; ``trim``, ``rebind``, ``relay_counters``).
Every relayed call is numbered and runs on a receiver through :meth:`relayed`, which
skips a number it has run already.

Standby (every Ray run, also with one shard, unless ``--no-standby``): a second actor of shard 0
(``standby=True``) receives every call the head passes on, with every shard's
arguments, before anyone else and before the head answers (:meth:`replica`; the head
waits for it); it runs shard 0's part exactly as the head did (the staleness gate
follows the head's decisions instead of making its own, and is told the head's waiting
workers whenever one starts waiting: :meth:`waiting`) and keeps the same log. It
answers workers' calls with :data:`NOT_HEAD` until the driver promotes it
(:meth:`promote`) when the head is lost; the driver then gives it a new standby
(:meth:`attach_standby`).

Counters: ``steps`` (gradient computations, local ones included: the simulator's
``steps``; epochs are ``steps / batches_per_epoch``), ``pushes`` (messages applied) and
``updates`` (times the master's parameters moved: one per push, or one per round of
``k`` for ``ssgd``). The staleness of a push is ``updates`` now minus ``updates`` at the
worker's pull. At every evaluation or checkpoint point (a number of steps; for ``ssgd``
the first round boundary at or after it) the server snapshots the parameters to
evaluate, and at checkpoint points its whole state, without stopping.
"""

from __future__ import annotations

import math
import time
import warnings
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dana.algorithms.base import Algorithm, MasterRule
from dana.ps.layout import Layout
from dana.ps.log import ShardLog
from dana.ps.recovery import SNAPSHOT_SECONDS, load_recovery, recovery_state
from dana.ps.relay import Relay
from dana.ps.snapshots import Snapshots
from dana.train.config import TrainConfig
from dana.train.gate import StalenessGate, bounds_staleness
from dana.train.runner import build_schedule
from dana.train.schedule import schedule_epoch

APPLIED, DUPLICATE, LOCAL, STOP, PARAMS = "applied", "duplicate", "local", "stop", "params"
WAIT = "wait"  # bounded staleness: the call is refused for now; ask again
NOT_HEAD = "not-head"  # a standby not (yet) promoted: ask again, or the next one
HEAD, STANDBY, SHARD = "head", "standby", "shard"  # roles

# Arrays from Ray's object store are read-only; the rules only read messages.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


class ShardServer:
    """The master rule on one shard of the parameters, with the run's counters.

    Args:
        config: the run's :class:`TrainConfig` as a dict.
        shard: this shard's index ``s`` (shard 0 is the primary: its log orders the run's).
        params: the shard's initial parameters.
        d: the size of the whole parameter vector.
        batches_per_epoch: ``train_size // batch_size``.
        end: stop after this many steps (asynchronous runs); ``None``: the driver ends
            the run (``ssgd``'s rounds).
        evals, checkpoints: the step counts at which to snapshot for an evaluation, and
            for a checkpoint.
        state: a checkpointed :meth:`state` to continue from.
        peers: shard 0 of a sharded run: the names of the other shards' actors, to which
            it relays every call (resolved by :meth:`begin`; :class:`~dana.ps.relay.Relay`,
            which keeps the calls in a :class:`~dana.ps.recovery.RelayLog` to rebuild a
            lost one).
        recovered: a shard ``s >= 1`` rebuilt after its loss: its latest
            :func:`~dana.ps.recovery.recovery_state`.
        algorithm: the run's algorithm, built once by the driver (``None``: build it
            from ``config``).
        standby: a standby of shard 0 (it follows the head until promoted).
        replicated: shard 0 of a run with a standby: log every call, also with one shard
            (False: ``--no-standby``, or a shard ``s >= 1``).
    """

    def __init__(
        self,
        config: dict[str, Any],
        shard: int,
        params: np.ndarray,
        *,
        d: int,
        batches_per_epoch: int,
        end: int | None,
        evals: list[int],
        checkpoints: list[int],
        state: dict[str, Any] | None = None,
        peers: list[str] | None = None,
        recovered: dict[str, Any] | None = None,
        algorithm: Algorithm | None = None,
        standby: bool = False,
        replicated: bool = False,
    ):
        torch.set_num_threads(1)
        cfg = TrainConfig.from_dict(config)
        if algorithm is None:
            algorithm = cfg.build_algorithm()
        self.shard, self.k = shard, cfg.workers
        self.synchronous = algorithm.synchronous
        bounded = bounds_staleness(cfg.max_staleness, self.synchronous)
        self.gate = StalenessGate(cfg.max_staleness) if bounded and shard == 0 else None
        self.role = SHARD if shard > 0 else STANDBY if standby else HEAD
        self.relay = Relay(peers or [], self.k, replicated=standby or replicated)
        self.calls = 0  # pulls, pushes and stops run (on s >= 1, a standby: relayed calls)
        self.following = False  # running a call the head decided (a standby)
        self.repeats = self.call_gaps = 0  # relayed calls skipped (run already), missed
        self.snapshot_at = -math.inf  # when the last recovery snapshot was taken
        self.master = algorithm.master(torch.from_numpy(params), self.k)  # (a copy)
        self._plain_pull = type(self.master).pull is MasterRule.pull  # pull == copy theta
        self._out = None if self._plain_pull else torch.empty_like(self.master.theta)
        self.schedule = build_schedule(cfg, batches_per_epoch)
        self.batches_per_epoch = batches_per_epoch
        self.end = end
        self.clock_zero = time.time()  # reset by begin()
        layout = Layout(d, cfg.servers, cfg.seed)
        self.probe = torch.from_numpy(layout.probes[shard])
        self.n_probes = n = len(self.probe)
        dtype = self.master.theta.dtype
        self.pulled_probes = torch.zeros(self.k, n, dtype=dtype)  # each p_i on the probes
        self.offsets: Tensor | None = None  # each worker's theta_offset(1) on the probes
        self.offset_sum: Tensor | None = None
        self._diff = torch.empty(n, dtype=dtype)

        self.steps = self.updates = self.pushes = 0
        self.local_steps = self.duplicates = self.rejected = self.seq_gaps = 0
        self.last_seq = [0] * self.k
        self.applied = [0] * self.k
        self.joins = [0] * self.k
        self.pulled_at = [0] * self.k
        self.cycle_start = [time.time()] * self.k
        self.stopped = False
        self.waits_before, self.wait_before = 0, 0.0  # before a resume (the gate: since)
        self.buffers: dict[str, np.ndarray] | None = None
        self.log = ShardLog()
        if state is not None:
            self.load_state(state)
        self.snapshots = Snapshots(evals, checkpoints, self.steps, fresh=state is None)
        if end is not None and self.steps >= end:
            self.stopped = True
        if recovered is not None:
            load_recovery(self, recovered)

    # -- the protocol -------------------------------------------------------------------
    def ready(self) -> dict[str, str]:
        from dana.ps.cluster import node_of

        return node_of()

    def begin(self, clock_zero: float) -> None:
        """Start the clock: log times are ``time.time() - clock_zero`` (the driver's
        start of training, earlier by the training time before a resume)."""
        self.clock_zero = clock_zero
        self.cycle_start = [time.time()] * self.k
        if self.role == HEAD:
            self.relay.connect()
        self._after_step(moved=True)  # the snapshot of point 0, if due

    def pull(
        self, worker: int, join: bool = False
    ) -> tuple[str, np.ndarray | None, float, int, int]:
        self.calls += 1
        if join:
            self.joins[worker] += 1
            self.relay.joined(worker)
        seen = self.last_seq[worker], self.joins[worker]
        if self.stopped:
            return STOP, None, math.nan, *seen
        if not self._admit(worker, join):
            return WAIT, None, math.nan, *seen
        return PARAMS, self._serve(worker, join), self.lr(), *seen

    def push(
        self,
        worker: int,
        seq: int,
        message: np.ndarray | None,
        loss: float = math.nan,
        offset: np.ndarray | None = None,
        buffers: dict[str, np.ndarray] | None = None,
    ) -> str:
        self.calls += 1
        if seq <= self.last_seq[worker]:
            self.duplicates += 1
            return DUPLICATE
        if self.stopped:
            self.rejected += 1
            return STOP
        now = time.time()
        # (a local step is never held: its worker stays in flight)
        if message is not None and self.gate is not None:
            if self.following:  # a standby applies what its head applied
                self.gate.resume(worker, now)
            elif not self._may_push(worker, now):
                return WAIT  # held: not applied, its seq not taken; the worker sends it again
        if seq != self.last_seq[worker] + 1:
            self.seq_gaps += 1
        self.last_seq[worker] = seq
        if message is None:
            self.steps += 1
            self.local_steps += 1
            self._after_step(moved=False)
            return LOCAL
        lr = self.lr()
        staleness = self.updates - self.pulled_at[worker]
        gap_sq = self._gap_sq(worker, lr)
        moved = self.master.push(worker, torch.from_numpy(message), lr)
        self.updates += moved
        self.pushes += 1
        self.steps += 1
        self.applied[worker] += 1
        if self.gate is not None:
            self.gate.pushed(worker)
        if offset is not None:
            self._set_offset(worker, offset)
        if buffers is not None:
            self.buffers = buffers
        duration = now - self.cycle_start[worker]
        if not self.synchronous:
            self.cycle_start[worker] = now
        self.log.append(
            worker=worker,
            seq=seq,
            staleness=staleness,
            gap_sq=gap_sq,
            gap_n=self.n_probes,
            loss=loss,
            lr=lr,
            time=now - self.clock_zero,
            duration=duration,
            updates=self.updates,
        )
        self._after_step(moved)
        return APPLIED

    def exchange(
        self,
        worker: int,
        seq: int,
        message: np.ndarray | None,
        loss: float = math.nan,
        offset: np.ndarray | None = None,
        buffers: dict[str, np.ndarray] | None = None,
    ) -> tuple[str, np.ndarray | None, float]:
        status = self.push(worker, seq, message, loss, offset, buffers)
        if self.stopped:  # this push may have been the run's last one: status says
            return status, None, math.nan
        if status == WAIT or not self._admit(worker, join=False):
            return status, None, self.lr()  # held, or applied and the pull must wait
        return status, self._serve(worker, join=False), self.lr()

    # -- relayed calls (shard 0: the head) ------------------------------------------------
    def relay_pull(self, worker: int, join: bool = False) -> tuple[Any, ...]:
        """:meth:`pull`, then the same pull on the standby and every other shard if it was
        served: the reply and, last, the references of the other shards' replies."""
        if self.role != HEAD:
            return NOT_HEAD, None, math.nan, 0, 0, []
        reply = self.pull(worker, join)
        if reply[0] == PARAMS:
            self.relay.pull(worker)
        return (*reply, self.relay.flush()[-1] if reply[0] == PARAMS else [])

    def relay_push(
        self,
        worker: int,
        seq: int,
        message: np.ndarray | None,
        loss: float,
        offset: np.ndarray | None,
        buffers: dict[str, np.ndarray] | None,
        pieces: list[Any] | None,
        offsets: list[np.ndarray | None],
    ) -> str:
        """:meth:`push`, then the same push on the standby and every other shard if it was
        taken.

        ``pieces``: the other shards' slices of the message (``None`` for a local step),
        which this shard sends on from its own copies (so they outlive the worker);
        ``offsets``: their probe coordinates of the worker's ``theta_offset``.
        """
        if self.role != HEAD:
            return NOT_HEAD
        status = self.push(worker, seq, message, loss, offset, buffers)
        own = (worker, seq, message, loss, offset, buffers)
        self._relay_push(status, own, pieces, offsets)
        self.relay.flush()
        return status

    def relay_exchange(
        self,
        worker: int,
        seq: int,
        message: np.ndarray,
        loss: float,
        offset: np.ndarray | None,
        buffers: dict[str, np.ndarray] | None,
        pieces: list[Any],
        offsets: list[np.ndarray | None],
    ) -> tuple[str, np.ndarray | None, float, list[Any]]:
        """:meth:`exchange`, relayed: (status, params, lr, the other shards' pull replies)."""
        if self.role != HEAD:
            return NOT_HEAD, None, math.nan, []
        status, params, lr = self.exchange(worker, seq, message, loss, offset, buffers)
        own = (worker, seq, message, loss, offset, buffers)
        self._relay_push(status, own, pieces, offsets)
        if params is not None:
            self.relay.pull(worker)
        refs = self.relay.flush()[-1]
        return status, params, lr, refs if params is not None else []

    def _relay_push(
        self,
        status: str,
        own: tuple,
        pieces: list[Any] | None,
        offsets: list[np.ndarray | None],
    ) -> None:
        if status in (APPLIED, LOCAL):
            self.relay.push(own, own[0], own[1], pieces, offsets)

    # -- receiving relayed calls (shards s >= 1, the standby) -------------------------------
    def relayed(self, number: int, method: str, *args: Any) -> Any:
        """Run relayed call ``number`` (``pull``, ``push`` or ``stop`` with ``args``) if it
        is the next one; a call run already (a replay, a promotion's resend) is skipped."""
        if number <= self.calls:
            self.repeats += 1
            return None
        if number != self.calls + 1:
            self.call_gaps += 1  # (never expected: counted, for the tests to check)
        if method == "stop":
            return self._halt()
        return getattr(self, method)(*args)

    def replica(self, calls: list[tuple[int, str, list[tuple]]]) -> None:
        """A standby: the head's calls ``(number, method, every shard's args)``: log each,
        and run shard 0's part of those past this standby's count, as the head did."""
        for number, method, args in calls:
            self.relay.log.append(method, args, number)
            if number <= self.calls:
                continue
            self.following = True
            try:
                self.relayed(number, method, *args[0])
            finally:
                self.following = False
            if method == "pull":  # (the head passed the join on already)
                self.relay.rejoined[args[0][0]] = False

    def adopt(self, kept: list[int], calls: list[tuple[int, str, list[tuple]]]) -> None:
        """A new standby: the head's whole log (``kept``: what the driver's snapshots
        cover), then its calls from now on (:meth:`replica`)."""
        self.relay.log.kept = list(kept)
        self.replica(calls)

    def promote(self, peers: list[Any]) -> int:
        """The head was lost: this standby is the head now, ``peers`` the other shards.
        Sends them its log (each skips what it has); how many calls."""
        self.role = HEAD
        return self.relay.promote(peers)

    def attach_standby(self, actor: Any, covered: int = 0) -> int:
        """The head: ``actor``, rebuilt from a snapshot covering the calls up to
        ``covered``, is its standby now (sent the whole log, then the workers waiting for
        the staleness bound); how many calls."""
        sent = self.relay.attach(actor, covered)
        if self.gate is not None:
            self.relay.waiting(self.gate.waiting_state())
        return sent

    def waiting(self, state: dict[str, Any]) -> None:
        """A standby: the workers its head's staleness gate holds now
        (:meth:`~dana.train.gate.StalenessGate.waiting_state`), sent whenever one starts
        waiting, so that once promoted it keeps their places in line."""
        if self.gate is not None:
            self.gate.load_waiting(state)

    # -- recovery of a lost shard s >= 1 (dana.ps.recovery) -----------------------------
    def trim(self, shard: int, covered: int) -> None:
        """The driver holds a snapshot of ``shard`` covering the relayed calls up to
        ``covered``: drop the calls no shard needs any more."""
        self.relay.trim(shard, covered)

    def rebind(self, shard: int, actor: Any, covered: int) -> int:
        """Shard ``shard`` is ``actor`` now, rebuilt from a snapshot covering the calls up
        to ``covered``: send it the calls since, then relay to it. How many were sent."""
        return self.relay.rebind(shard, actor, covered)

    def relay_counters(self) -> dict[str, int]:
        return self.relay.counters()

    # -- the driver's calls ---------------------------------------------------------------
    def poll(self) -> dict[str, Any]:
        snapshots = self.snapshots.drain()
        waits, wait_time = self._waits()
        recovery = None
        if self.role != HEAD and time.time() - self.snapshot_at >= SNAPSHOT_SECONDS:
            self.snapshot_at = time.time()
            recovery = recovery_state(self)
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
        }

    def stop(self) -> list[Any]:
        """Stop; the head also stops its standby and the other shards, after every call it
        relayed to them (the references of the other shards' stops)."""
        self._halt()
        return self.relay.stop()

    def _halt(self) -> None:
        self.calls += 1
        self.stopped = True

    def forget(self, worker: int) -> None:
        if self.gate is not None:
            self.gate.forget(worker)

    def role_of(self) -> str:
        return self.role

    def counters(self) -> dict[str, Any]:
        waits, wait_time = self._waits()
        gate = {} if self.gate is None else self.gate.counters()
        return {
            **gate,
            "waits": waits,
            "wait_time": wait_time,
            "steps": self.steps,
            "updates": self.updates,
            "pushes": self.pushes,
            "local_steps": self.local_steps,
            "duplicates": self.duplicates,
            "rejected_after_stop": self.rejected,
            "seq_gaps": self.seq_gaps,
            "last_seq": list(self.last_seq),
            "applied": list(self.applied),
            "joins": list(self.joins),
            "calls": self.calls,
            "repeats": self.repeats,
            "call_gaps": self.call_gaps,
            "role": self.role,
        }

    # -- state --------------------------------------------------------------------------
    def lr(self) -> float:
        """The rate of the next update (``ssgd``: of the round under way)."""
        return self.schedule(
            schedule_epoch(
                self.steps, self.updates, self.k, self.batches_per_epoch, self.synchronous
            )
        )

    def state(self) -> dict[str, Any]:
        """The server's state for a checkpoint: numpy arrays and plain values."""
        master = {
            k: v.numpy() if isinstance(v, Tensor) else v
            for k, v in self.master.state_dict().items()
        }
        counters = self.counters()
        return {"master": master, **{k: counters[k] for k in _STATE_COUNTERS}}

    def load_state(self, state: dict[str, Any]) -> None:
        self.master.load_state_dict(
            {
                k: torch.as_tensor(np.asarray(v)) if isinstance(v, np.ndarray | Tensor) else v
                for k, v in state["master"].items()
            }
        )
        self.steps, self.updates = int(state["steps"]), int(state["updates"])
        self.pushes, self.local_steps = int(state["pushes"]), int(state["local_steps"])
        self.last_seq = [int(s) for s in state["last_seq"]]
        self.applied = [int(s) for s in state["applied"]]
        self.joins = [int(s) for s in state["joins"]]
        self.waits_before = int(state.get("waits", 0))  # (absent before dana-ray/1 had it)
        self.wait_before = float(state.get("wait_time", 0.0))

    # -- internals ----------------------------------------------------------------------
    def _admit(self, worker: int, join: bool) -> bool:
        """The start gate (bounded staleness): whether ``worker`` may pull now; records
        its start if so."""
        if self.gate is None:
            return True
        if self.following:  # a standby: the head admitted it
            self.gate.admit(worker, self.pushes, join, time.time())
            return True
        if join:  # a new process: its earlier incarnation's records go
            self.gate.forget(worker)
        else:  # (a worker pulls while in flight only to start its step again)
            self.gate.pushed(worker)
        queued = any(w == worker for w, _ in self.gate.idle)
        if self.gate.start(worker, self.pushes, time.time()):
            return True
        if not queued:  # it starts waiting now: its standby must know (relay.waiting)
            self.relay.waiting(self.gate.waiting_state())
        return False

    def _may_push(self, worker: int, now: float) -> bool:
        """The push gate (bounded staleness): whether ``worker``'s push may be applied
        now; a push held for the first time is passed on to the standby."""
        held = worker in self.gate.held
        if self.gate.may_push(worker, self.pushes, now):
            return True
        if not held:
            self.relay.waiting(self.gate.waiting_state())
        return False

    def _waits(self) -> tuple[int, float]:
        """Waits for the staleness bound and their total seconds, over the whole run."""
        if self.gate is None:
            return self.waits_before, self.wait_before
        return self.waits_before + self.gate.waits, self.wait_before + self.gate.wait_time

    def _serve(self, worker: int, join: bool) -> np.ndarray:
        if self._plain_pull:  # Ray copies the returned array once, into its object store
            out = self.master.theta
        else:
            out = self.master.pull(worker, self.lr(), self._out)
        torch.index_select(out, 0, self.probe, out=self.pulled_probes[worker])
        self.pulled_at[worker] = self.updates
        if join or self.synchronous:
            self.cycle_start[worker] = time.time()
        return out.numpy()

    def _gap_sq(self, worker: int, lr: float) -> float:
        """``sum((theta_now - p_i)^2)`` over this shard's probes, theta the true one."""
        diff = torch.index_select(self.master.gap_reference(), 0, self.probe, out=self._diff)
        if self.offset_sum is not None:
            diff.add_(self.offset_sum, alpha=lr)
        diff.sub_(self.pulled_probes[worker])
        return float(diff.dot(diff))

    def _set_offset(self, worker: int, offset: np.ndarray) -> None:
        new = torch.from_numpy(offset)
        if self.offsets is None:
            self.offsets = torch.zeros_like(self.pulled_probes)
            self.offset_sum = torch.zeros_like(self._diff)
        self.offset_sum.add_(new).sub_(self.offsets[worker])
        self.offsets[worker].copy_(new)

    def _after_step(self, moved: bool) -> None:
        """Snapshot at the points passed (``ssgd``: once its round is complete); stop at end."""
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


_STATE_COUNTERS = (
    "steps",
    "updates",
    "pushes",
    "local_steps",
    "last_seq",
    "applied",
    "joins",
    "waits",
    "wait_time",
)
