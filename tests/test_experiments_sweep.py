"""Sweeps and reports: grid expansion, time to target, presets, and `dana sweep` /
`dana report` run as real subprocesses on tiny synthetic problems."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import pytest
from clirun import run_dana
from conftest import fake_run

from dana.cli import build_parser
from dana.errors import ConfigError
from dana.experiments.cli import sweep_spec
from dana.experiments.grid import Cell, SweepSpec, cell_name, expand
from dana.experiments.presets import load_preset, preset_names
from dana.experiments.report import build_report
from dana.experiments.results import load_results
from dana.experiments.sweep import LINUX, _die_with_parent, threads_per_job
from dana.experiments.table import error_cell
from dana.experiments.targets import time_to_target
from dana.train.config import TrainConfig
from dana.train.training import train

# One thread per run: tiny models gain nothing from more, and on a shared machine OpenMP's
# waits make each step many times slower. The sweep passes it on to its runs.
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# A run of a few pushes: the cost of a cell is the interpreter's start-up.
TINY = [
    "--dataset", "synthetic", "--model", "linear", "--train-size", "256",
    "--test-size", "64", "--batch-size", "32", "--epochs", "0.5", "--eval-every", "0.25",
    "--warmup-epochs", "0.25",
]  # fmt: skip


def dana(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``dana ARGS`` in a process of its own (tests/clirun.py); the finished process."""
    result = run_dana(*args, timeout=300)
    if check:
        assert result.returncode == 0, result.stdout + result.stderr
    return result


def summaries(out: Path) -> dict[str, float]:
    """mtime of each run's summary.json, by run name."""
    return {p.parent.name: p.stat().st_mtime_ns for p in out.glob("runs/*/summary.json")}


# -- grid -------------------------------------------------------------------------------
def test_grid_expansion_orders_cells_and_runs_only_the_baseline_at_one_worker():
    spec = SweepSpec(
        fixed={"epochs": 2.0},
        grid={"algorithm": ["ssgd", "nag-asgd"], "workers": [1, 4, 16], "seed": [0, 1]},
    )
    cells = expand(spec)
    assert [c.name for c in cells[:5]] == [
        "dana-slim_k1_s0",
        "ssgd_k4_s0",
        "nag-asgd_k4_s0",
        "ssgd_k16_s0",
        "nag-asgd_k16_s0",
    ]
    assert len(cells) == 2 * (1 + 2 * 2)
    assert all(c.options["epochs"] == 2.0 for c in cells)
    assert {(c.algorithm, c.workers) for c in cells if c.workers == 1} == {("dana-slim", 1)}
    every = expand(SweepSpec(grid=dict(spec.grid), baseline="all"))
    assert {c.algorithm for c in every if c.workers == 1} == {"ssgd", "nag-asgd"}


def test_grid_extra_axes_name_the_cells_and_fixed_options_override_axes():
    spec = SweepSpec.from_dict(
        {"grid": {"algorithms": ["dana-slim"], "workers": [8], "lr": [0.05, 0.1]}, "epochs": 1}
    )
    assert [c.name for c in expand(spec)] == ["dana-slim_k8_s0_lr0.05", "dana-slim_k8_s0_lr0.1"]
    # a value on the command line replaces the preset's list, and a list replaces a value
    spec = spec.override({"lr": 0.2}, {"seed": [3, 4]})
    assert "lr" not in spec.grid and spec.fixed["lr"] == 0.2
    assert [c.name for c in expand(spec)] == ["dana-slim_k8_s3", "dana-slim_k8_s4"]
    assert (
        cell_name(
            {"algorithm": "a", "workers": 2, "seed": 0, "lr_decay_epochs": [80, 120.0]},
            ["lr_decay_epochs"],
        )
        == "a_k2_s0_lr-decay-epochs80-120"
    )


def test_a_sweep_file_is_overridden_by_the_command_line(tmp_path):
    spec_file = tmp_path / "sweep.yaml"
    spec_file.write_text(
        "grid:\n  algorithms: [ssgd, dana-slim]\n  workers: [1, 8]\n  lr: [0.01, 0.02]\n"
        "epochs: 2\nbatch-size: 64\nbaseline: nag-asgd\n"
    )
    args = ["sweep", "--config", str(spec_file), "--seeds", "0,1", "--lr", "0.05", "--epochs", "4"]
    spec = sweep_spec(build_parser().parse_args(args))
    cells = expand(spec)
    assert {c.options["epochs"] for c in cells} == {4.0}  # the command line wins
    assert {c.options["lr"] for c in cells} == {0.05}  # a value replaces the file's list
    assert {c.options["batch_size"] for c in cells} == {64}
    assert [c.name for c in cells if c.seed == 0] == [
        "nag-asgd_k1_s0",
        "ssgd_k8_s0",
        "dana-slim_k8_s0",
    ]
    assert len(cells) == 6


