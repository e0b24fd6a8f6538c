"""The distributed runtime: the same master and worker rules, driven by Ray actors.

- :mod:`dana.dist.server`: a parameter-server shard (the master rule on a slice of the
  parameters) and the protocol the workers speak to it;
- :mod:`dana.dist.worker`: a worker (model replica, its own data stream, a worker rule);
- :mod:`dana.dist.link`: a worker's calls to all shards at once;
- :mod:`dana.dist.gate`: bounded staleness (``--max-staleness``), the simulator's gates;
- :mod:`dana.dist.launcher`: ``dana train --backend ray``'s driver (:class:`RayRun`);
- :mod:`dana.dist.recovery`: rebuilding a lost shard from a snapshot and shard 0's log;
- :mod:`dana.dist.log`, :mod:`dana.dist.checkpoint`, :mod:`dana.dist.layout`,
  :mod:`dana.dist.delay`, :mod:`dana.dist.cluster`, :mod:`dana.dist.auth`: the per-push
  log, checkpoints, the split of the parameters, emulated step times, starting or
  joining Ray (and its token authentication).

See docs/DISTRIBUTED.md. Importing this package does not import Ray.
"""
