"""What a schedule sees of the simulator: its state and its events.

:class:`dana.sim.simulator.Simulator` is the implementation; a schedule
(:mod:`dana.sim.schedules`, :mod:`dana.sim.clock`) orders these events and touches
nothing else.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

from torch import Tensor

from dana.algorithms.base import WorkerRule
from dana.train.rules.codecs import Wire
from dana.train.rules.step import Loss


class Work(NamedTuple):
    """A computation made and not yet applied.

    ``tensor`` is its gradient, or (``is_message``) the message a rule with local steps
    made of it at ``lr`` (``None``: the rate when it is applied); ``counted``: whether
    the simulator has counted its step yet.
    """

    tensor: Tensor
    loss: Loss
    is_message: bool
    lr: float | None
    counted: bool


class Events(Protocol):
    k: int  #: workers
    synchronous: bool  #: the algorithm runs in rounds (``ssgd``)
    sim_time: float  #: simulated time, ms: a schedule sets it as events happen
    updates: int  #: master updates applied
    batch: list[Any]  #: each worker's batch, taken at its pull
    sent: Tensor  #: each worker's pulled parameters, ``(k, d)``
    worker_rule: WorkerRule
    bound: Any  #: bounded staleness, if any (a dana.sim.bound.Bound: it imports this module)
    wire: Wire | None  #: the codec of the pushes, if any

    def pull(self, i: int) -> None:
        """Worker ``i`` pulls the master's parameters and takes its next batch."""

    def advance(self, i: int) -> None:
        """Worker ``i`` takes its next batch without pulling (a local step)."""

    def compute(self, i: int, *, count: bool = True) -> Work | None:
        """Worker ``i``'s computation, to apply later (``None``: a local step)."""

    def push(self, i: int, work: Work | None = None) -> bool:
        """Worker ``i``'s push reaches the master (False: a local step)."""

    def hold(self, i: int, work: Work, now: float) -> None:
        """The bound refuses worker ``i``'s push: it waits at the servers."""

    def leave(self, i: int) -> bool:
        """Worker ``i`` leaves (True: a computation under way was lost)."""

    def join(self, i: int) -> None:
        """Worker ``i`` returns."""
