"""Bounded staleness (``max_staleness = s``, stale synchronous parallel): the one gate.

The rule (docs/ALGORITHMS.md, "Bounded staleness"): no push is applied with a staleness
above ``s``. The in-flight workers (pulled, not yet pushed; a worker taking local steps
stays in flight) are kept in the order of their pulls. With ``U`` the count of applied
pushes and ``p_j`` the count at worker ``j``'s pull, the invariant is: the ``r``-th
oldest in-flight worker has ``U - p_j + r - 1 <= s`` (it could still push within ``s``
if the ``r - 1`` older ones pushed first). Two gates keep it:

- start: a worker pulls (starts computing) only while at most ``s`` workers are in
  flight, first come first served among the workers waiting to start: the ``n``-th
  waiter may start when at least ``n`` of the ``s + 1`` places are free;
- push: a push is applied only if every older in-flight worker ``j``, of rank ``r``,
  has ``U - p_j + r <= s``. The oldest in-flight worker is never held, so a run cannot
  deadlock.

Every runner drives the same :class:`StalenessGate` with its own clock: the simulator
with simulated time (it queues a worker that pushed with :meth:`~StalenessGate.queue`
and starts the waiters with :meth:`~StalenessGate.release`), a parameter server with
its wall clock (a worker asks with :meth:`~StalenessGate.start` and
:meth:`~StalenessGate.may_push` and is answered at once). A wait is timed from the
first refusal to the call that is allowed; ``wait_time`` sums the waits (over workers)
that lasted, and ``waits`` counts them. A synchronous algorithm (``ssgd``) runs in
rounds whose staleness is 0 and ignores the bound (:func:`bounds_staleness`).

A worker that joins afresh (a restart after a crash) drops its earlier records
(:meth:`~StalenessGate.forget`).

A replica of a gate (the Ray runtime's standby of shard 0) follows the decisions of the
gate it copies (:meth:`~StalenessGate.admit`, :meth:`~StalenessGate.resume`) and is
told its waiting workers whenever one starts waiting
(:meth:`~StalenessGate.waiting_state`, :meth:`~StalenessGate.load_waiting`), so that
once it decides for itself it has the same line to start and the same held pushes.
A runner saves and restores a gate whole with :meth:`~StalenessGate.state_dict` and
:meth:`~StalenessGate.load_state_dict`.

    >>> gate = StalenessGate(bound=0)
    >>> gate.start(0, pushes=0, now=0.0), gate.start(1, pushes=0, now=0.0)  # one at a time
    (True, False)
    >>> gate.may_push(0, pushes=0, now=1.0)
    True
    >>> gate.pushed(0)
    >>> gate.start(0, pushes=1, now=2.0), gate.start(1, pushes=1, now=2.0)  # 1 came first
    (False, True)
    >>> gate.waits, gate.wait_time
    (1, 2.0)
"""

from __future__ import annotations

from typing import Any


def check_staleness(max_staleness: int | None) -> int | None:
    """``max_staleness``, checked: an integer >= 0, or ``None`` (no bound)."""
    if max_staleness is not None and (
        isinstance(max_staleness, bool) or not isinstance(max_staleness, int) or max_staleness < 0
    ):
        raise ValueError(f"max_staleness must be an integer >= 0 or None, got {max_staleness!r}")
    return max_staleness


def bounds_staleness(max_staleness: int | None, synchronous: bool) -> bool:
    """Whether a run gates its workers: a bound is set and the algorithm is asynchronous
    (``ssgd``'s rounds have staleness 0 and ignore it)."""
    return max_staleness is not None and not synchronous


