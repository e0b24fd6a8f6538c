"""What a notebook or shell user expects of the command: --version, a did-you-mean for a
mistyped algorithm, run directories that never collide, local paths only, and reports on
runs without an error rate."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

import dana
import dana.algorithms as A
from dana.cli import default_out, main
from dana.experiments.plots import error_vs_workers_figure
from dana.experiments.report import build_report
from dana.experiments.results import load_results
from dana.train.config import TrainConfig

TINY = ["--dataset", "synthetic", "--model", "linear", "--train-size", "128", "--test-size",
        "32", "--batch-size", "32", "--epochs", "0.5", "--workers", "2", "--quiet"]  # fmt: skip


def test_version(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["--version"])
    assert exit.value.code == 0
    assert capsys.readouterr().out.strip() == f"dana {dana.__version__}"


def test_a_mistyped_algorithm_gets_a_suggestion(tmp_path, capsys):
    with pytest.raises(
        ValueError, match=r"unknown algorithm 'dana-slm' \(did you mean 'dana-slim'\?\)"
    ):
        A.get("dana-slm")
    with pytest.raises(ValueError, match=r"'nag_asgd' \(did you mean 'nag-asgd'\?\)"):
        A.build("nag_asgd")
    assert A.did_you_mean("zzzz") == ""
    assert main(["train", *TINY, "--algorithm", "dana-slm", "--out", str(tmp_path / "r")]) == 2
    assert "did you mean 'dana-slim'?" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
    argv = ["sweep", *TINY, "--algorithms", "dana-slim,multi-asg", "--out", str(tmp_path / "s")]
    assert main(argv) == 2
    assert "did you mean 'multi-asgd'?" in capsys.readouterr().err


def test_runs_without_out_never_collide(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", *TINY]) == 0
    assert main(["train", *TINY]) == 0  # (runs/latest made this one fail)
    runs = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert len(runs) == 2 and all(r.startswith("dana-slim-k2-") for r in runs)
    assert f"Results in runs/{runs[-1]}." in capsys.readouterr().out
    config = TrainConfig(algorithm="asgd", workers=4)
    monkeypatch.setattr("time.strftime", lambda fmt: "20250131-142501")
    first = default_out(config, "runs")
    assert first == os.path.join("runs", "asgd-k4-20250131-142501")
    os.makedirs(first)
    assert default_out(config, "runs") == first + "-2"  # two runs in one second


@pytest.mark.parametrize("command", ["train", "sweep"])
def test_remote_out_is_refused_and_nothing_written(tmp_path, monkeypatch, capsys, command):
    monkeypatch.chdir(tmp_path)
    extra = ["--algorithms", "asgd"] if command == "sweep" else []
    assert main([command, *TINY, *extra, "--out", "s3://bucket/run"]) == 2
    assert "local directory" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_report_without_error_rates_falls_back_to_the_loss(tmp_path):
    """Runs whose metrics have no error (a regression: NaN test_error) are reported on the
    test loss: numbers in every table, lines in every panel, no nan verdict."""
    header = (
        "epoch,updates,sim_time,wall_seconds,lr,train_loss,test_loss,test_error,mean_gap,"
        "mean_staleness"
    )
    for name, algorithm, k, losses in [
        ("base", "dana-slim", 1, [1.0, 0.5, 0.3]),
        ("slim", "dana-slim", 4, [1.0, 0.6, 0.31]),
        ("nag", "nag-asgd", 4, [1.0, 0.9, 0.8]),
    ]:
        run = tmp_path / "runs" / name
        run.mkdir(parents=True)
        (run / "config.json").write_text(
            json.dumps({"algorithm": algorithm, "workers": k, "seed": 0, "dataset": "user"})
        )
        rows = [
            f"{i},{10 * i},{100.0 * i / k},0,0.1,1,{v},nan,0.01,{k - 1}"
            for i, v in enumerate(losses)
        ]
        (run / "metrics.csv").write_text("\n".join([header, *rows]) + "\n")
        summary = {"final_test_error": None, "final_test_loss": losses[-1], "diverged": False,
                   "mean_gap": 0.01}  # fmt: skip
        (run / "summary.json").write_text(json.dumps(summary))
    results = load_results(tmp_path)
    assert results.metric.key == "test_loss" and not results.metric.perplexity
    report = build_report(tmp_path)
    text = report.markdown
    assert "## Final test loss" in text and "0.3100" in text and "+0.5000" in text
    assert "nan" not in text.replace("NaN or infinite", "").lower()
    assert "No verdict" in text
    assert [t.value for t in report.targets] == pytest.approx([0.303, 0.306])  # +1%, +2%
    fig = error_vs_workers_figure(results)
    plotted = [y for line in fig.axes[0].lines for y in line.get_ydata()]
    assert any(math.isfinite(y) and y > 0 for y in plotted)


def test_version_answers_without_importing_torch():
    code = (
        "import sys; from dana.launcher import main; assert main(['--version']) == 0; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith("dana ")


def test_list_options_take_spaces_or_commas():
    """`--lr-decay-epochs 1 2`, `1,2` and `"1 2"` are one list; so are the sweep's grid
    lists (`--workers 1 16`, `--workers 1,16`)."""
    from dana.cli import build_parser
    from dana.train.options import collect_options

    def decay(*values):
        args = build_parser().parse_args(["train", "--lr-decay-epochs", *values, "--epochs", "4"])
        return collect_options(args)["lr_decay_epochs"]

    assert decay("1", "2") == decay("1,2") == decay("1 2") == [1.0, 2.0]
    assert decay("") == []
    sweep = build_parser().parse_args(["sweep", "--workers", "1", "16", "--seeds", "0,1", "2"])
    assert (sweep.grid_workers, sweep.grid_seed) == ([1, 16], [0, 1, 2])
