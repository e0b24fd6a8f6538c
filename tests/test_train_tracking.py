"""Tracking: MLflow (``--mlflow``) into a real local file store, read back with MLflow's
client; Weights & Biases (``--wandb``) offline, its run file read back record by record."""

from __future__ import annotations

import csv
import glob
import json
import os
import struct
import subprocess
import sys
import time

import pytest
import torch

import dana
import dana.fitting
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


def _uninstalled(monkeypatch, package):
    """Make ``package`` (and its submodules) fail to import, as when not installed."""
    for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, package, None)


@pytest.mark.parametrize(
    "flag, package, install",
    [
        ("--mlflow", "mlflow", "pip install mlflow-skinny"),
        ("--wandb", "wandb", "pip install wandb"),
    ],
)
def test_a_missing_tracker_is_a_clear_error(tmp_path, monkeypatch, capsys, flag, package, install):
    _uninstalled(monkeypatch, package)
    out = tmp_path / "run"
    assert main(["train", *TINY, flag, str(tmp_path / "where"), "--out", str(out)]) == 2
    assert install in capsys.readouterr().err
    assert not out.exists()  # nothing written


def test_fit_tracks_into_mlflow_too(tmp_path):
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


class MyNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)


def _fit(**kwargs):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(100, 4, generator=g)
    y = (x[:, 0] > 0).long()
    return dana.fit(MyNet, (x, y), workers=2, lr=0.1, epochs=1, batch_size=20, **kwargs)


def test_fit_names_the_models_class_and_no_deleted_run_directory(tmp_path):
    client = _client(tmp_path / "mlruns")
    _fit(mlflow=str(tmp_path / "mlruns"))  # a factory; no out=: a temporary run directory
    (run,) = _runs(client)
    assert run.data.params["model"] == "MyNet"
    assert "dana.run_dir" not in run.data.tags  # the temporary directory is gone
    out = tmp_path / "kept"
    _fit(mlflow=str(tmp_path / "mlruns"), mlflow_experiment="kept", out=out)
    (run,) = _runs(client, "kept")
    assert run.data.tags["dana.run_dir"] == str(out.resolve())
    assert json.loads((out / "config.json").read_text())["model"] == "MyNet"


def _wandb_records(wandb_dir):
    """The records of the one offline W&B run under ``wandb_dir``, up to its exit record:
    wandb-core may still be writing them when ``finish`` returns (it closes the file
    later), so read until that record is there."""
    deadline = time.monotonic() + 30
    while True:
        paths = glob.glob(str(wandb_dir / "wandb" / "offline-run-*" / "*.wandb"))
        assert len(paths) <= 1, paths
        records = _read_records(paths[0]) if paths else []
        if any(r.HasField("exit") for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.1)


def _read_records(path):
    """The protobuf ``Record`` messages of a ``.wandb`` file, a LevelDB-style log: a 7-byte
    header, then 32 KiB blocks of chunks, each with a 7-byte header (CRC, length, type:
    FULL = 1, or FIRST, MIDDLE, LAST = 2, 3, 4); wandb 0.31 ships no Python reader."""
    from wandb.proto import wandb_internal_pb2

    data = open(path, "rb").read()
    if len(data) < 7:  # its header not written yet
        return []
    assert data[:4] == b":W&B", path
    records, chunk, pos, block = [], b"", 7, 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header: padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if pos + 7 + length > len(data):  # still being written
            break
        chunk += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunk)
            records.append(record)
            chunk = b""
    return records


def _items(updates):
    """``{key: value}`` of a W&B history or summary record's items."""
    return {".".join(u.nested_key) or u.key: json.loads(u.value_json) for u in updates}


def test_wandb_tracks_config_rows_and_summary_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="W&B not installed: pip install wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)  # the default: offline
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    out = tmp_path / "run"
    assert main(["train", *TINY, "--epochs", "0.5", "--eval-every", "0.25", "--lr", "0.05",
                 "--wandb", "--out", str(out)]) == 0  # fmt: skip
    records = _wandb_records(tmp_path)
    (start,) = [r.run for r in records if r.HasField("run")]
    assert start.project == "dana" and start.display_name == "run"  # --wandb's default
    config = {u.key: json.loads(u.value_json) for u in start.config.update}
    assert config["lr"] == 0.05 and config["model"] == "linear" and config["wandb"] == "dana"
    rows = list(csv.DictReader((out / "metrics.csv").open()))
    history = [_items(r.history.item) for r in records if r.HasField("history")]
    assert len(rows) == len(history) == 3  # epochs 0, 0.25, 0.5
    assert [h["_step"] for h in history] == [int(float(r["updates"])) for r in rows]
    assert [h["test_error"] for h in history] == pytest.approx(
        [float(r["test_error"]) for r in rows]
    )
    summary = {}
    for r in records:
        if r.HasField("summary"):
            summary.update(_items(r.summary.update))
    assert summary["final_test_error"] == pytest.approx(float(rows[-1]["test_error"]))
    assert summary["diverged"] is False
    (end,) = [r.exit for r in records if r.HasField("exit")]
    assert end.exit_code == 0
    saved = json.loads((out / "wandb_run.json").read_text())
    assert saved == {"project": "dana", "run_id": start.run_id}


def test_a_failed_run_is_marked_failed_in_every_tracker(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="W&B not installed: pip install wandb")
    client = _client(tmp_path / "mlruns")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))

    def explode(problem, params):
        raise RuntimeError("the loss exploded")

    monkeypatch.setattr(dana.fitting.UserProblem, "evaluate", explode)
    with pytest.raises(RuntimeError, match="exploded"):
        _fit(mlflow=str(tmp_path / "mlruns"), wandb="proj")
    (run,) = _runs(client)
    assert run.info.status == "FAILED"
    (end,) = [r.exit for r in _wandb_records(tmp_path) if r.HasField("exit")]
    assert end.exit_code == 1