def test_clusters_are_a_grid_axis_with_short_cell_names(tmp_path):
    """`--clusters` (or `cluster:` in a grid) crosses clusters; a cell is named by its
    cluster and split, and its config holds the resolved cluster, as config.json will."""
    cluster = tmp_path / "slowlink.yaml"
    cluster.write_text("network: {latency_ms: 5}\n")
    args = ["sweep", "--algorithms", "asgd", "--workers", "4", "--seeds", "0",
            "--clusters", f"geo,{cluster}", "--grid", "partition=iid,shards:2"]  # fmt: skip
    cells = expand(sweep_spec(build_parser().parse_args(args)))
    assert [c.name for c in cells] == [
        "asgd_k4_s0_geo_iid",
        "asgd_k4_s0_geo_shards2",
        "asgd_k4_s0_slowlink_iid",
        "asgd_k4_s0_slowlink_shards2",
    ]
    config = cells[3].config()
    assert config.cluster["name"] == "slowlink" and config.cluster["network"]["latency_ms"] == 5.0
    assert config.partition == "shards:2"


def test_grid_rejects_unknown_options_and_bad_values():
    with pytest.raises(ConfigError, match="unknown grid option"):
        SweepSpec.from_dict({"grid": {"learning_rate": [0.1]}})
    with pytest.raises(ConfigError, match="unknown option"):
        SweepSpec.from_dict({"epoch": 3})
    with pytest.raises(ConfigError, match="repeats"):
        SweepSpec.from_dict({"grid": {"workers": [4, 4]}})
    cells = expand(SweepSpec(grid={"algorithm": ["no-such-algorithm"], "workers": [2]}))
    with pytest.raises(ConfigError, match="no-such-algorithm"):
        cells[0].config()


def test_each_job_gets_its_share_of_the_cores():
    assert [threads_per_job(jobs, cores=2) for jobs in (1, 2, 4)] == [2, 1, 1]
    assert threads_per_job(3, cores=16) == 5


# -- time to target -----------------------------------------------------------------------
def test_time_to_target_interpolates_between_evaluations():
    rows = [
        {"sim_time": 0.0, "test_error": 0.9},
        {"sim_time": 100.0, "test_error": 0.5},
        {"sim_time": 300.0, "test_error": 0.1},
        {"sim_time": 400.0, "test_error": 0.2},
    ]
    assert time_to_target(rows, 0.5) == 100.0  # exactly at an evaluation
    assert time_to_target(rows, 0.3) == pytest.approx(200.0)  # half-way from 0.5 to 0.1
    assert time_to_target(rows, 0.95) == 0.0  # the first row is below it
    assert time_to_target(rows, 0.05) is None  # never reached
    diverged = rows[:2] + [{"sim_time": 200.0, "test_error": float("nan")}] + rows[2:]
    assert time_to_target(diverged, 0.3) is None  # a diverged run never reaches it


