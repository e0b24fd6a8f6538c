"""The floor: what every runner stands on, and nothing that is a runner.

- :mod:`dana.train.config`: :class:`~dana.train.config.TrainConfig`, every option of a run;
- :mod:`dana.train.options`: the option table both CLIs are built from;
- :mod:`dana.train.problem`, :mod:`dana.train.flat`, :mod:`dana.train.batches`: the data
  and model of a run as a flat parameter vector, and the stream of batches;
- :mod:`dana.train.schedule`, :mod:`dana.train.timing`: the learning-rate schedule and
  the timing models of step times (simulated, or emulated on Ray);
- :mod:`dana.train.step`: a worker's step (gradient, weight decay, message);
- :mod:`dana.train.gate`: the bounded-staleness gate;
- :mod:`dana.train.pushlog`, :mod:`dana.train.metrics`: the per-push log, the metrics
  row and the summary;
- :mod:`dana.train.rundir`, :mod:`dana.train.progress`: the run directory, the progress bar;
- :mod:`dana.train.runners`, :mod:`dana.train.backends`, :mod:`dana.train.training`: the
  runner protocol, runners by backend name, and ``dana train``'s
  :func:`~dana.train.training.train`.

The runners (:mod:`dana.sim`, :mod:`dana.ps`) import the floor; the floor names them
only in :data:`dana.train.backends.RUNNERS` and imports one when a run asks for it.
docs/ARCHITECTURE.md draws the layers.
"""
