"""A cluster model fitted to a Ray run's records (dana.train.cluster.fit, dana fit-cluster)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from conftest import run_on_ray, tiny

from dana.cli import main
from dana.errors import DataError
from dana.train.cluster.fit import fit_cluster, read_step_times
from dana.train.cluster.timing import read_trace, write_trace


def _fake_ray_run(path, scale=0.001, means=(0.1, 0.15, 0.2), latency=0.005, cv=0.1, gone=None):
    """A run directory as a Ray run with --time-scale ``scale`` leaves it: worker ``i``'s
    steps ~ Gamma(mean means[i], cv), each cycle its step plus a 2 * ``latency`` round
    trip; ``gone = (worker, push, seconds)``: that push's cycle holds an absence."""
    rng = np.random.default_rng(0)
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"workers": len(means), "time_scale": scale}))
    shape = 1 / cv**2
    rows, steps, times = [], [], []
    clocks = [0.0] * len(means)
    for n in range(400):
        for i, mean in enumerate(means):
            step = rng.gamma(shape, mean / shape)
            cycle = step + 2 * latency
            if gone is not None and (i, n) == gone[:2]:
                cycle += gone[2]
            clocks[i] += cycle
            rows.append((i, cycle))
            steps.append(step)
            times.append(clocks[i])
    order = np.argsort(times, kind="stable")
    write_trace(
        path / "step_times.csv",
        [rows[j] for j in order],
        {"compute": [steps[j] for j in order], "time": [times[j] for j in order]},
    )
    return path


def test_the_fit_recovers_the_factors_the_spread_the_latency_and_an_absence(tmp_path):
    run = _fake_ray_run(tmp_path / "run", gone=(1, 200, 30.0))
    cluster = fit_cluster(run)
    compute = cluster["compute"]
    assert compute["model"] == "gamma"
    mean = compute["shape"] * compute["scale"]  # model units: ms at time scale 0.001
    assert mean == pytest.approx(100, rel=0.03)
    assert 1 / np.sqrt(compute["shape"]) == pytest.approx(0.1, rel=0.1)
    assert compute["worker_factors"] == pytest.approx([1.0, 1.5, 2.0], rel=0.03)
    assert cluster["network"]["latency_ms"] == pytest.approx([5.0] * 3, rel=1e-6)
    (spell,) = cluster["availability"]["preemptions"]
    assert spell["worker"] == 1
    assert spell["rejoin_ms"] - spell["leave_ms"] == pytest.approx(30_000, rel=0.02)


def test_a_heavy_tail_is_fitted_lognormal(tmp_path):
    path = tmp_path / "run"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"workers": 1, "time_scale": 0}))
    rng = np.random.default_rng(1)
    steps = np.exp(rng.normal(np.log(0.05), 0.8, size=500))  # seconds; cv ~ 0.95
    write_trace(path / "step_times.csv", [(0, s) for s in steps], {"compute": list(steps)})
    compute = fit_cluster(path)["compute"]
    assert compute["model"] == "lognormal"
    assert compute["mean"] == pytest.approx(1000 * steps[1:].mean(), rel=1e-6)  # ms


def test_step_times_stay_a_trace_the_simulator_replays(tmp_path):
    run = _fake_ray_run(tmp_path / "run")
    assert len(read_trace(run / "step_times.csv")) == 3
    columns = read_step_times(run / "step_times.csv")
    assert (columns["cycle"] > columns["step"]).all()


def test_an_old_trace_without_steps_gives_cycles_and_no_latency(tmp_path):
    path = tmp_path / "run"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"workers": 2, "time_scale": 0.01}))
    write_trace(path / "step_times.csv", [(i % 2, 0.5 + 0.5 * (i % 2)) for i in range(40)])
    cluster = fit_cluster(path)
    assert cluster["compute"]["model"] == "constant"
    assert cluster["compute"]["duration"] == pytest.approx(50.0)
    assert cluster["compute"]["worker_factors"] == [1.0, 2.0]
    assert cluster["network"]["latency_ms"] == [0.0, 0.0]


def test_bad_records_are_refused_with_what_to_pass(tmp_path, capsys):
    with pytest.raises(DataError, match="no step_times.csv"):
        fit_cluster(tmp_path)
    run = _fake_ray_run(tmp_path / "run")
    (run / "step_times.csv").write_text("worker,duration\n0,1\n")
    with pytest.raises(DataError, match="worker 0 has 1 pushes"):
        fit_cluster(run)
    (run / "step_times.csv").write_text("worker,duration\n0,abc\n")
    with pytest.raises(DataError, match="expected numbers"):
        fit_cluster(run)
    assert main(["fit-cluster", str(run), "--gap-factor", "0.5"]) == 2
    assert "--gap-factor must be a number above 1" in capsys.readouterr().err


def test_the_simulator_replays_a_fitted_cluster(tmp_path, capsys):
    run = _fake_ray_run(tmp_path / "run", gone=(2, 10, 2.0))
    out = tmp_path / "fitted.yaml"
    assert main(["fit-cluster", str(run), "--out", str(out)]) == 0
    assert "dana train --cluster" in capsys.readouterr().out
    assert yaml.safe_load(out.read_text())["name"] == "fitted-run"
    train = tmp_path / "train"
    args = ["train", "--dataset", "synthetic", "--model", "linear", "--train-size", "256",
            "--test-size", "64", "--epochs", "1", "--workers", "3", "--cluster", str(out),
            "--out", str(train), "--quiet"]  # fmt: skip
    assert main(args) == 0
    config = json.loads((train / "config.json").read_text())
    assert config["cluster"]["name"] == "fitted-run"
    assert config["cluster"]["availability"]["preemptions"][0]["worker"] == 2


@pytest.mark.ray
def test_a_ray_run_records_its_workers_steps_and_its_cycles(tmp_path, local_ray):
    config = tiny(workers=2, timing="heterogeneous", time_scale=0.0002, epochs=2.0)
    run_on_ray(config, tmp_path / "ray")
    columns = read_step_times(tmp_path / "ray" / "step_times.csv")
    assert np.isfinite(columns["step"]).all() and np.isfinite(columns["time"]).all()
    assert (columns["step"] <= columns["cycle"] + 1e-6).all()
    assert (np.diff(columns["time"]) >= 0).all()  # in the order shard 0 applied them
    cluster = fit_cluster(tmp_path / "ray")
    assert len(cluster["compute"]["worker_factors"]) == 2