# -- presets ------------------------------------------------------------------------------
def test_presets_expand_into_valid_runs_following_the_paper_protocol():
    assert {"paper-cifar10-resnet20", "fashion-quick", "fashion-full"} <= set(preset_names())
    for name in preset_names():
        spec = load_preset(name)
        cells = expand(spec)
        assert spec.description, name
        if spec.fixed.get("dataset") == "text":  # language models: tests/test_models_language.py
            continue
        for cell in cells:
            config = cell.config()
            assert config.weight_decay == 1e-4 and config.momentum == 0.9, cell.name
            assert config.warmup_epochs > 0 and config.model in ("resnet20", "resnet8", "cnn"), (
                cell.name
            )
        # the one-worker hyper-parameters are reused unchanged for every k; only SSGD
        # has a second row, with the linear-scaling rule
        configs = [c.config().to_dict() for c in cells]
        varying = {k for c in configs for k, v in c.items() if v != configs[0][k]}
        # (and fashion-dylu's second row: the same rules with Dynamic Local Updates on)
        allowed = {"algorithm", "workers", "seed", "lr_scaling", "algorithm_params", "lr"}
        if name == "fashion-k64-budget":  # the budget curve: the same shape, shorter
            allowed |= {"epochs", "lr_decay_epochs"}
        if name == "fashion-clusters":  # the clusters (their compute models) and splits
            allowed |= {"cluster", "partition", "timing", "timing_params"}
            for c in configs:
                assert c["lr_decay_epochs"] == [c["epochs"] / 2, c["epochs"] * 3 / 4]
        assert varying <= allowed, (name, varying)
        assert all(c["lr_scaling"] == "none" or c["algorithm"] == "ssgd" for c in configs)
        # the one other rate: plain ASGD's fair control at the momentum methods'
        # effective step, lr/(1 - m)
        lr = configs[0]["lr"]
        for c in configs:
            assert c["lr"] == lr or (
                c["algorithm"] == "asgd" and c["lr"] == pytest.approx(lr / (1 - c["momentum"]))
            ), (name, c["algorithm"], c["lr"])
        # (fashion-dylu-h5, its control: H = 5 for every rule alike; Delayed Nesterov at
        # the other outer rules' step per outer gradient, 0.07*N/sqrt(k) with N = k)
        own = ({}, {"dynamic_steps": True}, {"local_steps": 5})
        for c in configs:
            if c["algorithm"] == "local-dn" and "outer_lr" in c["algorithm_params"]:
                matched = 0.07 * c["workers"] ** 0.5
                assert c["algorithm_params"] == {"outer_lr": pytest.approx(matched)}, c
            else:
                assert c["algorithm_params"] in own, (name, c["algorithm_params"])
    long = expand(load_preset("fashion-long"))
    assert {c.workers for c in long} == {1, 8, 16, 32, 64} and {c.seed for c in long} == {0, 1}
    assert len(long) == 2 * (1 + 4 * 10 + 3)  # + ASGD's control at k = 16, 32, 64
    assert sum(c.options.get("lr_scaling") == "linear" for c in long) == 8
    assert sum(c.options.get("lr") == 0.05 for c in long) == 6
    config = long[1].config()
    assert (config.train_size, config.epochs, config.warmup_epochs) == (30000, 40, 5)
    assert config.lr_decay_epochs == [20, 30]
    beyond = expand(load_preset("fashion-beyond"))
    assert {c.workers for c in beyond} == {1, 16, 64} and {c.seed for c in beyond} == {0, 1}
    # + Delayed Nesterov at the matched step, k = 16 and 64
    assert len(beyond) == 2 * (1 + 2 * len({c.algorithm for c in beyond}) + 2) == 66
    assert [(c.algorithm, c.seed) for c in beyond if c.workers == 1] == [
        ("dana-slim", 0),
        ("dana-slim", 1),
    ]  # its own baseline: fashion-long's, with the same settings (so --reuse copies it)
    assert beyond[0].config().to_dict() == long[0].config().to_dict()
    assert {"dana-slim", "dana-ga", "gap-aware", "dana-local", "ormo", "smega2"} <= {
        c.algorithm for c in beyond
    }
    dylu = expand(load_preset("fashion-dylu"))
    assert len(dylu) == 24 and {c.config().timing for c in dylu} == {"heterogeneous"}
    assert sum(c.config().algorithm_params == {"dynamic_steps": True} for c in dylu) == 12
    control = expand(load_preset("fashion-dylu-h5"))
    assert [(c.algorithm, c.workers, c.seed) for c in control] == [
        (c.algorithm, c.workers, c.seed) for c in dylu[:3]
    ]
    for c in control:  # fashion-dylu's plain cells at k = 16, seed 0, but for H
        twin = next(d for d in dylu if d.name == c.name).config().to_dict()
        assert c.config().to_dict() == {**twin, "algorithm_params": {"local_steps": 5}}
    fixed = {k: v for k, v in load_preset("fashion-long").fixed.items() if k != "description"}
    assert {k: load_preset("fashion-beyond").fixed.get(k) for k in fixed} == fixed
    # the third-seed rule in every multi-seed study
    for name in ("fashion-long", "fashion-beyond", "fashion-dylu", "fashion-k64"):
        assert load_preset(name).more_seeds == {"above_spread": 2, "seeds": [2]}, name
    k64 = expand(load_preset("fashion-k64"))
    assert len(k64) == 18 and {c.workers for c in k64} == {1, 64}  # 16 + ASGD's control
    config = k64[0].config()
    assert (config.train_size, config.epochs, config.lr_decay_epochs) == (None, 133, [67, 100])
    budget = expand(load_preset("fashion-k64-budget"))
    assert sorted((c.workers, c.config().epochs) for c in budget) == sorted(
        ([(1, e) for e in (20, 40, 80, 133)] + [(64, e) for e in (20, 40, 80, 133)] * 3) * 2
    )
    assert {k: v for k, v in budget[0].config().to_dict().items() if "epochs" not in k} == {
        k: v for k, v in config.to_dict().items() if "epochs" not in k
    }
    full = expand(load_preset("fashion-full"))
    assert {1, 4, 8, 16, 32, 64} <= {c.workers for c in full}
    assert len({c.seed for c in full}) >= 2
    assert {
        "ssgd",
        "asgd",
        "nag-asgd",
        "multi-asgd",
        "dc-asgd",
        "dana-zero",
        "dana-slim",
        "dana-dc",
        "gap-aware",
    } <= {c.algorithm for c in full}
    clusters = expand(load_preset("fashion-clusters"))
    # + ASGD's control on the three IID panels
    assert len(clusters) == 2 * 3 * 2 * 7 + 2 * 3 and {c.workers for c in clusters} == {1, 16}
    configs = [c.config() for c in clusters]
    assert {c.cluster["name"] for c in configs} == {"datacenter", "cloud", "geo"}
    assert {c.partition for c in configs} == {"iid", "dirichlet:0.5"}
    assert {c.algorithm for c in configs if c.workers == 16} == {
        "ssgd", "asgd", "dana-slim", "gap-aware", "local-dn", "dana-local"
    }  # fmt: skip
    assert all(c.lr_scaling == "linear" for c in configs if c.algorithm == "ssgd")
    assert all(
        c.algorithm_params == {"dynamic_steps": True} for c in configs if "local" in c.algorithm
    )
    assert "dana-slim_k16_s0_geo_dir0.5" in {c.name for c in clusters}  # short names
    same = {k: v for k, v in fixed.items() if k not in ("timing", "more_seeds")}
    assert {k: load_preset("fashion-clusters").fixed.get(k) for k in same} == same
    paper = load_preset("paper-cifar10-resnet20").fixed
    assert (paper["epochs"], paper["lr_decay_epochs"], paper["warmup_epochs"]) == (
        160,
        [80, 120],
        5,
    )


