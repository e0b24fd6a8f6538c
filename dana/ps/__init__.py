"""The parameter-server runtime on Ray: the same master and worker rules, driven by actors.

- :mod:`dana.ps.protocol`: what workers, servers and the driver say to each other (the
  calls, statuses and roles; a push as one record; a relayed call and its one dispatch);
- :mod:`dana.ps.shard`: a parameter-server shard (the master rule on a slice of the
  parameters), with its records (:mod:`dana.ps.records`) and snapshots for evaluations
  and checkpoints (:mod:`dana.ps.snapshots`);
- :mod:`dana.ps.head`: shard 0, the head: the staleness gate, the relay to its standby
  and the other shards (:mod:`dana.ps.relay`), the standby (a head in waiting); its
  roles (head, standby, deposed) and their transitions in :mod:`dana.ps.roles`;
- :mod:`dana.ps.worker`, :mod:`dana.ps.link`: a worker (model replica, its own data
  stream, a worker rule; its pushes made by :mod:`dana.ps.steps`) and its calls to the
  head;
- :mod:`dana.ps.driver`: ``dana train --backend ray``'s driver (:class:`RayRun`), with
  its shard group (:mod:`dana.ps.group`: starting, watching, promoting and rebuilding
  the servers, each built from :mod:`dana.ps.settings`; :mod:`dana.ps.standby`: the
  head's standby) and its evaluation and checkpoint points (:mod:`dana.ps.points`);
- :mod:`dana.ps.recovery`: rebuilding a lost shard from a snapshot and shard 0's log;
- :mod:`dana.ps.calls`, :mod:`dana.ps.replay`: the record of the calls the head passed
  on, and ``dana replay``: a finished run rebuilt from it in one process, without Ray;
- :mod:`dana.ps.membership`: workers that leave for good and workers added while the
  run goes on (the driver's side; the servers' is the relayed ``relay_member`` call);
- :mod:`dana.ps.emulation`: a cluster model (``--cluster``) lived in real time by each
  worker (``--time-scale``): compute, its own link, departures and returns;
- :mod:`dana.ps.log`, :mod:`dana.ps.checkpoint`, :mod:`dana.ps.layout`,
  :mod:`dana.ps.delay`, :mod:`dana.ps.cluster`, :mod:`dana.ps.auth`: the per-push
  log, checkpoints, the split of the parameters, emulated step times, starting or
  joining Ray (and its token authentication).

It stands on the floor (:mod:`dana.train`): the config, the staleness gate
(:mod:`dana.train.rules.gate`), the worker step, the push log, the metrics and the timing
models come from there; it never imports the simulator.

See docs/DISTRIBUTED.md. Importing this package does not import Ray.
"""
