"""A lost node: a second Ray node joining a head started here, killed mid-run.

Its own module, so that no other test's Ray session (the one local Ray of
tests/test_ps_faults.py) lives in this process while it starts and kills whole nodes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import free_port, kill_tree, needs_ray


@pytest.mark.ray
@needs_ray
@pytest.mark.slow
def test_two_nodes_the_second_lost_mid_run(tmp_path):
    """A head node and a second node (its own address, 127.0.0.2, and resource
    ``node2``) with token authentication; the run's shards and workers spread over
    both; the second node killed mid-run: the run completes on the head, its lost shard
    rebuilt, every push applied exactly once on every shard."""
    temp = Path(tempfile.mkdtemp(prefix="/tmp/dn"))  # short: Ray's socket paths
    home = temp / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(
        HOME=str(home), RAY_AUTH_MODE="token", RAY_health_check_period_ms="500",
        RAY_health_check_failure_threshold="3", RAY_health_check_initial_delay_ms="0",
        OMP_NUM_THREADS="1", RAY_worker_niceness="0",
    )  # fmt: skip
    # Loopback only: the head on 127.0.0.3 (on 127.0.0.1 Ray rewrites a head's address,
    # and the flag that keeps it refuses a second node), the node on 127.0.0.2.
    head_ip, port = "127.0.0.3", free_port()
    ray_cli = [sys.executable, "-m", "ray.scripts.scripts"]
    out = tmp_path / "run"
    train = [sys.executable, "-m", "dana.cli", "train", "--backend", "ray"]
    options = [
        "--address", f"{head_ip}:{port}", "--algorithm", "dana-slim", "--workers", "3",
        "--servers", "2", "--dataset", "synthetic", "--model", "mlp", "--train-size", "1024",
        "--test-size", "256", "--epochs", "5", "--batch-size", "32", "--lr", "0.05",
        "--time-scale", "0.001", "--quiet", "--out", str(out),
    ]  # fmt: skip
    try:
        subprocess.run([*ray_cli, "get-auth-token", "--generate"], env=env, check=True,
                       capture_output=True)  # fmt: skip
        common = ["--temp-dir", str(temp), "--disable-usage-stats"]
        # The head has room for what the second node runs, once that is lost.
        subprocess.run(
            [*ray_cli, "start", "--head", "--port", str(port), "--num-cpus", "3",
             "--node-ip-address", head_ip, "--include-dashboard", "false", *common],
            env=env, check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        subprocess.run(
            [*ray_cli, "start", "--address", f"{head_ip}:{port}", "--num-cpus", "1",
             "--node-ip-address", "127.0.0.2", "--resources", '{"node2": 1}', *common],
            env=env, check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        # Without token mode the driver is refused at once, with what to do.
        plain = {k: v for k, v in env.items() if k != "RAY_AUTH_MODE"}
        refused = subprocess.run([*train, *options], env=plain, capture_output=True, text=True,
                                 timeout=120)  # fmt: skip
        assert refused.returncode == 2, refused.stderr[-2000:]
        assert "requires token authentication" in refused.stderr
        assert "export RAY_AUTH_MODE=token" in refused.stderr
        assert "Traceback" not in refused.stderr
        if out.exists():  # (a failed start's leftovers are not this test's subject)
            subprocess.run(["rm", "-rf", str(out)], check=True)

        driver = subprocess.Popen([*train, *options], env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True)  # fmt: skip
        deadline = time.time() + 240
        metrics = out / "metrics.csv"
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
            assert driver.poll() is None, driver.stderr.read()[-3000:]
            assert time.time() < deadline, "no evaluation after 240 s"
            time.sleep(0.2)
        killed = kill_tree("127.0.0.2")  # the second node: its raylet, agents, actors
        assert killed > 0
        _, err = driver.communicate(timeout=300)
        assert driver.returncode == 0, err[-3000:]
    finally:
        kill_tree(str(temp))
        shutil.rmtree(temp, ignore_errors=True)
    dist = json.loads((out / "dist.json").read_text())
    ips = {name: where["ip"] for name, where in dist["placement"].items()}
    print(json.dumps({"placement": ips, "rebuilt": dist["shards_rebuilt"],
                      "standbys_rebuilt": dist["standbys_rebuilt"]}))  # fmt: skip
    assert set(ips.values()) == {head_ip, "127.0.0.2"}, ips  # across both nodes
    assert ips["shard0"] == head_ip  # shard 0 stays with the driver
    lost_shards = [s for s in range(2) if ips[f"shard{s}"] == "127.0.0.2"]
    assert [r["shard"] for r in dist["shards_rebuilt"]] == lost_shards
    assert all(r["node"]["ip"] == head_ip for r in dist["shards_rebuilt"])
    # shard 0's standby, if it was lost with the node: noticed, rebuilt on the head (if the
    # new one started before the run's end)
    assert (dist["standby_lost"] >= 1) == (ips["standby"] == "127.0.0.2")
    assert all(r["node"]["ip"] == head_ip for r in dist["standbys_rebuilt"])
    first = dist["shards"][0]
    for shard in dist["shards"]:
        assert shard["applied"] == shard["last_seq"] == first["applied"]
        assert shard["seq_gaps"] == shard["duplicates"] == 0
        assert shard["pushes"] == 5 * 32
    summary = json.loads((out / "summary.json").read_text())
    assert summary["pushes"] == 5 * 32