class StalenessGate:
    """The two gates of bounded staleness ``bound`` and the records they need."""

    def __init__(self, bound: int):
        self.bound = bound
        self.inflight: list[int] = []  # pulled, not yet pushed: oldest pull first
        self.pulled: dict[int, int] = {}  # pushes applied at each in-flight worker's pull
        self.idle: list[tuple[int, float]] = []  # (worker, since): waiting to start
        self.held: dict[int, float] = {}  # worker -> since: its push is held
        self.waits = 0
        self.wait_time = 0.0
        self.held_starts = self.held_pushes = 0

    # -- the start gate -----------------------------------------------------------------
    def start(self, worker: int, pushes: int, now: float) -> bool:
        """Start ``worker`` (it pulls now, after ``pushes`` pushes) if the start gate
        allows it; otherwise it waits in line from ``now`` on and False."""
        free = self.bound + 1 - len(self.inflight)
        for n, (w, since) in enumerate(self.idle):
            if w == worker:
                if n >= free:
                    return False
                del self.idle[n]
                self._waited(now - since)
                break
        else:
            if len(self.idle) >= free:
                self.queue(worker, now)
                self.held_starts += 1
                return False
        self._started(worker, pushes)
        return True

    def admit(self, worker: int, pushes: int, join: bool, now: float | None = None) -> None:
        """Start ``worker`` without a decision: a replica following the decisions of the
        gate it copies (the Ray runtime's standby of shard 0); a wait in its line to
        start ends at ``now`` (counted as the copied gate counted it)."""
        since = next((t for w, t in self.idle if w == worker), None)
        if join:
            self.forget(worker)
        else:
            self.pushed(worker)
        self.idle = [(w, t) for w, t in self.idle if w != worker]
        if since is not None and now is not None:
            self._waited(now - since)
        self._started(worker, pushes)

    def waiting_state(self) -> dict[str, Any]:
        """The workers waiting (to start, in line; with a held push) and the counts of
        refusals: what a replica needs to decide as this gate would (plain values)."""
        return {
            "idle": [list(entry) for entry in self.idle],
            "held": [[w, t] for w, t in self.held.items()],
            "held_starts": self.held_starts,
            "held_pushes": self.held_pushes,
        }

    def load_waiting(self, state: dict[str, Any]) -> None:
        """A replica: the copied gate's :meth:`waiting_state`."""
        self.idle = [(int(w), float(t)) for w, t in state["idle"]]
        self.held = {int(w): float(t) for w, t in state["held"]}
        self.held_starts, self.held_pushes = int(state["held_starts"]), int(state["held_pushes"])

    def queue(self, worker: int, now: float) -> None:
        """``worker`` waits to start, from ``now`` on, behind the workers already waiting."""
        self.idle.append((worker, now))

    def release(self, pushes: int, now: float) -> list[int]:
        """Start the waiting workers the start gate now allows, first come first served;
        the workers started (they pull now, after ``pushes`` pushes)."""
        started = []
        while self.idle and len(self.inflight) <= self.bound:
            worker, since = self.idle.pop(0)
            self._waited(now - since)
            self._started(worker, pushes)
            started.append(worker)
        return started

    # -- the push gate ------------------------------------------------------------------
    def allows_push(self, worker: int, pushes: int) -> bool:
        """Whether applying in-flight ``worker``'s push now (after ``pushes``) keeps the
        bound (records nothing)."""
        for rank, j in enumerate(self.inflight, start=1):
            if j == worker:
                return True
            if pushes - self.pulled[j] + rank > self.bound:
                return False
        return True

    def hold(self, worker: int, now: float) -> None:
        """``worker``'s push is held from ``now`` on (a later refusal keeps the start)."""
        if worker not in self.held:
            self.held[worker] = now
            self.held_pushes += 1

    def resume(self, worker: int, now: float) -> None:
        """``worker``'s push is allowed at ``now``: the end of its wait, if it was held."""
        since = self.held.pop(worker, None)
        if since is not None:
            self._waited(now - since)

    def may_push(self, worker: int, pushes: int, now: float) -> bool:
        """Whether applying ``worker``'s push now keeps the bound; if not, it is held."""
        if not self.allows_push(worker, pushes):
            self.hold(worker, now)
            return False
        self.resume(worker, now)
        return True

    def pushed(self, worker: int) -> None:
        """``worker``'s push was applied: it is no longer in flight."""
        if worker in self.pulled:
            self.inflight.remove(worker)
            del self.pulled[worker]

    def forget(self, worker: int) -> None:
        """Drop every record of ``worker`` (it joins afresh, or is gone for good)."""
        self.pushed(worker)
        self.idle = [(w, t) for w, t in self.idle if w != worker]
        self.held.pop(worker, None)

    def state_dict(self) -> dict[str, Any]:
        """Everything the gate holds, as plain values (its bound aside: an argument)."""
        return {
            "inflight": list(self.inflight),
            "pulled": [[w, p] for w, p in self.pulled.items()],
            **self.waiting_state(),
            "waits": self.waits,
            "wait_time": self.wait_time,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`."""
        self.inflight = [int(w) for w in state["inflight"]]
        self.pulled = {int(w): int(p) for w, p in state["pulled"]}
        self.load_waiting(state)
        self.waits, self.wait_time = int(state["waits"]), float(state["wait_time"])

    def counters(self) -> dict[str, Any]:
        return {
            "max_staleness": self.bound,
            "waits": self.waits,
            "wait_time": self.wait_time,
            "held_starts": self.held_starts,
            "held_pushes": self.held_pushes,
        }

    def _started(self, worker: int, pushes: int) -> None:
        self.inflight.append(worker)
        self.pulled[worker] = pushes

    def _waited(self, seconds: float) -> None:
        if seconds > 0:  # (a worker let through at once did not wait)
            self.waits += 1
            self.wait_time += seconds
