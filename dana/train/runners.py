"""The one protocol every runner implements.

A runner executes one :class:`~dana.train.config.TrainConfig` into one run directory,
standing on the floor (:mod:`dana.train`) and nothing else. :func:`dana.train.training.train`
builds the run's :class:`~dana.train.task.problem.Problem` and algorithm once, finds the
runner of ``config.backend`` by name (:mod:`dana.train.backends`) and calls it.

Adding a runner: a new package with a class that follows :class:`Runner`, and one line
in :data:`dana.train.backends.RUNNERS`.
"""

from __future__ import annotations

from typing import Any, Protocol

from torch import Tensor

from dana.algorithms.base import Algorithm
from dana.train.config import TrainConfig
from dana.train.records.progress import Progress
from dana.train.records.pushlog import PushLog
from dana.train.records.rundir import RunDir
from dana.train.task.problem import TrainingProblem


class Runner(Protocol):
    """What :func:`dana.train.training.train` and :func:`dana.fit` ask of a runner.

    - :meth:`check` (a class method): what this backend refuses of a config and its
      problem, before anything is written (the simulator: per-worker state that does
      not fit in memory), raising :class:`~dana.errors.ConfigError`;
    - ``threads``: the CPU threads the run may use (``dana train --threads``; a runner
      whose work runs elsewhere may ignore it);
    - ``rows``: the metrics rows so far (those of a checkpoint after
      :meth:`load_state_dict`);
    - :meth:`execute` runs to the end, writes ``metrics.csv`` (and checkpoints) through
      the :class:`RunDir` and returns the summary (:func:`dana.train.records.metrics.summarize`);
      a runner may also offer ``execute_steps(progress)``, the same as a generator that
      yields after each step and returns the summary (the simulator's: runs packed into
      one process advance in turn, :mod:`dana.sim.pack`), which ``train`` then drives;
    - then ``log``, the per-push log (:class:`~dana.train.records.pushlog.PushLog`), and
      :meth:`final_params`, the master's parameters at the end as evaluated.
    """

    rows: list[dict[str, float]]

    def __init__(
        self,
        config: TrainConfig,
        run: RunDir,
        problem: TrainingProblem,
        algorithm: Algorithm | None = None,
        *,
        threads: int = 1,
    ) -> None: ...

    @classmethod
    def check(cls, config: TrainConfig, problem: TrainingProblem) -> None: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def execute(self, progress: Progress) -> dict[str, Any]: ...

    @property
    def log(self) -> PushLog: ...

    def final_params(self) -> Tensor: ...
