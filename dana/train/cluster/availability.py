"""When each worker of a cluster is away: preemptions at given times, or at random.

A *spell* is a worker's time away: it leaves at ``leave`` and rejoins at ``rejoin``
(``None``: gone for good). Given spells come from the cluster's
``availability.preemptions`` (per worker, in time order, never overlapping); random
spells from ``availability.random``: every worker, from the time it is (back) in the
run, stays ``~ Exp(mean_up_ms)``, then is away ``~ Exp(mean_down_ms)``, each worker
drawing from a generator of its own (so the spells do not depend on the order of
events). What a departure does to the run is the runner's and the rules' business
(docs/ALGORITHMS.md, "Workers that leave and join").
"""

from __future__ import annotations

from typing import Any

from dana.train.cluster.steptimes import AVAILABILITY_SALT, worker_generator


class Availability:
    """Each worker's spells away, one at a time (:meth:`next_spell`)."""

    def __init__(self, availability: dict[str, Any], workers: int, seed: int = 0):
        self.given: list[list[tuple[float, float | None]]] = [[] for _ in range(workers)]
        for p in availability["preemptions"]:
            self.given[p["worker"]].append((p["leave_ms"], p["rejoin_ms"]))
        for spells in self.given:
            spells.sort(key=lambda s: s[0])
        self.position = [0] * workers  # the next given spell of each worker
        random = availability["random"]
        self.random = (random["mean_up_ms"], random["mean_down_ms"]) if random else None
        self.rngs = (
            [worker_generator(seed, AVAILABILITY_SALT, i) for i in range(workers)] if random else []
        )

    @property
    def any(self) -> bool:
        """Whether any worker is ever away."""
        return self.random is not None or any(self.given)

    def next_spell(self, worker: int, now: float) -> tuple[float, float | None] | None:
        """``worker``'s next spell away, for a worker in the run since ``now``: ``(leave,
        rejoin)`` with ``leave > now``, or None when it stays to the end."""
        if self.random is not None:
            up, down = self.random
            rng = self.rngs[worker]
            leave = now + float(rng.exponential(up))
            return leave, leave + float(rng.exponential(down))
        spells, n = self.given[worker], self.position[worker]
        while n < len(spells) and spells[n][0] <= now:
            n += 1  # (a spell that began before the worker was in the run: passed)
        self.position[worker] = n + 1
        return spells[n] if n < len(spells) else None

    def state_dict(self) -> dict[str, Any]:
        return {
            "position": list(self.position),
            "rngs": [r.bit_generator.state for r in self.rngs],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = [int(p) for p in state["position"]]
        for rng, s in zip(self.rngs, state["rngs"]):
            rng.bit_generator.state = s
