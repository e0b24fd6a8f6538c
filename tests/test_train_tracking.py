"""MLflow tracking (``--mlflow``) into a real local file store, read back with MLflow's client."""

from __future__ import annotations

import builtins
import csv
import os
import subprocess
import sys

import pytest

from dana.cli import main

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
TINY = ["--dataset", "synthetic", "--model", "linear", "--train-size", "256", "--test-size",
        "64", "--batch-size", "32", "--epochs", "1", "--eval-every", "0.5", "--quiet"]  # fmt: skip


def _client(store):
    pytest.importorskip("mlflow", reason="MLflow not installed: pip install mlflow-skinny")
    from mlflow.tracking import MlflowClient

    from dana.train.records.tracking import tracking_uri

    return MlflowClient(tracking_uri=tracking_uri(str(store)))


def _runs(client, experiment="dana"):
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None
    return client.search_runs([exp.experiment_id])


def test_train_logs_params_metrics_summary_and_plots(tmp_path):
    client = _client(tmp_path / "mlruns")
    out = tmp_path / "run"
    assert main(["train", *TINY, "--lr", "0.05", "--mlflow", str(tmp_path / "mlruns"),
                 "--out", str(out)]) == 0  # fmt: skip
    (run,) = _runs(client)
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    params = run.data.params
    assert params["algorithm"] == "dana-slim" and params["lr"] == "0.05"
    assert params["dataset"] == "synthetic" and params["train_size"] == "256"
    # One metric point per evaluation, at the master's updates, equal to metrics.csv.
    rows = list(csv.DictReader((out / "metrics.csv").open()))
    history = client.get_metric_history(run.info.run_id, "test_error")
    assert [m.step for m in history] == [int(float(r["updates"])) for r in rows]
    assert [m.value for m in history] == pytest.approx([float(r["test_error"]) for r in rows])
    assert len(rows) == 3  # epochs 0, 0.5, 1
    assert run.data.metrics["summary.final_test_error"] == pytest.approx(
        float(rows[-1]["test_error"])
    )
    assert run.data.tags["dana.run_dir"] == str(out.resolve())
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.json", "metrics.csv", "summary.json", "curves.png"} <= artifacts


@pytest.mark.slow
def test_sweep_tracks_every_run(tmp_path):
    client = _client(tmp_path / "mlruns")
    out = tmp_path / "sweep"
    result = subprocess.run(
        [sys.executable, "-m", "dana.cli", "sweep", *TINY, "--algorithms", "asgd,dana-slim",
         "--workers", "2", "--jobs", "2", "--mlflow", str(tmp_path / "mlruns"),
         "--mlflow-experiment", "sweep-test", "--out", str(out)],
        capture_output=True, text=True, timeout=300, env=ENV,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    runs = _runs(client, "sweep-test")
    names = {r.info.run_name for r in runs}
    assert names == {p.name for p in (out / "runs").iterdir()} and len(names) == 2
    assert {r.data.params["algorithm"] for r in runs} == {"asgd", "dana-slim"}
    assert all("summary.final_test_error" in r.data.metrics for r in runs)


def test_resume_continues_the_same_mlflow_run(tmp_path):
    client = _client(tmp_path / "mlruns")
    out = tmp_path / "run"
    args = ["train", *TINY, "--epochs", "2", "--checkpoint-every", "1"]
    assert main([*args, "--mlflow", str(tmp_path / "mlruns"), "--out", str(out)]) == 0
    # Pretend the run was killed after its checkpoint: drop its summary, resume.
    (out / "summary.json").unlink()
    assert main(["train", "--resume", str(out), "--quiet"]) == 0
    (run,) = _runs(client)
    assert run.info.status == "FINISHED"


def test_mlflow_missing_is_a_clear_error(tmp_path, monkeypatch, capsys):
    real_import = builtins.__import__

    def no_mlflow(name, *args, **kwargs):
        if name == "mlflow" or name.startswith("mlflow."):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_mlflow)
    out = tmp_path / "run"
    assert main(["train", *TINY, "--mlflow", str(tmp_path / "mlruns"), "--out", str(out)]) == 2
    assert "pip install mlflow-skinny" in capsys.readouterr().err
    assert not out.exists()  # nothing written


def test_fit_tracks_into_mlflow_too(tmp_path):
    import torch

    import dana

    client = _client(tmp_path / "mlruns")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 4, generator=g)
    y = (x[:, 0] > 0).long()
    result = dana.fit(torch.nn.Linear(4, 2), (x, y), workers=2, lr=0.1, epochs=1,
                      batch_size=20, mlflow=str(tmp_path / "mlruns"))  # fmt: skip
    (run,) = _runs(client)
    history = client.get_metric_history(run.info.run_id, "test_error")
    assert [m.value for m in history] == pytest.approx([r["test_error"] for r in result.metrics])
    assert "curves.png" in {a.path for a in client.list_artifacts(run.info.run_id)}
