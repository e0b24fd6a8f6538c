"""The event-driven simulator and its timing models."""

from dana.sim.simulator import PushLog, Simulator
from dana.sim.timing import TIMING_MODELS, TimingModel, build_timing

__all__ = ["TIMING_MODELS", "PushLog", "Simulator", "TimingModel", "build_timing"]
