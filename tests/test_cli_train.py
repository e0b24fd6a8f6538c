"""End-to-end tests of `dana train`: the real command in a process of its own (forked
from a helper that has imported dana once: tests/clirun.py), on small data."""

from __future__ import annotations

import csv
import gzip
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from clirun import kill_at_first_checkpoint, run_dana

from dana.data import write_cifar10, write_idx
from dana.train.records.rundir import METRICS_COLUMNS

SMALL = ["--dataset", "synthetic", "--model", "linear", "--train-size", "512", "--test-size", "256",
         "--batch-size", "32", "--quiet"]  # fmt: skip


# One thread per process: the tiny models here gain nothing from more, and on a shared
# machine OpenMP's waits make each step many times slower.
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def dana(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``dana ARGS`` in a process of its own (tests/clirun.py)."""
    return run_dana(*args, timeout=timeout)


def read_metrics(path: Path) -> list[dict[str, str]]:
    with (path / "metrics.csv").open() as f:
        return list(csv.DictReader(f))


def without_wall(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    return [{k: v for k, v in r.items() if k != "wall_seconds"} for r in rows]


def assert_bad_input(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("dana: error:"), result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, (fragment, result.stderr)


def test_outputs_are_present_and_well_formed(tmp_path):
    out = tmp_path / "run"
    result = dana("train", *SMALL, "--workers", "4", "--epochs", "2", "--eval-every", "0.5",
                  "--out", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "final test error" in result.stdout and "epoch" in result.stdout

    config = json.loads((out / "config.json").read_text())
    assert config["workers"] == 4 and config["algorithm"] == "dana-slim"
    assert config["dana_version"]

    rows = read_metrics(out)
    assert list(rows[0]) == list(METRICS_COLUMNS)
    assert [float(r["epoch"]) for r in rows] == [0.0, 0.5, 1.0, 1.5, 2.0]
    assert all(float(r["test_error"]) <= 1 for r in rows)
    assert float(rows[-1]["updates"]) == 2 * (512 // 32)
    assert 0 < float(rows[-1]["mean_staleness"]) <= 4

    summary = json.loads((out / "summary.json").read_text())
    for key in ("algorithm", "workers", "final_test_error", "best_test_error", "final_test_loss",
                "diverged", "updates", "epochs", "mean_gap", "mean_staleness", "wall_seconds"):  # fmt: skip
        assert key in summary
    assert summary["diverged"] is False
    assert summary["final_test_error"] == pytest.approx(float(rows[-1]["test_error"]))
    assert summary["final_train_loss"] == pytest.approx(float(rows[-1]["train_loss"]))
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(out.glob(".*.tmp*"))


def test_config_json_reruns_the_same_run(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    args = (
        "--algorithm",
        "nag-asgd",
        "--workers",
        "3",
        "--epochs",
        "1",
        "--timing",
        "heterogeneous",
    )
    assert dana("train", *SMALL, *args, "--out", str(first)).returncode == 0
    result = dana("train", "--config", str(first / "config.json"), "--quiet", "--out", str(second))
    assert result.returncode == 0, result.stderr
    assert without_wall(read_metrics(first)) == without_wall(read_metrics(second))


def test_yaml_config_and_command_line_override(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("dataset: synthetic\nmodel: linear\ntrain-size: 256\nworkers: 2\nepochs: 1\n")
    out = tmp_path / "run"
    result = dana("train", "--config", str(config), "--workers", "5", "--batch-size", "32",
                  "--quiet", "--out", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr
    saved = json.loads((out / "config.json").read_text())
    assert saved["workers"] == 5 and saved["train_size"] == 256 and saved["model"] == "linear"


def killed_and_resumed(tmp_path: Path, args: list[str]) -> tuple[Path, Path]:
    """``dana train ARGS`` run whole, and run again killed at its first checkpoint then
    resumed: the two run directories, whose metrics (but the wall times) are asserted
    equal."""
    whole = tmp_path / "whole"
    assert dana("train", *args, "--out", str(whole)).returncode == 0
    killed = tmp_path / "killed"
    kill_at_first_checkpoint(*args, out=killed)
    result = dana("train", "--resume", str(killed), "--quiet")
    assert result.returncode == 0, result.stderr
    assert without_wall(read_metrics(killed)) == without_wall(read_metrics(whole))
    return whole, killed


def test_resume_after_kill_equals_uninterrupted_run(tmp_path):
    args = [*SMALL, "--algorithm", "dana-zero", "--workers", "4", "--epochs", "60",
            "--eval-every", "5", "--checkpoint-every", "5", "--timing", "gamma"]  # fmt: skip
    whole, killed = killed_and_resumed(tmp_path, args)
    summary = json.loads((killed / "summary.json").read_text())
    assert summary["updates"] == json.loads((whole / "summary.json").read_text())["updates"]

    again = dana("train", "--resume", str(killed), "--quiet")
    assert again.returncode == 0 and "already finished" in again.stdout


def test_divergence_is_reported_not_crashed(tmp_path):
    out = tmp_path / "run"
    result = dana("train", *SMALL, "--algorithm", "multi-asgd", "--workers", "8", "--lr", "1e30",
                  "--warmup-epochs", "0", "--epochs", "2", "--out", str(out))  # fmt: skip
    assert result.returncode == 3, result.stderr
    assert "Traceback" not in result.stderr
    assert "DIVERGED" in result.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["diverged"] is True and summary["diverged_at_update"] >= 0


def test_small_cnn_learns_synthetic_data(tmp_path):
    out = tmp_path / "run"
    result = dana("train", "--dataset", "synthetic", "--model", "cnn", "--algorithm", "dana-slim",
                  "--workers", "4", "--epochs", "4", "--batch-size", "32", "--lr", "0.05",
                  "--train-size", "1000", "--test-size", "500", "--quiet", "--out", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["final_test_error"] < 0.45  # chance is 0.9


def test_tensorboard_logs(tmp_path):
    pytest.importorskip("tensorboard")
    out = tmp_path / "run"
    result = dana("train", *SMALL, "--epochs", "1", "--tensorboard", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))


# -- bad input: a clear error, exit status 2, no traceback, nothing written -------------


def idx_dir(tmp_path: Path, image_size: int = 8, n: int = 64) -> Path:
    d = tmp_path / "idx"
    d.mkdir()
    rng = np.random.default_rng(0)
    for prefix, count in (("train", n), ("t10k", n // 2)):
        images = torch.from_numpy(
            rng.integers(0, 256, (count, image_size, image_size), dtype=np.uint8)
        )
        labels = torch.from_numpy(rng.integers(0, 10, count, dtype=np.uint8))
        write_idx(d / f"{prefix}-images-idx3-ubyte.gz", images)
        write_idx(d / f"{prefix}-labels-idx1-ubyte.gz", labels)
    return d


def test_small_idx_and_cifar_files_train(tmp_path):
    data = idx_dir(tmp_path)
    result = dana("train", "--dataset", "mnist", "--data-dir", str(data), "--model", "mlp",
                  "--batch-size", "16", "--epochs", "1", "--quiet", "--out", str(tmp_path / "m"))  # fmt: skip
    assert result.returncode == 0, result.stderr

    cifar = tmp_path / "cifar-10-batches-bin"
    rng = np.random.default_rng(0)
    images = torch.from_numpy(rng.integers(0, 256, (50, 3, 32, 32), dtype=np.uint8))
    labels = torch.from_numpy(rng.integers(0, 10, 50))
    write_cifar10(cifar, images, labels, images[:20], labels[:20])
    result = dana("train", "--dataset", "cifar10", "--data-dir", str(tmp_path), "--model", "cnn",
                  "--batch-size", "10", "--epochs", "1", "--quiet", "--out", str(tmp_path / "c"))  # fmt: skip
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (lambda p: p.write_bytes(b""), "empty"),
        (
            lambda p: p.write_bytes(gzip.compress(b"\x00\x00\x08\x01" + b"\x00\x00\x00\x40")),
            "truncated",
        ),
        (lambda p: p.write_bytes(gzip.compress(b"\x12\x34\x08\x01" + b"\x00" * 68)), "magic"),
    ],
    ids=["empty", "truncated", "wrong-magic"],
)
def test_bad_idx_files(tmp_path, corrupt, message):
    data = idx_dir(tmp_path)
    corrupt(data / "train-labels-idx1-ubyte.gz")
    out = tmp_path / "run"
    result = dana("train", "--dataset", "mnist", "--data-dir", str(data), "--model", "mlp",
                  "--out", str(out))  # fmt: skip
    assert_bad_input(result, "train-labels-idx1-ubyte.gz", message)
    assert not out.exists()


def test_truncated_cifar_file(tmp_path):
    cifar = tmp_path / "cifar-10-batches-bin"
    images = torch.zeros(20, 3, 32, 32, dtype=torch.uint8)
    labels = torch.zeros(20, dtype=torch.int64)
    write_cifar10(cifar, images, labels, images[:10], labels[:10])
    victim = cifar / "data_batch_3.bin"
    victim.write_bytes(victim.read_bytes()[:-100])
    out = tmp_path / "run"
    result = dana("train", "--dataset", "cifar10", "--data-dir", str(cifar), "--out", str(out))
    assert_bad_input(result, "data_batch_3.bin")
    assert not out.exists()


def test_missing_default_dataset_says_how_to_install(tmp_path, monkeypatch, capsys):
    import dana.data.datasets as datasets
    from dana.cli import main

    monkeypatch.setattr(datasets, "DEFAULT_FASHION_DIR", str(tmp_path / "nowhere"))
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "apt-get install dataset-fashion-mnist" in err and "--data-dir" in err
    assert not out.exists()


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--workers", "0"], "--workers"),
        (["--lr", "-0.1"], "--lr"),
        (["--momentum", "1.0"], "--momentum"),
        (["--epochs", "0"], "--epochs"),
        (["--batch-size", "100000"], "--batch-size"),
        (["--algorithm", "sgd-magic"], "sgd-magic"),
        (["--model", "resnet21"], "resnet21"),
        (["--timing", "weibull"], "weibull"),
        (["--timing", "trace", "--timing-trace", "/no/such/trace.csv"], "trace.csv"),
        (["--algorithm", "dc-asgd", "--lc", "-1"], "lc"),
        (["--algo-param", "bogus=1"], "bogus"),
    ],
)
def test_out_of_range_options(tmp_path, args, fragment):
    out = tmp_path / "run"
    assert_bad_input(dana("train", *SMALL, *args, "--out", str(out)), fragment)
    assert not out.exists()


def test_dataset_model_mismatch(tmp_path):
    data = idx_dir(tmp_path, image_size=3)
    out = tmp_path / "run"
    result = dana("train", "--dataset", "mnist", "--data-dir", str(data), "--model", "cnn",
                  "--batch-size", "16", "--out", str(out))  # fmt: skip
    assert_bad_input(result, "cnn", "3x3")
    assert not out.exists()


def test_bad_config_files(tmp_path):
    out = tmp_path / "run"
    assert_bad_input(
        dana("train", "--config", str(tmp_path / "none.yaml"), "--out", str(out)), "none.yaml"
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text("workers: [1, 2\n")
    assert_bad_input(dana("train", "--config", str(bad), "--out", str(out)), "bad.yaml")
    unknown = tmp_path / "unknown.json"
    unknown.write_text('{"wrokers": 4}')
    assert_bad_input(dana("train", "--config", str(unknown), "--out", str(out)), "wrokers")
    assert not out.exists()


def test_resume_of_a_directory_without_a_run(tmp_path):
    assert_bad_input(dana("train", "--resume", str(tmp_path)), "holds no run")


def test_out_that_already_holds_a_run_is_not_overwritten(tmp_path):
    out = tmp_path / "run"
    assert dana("train", *SMALL, "--epochs", "0.5", "--out", str(out)).returncode == 0
    before = (out / "metrics.csv").read_bytes()
    assert_bad_input(
        dana("train", *SMALL, "--workers", "2", "--out", str(out)), "already holds a run"
    )
    assert (out / "metrics.csv").read_bytes() == before


def test_help_and_algorithm_list():
    for command in ([], ["train"], ["algorithms"]):
        result = dana(*command, "--help")
        assert result.returncode == 0 and "usage" in result.stdout
    shown = " ".join(dana("train", "--help").stdout.split())
    assert "(default: dana-slim)" in shown
    assert "--no-standby with --backend ray: no standby replica of shard 0" in shown
    listing = dana("algorithms").stdout
    from dana.algorithms import ALGORITHMS

    for name in ALGORITHMS:
        assert name in listing


def test_cluster_run_keeps_its_model_and_reruns_from_config(tmp_path):
    """config.json holds the resolved cluster (not its name or path): rerunning it gives
    the same run; summary.json reports the departures and the classes applied."""
    cluster = tmp_path / "mine.yaml"
    cluster.write_text(
        "compute: {model: lognormal, mean: 100, cv: 0.3}\n"
        "network: {latency_ms: 2, bandwidth_gbps: 0.001, server_bandwidth_gbps: 0.002}\n"
        "availability:\n  preemptions: [{worker: 1, leave_ms: 2000, rejoin_ms: 5000}]\n"
    )
    first = tmp_path / "first"
    args = [*SMALL, "--workers", "3", "--epochs", "3", "--partition", "dirichlet:1"]
    assert dana("train", *args, "--cluster", str(cluster), "--out", str(first)).returncode == 0
    cluster.unlink()  # the run does not need the file any more
    saved = json.loads((first / "config.json").read_text())
    assert saved["cluster"]["name"] == "mine" and saved["cluster"]["network"]["latency_ms"] == 2.0
    assert saved["timing"] == "lognormal" and saved["timing_params"] == {"mean": 100.0, "cv": 0.3}
    again = tmp_path / "again"
    result = dana("train", "--config", str(first / "config.json"), "--out", str(again), "--quiet")
    assert result.returncode == 0, result.stderr
    assert without_wall(read_metrics(again)) == without_wall(read_metrics(first))
    summary = json.loads((first / "summary.json").read_text())
    assert summary["cluster"] == "mine" and summary["leaves"] == 1 and summary["joins"] == 1
    assert sum(summary["data_class_counts"]) == 512
    assert 0 < sum(summary["applied_class_counts"]) <= 3 * 512


def test_resume_after_kill_on_a_cluster_equals_uninterrupted_run(tmp_path):
    """Killed midway with workers away, messages on their way and held pushes, then
    resumed: the same metrics and summary as the run never interrupted."""
    cluster = tmp_path / "churn.yaml"
    cluster.write_text(
        "compute: {model: gamma, slow_episodes: {every_ms: 3000, length_ms: 500, factor: 3}}\n"
        "network: {latency_ms: 20, bandwidth_gbps: 0.0001, server_bandwidth_gbps: 0.0002}\n"
        "availability: {random: {mean_up_ms: 4000, mean_down_ms: 1000}}\n"
    )
    args = [*SMALL, "--algorithm", "dana-zero", "--workers", "4", "--epochs", "40",
            "--eval-every", "5", "--checkpoint-every", "5", "--cluster", str(cluster),
            "--partition", "shards:2", "--max-staleness", "3"]  # fmt: skip
    whole, killed = killed_and_resumed(tmp_path, args)
    a, b = (json.loads((d / "summary.json").read_text()) for d in (killed, whole))
    assert {k: v for k, v in a.items() if k != "wall_seconds"} == {
        k: v for k, v in b.items() if k != "wall_seconds"
    }
    assert a["leaves"] > 1 and a["lost_computations"] > 0


def test_a_cluster_of_nothing_is_the_run_without_one(tmp_path):
    """A cluster file that sets nothing (no latency, no limits, no drift, no departures)
    gives the run without a cluster, row for row."""
    empty = tmp_path / "zero.yaml"
    empty.write_text("name: zero\nnetwork: {latency_ms: 0}\n")
    args = [*SMALL, "--workers", "4", "--epochs", "3", "--max-staleness", "2"]
    plain, zero = tmp_path / "plain", tmp_path / "zero"
    assert dana("train", *args, "--out", str(plain)).returncode == 0
    assert dana("train", *args, "--cluster", str(empty), "--out", str(zero)).returncode == 0
    assert without_wall(read_metrics(zero)) == without_wall(read_metrics(plain))
    assert json.loads((zero / "summary.json").read_text())["cluster"] == "zero"
