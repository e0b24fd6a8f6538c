"""Experiments: sweeps of many training runs, and reports (tables and plots) of their results.

- :mod:`~dana.experiments.grid`: a sweep's spec and its expansion into cells;
- :mod:`~dana.experiments.presets`: the shipped specs (``dana/presets/*.yaml``);
- :mod:`~dana.experiments.layout`: a results directory's files and each cell's state;
- :mod:`~dana.experiments.sweep`: running the cells as ``dana train`` subprocesses;
- :mod:`~dana.experiments.results`: reading and grouping the runs of a directory;
- :mod:`~dana.experiments.targets`: time to a target error, speed-up over ssgd;
- :mod:`~dana.experiments.table`, :mod:`~dana.experiments.plots`,
  :mod:`~dana.experiments.report`: the report;
- :mod:`~dana.experiments.cli`: ``dana sweep``, ``dana report``, ``dana presets``.
"""
