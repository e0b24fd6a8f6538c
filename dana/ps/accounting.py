"""The accounting of a Ray run: every push applied exactly once on every shard.

The rule, checked from a finished run's ``dist.json`` and ``summary.json``
(:func:`check_run`): on every shard and on shard 0's standby, per worker, the pushes
applied equal the worker's last sequence number applied (none lost in between, none
applied twice), the same lists on every shard; no sequence gap, no relayed call
missed; every shard applied the run's number of pushes, which is the merged log's
length. Pushes sent again to a promoted standby are answered ``duplicate`` and not
applied: counted, not a fault. :func:`lost_and_doubled` gives the figures.
"""

from __future__ import annotations

from typing import Any


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
