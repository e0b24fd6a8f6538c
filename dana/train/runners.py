"""Runners, found by backend name: the one protocol every runner implements.

A runner executes one :class:`~dana.train.config.TrainConfig` into one run directory,
standing on the floor (:mod:`dana.train`) and nothing else. :func:`dana.train.runner.train`
builds the run's :class:`~dana.train.problem.Problem` and algorithm once, finds the
runner of ``config.backend`` here and calls it. The floor names each runner by its
module and class and imports it only when a run asks for it (so the floor imports no
runner, and a backend's optional dependency is needed only by its runs).

Adding a runner: a new package with a class that follows :class:`Runner`, and one line
in :data:`RUNNERS`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from dana.errors import DanaError

if TYPE_CHECKING:  # (the config validates --backend against RUNNERS: no cycle at run time)
    from dana.algorithms.base import Algorithm
    from dana.train.config import TrainConfig
    from dana.train.problem import Problem
    from dana.train.progress import Progress
    from dana.train.rundir import RunDir


class Runner(Protocol):
    """What :func:`dana.train.runner.train` asks of a runner.

    ``rows``: the metrics rows so far (those of a checkpoint after
    :meth:`load_state_dict`); :meth:`execute` runs to the end, writes ``metrics.csv``
    (and checkpoints) through the :class:`RunDir` and returns the summary
    (:func:`dana.train.metrics.summarize`).
    """

    rows: list[dict[str, float]]

    def __init__(
        self, config: TrainConfig, run: RunDir, problem: Problem, algorithm: Algorithm
    ) -> None: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def execute(self, progress: Progress) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Backend:
    """A runner by name: ``module:cls``, and the module it needs (with how to get it)."""

    module: str
    cls: str
    needs: str | None = None
    install: str = ""


#: The runners, by ``--backend`` name.
RUNNERS: dict[str, Backend] = {
    "sim": Backend("dana.sim.runner", "SimRun"),
    "ray": Backend("dana.ps.launcher", "RayRun", needs="ray", install="pip install 'ray>=2.9'"),
}


def check_backend(name: str) -> Backend:
    """The backend ``name``, once its optional dependency is importable."""
    backend = RUNNERS[name]
    if backend.needs is not None:
        try:
            importlib.import_module(backend.needs)
        except ImportError:
            raise DanaError(f"--backend {name} needs {backend.needs}: {backend.install}") from None
    return backend


def runner_class(name: str) -> type[Runner]:
    """The runner class of backend ``name`` (imported now)."""
    backend = check_backend(name)
    return getattr(importlib.import_module(backend.module), backend.cls)
