"""What a run trains: data, a model as a flat vector, its gradient and its evaluation.

- :mod:`~dana.train.task.problem`: a dataset and a model of dana's
  (:class:`~dana.train.task.problem.Problem`) and the protocol the runners read
  (:class:`~dana.train.task.problem.TrainingProblem`);
- :mod:`~dana.train.task.flat`: a model whose parameters are views into a flat vector;
- :mod:`~dana.train.task.stacked`: many workers' gradients at once;
- :mod:`~dana.train.task.batches`: the streams of mini-batches;
- :mod:`~dana.train.task.reading`, :mod:`~dana.train.task.inputs`: ``dana.fit``'s data
  and a model's input (a tensor, tuple or dict of tensors);
- :mod:`~dana.train.task.evaluation`: what an evaluation measures.
"""
