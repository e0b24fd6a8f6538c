"""Graceful preemption (dana/train/records/preempt.py): SIGTERM on `dana train` (the simulator,
and Ray: tests/test_ps_robust.py) or `dana sweep` writes a checkpoint of that moment,
says so in one line and exits 75; `--resume` continues exactly."""

from __future__ import annotations

import csv
import json
import signal
from pathlib import Path

import pytest
from clirun import run_dana, start, wait_for, wait_rows

from dana.errors import EXIT_PREEMPTED

SMALL = ["--dataset", "synthetic", "--model", "linear", "--train-size", "512", "--test-size", "256",
         "--batch-size", "32", "--quiet"]  # fmt: skip
ARGS = [*SMALL, "--algorithm", "dana-zero", "--workers", "4", "--epochs", "60",
        "--eval-every", "5", "--timing", "gamma"]  # fmt: skip


def rows(path: Path) -> list[dict[str, str]]:
    with (path / "metrics.csv").open() as f:
        return [{k: v for k, v in r.items() if k != "wall_seconds"} for r in csv.DictReader(f)]


def test_sigterm_checkpoints_mid_run_and_resume_equals_the_uninterrupted_run(tmp_path):
    whole = tmp_path / "whole"
    assert run_dana("train", *ARGS, "--out", str(whole)).returncode == 0

    cut = tmp_path / "cut"
    proc = start("train", *ARGS, "--out", str(cut))
    wait_rows(cut, 2, proc, timeout=120)  # past the first evaluations
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == EXIT_PREEMPTED, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "preempted by SIGTERM: checkpoint written at step" in err
    assert f"dana train --resume {cut}" in err
    assert (cut / "checkpoint.pt").exists() and not (cut / "summary.json").exists()
    step = int(err.split("at step ")[1].split(";")[0])
    assert 0 < step < 60 * 16 and step % 80, err  # mid-way, not at an evaluation point

    result = run_dana("train", "--resume", str(cut), "--quiet")
    assert result.returncode == 0, result.stderr
    assert rows(cut) == rows(whole)
    done, ref = (json.loads((p / "summary.json").read_text()) for p in (cut, whole))
    for key in ("updates", "pushes", "final_test_loss", "mean_gap", "mean_staleness"):
        assert done[key] == ref[key], key
    assert (cut / "model.safetensors").read_bytes() == (whole / "model.safetensors").read_bytes()


@pytest.mark.slow
def test_sigterm_on_a_sweep_checkpoints_its_runs_and_exits_75(tmp_path):
    spec = tmp_path / "sweep.yaml"
    spec.write_text(
        "dataset: synthetic\nmodel: linear\ntrain-size: 512\ntest-size: 256\nbatch-size: 32\n"
        "epochs: 200\neval-every: 5\nalgorithm: dana-zero\nworkers: 4\ngrid:\n  seed: [0, 1]\n"
    )
    out = tmp_path / "sweep"
    proc = start("sweep", "--config", str(spec), "--out", str(out), "--jobs", "2")

    def both_evaluated() -> bool:
        metrics = list(out.glob("runs/*/metrics.csv"))
        return len(metrics) == 2 and all(len(m.read_text().splitlines()) > 2 for m in metrics)

    wait_for(both_evaluated, proc, "two runs past their first evaluations", timeout=120)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == EXIT_PREEMPTED, err
    assert "Traceback" not in err and "rerun the same command" in err, err
    runs = sorted(out.glob("runs/*"))
    assert len(runs) == 2
    for run in runs:
        assert (run / "checkpoint.pt").exists() and not (run / "summary.json").exists()
        log = next(out.glob(f"logs/{run.name}*")).read_text()
        assert "preempted by SIGTERM: checkpoint written at step" in log, log
    assert "preempted" in (out / "sweep.log").read_text()


def test_sigterm_once_the_run_is_over_still_writes_every_file(tmp_path, monkeypatch):
    # the signal lands while the curves are drawn (the run's last seconds): the run is
    # done, its files all written, summary.json last; nothing is left to resume
    import os

    from dana.train.config import TrainConfig
    from dana.train.records.rundir import RunDir
    from dana.train.training import train

    draw = RunDir.write_plot

    def signalled(self, *args):
        os.kill(os.getpid(), signal.SIGTERM)
        return draw(self, *args)

    def outside(signum, frame):
        raise RuntimeError("SIGTERM reached the process outside the run's watch")

    monkeypatch.setattr(RunDir, "write_plot", signalled)
    config = TrainConfig(dataset="synthetic", model="linear", train_size=256, test_size=64,
                         batch_size=32, epochs=1.0, workers=2)  # fmt: skip
    before = signal.signal(signal.SIGTERM, outside)
    try:
        summary = train(config, tmp_path / "run", progress=False)
        assert signal.getsignal(signal.SIGTERM) is outside  # (restored after the run)
    finally:
        signal.signal(signal.SIGTERM, before)
    assert not summary["diverged"]
    for name in ("summary.json", "curves.png", "model.safetensors", "metrics.csv"):
        assert (tmp_path / "run" / name).is_file(), name


@pytest.mark.parametrize("moment", ["problem", "start_run"])
def test_sigterm_while_the_run_is_built_ends_it_at_once_with_nothing_written(
    tmp_path, monkeypatch, moment
):
    # the signal lands while the data and model load (before any file: nothing left) or
    # once the run directory is begun (its config.json: --resume starts it): Preempted at
    # once, the process's own handler back afterwards
    import os

    import dana.train.training as training
    from dana.errors import Preempted
    from dana.train.config import TrainConfig

    target = "Problem" if moment == "problem" else "start_run"
    real = getattr(training, target)

    def signalled(*args, **kwargs):
        built = real(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)
        return built

    def outside(signum, frame):
        raise RuntimeError("SIGTERM reached the process outside the run's start")

    monkeypatch.setattr(training, target, signalled)
    config = TrainConfig(dataset="synthetic", model="linear", train_size=256, test_size=64,
                         batch_size=32, epochs=1.0, workers=2)  # fmt: skip
    before = signal.signal(signal.SIGTERM, outside)
    try:
        with pytest.raises(Preempted) as stopped:
            training.train(config, tmp_path / "run", progress=False)
        assert signal.getsignal(signal.SIGTERM) is outside
    finally:
        signal.signal(signal.SIGTERM, before)
    said = "preempted by SIGTERM while the run was being built: "
    if moment == "problem":
        assert str(stopped.value) == said + "nothing written; run the same command again"
        assert not (tmp_path / "run").exists()
        return
    resume = f"`dana train --resume {tmp_path / 'run'}`"
    assert str(stopped.value) == said + f"no step taken; start it with {resume}"
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["config.json"]
    monkeypatch.undo()
    summary = training.train(config, tmp_path / "run", resume=True, progress=False)
    assert not summary["diverged"] and summary["pushes"] > 0
