"""A shard's snapshots: at which steps it takes them, and those the driver has not fetched.

At every evaluation or checkpoint point (a number of steps; for a synchronous rule,
``ssgd`` or ``diloco``, the first round boundary at or after it) a shard server
snapshots the parameters to evaluate, and at checkpoint points its whole state, without
stopping (:mod:`dana.ps.server`); the driver fetches them with ``poll``. A fresh run
also snapshots its start (point 0), a resumed one only the points after its checkpoint.
"""

from __future__ import annotations

from typing import Any


class Snapshots:
    """The points still to snapshot, and the snapshots taken since the last :meth:`drain`."""

    def __init__(self, evals: list[int], checkpoints: list[int], steps: int, fresh: bool):
        self.evals = {p for p in evals if p > steps or fresh}
        self.checkpoints = {p for p in checkpoints if p > steps}
        self.points = sorted(self.evals | self.checkpoints)
        self.taken: list[dict[str, Any]] = []

    def due(self, steps: int, moved: bool, synchronous: bool) -> list[int]:
        """The points passed at ``steps`` (synchronous: only once the round is complete,
        ``moved``, so never at a local step); they are no longer pending."""
        due: list[int] = []
        if self.points and steps >= self.points[0] and (moved or not synchronous):
            while self.points and steps >= self.points[0]:
                due.append(self.points.pop(0))
        return due

    def add(self, snapshot: dict[str, Any]) -> None:
        self.taken.append(snapshot)

    def drain(self) -> list[dict[str, Any]]:
        taken, self.taken = self.taken, []
        return taken

    def state_dict(self) -> dict[str, Any]:
        """The points still to snapshot (those taken go to the driver with the polls)."""
        return {"points": list(self.points)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.points = [int(p) for p in state["points"]]
