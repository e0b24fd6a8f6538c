"""The event-driven simulator (a runner on the floor, :mod:`dana.train`).

- :mod:`dana.sim.simulator`: :class:`Simulator`, a run's state and its events;
- :mod:`dana.sim.events`: what a schedule sees of it (:class:`~dana.sim.events.Events`);
- :mod:`dana.sim.schedules`: the orders of events (free, rounds, bounded);
  :mod:`dana.sim.clock`: a cluster's; :mod:`dana.sim.bound`: bounded staleness;
- :mod:`dana.sim.compute`: the batched and threaded gradient engines;
- :mod:`dana.sim.driver`: ``dana train --backend sim``'s run loop (:class:`SimRun`).

The timing models it draws step times from are the floor's (:mod:`dana.train.cluster.timing`),
re-exported here.
"""

from dana.sim.simulator import Simulator
from dana.train.cluster.timing import TIMING_MODELS, TimingModel, build_timing
from dana.train.records.pushlog import PushLog

__all__ = ["TIMING_MODELS", "PushLog", "Simulator", "TimingModel", "build_timing"]
