"""What a run writes and how it stops, the same in every runner.

- :mod:`~dana.train.records.rundir`: the run directory, every file atomically;
- :mod:`~dana.train.records.metrics`: the metrics row and the summary;
- :mod:`~dana.train.records.pushlog`: the per-push log;
- :mod:`~dana.train.records.modelfile`: the model a run keeps (``model.safetensors``);
- :mod:`~dana.train.records.progress`: the progress bar and the closing table;
- :mod:`~dana.train.records.tracking`: MLflow and W&B tracking;
- :mod:`~dana.train.records.preempt`: SIGTERM or SIGINT stops a run with a checkpoint.
"""
