"""Runners by backend name: the registry (``--backend``), importing a runner only when asked.

The floor names each runner by its module and class, and imports it only when a run
asks for it: the floor imports no runner, and a backend's optional dependency (Ray) is
needed only by its runs. A runner follows :class:`dana.train.runners.Runner`; adding
one is one line in :data:`RUNNERS`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from dana.errors import DanaError


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


def runner_class(name: str) -> Any:
    """The runner class of backend ``name`` (imported now; a
    :class:`dana.train.runners.Runner`)."""
    backend = check_backend(name)
    return getattr(importlib.import_module(backend.module), backend.cls)
