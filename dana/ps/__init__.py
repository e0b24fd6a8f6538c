"""The parameter-server runtime on Ray: the same master and worker rules, driven by actors.

- :mod:`dana.ps.server`: a parameter-server shard (the master rule on a slice of the
  parameters) and the protocol the workers speak to it;
- :mod:`dana.ps.worker`: a worker (model replica, its own data stream, a worker rule);
- :mod:`dana.ps.link`: a worker's calls to all shards at once;
- :mod:`dana.ps.relay`, :mod:`dana.ps.snapshots`: shard 0's relay to the other shards
  (always with ``--servers`` > 1), a shard's snapshots for evaluations and checkpoints;
- :mod:`dana.ps.launcher`: ``dana train --backend ray``'s driver (:class:`RayRun`);
- :mod:`dana.ps.recovery`: rebuilding a lost shard from a snapshot and shard 0's log;
- :mod:`dana.ps.log`, :mod:`dana.ps.checkpoint`, :mod:`dana.ps.layout`,
  :mod:`dana.ps.delay`, :mod:`dana.ps.cluster`, :mod:`dana.ps.auth`: the per-push
  log, checkpoints, the split of the parameters, emulated step times, starting or
  joining Ray (and its token authentication).

It stands on the floor (:mod:`dana.train`): the config, the staleness gate
(:mod:`dana.train.gate`), the worker step, the push log, the metrics and the timing
models come from there; it never imports the simulator.

See docs/DISTRIBUTED.md. Importing this package does not import Ray.
"""
