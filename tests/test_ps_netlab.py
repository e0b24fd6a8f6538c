"""A Ray cluster over real, shaped links (dana/ps/netlab.py): network namespaces joined
by veth pairs, each worker node's link limited by tc's token bucket."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import needs_ray

from dana.ps.netlab import NetLab, Node, unavailable

ROOT = Path(__file__).resolve().parents[1]
#: The committed study (bench/links_vs_sim.py, docs/RESULTS.md).
STUDY = ROOT / "docs" / "measurements" / "links-vs-sim"


@pytest.fixture(scope="module")
def why_not() -> str | None:
    return unavailable()


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


@pytest.mark.ray
@pytest.mark.slow
@needs_ray
def test_a_shaped_link_limits_throughput_and_a_run_finishes_across_it(tmp_path, why_not):
    """Two nodes: the head (servers, driver) and a worker node behind a 20 Mbit/s link.
    A transfer each way is held to the link's rate (TCP/IP headers take ~4% of it), a
    `dana train --backend ray` across it finishes with its servers on the head and its
    workers on the worker node, and the lab leaves no namespace or process behind."""
    if why_not:
        pytest.skip(why_not)
    mbit, nbytes = 20.0, 2_000_000  # about 0.8 s each way
    out = tmp_path / "run"
    lab = NetLab([Node("w0", mbit, cpus=2)], head_cpus=2)
    with lab:
        assert lab.netns("w0") in _namespaces()
        rates = [
            lab.throughput(a, b, nbytes) * 8 / 1e6 for a, b in (("w0", "head"), ("head", "w0"))
        ]
        done = lab.train(
            ["--algorithm", "dana-slim", "--workers", "2", "--servers", "2", "--no-standby",
             "--dataset", "synthetic", "--model", "mlp", "--train-size", "512", "--test-size",
             "128", "--epochs", "1", "--batch-size", "32", "--quiet", "--out", str(out)],
            timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        where = lab.nodes_of(out)
    print(json.dumps({"mbit": rates, "placement": where}))
    assert all(0.25 * mbit < rate <= mbit for rate in rates), rates
    assert where == {"shard0": "head", "shard1": "head", "worker0": "w0", "worker1": "w0"}
    assert json.loads((out / "summary.json").read_text())["pushes"] == 512 // 32
    assert lab.tag not in _namespaces()
    left = subprocess.run(["pgrep", "-f", lab.tag], capture_output=True, text=True).stdout
    assert not left.strip(), left


@pytest.mark.ray
@pytest.mark.slow
@needs_ray
def test_a_lab_that_fails_to_start_is_torn_down(why_not, monkeypatch):
    """A lab whose start fails once its links and head node are up (an error injected
    after the head's `ray start`) raises, and leaves no namespace or process behind."""
    if why_not:
        pytest.skip(why_not)

    def head_then_fail(self: NetLab) -> None:
        self._start_node("head", "--head", "--num-cpus", "1")
        raise RuntimeError("injected")

    monkeypatch.setattr(NetLab, "_ray", head_then_fail)
    lab = NetLab([Node("w0", 10.0)], head_cpus=1)
    with pytest.raises(RuntimeError, match="injected"):
        with lab:
            pass
    assert lab.tag not in _namespaces()
    left = subprocess.run(["pgrep", "-f", lab.tag], capture_output=True, text=True).stdout
    assert not left.strip(), left


def test_the_committed_study_table_is_made_from_its_records(tmp_path):
    """bench/links_vs_sim.py --report-only makes docs/measurements/links-vs-sim/table.md again
    from the committed records (the residual latencies fitted again from each Ray run's
    step_times.csv)."""
    copy = tmp_path / "study"
    shutil.copytree(STUDY, copy)
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "links_vs_sim.py"), "--report-only", "--out", str(copy)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert (copy / "table.md").read_text() == (STUDY / "table.md").read_text()
