"""``ray job submit`` of ``dana train --backend ray --address auto`` to a real Ray head.

The test starts its own head (``ray start --head --block``) with a dedicated temp dir
and free ports, submits the job through the dashboard's job server with a working
directory holding the package and the data (as docs/DISTRIBUTED.md says), and checks
that the results came back where the job was told to write them. It stops only the Ray
it started: SIGTERM to its ``ray start`` (which then stops its processes), and at the
end any process left whose command line names the dedicated temp dir. ``ray stop`` is
not used: it stops every Ray on the machine.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
RAY = shutil.which("ray")


def _free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def _has_job_server() -> bool:
    try:
        import aiohttp  # noqa: F401
        import ray.dashboard.modules.job.cli  # noqa: F401
    except ImportError:
        return False
    return RAY is not None


def _kill_leftovers(marker: str) -> None:
    """SIGKILL the processes whose command line names ``marker`` (our temp dir)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            try:
                os.kill(int(proc.name), signal.SIGKILL)
            except OSError:
                pass


@pytest.fixture
def ray_head():
    """A Ray head with the dashboard (the job server); yields its dashboard URL."""
    temp = tempfile.mkdtemp(prefix="dana-rj-", dir="/tmp")  # short: Ray's socket paths
    gcs, dash, client, agent, agent_grpc, metrics, node, obj, rt_env = _free_ports(9)
    # Ray 2.5x clusters require a token: this head's own, which the client then sends.
    token = Path(temp) / "auth_token"
    token.write_text(secrets.token_hex(32))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RAY_ADDRESS")}
    env |= {
        "OMP_NUM_THREADS": "1",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token),
        # the actors at the tests' priority, as docs/DISTRIBUTED.md tells `ray start` users
        "RAY_worker_niceness": "0",
    }
    head = subprocess.Popen(
        [RAY, "start", "--head", "--block", f"--port={gcs}", "--num-cpus=4",
         f"--temp-dir={temp}", "--include-dashboard=true", "--dashboard-host=127.0.0.1",
         f"--dashboard-port={dash}", f"--ray-client-server-port={client}",
         f"--dashboard-agent-listen-port={agent}", f"--dashboard-agent-grpc-port={agent_grpc}",
         f"--metrics-export-port={metrics}", f"--node-manager-port={node}",
         f"--object-manager-port={obj}", f"--runtime-env-agent-port={rt_env}",
         "--disable-usage-stats"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{dash}"
    try:
        deadline = time.monotonic() + 180
        while True:  # the job server answers once the dashboard is up
            try:
                urllib.request.urlopen(f"{url}/api/version", timeout=5).read()
                break
            except urllib.error.HTTPError:  # it answered (401 without the token): up
                break
            except OSError:
                if head.poll() is not None or time.monotonic() > deadline:
                    out = head.stdout.read().decode(errors="replace") if head.poll() else ""
                    pytest.fail(f"the Ray head did not come up:\n{out[-3000:]}")
                time.sleep(1)
        yield url, env
    finally:
        head.send_signal(signal.SIGTERM)
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
        _kill_leftovers(temp)
        shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.skipif(
    not _has_job_server(), reason="needs Ray's job server: pip install 'ray[default]'"
)
def test_ray_job_submit_runs_dana_train_on_the_cluster(ray_head, tmp_path):
    url, env = ray_head
    # The working directory: the package (as a user's checkout would hold it) and the data.
    work = tmp_path / "job"
    shutil.copytree(ROOT / "dana", work / "dana", ignore=shutil.ignore_patterns("__pycache__"))
    (work / "data").mkdir()
    g = torch.Generator().manual_seed(0)
    y = torch.arange(300) % 3
    x = (y.view(-1, 1, 1) * 60 + torch.randint(0, 60, (300, 6, 6), generator=g)).to(torch.uint8)
    torch.save({"train_x": x[:240], "train_y": y[:240], "test_x": x[240:], "test_y": y[240:]},
               work / "data" / "arrays.pt")  # fmt: skip
    out = tmp_path / "results" / "run"  # an absolute path: where the results come back
    runtime_env = {"env_vars": {"OMP_NUM_THREADS": "1"}}
    result = subprocess.run(
        [RAY, "job", "submit", "--address", url, "--working-dir", str(work),
         "--runtime-env-json", json.dumps(runtime_env), "--",
         sys.executable, "-m", "dana.cli", "train", "--backend", "ray", "--address", "auto",
         "--dataset", "tensors", "--data-dir", "data/arrays.pt", "--model", "linear",
         "--workers", "2", "--batch-size", "16", "--epochs", "2", "--lr", "0.05",
         "--quiet", "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=480, cwd=tmp_path,
    )  # fmt: skip
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-4000:]
    assert "succeeded" in log and "final test error" in log
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dataset"] == "tensors" and summary["workers"] == 2
    assert summary["pushes"] == 2 * 240 // 16 and summary["final_test_error"] < 0.5
    assert (out / "dist.json").is_file() and (out / "step_times.csv").is_file()
