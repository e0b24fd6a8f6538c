"""The cluster a run trains on, and the time it takes.

- :mod:`~dana.train.cluster.model`: the cluster file (compute, network, availability)
  and its presets;
- :mod:`~dana.train.cluster.timing`: the timing models of step times;
  :mod:`~dana.train.cluster.steptimes`: each computation's duration on a cluster;
- :mod:`~dana.train.cluster.network`: the messages' time on the links;
- :mod:`~dana.train.cluster.availability`: when each worker is away;
- :mod:`~dana.train.cluster.partition`: the data each worker draws from;
  :mod:`~dana.train.cluster.classmeter`: the classes behind the applied updates;
- :mod:`~dana.train.cluster.fit`: a cluster model fitted to a Ray run's records.
"""
