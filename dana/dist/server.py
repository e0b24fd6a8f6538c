"""The parameter server of one shard: the master rule, served to workers one call at a time.

A :class:`ShardServer` owns the master rule of an algorithm built on the contiguous shard
``params[lo:hi]`` (every rule in the registry is element-wise, so a rule on a shard is
the rule; ``ssgd``'s round of ``k`` pushes completes on every shard with the same
pushes). It runs as a Ray actor that executes one method at a time, so a push is applied
whole before the next call is looked at, and no call ever waits for a worker: a slow
worker only delays its own next call.

Protocol (all arguments and results are numpy arrays and plain values):

- ``pull(worker, join) -> (status, params, lr, last_seq, joins)``: the parameters
  ``worker`` computes at (``master.pull`` at the current learning rate ``lr``, which the
  worker rule also gets through ``set_lr`` for its step), or ``status == "stop"`` and no
  parameters once the run is over. ``join=True`` marks the first pull of a
  worker process (a start, a restart after a crash, a resume); the reply tells it the
  sequence number of its last push this server applied and how often it has joined.
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

from dana import algorithms
from dana.algorithms.base import MasterRule
from dana.dist.layout import Layout
from dana.dist.log import ShardLog
from dana.train.config import TrainConfig
from dana.train.runner import build_schedule

APPLIED, DUPLICATE, LOCAL, STOP, PARAMS = "applied", "duplicate", "local", "stop", "params"

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
    ):
        torch.set_num_threads(1)
        cfg = TrainConfig.from_dict(config)
        algorithm = algorithms.build(cfg.algorithm, **cfg.algorithm_hparams())
        self.shard, self.k = shard, cfg.workers
        self.synchronous = algorithm.synchronous
        self.master = algorithm.master(torch.from_numpy(params), self.k)  # (a copy)
        self._plain_pull = type(self.master).pull is MasterRule.pull  # pull == copy theta
        self._out = None if self._plain_pull else torch.empty_like(self.master.theta)
        self.schedule = build_schedule(cfg)
        self.batches_per_epoch = batches_per_epoch
        self.end = end
        self.clock_zero = time.time()  # reset by begin()
        layout = Layout(d, cfg.servers, cfg.seed)
        self.probe = torch.from_numpy(layout.probes[shard])
        self.n_probes = n = len(self.probe)
        dtype = self.master.theta.dtype
        self.sent = torch.zeros(self.k, n, dtype=dtype)  # probe coordinates of each p_i
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
        self.buffers: dict[str, np.ndarray] | None = None
        self.log = ShardLog()
        self.snapshots: list[dict[str, Any]] = []
        if state is not None:
            self.load_state(state)
        # A fresh run also snapshots its start (point 0); a resumed one the points after
        # its checkpoint.
        self.evals = {p for p in evals if p > self.steps or state is None}
        self.checkpoints = {p for p in checkpoints if p > self.steps}
        self.points = sorted(self.evals | self.checkpoints)
        if end is not None and self.steps >= end:
            self.stopped = True

    # -- the protocol -------------------------------------------------------------------
    def ready(self) -> bool:
        return True

    def begin(self, clock_zero: float) -> None:
        """Start the clock: log times are ``time.time() - clock_zero`` (the driver's
        start of training, earlier by the training time before a resume)."""
        self.clock_zero = clock_zero
        self.cycle_start = [time.time()] * self.k
        self._after_step(moved=True)  # the snapshot of point 0, if due

    def pull(
        self, worker: int, join: bool = False
    ) -> tuple[str, np.ndarray | None, float, int, int]:
        if join:
            self.joins[worker] += 1
        seen = self.last_seq[worker], self.joins[worker]
        if self.stopped:
            return STOP, None, math.nan, *seen
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
        if seq <= self.last_seq[worker]:
            self.duplicates += 1
            return DUPLICATE
        if self.stopped:
            self.rejected += 1
            return STOP
        if seq != self.last_seq[worker] + 1:
            self.seq_gaps += 1
        self.last_seq[worker] = seq
        if message is None:
            self.steps += 1
            self.local_steps += 1
            self._after_step(moved=False)
            return LOCAL
        now = time.time()
        lr = self.lr()
        staleness = self.updates - self.pulled_at[worker]
        gap_sq = self._gap_sq(worker, lr)
        moved = self.master.push(worker, torch.from_numpy(message), lr)
        self.updates += moved
        self.pushes += 1
        self.steps += 1
        self.applied[worker] += 1
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
        return status, self._serve(worker, join=False), self.lr()

    def poll(self) -> dict[str, Any]:
        snapshots, self.snapshots = self.snapshots, []
        return {
            "log": self.log.drain(),
            "snapshots": snapshots,
            "steps": self.steps,
            "updates": self.updates,
            "pushes": self.pushes,
            "stopped": self.stopped,
        }

    def stop(self) -> None:
        self.stopped = True

    def counters(self) -> dict[str, Any]:
        return {
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
        }

    # -- state --------------------------------------------------------------------------
    def lr(self) -> float:
        return self.schedule(self.steps / self.batches_per_epoch)

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

    # -- internals ----------------------------------------------------------------------
    def _serve(self, worker: int, join: bool) -> np.ndarray:
        if self._plain_pull:  # Ray copies the returned array once, into its object store
            out = self.master.theta
        else:
            out = self.master.pull(worker, self.lr(), self._out)
        torch.index_select(out, 0, self.probe, out=self.sent[worker])
        self.pulled_at[worker] = self.updates
        if join or self.synchronous:
            self.cycle_start[worker] = time.time()
        return out.numpy()

    def _gap_sq(self, worker: int, lr: float) -> float:
        """``sum((theta_now - p_i)^2)`` over this shard's probes, theta the true one."""
        diff = torch.index_select(self.master.gap_reference(), 0, self.probe, out=self._diff)
        if self.offset_sum is not None:
            diff.add_(self.offset_sum, alpha=lr)
        diff.sub_(self.sent[worker])
        return float(diff.dot(diff))

    def _set_offset(self, worker: int, offset: np.ndarray) -> None:
        new = torch.from_numpy(offset)
        if self.offsets is None:
            self.offsets = torch.zeros_like(self.sent)
            self.offset_sum = torch.zeros_like(self._diff)
        self.offset_sum.add_(new).sub_(self.offsets[worker])
        self.offsets[worker].copy_(new)

    def _after_step(self, moved: bool) -> None:
        """Snapshot at the points passed (``ssgd``: once its round is complete); stop at end."""
        if self.points and self.steps >= self.points[0] and (moved or not self.synchronous):
            while self.points and self.steps >= self.points[0]:
                self._snapshot(self.points.pop(0))
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
        if point in self.evals:
            snap["params"] = self.master.params().numpy().copy()
        if point in self.checkpoints:
            snap["state"] = self.state()
        self.snapshots.append(snap)


_STATE_COUNTERS = ("steps", "updates", "pushes", "local_steps", "last_seq", "applied", "joins")
