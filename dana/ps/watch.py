"""The driver's deadline on its workers: a hung worker (a paused process, a stuck node)
is found and dropped, never waited for for ever.

A worker's ``run`` call lasts its whole loop (asynchronous rules) or its round
(synchronous ones), so that call says nothing meanwhile about whether the worker is
still there. The driver asks each running worker a trivial question (``ready``) on a
side thread of its actor (the concurrency group :data:`WATCH`; its ``run`` goes on
meanwhile), at most every :data:`ASK_SECONDS`, one question at a time. A worker whose
question has gone unanswered for longer than the deadline (``--server-timeout``, as for
a server) is hung: a slow step does not count, only a process that answers nothing. A
worker just started or restarted by Ray has :data:`~dana.ps.cluster.READY_SECONDS` for
its first answer, as at the run's start. A question that fails (the process died)
counts as answered: the death is the ``run`` call's to report.

Once the run's end is reached, the calls still running get the deadline once more
(:meth:`WorkerWatch.past_end`), then the driver stops waiting for them.
"""

from __future__ import annotations

import math
import time
from typing import Any

from dana.ps.cluster import READY_SECONDS

#: The concurrency group of a worker's actor in which it answers the driver's questions.
WATCH = "watch"
#: A worker actor's concurrency groups (``ray.remote(concurrency_groups=...)``).
WATCH_GROUPS = {WATCH: 1}
#: Seconds between a worker's answer and the driver's next question.
ASK_SECONDS = 1.0


class WorkerWatch:
    """Which running workers have not answered within ``deadline`` seconds."""

    def __init__(self, ray: Any, deadline: float):
        self.ray, self.deadline = ray, deadline
        self.asked: dict[int, tuple[Any, float, float]] = {}  # worker: (question, when, limit)
        self.answered: dict[int, float] = {}  # worker: when it last answered
        self.starting: set[int] = set()  # started or restarted since its last answer
        self.ended: float | None = None  # when the run's end was first seen

    def started(self, worker: int) -> None:
        """``worker``'s process was started or restarted: its next answer may take
        :data:`~dana.ps.cluster.READY_SECONDS`."""
        self.asked.pop(worker, None)
        self.starting.add(worker)

    def hung(self, workers: dict[int, Any]) -> list[int]:
        """Of ``workers`` (index: actor), those whose question has waited past its limit;
        ask again those that answered (no sooner than :data:`ASK_SECONDS` after)."""
        ray, now, late = self.ray, time.time(), []
        for i, actor in workers.items():
            if i not in self.asked:
                if now - self.answered.get(i, -math.inf) >= ASK_SECONDS:
                    limit = READY_SECONDS if i in self.starting else self.deadline
                    self.starting.discard(i)
                    question = actor.ready.options(concurrency_group=WATCH).remote()
                    self.asked[i] = (question, now, limit)
                continue
            question, when, limit = self.asked[i]
            if ray.wait([question], timeout=0)[0]:
                del self.asked[i]
                self.answered[i] = now
                try:
                    ray.get(question)  # (taken, so that Ray reports no unhandled error)
                except ray.exceptions.RayError:
                    pass  # (died: its run call says so)
            elif now - when > limit:
                late.append(i)
        return late

    def past_end(self, ended: bool) -> bool:
        """Whether the run's end (``ended``: reached now) was reached more than the
        deadline ago."""
        if not ended:
            return False
        if self.ended is None:
            self.ended = time.time()
        return time.time() - self.ended > self.deadline
