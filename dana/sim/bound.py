"""Bounded staleness in the simulator: the floor's gate and the pushes it holds.

The rule is the floor's (:class:`~dana.train.rules.gate.StalenessGate`, stale synchronous
parallel): a worker starts only while the bound allows it, and a push that would break
the bound waits at the servers, held, until a later push frees it. The simulator counts
every push as an update. Held pushes are applied in the order they were held, at the
learning rate of their release (:meth:`Bound.release`).
"""

from __future__ import annotations

from typing import Any

from dana.sim.events import Events, Work
from dana.train.rules.gate import StalenessGate


class Bound:
    """The staleness gate (``gate``) and the pushes it holds (``held``: worker, work and
    the time it was held, in the order held)."""

    def __init__(self, max_staleness: int):
        self.max_staleness = max_staleness
        self.gate = StalenessGate(max_staleness)
        self.held: list[tuple[int, Work, float]] = []

    def hold(self, i: int, work: Work, now: float) -> None:
        """Hold worker ``i``'s counted ``work`` from ``now``."""
        self.gate.hold(i, now)
        self.held.append((i, work, now))

    def release(self, sim: Events) -> list[int]:
        """Apply the held pushes the bound now allows, in the order they were held
        (:meth:`Simulator.push <dana.sim.simulator.Simulator.push>`); return the waiting
        workers it now lets start, in the order they began to wait."""
        n = 0
        while n < len(self.held):
            i, work, _ = self.held[n]
            if not self.gate.allows_push(i, sim.updates):
                n += 1
                continue
            del self.held[n]
            self.gate.resume(i, sim.sim_time)
            sim.push(i, work)
            self.pushed(i, sim.sim_time)
            n = 0  # (a push may free an earlier one)
        return self.gate.release(sim.updates, sim.sim_time)

    def pushed(self, i: int, now: float) -> None:
        """Worker ``i``'s push is applied: it asks to start again at ``now``."""
        self.gate.pushed(i)
        self.gate.queue(i, now)

    def forget(self, i: int) -> None:
        """Worker ``i`` left: its held push is lost and the gate forgets it."""
        self.held = [h for h in self.held if h[0] != i]
        self.gate.forget(i)

    def state_dict(self) -> dict[str, Any]:
        gate = self.gate.state_dict()  # (its waits are saved with the run's)
        return {
            "inflight": gate["inflight"],
            "held": [
                [i, w.tensor.clone(), w.loss, since, w.is_message] for i, w, since in self.held
            ],
            "idle": gate["idle"],
        }

    def load_state_dict(self, state: dict[str, Any], pulled_at: list[int]) -> None:
        # Entries of older checkpoints have no fifth field: they held messages.
        self.held = [
            (
                int(e[0]),
                Work(e[1].clone(), float(e[2]), bool(e[4]) if len(e) > 4 else True, None, True),
                float(e[3]),
            )
            for e in state["held"]
        ]
        inflight = [int(i) for i in state["inflight"]]
        self.gate = StalenessGate(self.max_staleness)
        self.gate.load_state_dict(
            {
                "inflight": inflight,
                "pulled": [[i, pulled_at[i]] for i in inflight],  # (every push updates)
                "idle": state["idle"],
                "held": [[i, since] for i, _, since in self.held],
                "waits": state.get("waits", 0),
                "wait_time": state.get("wait_time", 0.0),
                "held_starts": 0,  # (counts of refusals the simulator does not report)
                "held_pushes": 0,
            }
        )
