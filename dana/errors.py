"""User-facing errors.

A :class:`DanaError` is a problem with the user's input (a bad option, a missing or
corrupt file, an invalid config). The command line prints its message, without a
traceback, and exits with status 2.

Exit status of the ``dana`` command: 0 success; 2 bad input; 3 the training diverged
(a result); 4 a fault the run could not survive (:class:`FaultError`); 75 preempted
(SIGTERM or SIGINT: a checkpoint of the moment was written, :class:`Preempted`,
``--resume`` continues); 1 an unexpected internal error; 130 interrupted.
"""

EXIT_OK, EXIT_ERROR, EXIT_BAD_INPUT, EXIT_DIVERGED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
EXIT_FAULT = 4  # a fault the run could not survive (shard 0 and its standby, or shard 0
# of a --no-standby run, lost): --resume
EXIT_PREEMPTED = 75  # EX_TEMPFAIL: stopped by SIGTERM/SIGINT, checkpointed: --resume


class DanaError(Exception):
    """Bad input from the user: the message says what is wrong and what to do."""


class DataError(DanaError, ValueError):
    """A dataset file is missing, truncated or not in the expected format."""


class ConfigError(DanaError, ValueError):
    """An option or a config file is out of range or invalid."""


class FaultError(Exception):
    """A fault the run could not survive (shard 0 and its standby lost together, shard 0
    of a run without a standby, a lost actor that cannot be placed again, every worker
    out of its restarts): not bad input. The command line prints the message (it says
    how to continue, usually ``dana train --resume``) and exits with status 4."""


class WriteError(DanaError, OSError):
    """A file could not be written (a full disk, no permission); nothing half-written is
    left, and a file it was to replace is kept as it was."""


class ArgumentTypeError(DanaError, TypeError):
    """An argument of the Python entries (``dana.fit``, ``dana.simulate``) of the wrong
    type, or a keyword they do not take: a ``TypeError``, as Python raises for a call
    that does not fit a function's signature."""


class Preempted(Exception):
    """The run was stopped by SIGTERM or SIGINT and wrote a checkpoint of that moment
    (:mod:`dana.train.records.preempt`): not a failure. The command line prints the message
    (where the checkpoint is and the ``--resume`` command) and exits with status 75
    (:data:`EXIT_PREEMPTED`)."""
