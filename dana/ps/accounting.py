"""The accounting of a Ray run: its counters (``dist.json``), and the rule they must
keep, every push applied exactly once on every shard.

The driver keeps its workers' side (:class:`WorkerCalls`) and, at the end, asks the
servers for theirs (:class:`ServerCounters`); :func:`dist_counters` puts them together
as ``dist.json``. The rule, checked from a finished run's ``dist.json`` and ``summary.json``
(:func:`check_run`): on every shard and on shard 0's standby, per worker, the pushes
applied equal the worker's last sequence number applied (none lost in between, none
applied twice), the same lists on every shard; no sequence gap, no relayed call
missed; every shard applied the run's number of pushes, which is the merged log's
length. Pushes sent again to a promoted standby are answered ``duplicate`` and not
applied: counted, not a fault. :func:`lost_and_doubled` gives the figures.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dana.train.config import TrainConfig


@dataclass
class WorkerCalls:
    """The driver's record of its workers' ``run`` calls, per worker (``k_max`` of them):
    the last seq each sent (from its last completed call), the calls cut short by its
    crash, the workers out of restarts, and the workers' replies counted by kind."""

    last_seq: list[int]
    failed: list[int]
    lost: list[int] = field(default_factory=list)
    replies: Counter[str] = field(default_factory=Counter)

    @classmethod
    def of(cls, k_max: int) -> WorkerCalls:
        return cls([0] * k_max, [0] * k_max)

    def returned(self, worker: int, result: dict[str, Any]) -> None:
        """Worker ``worker``'s call returned ``result``: its ``seq`` and reply counts."""
        self.last_seq[worker] = result.pop("seq")
        self.replies.update(result)


@dataclass
class ServerCounters:
    """The servers' counters at the end of a run
    (:meth:`~dana.ps.group.ShardGroup.counters`)."""

    shards: list[dict[str, Any]]  # every shard's (shard 0: the head)
    relay: dict[str, int]  # the head's relay's (its log)
    standby: dict[str, Any] | None  # shard 0's standby's (None: none)
    placement: dict[str, Any]  # where each actor started: its node's IP address and id
    rebuilt: list[dict[str, Any]]  # shards rebuilt after their loss (dana.ps.recovery)
    promotions: list[dict[str, Any]]  # lost heads replaced by their standby
    standbys_rebuilt: list[dict[str, Any]]  # standbys built since the start


def dist_counters(
    config: TrainConfig,
    *,
    bounded: bool,
    startup_seconds: float,
    cpus_per_actor: float,
    servers: ServerCounters,
    calls: WorkerCalls,
    members: dict[str, Any],
) -> dict[str, Any]:
    """A finished run's ``dist.json``: its setup (``bounded``: whether
    ``--max-staleness`` applied), the pushes sent and applied (shard 0's counts), the
    workers' calls, the membership (``members``: :meth:`Membership.counters
    <dana.ps.membership.Membership.counters>`), the servers' faults and repairs, the
    relay's counters and every server's own."""
    head = servers.shards[0]
    return {
        "servers": config.servers,
        "workers": config.workers,
        "max_staleness": config.max_staleness if bounded else None,
        "relayed": True,
        "with_standby": config.standby,
        "startup_seconds": startup_seconds,
        "cpus_per_actor": cpus_per_actor,
        "placement": servers.placement,
        # Every push a worker numbered (its last seq): applied once, or answered
        # "stop" after the run's last step; a crashed worker renumbers from the
        # servers' last applied seq, so a push lost in flight is not counted; for a
        # worker lost for good (no call of it returned its count) the servers' stands.
        "pushes_sent": sum(
            head["last_seq"][i] if i in calls.lost else seq for i, seq in enumerate(calls.last_seq)
        ),
        "pushes_applied": head["pushes"],
        "local_steps": head["local_steps"],
        "rejected_after_stop": head["rejected_after_stop"],
        "duplicates": head["duplicates"],
        "waits": head["waits"],
        "wait_time": head["wait_time"],
        "failed_run_calls": calls.failed,
        "workers_lost": calls.lost,
        # elastic membership: k_max, each join and departure, who is live at the end
        **members,
        "live": [i for i, live in enumerate(head["live"]) if live],
        "shards_rebuilt": servers.rebuilt,
        "promotions": servers.promotions,
        "standbys_rebuilt": servers.standbys_rebuilt,
        "standby": servers.standby,
        **servers.relay,
        "worker_replies": dict(calls.replies),
        "shards": servers.shards,
    }


def servers(dist: dict[str, Any]) -> list[dict[str, Any]]:
    """Every shard's counters, then the standby's (if any)."""
    return [*dist["shards"], *([dist["standby"]] if dist.get("standby") else [])]


def lost_and_doubled(dist: dict[str, Any]) -> tuple[int, int]:
    """Pushes lost (a worker's last seq above what a server applied of it) and doubled
    (applied more often than numbered), summed over servers and workers."""
    lost = doubled = 0
    for server in servers(dist):
        for applied, last in zip(server["applied"], server["last_seq"]):
            lost += max(0, last - applied)
            doubled += max(0, applied - last)
    return lost, doubled


def check_run(dist: dict[str, Any], summary: dict[str, Any], pushes: int) -> list[str]:
    """What breaks the rule (empty: nothing) in a run that should have applied
    ``pushes`` pushes."""
    problems = []
    first = dist["shards"][0]
    for s, server in enumerate(servers(dist)):
        name = f"shard {s}" if s < len(dist["shards"]) else "the standby"
        if server["applied"] != server["last_seq"]:
            problems.append(f"{name}: applied {server['applied']} != last seq {server['last_seq']}")
        if server["applied"] != first["applied"]:
            problems.append(f"{name}: applied {server['applied']}, shard 0 {first['applied']}")
        if server["seq_gaps"] or server.get("call_gaps", 0):
            problems.append(f"{name}: {server['seq_gaps']} seq gaps, {server['call_gaps']} calls")
        if server["pushes"] != pushes:
            problems.append(f"{name}: {server['pushes']} pushes applied, not {pushes}")
    if summary["pushes"] != pushes:
        problems.append(f"the summary counts {summary['pushes']} pushes, not {pushes}")
    return problems
