"""The driver's side of elastic membership: who is in the run, and who comes next.

Rule (docs/DISTRIBUTED.md, "Workers that leave and join"): a worker is **in the run**
from its join to its departure; the master rule hears of both through one relayed,
logged call, ``relay_member`` (:mod:`dana.ps.head`: applied on shard 0, its standby
and every other shard in the head's order, kept in the relay log so a rebuilt shard
replays it; the head then answers every call of a worker not in the run ``"gone"``).

- **Gone for good**: a worker out of restarts (killed and not restarted) is declared
  gone by the driver: ``master.leave(i, lr)``; the run no longer waits for it. A worker
  of an emulated cluster (:mod:`dana.ps.emulation`) leaves and returns on its own, at
  its model's times, with the same call.
- **Added**: ``--grow-at STEP:N``: every shard admits them within the call that
  applies step ``STEP`` (:meth:`dana.ps.shard.ShardServer._reached`), whatever the
  driver's polls; or a request written to ``RUN/add-workers`` (its text: how many; the
  driver reads and removes it at its next poll, every 0.2 s, and asks the head,
  ``relay_admit``). A new worker takes the next index never used (``k, k+1, ...``; the
  rules were built for ``k_max = --max-workers``, the workers beyond ``k`` outside the
  run from the start): the master hears first (``master.join(i)``), then the driver
  starts its actor (seeing ``started`` in the head's poll), whose first pull is a fresh
  one. Requests beyond ``k_max`` are refused with a
  message on stderr (the rules cannot grow).

:class:`Membership` keeps the live set the driver believes (the servers' is the truth:
``live`` in ``dist.json``), the requested growth, and the events, which go
to ``dist.json`` (``membership``) and, per push, ``members.csv`` (who was live).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from dana.atomic import write_text_atomic
from dana.train.rules.members import ADD_WORKERS_FILE, capacity


class Membership:
    """The run's workers: the first ``workers`` live, room for ``k_max``."""

    def __init__(self, config: Any, run_path: Path):
        self.k, self.k_max = config.workers, capacity(config)
        self.started = self.k  # worker indices handed out so far
        self.live = set(range(self.k))
        self.request = run_path / ADD_WORKERS_FILE
        self.events: list[dict[str, Any]] = []
        self.refused = 0  # workers asked for beyond k_max

    def resume(self, saved: dict[str, Any]) -> None:
        """Continue from a checkpoint's shard 0 (its ``live``, ``joins``): the workers
        ever started are started again (those not live answer ``gone`` at once)."""
        live = [bool(x) for x in saved.get("live", [True] * self.k)]
        used = [i for i, (j, x) in enumerate(zip(saved["joins"], live)) if j > 0 or x]
        self.started = max([self.k, *(i + 1 for i in used)])
        self.live = {i for i, x in enumerate(live) if x}

    def due(self) -> int:
        """How many workers to add now: a request in the run directory, up to the room
        left (the planned growth is the head's)."""
        n = self._requested()
        room = self.k_max - self.started
        if n > room:
            self.refused += n - room
            print(
                f"dana: {n} workers asked for, room for {room} (--max-workers {self.k_max}: "
                "the rules are built for that many); start the run with a larger "
                "--max-workers to grow further",
                file=sys.stderr,
            )
            n = room
        return n

    def _requested(self) -> int:
        try:
            text = self.request.read_bytes().decode("utf-8", errors="replace")
        except OSError:
            return 0
        self.request.unlink(missing_ok=True)
        try:
            return max(0, int(text.strip()))
        except ValueError:  # (not a number, not UTF-8 text, or of too many digits)
            print(
                f"dana: {self.request} holds {text.strip()[:40]!r}, not a number of workers to "
                "add: ignored (write e.g. 2)",
                file=sys.stderr,
            )
            return 0

    def next_index(self) -> int:
        i, self.started = self.started, self.started + 1
        return i

    def joined(self, worker: int, steps: int, why: str) -> None:
        """``worker`` joined at ``steps`` (``why``: the plan or a request), said on stderr."""
        self.live.add(worker)
        self._event(worker, "join", steps, why)
        print(
            f"dana: worker {worker} joined at step {steps} ({why}): {len(self.live)} live",
            file=sys.stderr,
        )

    def left(self, worker: int, steps: int, why: str) -> None:
        self.live.discard(worker)
        self._event(worker, "leave", steps, why)

    def _event(self, worker: int, what: str, steps: int, why: str) -> None:
        self.events.append(
            {
                "worker": worker,
                "event": what,
                "steps": steps,
                "time": time.time(),
                "live": len(self.live),
                "why": why,
            }
        )

    def counters(self) -> dict[str, Any]:
        return {"max_workers": self.k_max, "membership": self.events, "refused": self.refused}


def live_workers(mask: int) -> list[int]:
    """The workers of a bitmask (bit ``i``: worker ``i``)."""
    return [i for i in range(mask.bit_length()) if mask >> i & 1]


def write_members(path: Path, workers: list[int], masks: list[int]) -> None:
    """``members.csv``: per push (in the log's order), its worker, how many workers were
    live and which (space-separated indices)."""
    rows = ["push,worker,live,members"]
    for n, (w, mask) in enumerate(zip(workers, masks)):
        live = live_workers(mask)
        rows.append(f"{n},{w},{len(live)},{' '.join(map(str, live))}")
    write_text_atomic(path, "\n".join(rows) + "\n")