# -- the report on hand-made runs ---------------------------------------------------------
def test_report_states_divergence_by_rule_and_speedup_over_ssgd(tmp_path):
    fake_run(tmp_path, "base0", "dana-slim", 1, 0, [0.9, 0.3, 0.2], gap=0.01)
    fake_run(tmp_path, "base1", "dana-slim", 1, 1, [0.9, 0.3, 0.2], gap=0.01)
    fake_run(tmp_path, "s0", "ssgd", 4, 0, [0.9, 0.5, 0.2], gap=0.01)
    fake_run(tmp_path, "d0", "dana-slim", 4, 0, [0.9, 0.2, 0.1], gap=0.01)
    fake_run(tmp_path, "n0", "nag-asgd", 4, 0, [0.9, float("nan")], diverged=True, gap=0.01)
    fake_run(tmp_path, "n1", "nag-asgd", 4, 1, [0.9, float("nan")], diverged=True, gap=0.01)
    fake_run(tmp_path, "m0", "multi-asgd", 4, 0, [0.9, 0.5, 0.4], gap=0.01)
    fake_run(tmp_path, "m1", "multi-asgd", 4, 1, [0.9, float("nan")], diverged=True, gap=0.01)
    results = load_results(tmp_path)
    assert error_cell(results.group("nag-asgd", 4), 2) == "diverged"
    assert error_cell(results.group("multi-asgd", 4), 2) == "40.00 (1/2 diverged)"
    assert error_cell(results.group("dana-slim", 1), 2) == "20.00 ± 0.00"
    report = build_report(tmp_path, target=0.2)  # the baseline's final error
    assert report.target == pytest.approx(0.2)
    # at k=4, ssgd reaches 20% at its last row (sim_time 50), dana-slim at its second (25)
    assert "| 25 (2.00×) |" in report.markdown
    assert "| not reached (0/2) |" in report.markdown  # nag-asgd: both seeds diverged
    assert all(f.is_file() for f in report.files)


