"""The rules every runner applies around the algorithms' own.

- :mod:`~dana.train.rules.step`: a worker's step (gradient, weight decay, message);
- :mod:`~dana.train.rules.schedule`: the learning-rate schedule and the rate of the
  next update;
- :mod:`~dana.train.rules.gate`: the bounded-staleness gate;
- :mod:`~dana.train.rules.codecs`: the codecs of the messages;
- :mod:`~dana.train.rules.members`: elastic membership (how many workers, when it grows).
"""
