"""Runners by backend name: the registry (``--backend``), importing a runner only when asked.

The floor names each runner by its module and class, and imports it only when a run
asks for it: the floor imports no runner, and a backend's optional dependency (Ray) is
needed only by its runs. A runner follows :class:`dana.train.runners.Runner`; adding
one is one line in :data:`RUNNERS` (or a call of :func:`register`). Nothing outside the
runners and this table tests a backend's name: what the package may assume of a
backend's runs is its entry's data (``deterministic``, ``wall_clock``), and what a
run needs of its runner is the protocol.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from dana.errors import ConfigError, DanaError


@dataclass(frozen=True)
class Backend:
    """A runner by name: ``module:cls``, the module it needs (with how to get it), and
    what the rest of the package may assume of its runs:

    - ``deterministic``: the same settings give the same run, bit for bit (``dana sweep
      --reuse`` copies a finished run of the same settings instead of running it);
    - ``wall_clock``: its workers run on real time, so a rule that sizes each worker's
      work by its speed (Dynamic Local Updates) learns the speeds only from emulated
      step times (``--time-scale``);
    - ``cluster_model``: its clock carries a simulated cluster (``--cluster``: the
      network, drift, departures; dana.train.cluster);
    - ``partitions``: its workers draw from their own parts of the data
      (``--partition``; dana.train.cluster.partition);
    - ``processes``: its workers and server shards are processes of their own, on a
      cluster it may join (``--address``), with a standby of shard 0 (``--no-standby``
      drops it) and emulated step times (``--time-scale``): options refused elsewhere;
    - ``emulates_cluster``: it runs a cluster model in real time with ``--time-scale S >
      0`` (each worker sleeps its modelled compute and transfer times and leaves and
      returns at the model's times);
    - ``elastic``: workers can be added to a running run (``--max-workers``,
      ``--grow-at``; dana.train.rules.members)."""

    module: str
    cls: str
    summary: str = ""  #: what it runs, for ``--backend``'s help
    needs: str | None = None
    install: str = ""
    deterministic: bool = False
    wall_clock: bool = False
    cluster_model: bool = False
    partitions: bool = False
    processes: bool = False
    emulates_cluster: bool = False
    elastic: bool = False


#: The runners, by ``--backend`` name (:func:`register` adds one).
RUNNERS: dict[str, Backend] = {
    "sim": Backend(
        "dana.sim.driver",
        "SimRun",
        "the simulator",
        deterministic=True,
        cluster_model=True,
        partitions=True,
    ),
    "ray": Backend(
        "dana.ps.driver",
        "RayRun",
        "real workers on Ray",
        needs="ray",
        install="pip install 'ray>=2.9'",
        wall_clock=True,
        processes=True,
        emulates_cluster=True,
        elastic=True,
    ),
}


def register(name: str, backend: Backend) -> Backend:
    """Add a runner under ``name`` (``--backend name``, ``dana.fit(backend=name)``)."""
    if name in RUNNERS and RUNNERS[name] != backend:
        raise ValueError(f"a backend named {name!r} is already registered")
    RUNNERS[name] = backend
    return backend


def check_name(name: Any, flag: str = "--backend") -> Backend:
    """The backend ``name``; ConfigError naming the registered ones if there is none."""
    if not isinstance(name, str) or name not in RUNNERS:
        raise ConfigError(f"{flag} {name!r} is unknown; choose one of: {', '.join(RUNNERS)}")
    return RUNNERS[name]


def check_backend(name: str) -> Backend:
    """The backend ``name``, once its optional dependency is importable."""
    backend = check_name(name)
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


def backends_help() -> str:
    """``--backend``'s help: every registered runner with what it runs."""
    return ", ".join(f"{name} ({b.summary})" if b.summary else name for name, b in RUNNERS.items())