# -- dana sweep and dana report as commands -----------------------------------------------
@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> Path:
    """A finished sweep: two algorithms at k = 2 and 4, plus the one-worker baseline."""
    out = tmp_path_factory.mktemp("sweep") / "results"
    dana("sweep", *TINY, "--algorithms", "ssgd,dana-slim", "--workers", "1,2,4",
         "--out", str(out), "--jobs", "2", "--quiet")  # fmt: skip
    return out


#: The tests of one finished sweep run in one xdist process, which runs the sweep once.
uses_swept = pytest.mark.xdist_group("swept")


@pytest.mark.slow
@uses_swept
def test_sweep_runs_every_cell_and_report_tabulates_and_plots_them(swept):
    names = {"dana-slim_k1_s0", "ssgd_k2_s0", "dana-slim_k2_s0", "ssgd_k4_s0", "dana-slim_k4_s0"}
    assert set(summaries(swept)) == names
    record = json.loads((swept / "sweep.json").read_text())
    assert {c["name"]: c["status"] for c in record["cells"]} == dict.fromkeys(names, "finished")
    copy = swept.parent / "copy"
    result = dana("report", str(swept), "--export", str(copy))
    table = [line for line in result.stdout.splitlines() if line.startswith("|")]
    # the copy holds the runs' small files only, and reports the same table
    assert {p.name for p in copy.glob("runs/*/*")} == {"config.json", "metrics.csv", "summary.json"}
    assert "\n".join(table) == build_report(swept).error_table
    assert table[0].split("|")[2:5] == [" k=1 ", " k=2 ", " k=4 "]
    rows = {line.split("|")[1].strip(): line.split("|")[2:-1] for line in table[2:]}
    assert rows["ssgd"][1].strip() and rows["ssgd"][2].strip()
    assert rows["dana-slim"][1].strip() and rows["dana-slim"][2].strip()
    assert any(r.startswith("baseline k=1: dana-slim") and v[0].strip() for r, v in rows.items())
    import matplotlib.image

    pngs = ["error_curves", "error_vs_workers", "gap_vs_workers"]
    # the speed-up plot only where some cell has a speed-up (or a bound) to draw
    report = (copy / "report.md").read_text()
    if "no speed-up plot" in report:
        assert not (copy / "speedup_vs_workers.png").exists()
    else:
        pngs.append("speedup_vs_workers")
    for name in pngs:
        path = copy / f"{name}.png"
        assert path.read_bytes()[:8] == PNG_SIGNATURE
        assert matplotlib.image.imread(path).shape[0] > 100
        assert f"({name}.png)" in (copy / "report.md").read_text()


@pytest.mark.slow
@uses_swept
def test_rerunning_a_sweep_skips_finished_runs(swept, tmp_path):
    before = summaries(swept)
    result = dana("sweep", *TINY, "--algorithms", "ssgd,dana-slim", "--workers", "1,2,4",
                  "--out", str(swept), "--quiet")  # fmt: skip
    assert summaries(swept) == before
    assert "5 skipped" in result.stdout
    assert (swept / "sweep.log").read_text().count("skip ") == 5
    # an export's sweep.json records them as finished (the rerun's "skipped" is its own)
    dana("report", str(swept), "--export", str(tmp_path / "copy"))
    cells = json.loads((tmp_path / "copy" / "sweep.json").read_text())["cells"]
    assert {c["status"] for c in cells} == {"finished"}


@pytest.mark.slow
@uses_swept
def test_a_sweep_refuses_a_directory_holding_runs_of_other_settings(swept):
    result = dana("sweep", *TINY, "--epochs", "0.75", "--algorithms", "ssgd", "--workers", "2",
                  "--out", str(swept), "--quiet", check=False)  # fmt: skip
    assert result.returncode == 2 and "other settings" in result.stderr


