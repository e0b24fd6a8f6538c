"""The simulator's clock on a cluster: the network, drift and departures in event order.

docs/ALGORITHMS.md, "The clock, exactly as simulated", states the model; here is how
the simulator runs it. Each event is ``(time, kind, worker)``, processed in that order
(at the same instant: departures, then pushes complete at the servers, then pull
requests reaching them, then pushes reaching their links, then computations ending,
then returns; each by worker index):

- ``REQUEST``: a pull request reaches the servers (at the start and after a return,
  ``latency`` after it is sent). The servers answer at once (bounded staleness: when
  the start gate lets the worker start): :meth:`Simulator.pull` reads the master's
  parameters and the worker's next batch now, the answer crosses the egress queue and
  the worker's link (:class:`~dana.train.cluster.network.Network`), and the computation starts
  when the worker has it; its duration is drawn then
  (:class:`~dana.train.cluster.steptimes.StepTimes`), so its end is an event, ``FINISH``.
- ``FINISH``: the computation ends. A rule that takes local steps makes its message now
  (``None``: a local step, counted done; the worker computes again on its next batch,
  without pulling); then the push leaves (the computation that made it counts as done
  when the push is applied, or held), and its first bit reaches the servers' links
  ``latency`` later (``ARRIVE``), where it joins the ingress queue; it is complete at
  the servers at ``APPLY``.
- ``APPLY``: the master applies the push (its gradient, for a rule without local steps,
  computed now, at the parameters the worker pulled: the same gradient as when it was
  computed) and answers the worker's pull at once, as ``REQUEST`` does. Bounded
  staleness: a push the push gate refuses waits at the servers (held) until a later
  push frees it; the worker then waits at the start gate, as in the loop without a
  cluster. ``ssgd``: a round ends when the pushes of every worker in the run are
  complete; they are applied then, in worker order, and every worker's pull answered.
- ``LEAVE`` / ``JOIN``: a worker leaves (:class:`~dana.train.cluster.availability.Availability`):
  its events still to come are dropped (its computation, its push on its way or held,
  its pull on its way: lost; a message already in a queue keeps its place, the bytes
  crossed), the engines forget its gradient computed ahead, the staleness gate forgets
  it, and the rules are told (``master.leave(i, lr)``, ``workers.leave(i)``). ``ssgd``:
  a push already complete at the servers is applied first (the round keeps it). When it
  returns, ``master.join(i)``, ``workers.join(i)``, and it sends a pull request.

With no latency, no limit on any link, no drift and no departures this loop gives the
simulator's loop without a cluster bit for bit (tested); the simulator runs that loop
then, which costs less.
"""

from __future__ import annotations

import heapq
from typing import Any

from torch import Tensor

from dana.sim.events import Events, Work
from dana.train.cluster.availability import Availability
from dana.train.cluster.network import Network
from dana.train.cluster.steptimes import StepTimes

#: Event kinds, in the order events at the same instant are processed.
LEAVE, APPLY, REQUEST, ARRIVE, FINISH, JOIN = range(6)
KINDS = ("leave", "apply", "request", "arrive", "finish", "join")
#: The events of a worker with a computation under way or a push on its way.
_WORK = (APPLY, ARRIVE, FINISH)


