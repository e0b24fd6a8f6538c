"""Elastic membership of a run: how many workers it may hold, and when it grows.

A run starts with ``workers`` (``k``) workers and may hold up to ``max_workers``
(``k_max``, default ``k``): the rules are built for ``k_max`` workers up front (their
per-worker state, e.g. DANA-Zero's ``v_i``, is sized then), and the workers ``k ..
k_max - 1`` start outside the run, as if they had left before the first step
(``master.leave(i, lr)``: nothing to drop yet). A worker added later takes the lowest
index never used (``master.join(i)``). ``grow_at`` (``--grow-at STEP:N[,STEP:N...]``)
adds ``N`` workers once the run has taken ``STEP`` steps; a running run also takes
requests (:data:`ADD_WORKERS_FILE` in its run directory, read by the Ray driver).

Only a runner whose backend says ``elastic`` (:mod:`dana.train.backends`) takes
``grow_at`` and ``max_workers``; the simulator's membership is its cluster's
availability (``--cluster``).
"""

from __future__ import annotations

from typing import Any

from dana.errors import ConfigError

#: A file in the run directory that asks a running Ray run for more workers: its text is
#: the number to add (the driver reads it, removes it and starts them).
ADD_WORKERS_FILE = "add-workers"

#: The most workers one run may hold (each push's log records who was live as a bitmask
#: of one 64-bit integer).
MAX_WORKERS = 63


def capacity(config: Any) -> int:
    """``k_max``: the most workers ``config``'s run may hold at once (its rules' size)."""
    return config.max_workers if config.max_workers is not None else config.workers


def parse_grow_at(text: str | None, flag: str = "--grow-at") -> list[tuple[int, int]]:
    """``"STEP:N,STEP:N"`` as ``[(step, n), ...]`` in step order; ConfigError naming the
    bad part and the form."""
    if text is None or text == "":
        return []
    out = []
    for part in str(text).split(","):
        step, _, n = part.strip().partition(":")
        try:
            pair = int(step), int(n)
        except ValueError:
            pair = (-1, 0)
        if pair[0] < 0 or pair[1] < 1:
            raise ConfigError(
                f"{flag} {text!r}: {part.strip()!r} is not STEP:N (a step >= 0 and a number "
                "of workers >= 1 to add then), e.g. 40:2,80:1"
            )
        out.append(pair)
    return sorted(out)


def check_members(config: Any, elastic: bool, flag: Any) -> None:
    """``max_workers`` and ``grow_at`` of a valid run: room for every worker it grows
    to, on a backend that can add workers."""
    grows = parse_grow_at(config.grow_at, flag("grow_at"))
    k_max = capacity(config)
    if config.max_workers is None and not grows:
        return
    if not elastic:
        raise ConfigError(
            f"{flag('max_workers')} and {flag('grow_at')} add workers to a running run, "
            f"which {flag('backend')} {config.backend} cannot; use {flag('backend')} ray "
            f"(the simulator's workers leave and return through {flag('cluster')})"
        )
    if k_max < config.workers or k_max > MAX_WORKERS:
        raise ConfigError(
            f"{flag('max_workers')} {k_max}: must be between {flag('workers')} "
            f"({config.workers}) and {MAX_WORKERS}"
        )
    added = sum(n for _, n in grows)
    if config.workers + added > k_max:
        raise ConfigError(
            f"{flag('grow_at')} {config.grow_at} adds {added} workers to {config.workers}, "
            f"more than {flag('max_workers')} {k_max} (the rules are built for that many): "
            f"raise {flag('max_workers')} to {config.workers + added}"
        )
    if grows and config.build_algorithm().synchronous:
        raise ConfigError(
            f"{flag('grow_at')}: {config.algorithm} runs synchronous rounds, which the Ray "
            "runtime does not grow yet; use an asynchronous algorithm"
        )


def check_growth_reached(config: Any, steps: int, flag: Any) -> None:
    """ConfigError for a growth point of ``grow_at`` at or past the run's last step
    (``steps``, known once the data are: ``epochs`` of ``train_size // batch_size``
    steps), which would never add its workers."""
    late = [at for at, _ in parse_grow_at(config.grow_at) if at >= steps]
    if late:
        raise ConfigError(
            f"{flag('grow_at')} {config.grow_at}: step {late[-1]} is not before the run's "
            f"end (it takes {steps} steps: {flag('epochs')} {config.epochs:g} of "
            f"{flag('batch_size')} {config.batch_size}), so the run would never grow; give "
            f"steps below {steps}, or more {flag('epochs')}"
        )