@pytest.mark.slow
@uses_swept
def test_a_sweep_reuses_finished_runs_of_the_same_settings(swept, tmp_path):
    out = tmp_path / "second"
    (out / "runs" / ".asgd_k2_s0.reuse").mkdir(parents=True)  # a copy a kill cut short
    result = dana("sweep", *TINY, "--algorithms", "dana-slim,asgd", "--workers", "2",
                  "--out", str(out), "--reuse", str(swept), "--quiet")  # fmt: skip
    assert "1 reused" in result.stdout
    copied, original = out / "runs" / "dana-slim_k2_s0", swept / "runs" / "dana-slim_k2_s0"
    assert {p.name for p in copied.iterdir()} == {
        p.name for p in original.iterdir() if p.name != "checkpoint.pt"
    }
    for name in ("config.json", "metrics.csv", "summary.json"):
        assert (copied / name).read_bytes() == (original / name).read_bytes()
    assert (out / "runs" / "asgd_k2_s0" / "summary.json").is_file()  # (ran: no such run)
    assert not (out / "runs" / ".asgd_k2_s0.reuse").exists()
    record = json.loads((out / "sweep.json").read_text())
    assert {c["name"]: c["status"] for c in record["cells"]} == {
        "dana-slim_k2_s0": "reused",
        "asgd_k2_s0": "finished",
    }
    assert f"reuse dana-slim_k2_s0: a copy of {original}" in (out / "sweep.log").read_text()
    # other settings are run, not copied; a directory that is not there is bad input
    other = dana("sweep", *TINY, "--momentum", "0.5", "--algorithms", "dana-slim", "--workers",
                 "2", "--out", str(tmp_path / "third"), "--reuse", str(swept), "--quiet")  # fmt: skip
    assert "0 reused" in other.stdout and "1 finished" in other.stdout
    bad = dana("sweep", *TINY, "--algorithms", "asgd", "--workers", "2", "--out",
               str(tmp_path / "fourth"), "--reuse", str(tmp_path / "none"), check=False)  # fmt: skip
    assert bad.returncode == 2 and "--reuse" in bad.stderr and "no such directory" in bad.stderr
    assert not (tmp_path / "fourth").exists()


@pytest.mark.slow
@uses_swept
def test_a_run_made_with_other_defaults_is_neither_reused_nor_taken_as_finished(swept, tmp_path):
    """summary.json records the hyper-parameters the algorithm ran with, defaults
    included: a run whose record differs from what its settings give now (a default
    changed since) is not copied by --reuse, and a sweep resumed on it refuses it."""
    from dana.experiments.layout import SweepDir, hparams_differ
    from dana.experiments.reuse import ReusableRuns
    from dana.train.records.rundir import RunDir

    old = tmp_path / "old"
    shutil.copytree(swept / "runs" / "dana-slim_k2_s0", old / "runs" / "dana-slim_k2_s0")
    run = RunDir(old / "runs" / "dana-slim_k2_s0")
    options = {k: v for k, v in run.read_config().items() if k != "dana_version"}
    summary = run.read_summary()
    assert summary["algorithm_hparams"] == {"momentum": options["momentum"]}
    assert hparams_differ(run, options) == ""
    assert ReusableRuns([old]).find(options) == run.path
    summary["algorithm_hparams"] = {"momentum": 0.5}  # as if the default had been 0.5
    run.summary.write_text(json.dumps(summary))
    assert "momentum: 0.5 there, 0.9 now" in hparams_differ(run, options)
    assert ReusableRuns([old]).find(options) is None
    cell = Cell("dana-slim_k2_s0", options)
    with pytest.raises(ConfigError, match="other hyper-parameters.*a default changed"):
        SweepDir(old).check_matches(cell, options)
    del summary["algorithm_hparams"]  # a record older than the field: taken as it is
    run.summary.write_text(json.dumps(summary))
    assert ReusableRuns([old]).find(options) == run.path


@pytest.mark.slow
def test_a_failing_run_does_not_stop_the_others(tmp_path):
    out = tmp_path / "results"
    result = dana("sweep", *TINY, "--algorithms", "asgd", "--workers", "2",
                  "--grid", "batch_size=4096,32", "--out", str(out), "--quiet",
                  "--report", check=False)  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    record = {c["name"]: c["status"] for c in json.loads((out / "sweep.json").read_text())["cells"]}
    assert record == {"asgd_k2_s0_batch-size4096": "failed", "asgd_k2_s0_batch-size32": "finished"}
    assert "batch-size" in (out / "logs" / "asgd_k2_s0_batch-size4096.log").read_text()
    assert "| asgd (batch_size=4096) | failed |" in result.stdout
    assert f"their output: {out / 'logs' / 'asgd_k2_s0_batch-size4096.log'}" in result.stderr


