"""dana: asynchronous distributed training with momentum.

DANA (Hakimi, Barkai, Gabel, Schuster, "Taming Momentum in a Distributed Asynchronous
Environment", arXiv 1907.11612), its baselines, an exact event-driven simulator of ``k``
asynchronous workers, and a parameter-server runtime on Ray.

The names below are imported on first use (PEP 562), so that ``dana --version`` and
``dana --help`` do not pay for torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from dana.version import __version__

#: Each public name and the module that defines it (a submodule: None).
_PUBLIC = {
    "FitResult": "dana.fitting",
    "fit": "dana.fitting",
    "SimulationResult": "dana.api",
    "simulate": "dana.api",
    "Simulator": "dana.sim",
    "load_model": "dana.train.records.modelfile",
    "algorithms": None,
    "optim": None,
}

__all__ = sorted(_PUBLIC) + ["__version__"]


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'dana' has no attribute {name!r}")
    module = _PUBLIC[name]
    value = (
        importlib.import_module(f"dana.{name}")
        if module is None
        else getattr(importlib.import_module(module), name)
    )
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
