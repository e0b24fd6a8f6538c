"""dana: asynchronous distributed training with momentum.

DANA (Hakimi, Barkai, Gabel, Schuster, "Taming Momentum in a Distributed Asynchronous
Environment", arXiv 1907.11612), its baselines, an exact event-driven simulator of ``k``
asynchronous workers, and a parameter-server runtime on Ray.
"""

from dana import algorithms, optim
from dana.api import SimulationResult, simulate
from dana.fitting import FitResult, fit
from dana.sim import Simulator
from dana.train.modelfile import load_model
from dana.version import __version__

__all__ = [
    "FitResult",
    "SimulationResult",
    "Simulator",
    "algorithms",
    "fit",
    "load_model",
    "optim",
    "simulate",
    "__version__",
]