@pytest.mark.skipif(not LINUX, reason="PR_SET_PDEATHSIG is Linux's")
def test_a_run_whose_sweep_died_before_it_was_tied_to_it_stops_at_once():
    # the sweep killed between the fork and the prctl: its run must not live on, unseen
    not_the_parent = os.getpid() + 1
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)"],
        preexec_fn=partial(_die_with_parent, not_the_parent),
    )
    assert child.wait(timeout=30) == 128 + signal.SIGTERM
    child = subprocess.Popen(
        [sys.executable, "-c", "pass"], preexec_fn=partial(_die_with_parent, os.getpid())
    )
    assert child.wait(timeout=30) == 0


@pytest.mark.slow
def test_a_killed_sweep_resumes_and_a_checkpointed_run_continues(tmp_path):
    out = tmp_path / "results"
    args = ["sweep", *TINY, "--algorithms", "dana-slim", "--workers", "2", "--seeds", "0,1,2",
            "--checkpoint-every", "0.25", "--out", str(out), "--quiet"]  # fmt: skip
    sweep = subprocess.Popen(
        [sys.executable, "-m", "dana.cli", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=ENV,
    )
    log = out / "sweep.log"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and "finished " not in (
        log.read_text() if log.is_file() else ""
    ):
        time.sleep(0.1)
    os.kill(sweep.pid, signal.SIGKILL)  # no chance to clean up: the runs die with it
    sweep.wait()
    assert 1 <= len(summaries(out)) < 3
    # a run that stopped after a checkpoint (here: finished, its summary then removed)
    # continues from that checkpoint
    cell = next(
        c
        for c in expand(sweep_spec(build_parser().parse_args(args)))
        if c.name == "dana-slim_k2_s2"
    )
    shutil.rmtree(out / "runs" / cell.name, ignore_errors=True)
    train(cell.config(), out / "runs" / cell.name, progress=False)
    (out / "runs" / cell.name / "summary.json").unlink()
    dana(*args)
    assert len(summaries(out)) == 3
    text = log.read_text()
    assert "resume from checkpoint dana-slim_k2_s2" in text
    assert "skip " in text


def test_also_grids_add_cells_in_run_order_and_rows_skip_defaults(tmp_path):
    spec = SweepSpec.from_dict(
        {
            "grid": {"algorithm": ["ssgd", "dana-slim"], "workers": [1, 2, 4], "seed": [0, 1]},
            "also": [{"algorithm": ["ssgd"], "lr_scaling": ["linear"]}],
        }
    )
    names = [c.name for c in expand(spec)]
    assert names[:4] == [
        "dana-slim_k1_s0",
        "ssgd_k2_s0",
        "dana-slim_k2_s0",
        "ssgd_k2_s0_lr-scalinglinear",
    ]
    assert len(names) == 2 * (1 + 3 + 3) and "ssgd_k1_s0_lr-scalinglinear" not in names
    assert SweepSpec.from_dict(spec.to_dict()).also == spec.also
    # an also grid that names workers runs its own baseline (another schedule, say)
    spec.also.append({"epochs": [2.0], "workers": [1, 4]})
    names = [c.name for c in expand(spec)]
    assert "dana-slim_k1_s0_epochs2" in names and "ssgd_k4_s1_epochs2" in names
    assert len(names) == 2 * (1 + 3 + 3) + 2 * (1 + 2)
    with pytest.raises(ConfigError, match="'also' grid option.*bogus"):
        SweepSpec.from_dict({"also": [{"bogus": [1]}]})
    with pytest.raises(ConfigError, match="list of grids"):
        SweepSpec.from_dict({"also": {"algorithm": ["ssgd"]}})
    from dana.experiments.results import row_label

    keys = ["lr_scaling"]
    assert row_label({"algorithm": "ssgd", "lr_scaling": "none"}, keys) == "ssgd"
    assert row_label({"algorithm": "ssgd", "lr_scaling": "linear"}, keys) == (
        "ssgd (lr_scaling=linear)"
    )


def test_linear_scaling_multiplies_the_peak_rate_after_a_warm_up_from_lr():
    from dana.train.training import build_schedule

    config = TrainConfig(
        workers=8, lr=0.01, warmup_epochs=5, lr_decay_epochs=[], lr_scaling="linear"
    ).validate()
    schedule = build_schedule(config, 100)
    assert schedule(0.0) == pytest.approx(0.01) and schedule(5.0) == pytest.approx(0.08)
    assert (
        build_schedule(TrainConfig(workers=8, lr=0.01, warmup_epochs=5, epochs=9), 100)(5.0) == 0.01
    )
    with pytest.raises(ConfigError, match="lr-scaling"):
        TrainConfig(lr_scaling="sqrt").validate()


def test_more_seeds_are_due_where_the_seeds_spread_widely(tmp_path):
    from dana.experiments.layout import SweepDir
    from dana.experiments.sweep import more_seeds

    spec = SweepSpec.from_dict(
        {
            "grid": {"algorithm": ["asgd", "dana-slim", "ssgd"], "workers": [2], "seed": [0, 1]},
            "more_seeds": {"above_spread": 2, "seeds": [2, 3]},
        }
    )
    cells = expand(spec)
    finals = {"asgd": (0.20, 0.21), "dana-slim": (0.20, 0.25), "ssgd": (0.2, None)}
    for cell in cells:
        error = finals[cell.algorithm][cell.seed]
        run = tmp_path / "runs" / cell.name
        run.mkdir(parents=True)
        (run / "config.json").write_text(json.dumps(cell.options))
        (run / "summary.json").write_text(
            json.dumps({"final_test_error": error, "diverged": error is None})
        )
    due = more_seeds(spec, SweepDir(tmp_path), cells)
    # asgd: 1 pp apart (not due); dana-slim: 5 pp; ssgd: one seed diverged
    assert sorted(c.name for c in due) == [
        "dana-slim_k2_s2", "dana-slim_k2_s3", "ssgd_k2_s2", "ssgd_k2_s3"
    ]  # fmt: skip
    assert all(c.options["seed"] in (2, 3) and c.config() for c in due)
    assert more_seeds(spec, SweepDir(tmp_path), cells + due) == []
    (tmp_path / "runs" / "asgd_k2_s1" / "summary.json").unlink()  # unfinished: not judged
    assert {c.algorithm for c in more_seeds(spec, SweepDir(tmp_path), cells)} == {
        "dana-slim",
        "ssgd",
    }
    with pytest.raises(ConfigError, match="more_seeds"):
        SweepSpec.from_dict({"more_seeds": {"above_spread": "wide", "seeds": [2]}})


@pytest.mark.slow
def test_sweep_runs_the_further_seeds_it_finds_due(tmp_path):
    config = tmp_path / "sweep.yaml"
    config.write_text(
        "grid:\n  algorithm: [asgd]\n  workers: [2]\n  seed: [0, 1]\n"
        "more_seeds:\n  above_spread: 0\n  seeds: [2]\n"
    )
    out = tmp_path / "out"
    # spread 0: any difference between the two seeds makes the third due
    dana("sweep", "--config", str(config), *TINY, "--lr", "0.3", "--out", str(out), "--quiet")
    errors = [
        json.loads((out / "runs" / f"asgd_k2_s{s}" / "summary.json").read_text())[
            "final_test_error"
        ]
        for s in (0, 1)
    ]
    third = out / "runs" / "asgd_k2_s2" / "summary.json"
    assert third.is_file() == (errors[0] != errors[1])
    assert "asgd_k2_s2" in (out / "sweep.log").read_text() or errors[0] == errors[1]


def test_automatic_warm_up_and_decay():
    """Unset, the warm-up gives every worker 60 steps (60*k updates) within [1/8, 2/3]
    of the run, and the rate decays once, at 9/10 of it."""
    from dana.train.training import build_schedule

    config = TrainConfig(workers=16, epochs=3).validate()
    assert config.warmup_epochs is None and config.lr_decay_epochs is None
    assert config.warmup_epochs_for(468) == 2.0  # 60*16/468 = 2.05, capped at 2/3 of 3
    assert config.warmup_epochs_for(4680) == 3 / 8  # 960 updates is under 1/8 of the run
    assert TrainConfig(workers=16, epochs=12).warmup_epochs_for(468) == pytest.approx(960 / 468)
    assert TrainConfig(workers=1, epochs=40).warmup_epochs_for(234) == 5.0  # 1/8 of 40
    assert config.decay_epochs_for() == [pytest.approx(2.7)]
    schedule = build_schedule(config, 468)
    assert schedule(0.0) == pytest.approx(0.005 / 16) and schedule(2.0) == 0.005
    assert schedule(2.71) == pytest.approx(0.0005)
    given = TrainConfig(workers=16, epochs=3, warmup_epochs=1, lr_decay_epochs=[]).validate()
    assert given.warmup_epochs_for(468) == 1 and given.decay_epochs_for() == []
