"""The floor: what every runner stands on, and nothing that is a runner.

- :mod:`dana.train.config`: :class:`~dana.train.config.TrainConfig`, every option of a
  run; :mod:`dana.train.options`: the option table both CLIs are built from;
  :mod:`dana.train.entries`: what the Python entries share;
- :mod:`dana.train.runners`: the runner protocol; :mod:`dana.train.backends`: runners by
  backend name; :mod:`dana.train.training`: ``dana train``'s run;
- :mod:`dana.train.device`, :mod:`dana.train.resources`: the device, threads and memory;
- :mod:`dana.train.task`: the data, the flat model, its gradient and evaluation;
- :mod:`dana.train.rules`: a worker's step, the rate schedule, the staleness gate, the
  codecs, membership;
- :mod:`dana.train.cluster`: the cluster model, timing, network, availability,
  partitions;
- :mod:`dana.train.records`: the run directory, metrics, push log, model file,
  progress, tracking, preemption.

The runners (:mod:`dana.sim`, :mod:`dana.ps`) import the floor; the floor names them
only in :data:`dana.train.backends.RUNNERS` and imports one when a run asks for it.
docs/ARCHITECTURE.md draws the layers.
"""
