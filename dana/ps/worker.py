"""A worker: a model replica, its own data stream and the worker rule of one worker.

Each :class:`Worker` runs as a Ray actor. It builds a :class:`~dana.train.task.problem.Problem`
from the run's config (the same dataset, and the same model: the parameters themselves
always come from the servers) and the algorithm's worker rule for a single worker (its
own state, e.g. ``dana-slim``'s momentum ``v_i``). One step, as in the simulator:

1. compute at the pulled parameters (``rule.compute_at``), on the next batch of its own
   stream, ``g = grad f(p_i) + wd * p_i`` (the floor's :class:`~dana.train.rules.step.WorkerStep`);
2. ``rule.set_lr(lr)``, ``message = rule.message(0, g)`` (``None``: a local step,
   counted by the servers, no pull); with ``--time-scale``, sleep to the emulated step
   time (:mod:`dana.ps.delay`; a rule that ``uses_speed``, Dynamic Local Updates, is
   told this worker's emulated speed relative to the fastest once, at construction).
   ``lr`` is the rate of the run's next step as the servers last told it: with the
   pulled parameters, and after a local step with the head's answer to it, so that
   each local step of a cycle reads the schedule anew, as in the simulator (the
   simulator's rate is the one at the push: they differ only by how far the schedule
   moved during one step);
   With a codec (``--compress``) the message is encoded here, each shard's part on its
   own (:class:`~dana.train.rules.codecs.Wire`; ``topk``'s residual is this worker's, kept
   across its pushes, and starts from zero when its process does, as its rule state).
   Steps 1 and 2 are :class:`~dana.ps.steps.PushMaker`'s (``dana replay`` takes them again);
3. push the message with the next sequence number and pull in the same round trip
   (``exchange``); a synchronous rule (``ssgd``, ``diloco``): push, and pull again only
   in the driver's next round.

Synchronous rounds (:meth:`Worker.run` with a round index ``r``): a worker takes its
``H`` steps of the round (``Algorithm.round_steps``: ``diloco``'s ``local_steps``, else 1) from
the round's parameters, the ``H - 1`` local steps reported to the servers as such, then
its push. Round ``r``'s calls are numbered ``r*H + 1 .. (r + 1)*H``, whatever happened
before, so that the servers count ``k*H`` steps a round and a restarted worker knows
from its join whether its push of the round is in (then it skips the round); if not, it
takes the round's ``H`` steps again from its fresh rule state, and the local steps its
lost process had reported are answered ``"duplicate"`` (not counted twice).

Bounded staleness (``--max-staleness``): a server answers a pull or a push the bound
does not allow yet with ``"wait"``; the worker sends the same call again after a pause
that doubles from :data:`WAIT_FIRST` up to :data:`WAIT_MAX` seconds (a held push keeps
its sequence number), and pulls on its own when an exchange's push was applied but its
pull had to wait.

Data: every worker draws batches from its own :class:`~dana.train.task.batches.BatchStream`,
a fresh shuffle of all ``N`` training examples per pass, seeded by
``(seed, worker, incarnation)``; a restarted or resumed worker (a new incarnation)
draws a new order. With augmentation, each batch's draws are seeded by its key in that
stream (:class:`~dana.train.task.batches.KeyedBatchStream`). The run's epochs count every worker's batches together (total
gradient computations / ``N // B``), as in the simulator, so in one epoch every example
is used once in expectation.

A worker that crashes is restarted by Ray (``max_restarts``) and rejoins: its first pull
is a ``join``, which tells it the last sequence number the servers applied, so no push
is applied twice (and a call a lost shard 0 left unanswered goes again to its promoted
standby: :mod:`dana.ps.link`); its rule state (``dana-slim``'s ``v_i``) starts again from zero, as for
a new worker.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from dana.algorithms.base import Algorithm
from dana.ps.delay import StepDelay, worker_speed
from dana.ps.emulation import ClusterDelay
from dana.ps.layout import Layout
from dana.ps.link import ServerLink
from dana.ps.protocol import Status
from dana.ps.steps import PushMaker
from dana.train.config import TrainConfig
from dana.train.task.batches import BatchStream, stream_seed
from dana.train.task.problem import Problem

#: Seconds before a worker asks again after a "wait" (bounded staleness); each further
#: "wait" doubles the pause, up to :data:`WAIT_MAX`.
WAIT_FIRST = 0.001
WAIT_MAX = 0.016


class Worker:
    """Args: the run's config (a dict), this worker's index, the names of the shard
    servers' actors (in shard order; names, not handles, so that Ray can restart the
    worker from plain arguments) and ``d``; ``algorithm``: the run's, built once by the
    driver (``None``: build it from ``config``).

    Only these small values are the actor's constructor arguments: Ray warns at error
    level about an actor that may restart (``max_restarts``) whose constructor takes
    anything from its object store, a reference or a large argument. The problem (data
    and model) is built by the first call of each process, :meth:`setup` or
    :meth:`run`, from the ``source`` they are given: ``None`` (the config's), or a
    user's problem (:class:`dana.fitting.UserProblemSpec`) as ``[reference]``, taken
    from the object store only by a process that has not built it yet."""

    def __init__(
        self,
        config: dict[str, Any],
        index: int,
        servers: list[str],
        d: int,
        algorithm: Algorithm | None = None,
    ):
        torch.set_num_threads(1)
        self.config = TrainConfig.from_dict(config)
        self.index = index
        if algorithm is None:
            algorithm = self.config.build_algorithm()
        dtype = getattr(torch, self.config.dtype)
        self.rule = algorithm.worker(1, d, dtype)
        if algorithm.uses_speed:  # the emulated speeds: the run's timing model (--time-scale)
            self.rule.set_speed(0, worker_speed(self.config, index))
        # The workers call shard 0 only, which relays to its standby and the other shards
        # (whose lost ones the driver rebuilds under new names); a lost shard 0 is
        # replaced by its standby, found by name (dana.ps.link.find_head).
        layout = Layout(d, self.config.servers, self.config.seed)
        self.link = ServerLink(servers[0], layout, index, dtype)
        self.problem: Any = None  # built by the process's first setup() or run()
        self.maker: PushMaker | None = None  # its pushes, once the problem is built
        self.stream: BatchStream | None = None  # created when this process first joins
        self.delay: StepDelay | ClusterDelay | None = None
        self.clock_zero = time.time()  # model time 0 of an emulated cluster (run())
        self.seq = 0  # the sequence number of this worker's last push
        self.round_steps = algorithm.round_steps  # H: its computations per synchronous round
        self.lr = 0.0  # the rate of the next step, as the servers last told it

    def setup(self, source: list[Any] | None = None) -> dict[str, str]:
        """Build the problem from ``source`` (the class docstring) unless this process
        has; where it runs (:meth:`ready`)."""
        if self.problem is None:
            if source is None:
                problem = Problem(self.config)
            else:
                import ray

                problem = ray.get(source[0]).build(self.config)
            self.maker = PushMaker(self.config, self.index, problem, self.rule)
            self.problem = problem
        return self.ready()

    def ready(self) -> dict[str, str]:
        from dana.ps.cluster import node_of

        return node_of()

    def run(
        self,
        round_index: int | None = None,
        clock_zero: float | None = None,
        source: list[Any] | None = None,
    ) -> dict[str, int]:
        """Steps until the servers say stop (``round_index=None``), or one synchronous
        round: its ``H`` steps, numbered ``r*H + 1 .. (r + 1)*H`` (skipped if its push is
        in already; the module docstring). ``clock_zero``: the servers' start of training
        (an emulated cluster's time 0); ``source``: the problem's, for a process that
        has not built it (:meth:`setup`: a restarted or an added worker).

        Returns counts of the pushes sent and of the servers' replies (shard 0's), and
        ``seq``: the sequence number of this worker's last push.
        """
        self.setup(source)
        if clock_zero is not None:
            self.clock_zero = clock_zero
        counts: Counter[str] = Counter()
        params = self._pull(counts)
        if round_index is not None:
            if params is not None and self.seq < (round_index + 1) * self.round_steps:
                self.seq = round_index * self.round_steps
                while params is not None:  # (None after the round's push, or at a stop)
                    params = self._step(params, counts, exchange=False)
            return {**counts, "seq": self.seq}
        while params is not None:
            params = self._step(params, counts, exchange=True)
        return {**counts, "seq": self.seq}

    def _pull(self, counts: Counter[str]) -> Tensor | None:
        """The parameters to compute at (None: stop), once the servers serve them."""
        join = self.stream is None
        pause = WAIT_FIRST
        while True:
            reply = self.link.pull(join=join)
            self.seq, self.lr = max(self.seq, reply.last_seq), reply.lr
            if join:
                self._start(reply.joins)
                join = False
            if reply.status is not Status.WAIT:
                return self._arrived(reply.params, counts)
            counts["wait_replies"] += 1
            pause = _pause(pause)

    def _start(self, incarnation: int) -> None:
        cfg = self.config
        seed = stream_seed(cfg.seed, self.index, incarnation)
        self.stream = self.problem.batches(seed, worker=self.index)
        self.drawn = 0
        if cfg.time_scale > 0 and cfg.cluster is not None:
            dataset, flat = self.problem.dataset, self.problem.flat.flat
            self.delay = ClusterDelay(
                cfg, self.index, incarnation, flat.numel(), flat.element_size(),
                dataset.train_y, self.clock_zero,
            )  # fmt: skip
            self.delay.request()
        elif cfg.time_scale > 0:
            self.delay = StepDelay(cfg, self.index, incarnation)

    def _arrived(self, params: Tensor | None, counts: Counter[str]) -> Tensor | None:
        """Pulled ``params`` (None: stop); on an emulated cluster, once they have crossed
        the link, or the next parameters after the worker left and came back."""
        if params is None or not isinstance(self.delay, ClusterDelay):
            return params
        if self.delay.received():
            return self._depart(counts)
        return params

    def _depart(self, counts: Counter[str]) -> Tensor | None:
        """An emulated departure (:mod:`dana.ps.emulation`): the work under way is lost;
        the run is told (``master.leave``), the rule's state reset; back at the model's
        time (``master.join``, a fresh pull), or gone for good (None)."""
        counts["departures"] += 1
        if self.link.member(join=False) is Status.STOP:
            return None
        self.rule.leave(0)
        if not self.delay.depart(over=lambda: self.link.member(join=False) is Status.STOP):
            return None  # gone for good, or the run ended while it was away
        self.rule.join(0)
        if self.link.member(join=True) is Status.STOP:
            return None
        counts["returns"] += 1
        self.delay.request()
        return self._pull(counts)

    def _step(self, params: Tensor, counts: Counter[str], exchange: bool) -> Tensor | None:
        """One gradient computation and its push; the next parameters (None: stop)."""
        started = time.perf_counter()
        batch, number = self.stream.next(), self.drawn
        self.drawn += 1
        # (encoded within the step: its time counts in the emulated step time)
        push = self.maker.push(params, batch, self.lr, self.seq + 1, number)
        if self.delay is not None and self.delay.pad(started, batch):
            return self._depart(counts)  # (left before its push was complete: lost)
        push = replace(push, compute=time.perf_counter() - started)
        self.seq += 1
        counts["sent"] += 1  # pushes sent: the key of dist.json's worker_replies, kept
        message = push.message
        pause = WAIT_FIRST
        while True:  # (only a bounded run's held push goes round more than once)
            if message is None or not exchange:
                reply = self.link.push(push)
            else:
                reply = self.link.exchange(push)
            if reply.status is not Status.WAIT:
                break
            counts["wait_replies"] += 1
            pause = _pause(pause)
        counts[_REPLY[reply.status]] += 1
        if reply.stop:
            return None
        if message is None:  # a local step: the next one computes at the same parameters,
            self.lr = reply.lr  # at the rate of the run's next step, as in the simulator
            return params
        if not exchange:  # a synchronous round: the next round pulls
            return None
        if reply.params is None:  # the run is over, or the pull must wait: pull on its own
            return self._pull(counts)
        self.lr = reply.lr
        return self._arrived(reply.params, counts)


def _pause(seconds: float) -> float:
    """Sleep ``seconds``; the next pause."""
    time.sleep(seconds)
    return min(2 * seconds, WAIT_MAX)


_REPLY = {
    Status.APPLIED: "applied",
    Status.DUPLICATE: "duplicate",
    Status.LOCAL: "local",
    Status.STOP: "stopped",
    Status.GONE: "gone",
}
