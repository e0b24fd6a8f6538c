"""Graceful preemption: SIGTERM or SIGINT stops a run at the next step with a checkpoint.

A scheduler that preempts a job (Slurm, Kubernetes, a spot instance) sends SIGTERM and
waits a little before SIGKILL. While :func:`watching` is active, the first SIGTERM or
SIGINT only sets a flag (:func:`requested`); the runner looks at it after every step
(the simulator) or every poll (the Ray driver), writes a checkpoint of the state at
that moment and raises :class:`~dana.errors.Preempted`; ``dana`` then prints one line
(the checkpoint and the ``--resume`` command) and exits with status 75
(:data:`~dana.errors.EXIT_PREEMPTED`, ``EX_TEMPFAIL``). A second signal while the
checkpoint is written raises :class:`KeyboardInterrupt` (the old behaviour: exit 130).
A signal while a run is starting (the Ray driver: Ray itself, its actors) ends the
start at the next look, with no checkpoint and status 75 too (:func:`preempted_at_start`);
one while it is being built (its data and model loaded, its checkpoint read), before any
of that, at once (:func:`starting`).

The rule: a checkpoint written on preemption is the run's whole state at a step
boundary, so ``--resume`` continues it exactly as if it had never stopped (the
simulator: bit for bit; Ray: every push applied once on every shard).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

from dana.errors import Preempted

#: The signals that preempt a run.
SIGNALS = (signal.SIGTERM, signal.SIGINT)

_received: list[str] = []  # the names of the signals received while watching
_watching = [0]  # nesting depth of watching()


def requested() -> str | None:
    """The name of the signal that asked the run to stop (``SIGTERM``), or None."""
    return _received[0] if _received else None


def _handler(signum: int, frame: Any) -> None:
    if _received:  # a second signal: stop at once
        raise KeyboardInterrupt
    _received.append(signal.Signals(signum).name)


def install() -> None:
    """(Re)install the handlers, while :func:`watching` (``ray.init`` replaces the
    SIGTERM handler with its own: the Ray driver calls this again after it)."""
    if _watching[0] and threading.current_thread() is threading.main_thread():
        for sig in SIGNALS:
            signal.signal(sig, _handler)


@contextlib.contextmanager
def watching() -> Iterator[None]:
    """Turn SIGTERM and SIGINT into a request to stop (:func:`requested`) for the block;
    the previous handlers come back after it. Outside the main thread (where signals
    cannot be handled) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in SIGNALS}
    _watching[0] += 1
    if _watching[0] == 1:
        _received.clear()
    install()
    try:
        yield
    finally:
        _watching[0] -= 1
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if not _watching[0]:
            _received.clear()


@contextlib.contextmanager
def starting(then: str) -> Iterator[None]:
    """While a run is being built, before :func:`watching`: SIGTERM or SIGINT raise
    :class:`~dana.errors.Preempted` at once, its message ending with ``then`` (what was
    written and how to go on). Inside :func:`watching` (runs packed into one process)
    or outside the main thread, nothing changes: the flag stops the run at its first
    step."""
    if _watching[0] or threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        raise Preempted(f"preempted by {name} while the run was being built: {then}")

    previous = {sig: signal.signal(sig, stop) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def preempted(resume: str, where: str) -> Preempted:
    """The exception a runner raises once its checkpoint (``where``: at which step) is
    written: its message names the signal, the point and the command that continues."""
    return Preempted(
        f"preempted by {requested() or 'a signal'}: checkpoint written {where}; continue "
        f"with `dana train --resume {resume}`"
    )


def preempted_at_start(resume: str, checkpointed: bool) -> Preempted:
    """The exception a runner raises when the signal came while the run was starting
    (before it could take a checkpoint of its own): nothing more is written, and
    ``--resume`` starts again from the last checkpoint (``checkpointed``), or from the
    beginning (the run directory keeps its ``config.json``)."""
    since = "its last checkpoint" if checkpointed else "the beginning (no checkpoint yet)"
    return Preempted(
        f"preempted by {requested() or 'a signal'} while the run was starting: no checkpoint "
        f"written; start it again from {since} with `dana train --resume {resume}`"
    )