class Clock:
    """The schedule of a simulator on a cluster (:class:`~dana.sim.schedules.Schedule`;
    the module docstring)."""

    def __init__(
        self,
        sim: Events,
        cluster: dict[str, Any],
        servers: int,
        seed: int,
        labels: Any,
        params: Tensor,
    ):
        k, d = sim.k, params.numel()
        if servers < 1 or servers > d:
            raise ValueError(f"servers must be in [1, {d}] (the parameters), got {servers!r}")
        self.sim = sim
        self.k = k
        self.times = StepTimes(cluster["compute"], k, seed, labels)
        codec = sim.wire.codec if sim.wire is not None else None  # (pushes: payloads' bytes)
        self.network = Network(cluster["network"], k, servers, d, params.element_size(), codec)
        self.availability = Availability(cluster["availability"], k, seed)
        self.events: list[tuple[float, int, int, int]] = []
        self.generation = [0] * k  # a departure makes a worker's earlier events stale
        self.away = [False] * k
        self.rejoin: list[float | None] = [None] * k  # of the spell under way or next
        self.arrived = [False] * k  # ssgd: the worker's push of the round is complete
        # A rule with local steps: the message made at FINISH, until APPLY
        self.message: list[Work | None] = [None] * k
        self.lost = self.leaves = self.joins = 0
        self.handlers = (
            self._leave,
            self._apply,
            self._request,
            self._arrive,
            self._finish,
            self._join,
        )

    # -- events ---------------------------------------------------------------------------
    def _at(self, time: float, kind: int, worker: int) -> None:
        heapq.heappush(self.events, (time, kind, worker, self.generation[worker]))

    def start(self) -> None:
        """Every worker sends its first pull request at time 0."""
        for i in range(self.k):
            self._at(self.network.latency[i], REQUEST, i)
            self._next_spell(i, 0.0)

    def step(self) -> None:
        """Process the next event."""
        events, generation = self.events, self.generation
        while True:
            if not events:
                raise RuntimeError(
                    "no event left: every worker is away for good, so the run cannot go on"
                )
            time, kind, worker, gen = heapq.heappop(events)
            if gen == generation[worker]:
                break
        self.sim.sim_time = time
        self.handlers[kind](worker, time)

    def due(self, i: int, size: int) -> list[int]:
        """The workers whose gradients come next after worker ``i``'s (for the engines'
        look-ahead): the rest of a round (``ssgd``), else the next to end a
        computation or push."""
        if self.sim.synchronous:
            return [j for j in range(i + 1, self.k) if self.arrived[j]]
        generation = self.generation
        live = (e for e in self.events if e[1] in _WORK and e[3] == generation[e[2]])
        return [j for _, _, j, _ in heapq.nsmallest(size, live)]

    # -- the handlers ---------------------------------------------------------------------
    def _request(self, i: int, t: float) -> None:
        sim = self.sim
        if sim.bound is not None:
            sim.bound.gate.queue(i, t)
            self._release(t)
            return
        self._serve(i, t)

    def _serve(self, i: int, t: float) -> None:
        """Answer worker ``i``'s pull at ``t``: its computation ends at ``FINISH``."""
        sim = self.sim
        sim.pull(i)
        start = self.network.from_server(i, t)
        self._at(start + self.times.duration(i, start, sim.batch[i]), FINISH, i)

    def _finish(self, i: int, t: float) -> None:
        sim = self.sim
        if sim.worker_rule.local_steps:
            work = sim.compute(i, count=False)
            if work is None:  # a local step: done; compute again, on the next batch
                sim.advance(i)
                self._at(t + self.times.duration(i, t, sim.batch[i]), FINISH, i)
                return
            self.message[i] = work
        self._at(t + self.network.latency[i], ARRIVE, i)

    def _arrive(self, i: int, t: float) -> None:
        self._at(self.network.to_server(i, t), APPLY, i)

    def _apply(self, i: int, t: float) -> None:
        sim = self.sim
        if sim.synchronous:
            self.arrived[i] = True
            self._end_round(t)
            return
        if sim.bound is None:
            self._push(i)
            self._serve(i, t)
            return
        if not sim.bound.gate.allows_push(i, sim.updates):
            work, self.message[i] = self.message[i], None
            sim.hold(i, work if work is not None else sim.compute(i), t)
            return
        self._push(i)
        sim.bound.pushed(i, t)
        self._release(t)

    def _push(self, i: int) -> None:
        """Apply worker ``i``'s push: its message made at ``FINISH``, or (a rule without
        local steps) its gradient's, made now."""
        work, self.message[i] = self.message[i], None
        self.sim.push(i, work)

    def _release(self, t: float) -> None:
        for i in self.sim.bound.release(self.sim):
            self._serve(i, t)

    def _end_round(self, t: float) -> None:
        """A synchronous rule: if every worker in the run has its push complete, apply them
        all (in worker order) and answer every pull."""
        arrived, away = self.arrived, self.away
        if not any(arrived) or not all(arrived[j] or away[j] for j in range(self.k)):
            return
        for j in range(self.k):
            if arrived[j]:
                arrived[j] = False
                self._push(j)
        for j in range(self.k):  # (every worker in the run: each one's push was in)
            if not away[j]:
                self._serve(j, t)

    def _leave(self, i: int, t: float) -> None:
        sim = self.sim
        self.generation[i] += 1
        self.away[i] = True
        self.leaves += 1
        if sim.synchronous and self.arrived[i]:
            self.arrived[i] = False  # complete at the servers: the round keeps it
            self._push(i)
        self.message[i] = None
        if sim.leave(i):
            self.lost += 1
        if self.rejoin[i] is not None:
            self._at(self.rejoin[i], JOIN, i)
        if sim.synchronous:
            self._end_round(t)
        elif sim.bound is not None:
            self._release(t)

    def _join(self, i: int, t: float) -> None:
        sim = self.sim
        self.away[i] = False
        self.joins += 1
        sim.join(i)
        self._at(t + self.network.latency[i], REQUEST, i)
        self._next_spell(i, t)

    def _next_spell(self, i: int, now: float) -> None:
        spell = self.availability.next_spell(i, now)
        if spell is None:
            self.rejoin[i] = None
            return
        leave, self.rejoin[i] = spell
        self._at(leave, LEAVE, i)

    # -- state ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"clock": self._state()}

    def _state(self) -> dict[str, Any]:
        return {
            "events": [list(e) for e in self.events],
            "generation": list(self.generation),
            "away": list(self.away),
            "rejoin": list(self.rejoin),
            "arrived": list(self.arrived),
            "message": [
                None if m is None else [m.tensor.clone(), m.loss, m.lr] for m in self.message
            ],
            "counts": [self.lost, self.leaves, self.joins],
            "times": self.times.state_dict(),
            "network": self.network.state_dict(),
            "availability": self.availability.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        state = state["clock"]
        self.events = [(float(t), int(k), int(i), int(g)) for t, k, i, g in state["events"]]
        heapq.heapify(self.events)
        self.generation = [int(g) for g in state["generation"]]
        self.away = [bool(a) for a in state["away"]]
        self.rejoin = [None if r is None else float(r) for r in state["rejoin"]]
        self.arrived = [bool(a) for a in state["arrived"]]
        device = self.sim.sent.device
        self.message = [
            None
            if m is None
            else Work(m[0].to(device).clone(), float(m[1]), True, float(m[2]), False)
            for m in state["message"]
        ]
        self.lost, self.leaves, self.joins = (int(c) for c in state["counts"])
        self.times.load_state_dict(state["times"])
        self.network.load_state_dict(state["network"])
        self.availability.load_state_dict(state["availability"])

    def counters(self) -> dict[str, Any]:
        """What the summary reports of the cluster: departures, returns, lost work."""
        return {"leaves": self.leaves, "joins": self.joins, "lost_computations": self.lost}


__all__ = ["Clock", "KINDS"]
