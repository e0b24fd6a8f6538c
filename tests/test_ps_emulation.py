"""A cluster model emulated on Ray (dana.ps.emulation, ``--cluster`` with ``--time-scale``):
each worker sleeps its modelled compute and transfer times and leaves and returns at the
model's times, through the membership call (dana.ps.membership).

The unit drives one worker's :class:`ClusterDelay` on the wall clock (1 model ms = 1 ms);
the run uses the session's local Ray (conftest's ``local_ray``) on the machine's 2 CPUs.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from conftest import needs_ray, run_on_ray, tiny

from dana.errors import ConfigError
from dana.ps.accounting import check_run, servers
from dana.ps.emulation import ClusterDelay
from dana.ps.membership import live_workers
from dana.train.config import TrainConfig


def cluster(**availability: Any) -> dict[str, Any]:
    return {
        "name": "lossy",
        "compute": {"model": "constant", "duration": 20, "worker_factors": [1, 2]},
        "network": {"latency_ms": 2, "bandwidth_gbps": 0.1},
        "availability": {"preemptions": availability.get("preemptions", [])},
    }


def test_a_worker_computes_sends_and_leaves_as_modelled():
    """Worker 1 (factor 2: 40 ms steps; 2 ms latency; 100 parameters of 4 bytes over 0.1
    Gbit/s: 0.032 ms) leaves at 110 ms and returns at 150 ms, then leaves for good at
    180 ms: its steps last the model's time, the step the departure cuts is lost, it
    sleeps while away (1 model ms = 2 ms)."""
    preemptions = [
        {"worker": 1, "leave_ms": 110, "rejoin_ms": 150},
        {"worker": 1, "leave_ms": 180},
    ]
    config = TrainConfig(
        workers=2, dataset="synthetic", model="mlp", backend="ray", time_scale=0.002,
        cluster=cluster(preemptions=preemptions),
    ).validate()  # fmt: skip
    delay = ClusterDelay(config, 1, 0, 100, 4, None, time.time())
    assert delay.latency == 2 and delay.link == pytest.approx(0.032)
    assert not delay.received()  # (the first pull: its transfer only)
    outcomes = []
    for _ in range(4):
        started = time.perf_counter()
        outcomes.append(delay.pad(started))
        if outcomes[-1]:
            break
        assert not delay.received()
    # pushes complete at about 2+40+2 = 44 ms and 88 ms (pulls back at 46, 90); the
    # third would be complete at 134, after the departure at 110: lost
    assert outcomes == [False, False, True]
    assert delay.now() == pytest.approx(110, abs=8)
    assert delay.depart() is True  # back at 150
    assert delay.now() == pytest.approx(150, abs=8)
    assert delay.leave_at == 180 and delay.rejoin_at is None
    started = time.perf_counter()
    assert delay.pad(started) is True  # 150 + 40 + 2 > 180: lost; leaves for good
    assert delay.depart() is False
    assert (delay.away, delay.returned) == (2, 1)


def test_the_cluster_on_ray_needs_a_time_scale_and_an_asynchronous_rule_to_leave():
    base = dict(workers=2, dataset="synthetic", model="mlp", backend="ray")
    with pytest.raises(ConfigError, match="pass --time-scale S > 0"):
        TrainConfig(**base, cluster=cluster()).validate()
    away = cluster(preemptions=[{"worker": 1, "leave_ms": 10}])
    with pytest.raises(ConfigError, match="cannot leave and return"):
        TrainConfig(**base, algorithm="ssgd", time_scale=0.001, cluster=away).validate()
    TrainConfig(**base, algorithm="ssgd", time_scale=0.001, cluster=cluster()).validate()


@pytest.mark.ray
@needs_ray
def test_a_lossy_heterogeneous_cluster_on_ray(local_ray, tmp_path):
    """3 workers (worker 2 twice as slow), worker 1 away from 1,500 to 3,000 model ms
    and worker 2 gone for good at 6,000: every push applied exactly once on both shards
    and the standby; each departure and return told to the rule (worker 1 not live while
    away, worker 2 not live at the end); the slow worker pushed fewer times."""
    spec = {
        "name": "lossy",
        "compute": {"model": "constant", "duration": 100, "worker_factors": [1, 1, 2]},
        "network": {"latency_ms": 5, "bandwidth_gbps": 1},
        "availability": {
            "preemptions": [
                {"worker": 1, "leave_ms": 1500, "rejoin_ms": 3000},
                {"worker": 2, "leave_ms": 6000},
            ]
        },
    }
    config = tiny(
        algorithm="dana-slim", workers=3, servers=2, cluster=spec, time_scale=0.0005, epochs=4.0
    )
    runner = run_on_ray(config, tmp_path / "run", None)
    dist = json.loads((runner.run.path / "dist.json").read_text())
    assert dist["standby"] is not None
    problems = check_run(dist, runner.summary, 128)  # every push applied once everywhere
    assert not problems, problems
    assert all(server["duplicates"] == 0 for server in servers(dist))
    first = dist["shards"][0]
    assert sum(first["applied"]) == first["pushes"]
    assert dist["live"] == [0, 1]
    replies = dist["worker_replies"]
    assert replies["departures"] == 2 and replies["returns"] == 1
    assert first["applied"][2] < first["applied"][0]
    rows = [r.split(",") for r in (runner.run.path / "members.csv").read_text().splitlines()[1:]]
    times = runner.merger.log.sim_time.tolist()  # seconds: model ms = s / time_scale
    for (_, w, _, members), t in zip(rows, times):
        ms = t / config.time_scale
        live = [int(x) for x in members.split(" ")]
        assert int(w) in live
        # (a departure is noticed when the worker's computation or transfer in progress
        # ends: up to a step, 100 model ms, plus Ray's round trip, ~70 model ms, late)
        if 1800 < ms < 2900:
            assert 1 not in live, ms
        if ms > 6300:
            assert 2 not in live, ms
    assert live_workers(runner.merger.members[-1]) == [0, 1]
