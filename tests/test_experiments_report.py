"""`dana report` on hand-made runs: the claim at a glance, the near-baseline targets and
the first-evaluation rule, the speed-up's reference row, and the plots' clipping and
missing-cell reasons."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from conftest import fake_run

from dana.experiments import plots
from dana.experiments.glance import glance_cells, glance_sentences, glance_table
from dana.experiments.report import build_report
from dana.experiments.results import load_results
from dana.experiments.table import time_table
from dana.experiments.targets import (
    DIVERGED,
    NO_SSGD,
    NOT_REACHED,
    SSGD_NOT_REACHED,
    choose_targets,
    reference_row,
    scaled_reference_row,
    speedup_bounds,
    speedup_cells,
)

NAN = float("nan")


def _baseline(root: Path, finals=(0.10, 0.12), first=0.5) -> None:
    for seed, final in enumerate(finals):
        fake_run(root, f"base{seed}", "dana-slim", 1, seed, [0.9, first, 0.3, final])


# -- the claim at a glance ----------------------------------------------------------------
def _claim_runs(root: Path) -> None:
    _baseline(root)  # mean final error 11%
    for seed, (slim, nag) in enumerate([(0.116, 0.19), (0.118, 0.20)]):
        fake_run(root, f"slim32_{seed}", "dana-slim", 32, seed, [0.9, 0.5, slim])
        fake_run(root, f"nag32_{seed}", "nag-asgd", 32, seed, [0.9, 0.5, nag])
    fake_run(root, "multi32_0", "multi-asgd", 32, 0, [0.9, 0.5, 0.15])
    fake_run(root, "multi32_1", "multi-asgd", 32, 1, [0.9, NAN], diverged=True)
    fake_run(root, "ssgd32_0", "ssgd", 32, 0, [0.9, 0.5, 0.13])
    fake_run(root, "asgd32_0", "asgd", 32, 0, [0.9, 0.5, 0.14])
    fake_run(root, "slim16_0", "dana-slim", 16, 0, [0.9, 0.5, 0.125])
    fake_run(root, "nag16_0", "nag-asgd", 16, 0, [0.9, 0.5, 0.12])
    for seed in (0, 1):
        fake_run(root, f"multi16_{seed}", "multi-asgd", 16, seed, [0.9, NAN], diverged=True)


def test_glance_table_gives_each_row_minus_the_baseline_seed_by_seed(tmp_path):
    _claim_runs(tmp_path)
    results = load_results(tmp_path)
    cells = glance_cells(results)
    assert list(cells) == [16, 32]
    # paired by seed: 11.6 - 10 and 11.8 - 12
    assert cells[32]["dana-slim"].values == pytest.approx([1.6, -0.2])
    assert cells[32]["dana-slim"].mean == pytest.approx(0.7)
    assert cells[32]["dana-slim"].bounds == pytest.approx((-0.2, 1.6))
    lines = glance_table(results).splitlines()
    # the claim's rows first in a fixed order, then the others (asgd)
    assert lines[0] == (
        "| k | baseline k=1 (%) | dana-slim (pp) | nag-asgd (pp) | multi-asgd (pp) "
        "| ssgd (pp) | asgd (pp) |"
    )
    assert lines[2] == "| 16 | 11.00 [10.00, 12.00] | +2.50 | +2.00 | diverged 2/2 | — | — |"
    assert lines[3] == (
        "| 32 | 11.00 [10.00, 12.00] | +0.70 [-0.20, +1.60] | +8.50 [+8.00, +9.00] "
        "| +5.00 (diverged 1/2) | +3.00 | +4.00 |"
    )


def test_glance_sentences_judge_the_claim_by_intervals_against_one_line(tmp_path):
    _claim_runs(tmp_path)
    assert glance_sentences(load_results(tmp_path)) == [
        "k=16: DANA-Slim +2.50 pp, 1 seed: within 1 pp of the baseline: inconclusive (one "
        "seed, no interval); NAG-ASGD +2.00 pp, 1 seed: worse by more than 1 pp: "
        "inconclusive (one seed, no interval); Multi-ASGD diverged 2/2: worse by more than "
        "1 pp: holds (a seed diverged): the claim inconclusive (within noise).",
        "k=32: DANA-Slim +0.70 pp [-0.20, +1.60], 2 seeds: within 1 pp of the baseline: "
        "inconclusive (margin -0.60 pp); NAG-ASGD +8.50 pp [+8.00, +9.00], 2 seeds: worse "
        "by more than 1 pp: holds (margin +7.00 pp); Multi-ASGD +5.00 pp, 1 seed, 1/2 "
        "diverged: worse by more than 1 pp: holds (a seed diverged): the claim inconclusive "
        "(within noise).",
    ]
    text = build_report(tmp_path).markdown
    # the comparison opens the report, right after the protocol lines
    assert text.index("Runs: ") < text.index("## The claim at a glance")
    assert text.index("## The claim at a glance") < text.index("## Final test error")
    assert "- k=32: DANA-Slim +0.70 pp [-0.20, +1.60], 2 seeds" in text
    assert "The verdicts use one line, 1 pp above the baseline" in text
    # the seed-by-seed differences drawn, the 1 pp line legible beside a method far off
    assert "![differences from the baseline](differences.png)" in text
    figure = plots.differences_figure(load_results(tmp_path))
    axes = [a for a in figure.axes if a.get_title()]
    assert [a.get_title().split(": ")[-1] for a in axes] == ["k = 16", "k = 32"]
    assert axes[1].get_ylim()[1] < 1 + plots.DIFFERENCE_CLIP_PP + 1  # NAG-ASGD's +8.5 clipped


def test_glance_verdict_holds_or_fails_only_when_the_whole_interval_clears_the_line(tmp_path):
    _baseline(tmp_path, finals=(0.10, 0.10))
    for seed, (slim, nag, multi) in enumerate([(0.101, 0.13, 0.115), (0.104, 0.12, 0.125)]):
        fake_run(tmp_path, f"slim_{seed}", "dana-slim", 16, seed, [0.9, 0.5, slim])
        fake_run(tmp_path, f"nag_{seed}", "nag-asgd", 16, seed, [0.9, 0.5, nag])
        fake_run(tmp_path, f"multi_{seed}", "multi-asgd", 16, seed, [0.9, 0.5, multi])
    (sentence,) = glance_sentences(load_results(tmp_path))
    assert (
        "DANA-Slim +0.25 pp [+0.10, +0.40], 2 seeds: within 1 pp of the baseline: holds "
        "(margin +0.60 pp)"
    ) in sentence
    assert (
        "NAG-ASGD +2.50 pp [+2.00, +3.00], 2 seeds: worse by more than 1 pp: holds "
        "(margin +1.00 pp)"
    ) in sentence
    assert "Multi-ASGD +2.00 pp [+1.50, +2.50], 2 seeds: worse by more than 1 pp: holds" in (
        sentence
    )
    assert sentence.endswith(": the claim holds.")
    # a DANA interval wholly above the line: that part, and so the claim, does not hold
    for seed in (0, 1):
        (tmp_path / "runs" / f"slim_{seed}" / "summary.json").unlink()
        fake_run(tmp_path, f"slim2_{seed}", "dana-slim", 16, seed, [0.9, 0.5, 0.12 + seed / 100])
    (sentence,) = glance_sentences(load_results(tmp_path))
    assert "within 1 pp of the baseline: does not hold (margin -2.00 pp)" in sentence
    assert sentence.endswith(": the claim does not hold.")


def test_glance_falls_back_to_dana_zero_and_says_when_there_is_no_baseline(tmp_path):
    _baseline(tmp_path)
    fake_run(tmp_path, "zero8", "dana-zero", 8, 0, [0.9, 0.5, 0.1])
    assert glance_sentences(load_results(tmp_path)) == [
        "k=8: DANA-Zero +0.00 pp, 1 seed: within 1 pp of the baseline: inconclusive (one "
        "seed, no interval)."
    ]
    lonely = tmp_path / "no-baseline"
    fake_run(lonely, "zero8", "dana-zero", 8, 0, [0.9, 0.5, 0.1])
    assert glance_table(load_results(lonely)) == ""
    assert "No finished one-worker baseline to compare with." in build_report(lonely).markdown


# -- targets ------------------------------------------------------------------------------
def test_default_targets_are_the_baseline_plus_half_and_one_point(tmp_path):
    _baseline(tmp_path)
    fake_run(tmp_path, "ssgd4", "ssgd", 4, 0, [0.9, 0.5, 0.2, 0.1])
    targets = choose_targets(load_results(tmp_path))
    assert [t.value for t in targets] == pytest.approx([0.115, 0.12])
    assert all(t.skip is None for t in targets)
    report = build_report(tmp_path)
    assert report.target == pytest.approx(0.115)
    assert "### Target 1: the one-worker baseline's final test error + 0.5 pp" in report.markdown
    assert "= 11.00% + 1 pp = 12.00%" in report.markdown
    assert report.markdown.count("Simulated time to the target") == 2


def test_a_target_the_baseline_reaches_at_its_first_evaluation_is_not_used(tmp_path):
    # seed 1's first evaluation after the start (updates 10) is at 11.8%: +1 pp (12%) is
    # passed there, +0.5 pp (11.5%) is not; the start row (updates 0) does not count
    fake_run(tmp_path, "base0", "dana-slim", 1, 0, [0.9, 0.5, 0.3, 0.10])
    fake_run(tmp_path, "base1", "dana-slim", 1, 1, [0.9, 0.118, 0.13, 0.12])
    fake_run(tmp_path, "ssgd4", "ssgd", 4, 0, [0.9, 0.5, 0.2, 0.1])
    results = load_results(tmp_path)
    first, second = choose_targets(results)
    assert first.skip is None
    assert second.skip is not None and "first evaluation after the start" in second.skip
    assert "(epoch 1, 10 updates)" in second.skip
    stated = choose_targets(results, 0.6)
    assert stated[0].skip is not None  # a stated target obeys the rule too
    assert choose_targets(results, 0.05)[0].skip is None
    report = build_report(tmp_path)
    assert report.target == pytest.approx(first.value)
    assert report.markdown.count("Simulated time to the target") == 1
    assert second.skip in report.markdown
    report = build_report(tmp_path, target=0.6)
    assert report.target is None and "Not used: the one-worker baseline is at 11.80%" in (
        report.markdown
    )


# -- the speed-up's reference -------------------------------------------------------------
def test_the_speedup_of_a_linearly_scaled_ssgd_row_is_over_plain_ssgd(tmp_path):
    _baseline(tmp_path, first=0.6)
    none, linear = {"lr_scaling": "none"}, {"lr_scaling": "linear"}
    # k=4: time at 20% error: plain ssgd 50 (its last row), linear 25, dana-slim 25
    fake_run(tmp_path, "ssgd4", "ssgd", 4, 0, [0.9, 0.5, 0.2], **none)
    fake_run(tmp_path, "lin4", "ssgd", 4, 0, [0.9, 0.2, 0.2], **linear)
    fake_run(tmp_path, "slim4", "dana-slim", 4, 0, [0.9, 0.2, 0.1], **none)
    for name in ("base0", "base1"):
        config = tmp_path / "runs" / name / "config.json"
        config.write_text(json.dumps({**json.loads(config.read_text()), **none}))
    results = load_results(tmp_path)
    assert "ssgd (lr_scaling=linear)" in results.rows
    lin = results.group("ssgd (lr_scaling=linear)", 4)
    assert reference_row(results, lin) == "ssgd"
    cells = speedup_cells(results, 0.2)
    assert cells[("ssgd (lr_scaling=linear)", 4)] == (pytest.approx(2.0), "")
    assert cells[("dana-slim", 4)] == (pytest.approx(2.0), "")
    assert cells[("ssgd", 4)] == (pytest.approx(1.0), "")
    table = time_table(results, 0.2)
    assert "| ssgd (lr_scaling=linear) |  | 25 (2.00×) |" in table
    # every other row also over the scaled one; plain ssgd only over it
    assert scaled_reference_row(results, lin) is None
    assert scaled_reference_row(results, results.group("dana-slim", 4)) == lin.row
    assert "| ssgd |  | 50 (0.50× vs linear) |" in table
    assert "| dana-slim |  | 25 (2.00×; 1.00× vs linear) |" in table
    results.group("ssgd", 4).results[0].metrics[2]["test_error"] = 0.3  # plain: not reached
    table = time_table(results, 0.2)
    # ssgd ran until time 50 without reaching it: the speed-up is at least 50 / 25
    assert "| dana-slim |  | 25 (ssgd not reached: > 2.00×; 1.00× vs linear) |" in table
    assert "| ssgd (lr_scaling=linear) |  | 25 (ssgd not reached: > 2.00×) |" in table
    assert (
        "| dana-slim |  | 37.5 (ssgd not reached: > 1.33×; linear not reached: > 1.33×) |"
        in time_table(results, 0.15)
    )
    markdown = build_report(tmp_path).markdown
    assert "a second speed-up follows, over it (`vs linear`" in markdown


def test_without_a_scaled_ssgd_row_there_is_one_speedup(tmp_path):
    _baseline(tmp_path, first=0.6)
    fake_run(tmp_path, "ssgd4", "ssgd", 4, 0, [0.9, 0.5, 0.2])
    fake_run(tmp_path, "slim4", "dana-slim", 4, 0, [0.9, 0.2, 0.1])
    results = load_results(tmp_path)
    assert scaled_reference_row(results, results.group("dana-slim", 4)) is None
    table = time_table(results, 0.2)
    assert "| dana-slim |  | 25 (2.00×) |" in table and "vs linear" not in table
    assert "vs linear" not in build_report(tmp_path).markdown


# -- the plots ----------------------------------------------------------------------------
def _gap_runs(root: Path) -> None:
    _baseline(root)
    for k, scale in ((4, 1.0), (8, 2.0)):
        for algorithm in ("ssgd", "dana-slim", "multi-asgd"):
            gap = 0.0 if algorithm == "ssgd" else scale * 1e-4
            fake_run(root, f"{algorithm}{k}", algorithm, k, 0, [0.9, 0.5, 0.2], gap=gap)
    fake_run(root, "nag4", "nag-asgd", 4, 0, [0.9, 0.5, 0.3], gap=3e-4)
    fake_run(root, "nag8", "nag-asgd", 8, 0, [0.9, NAN], diverged=True, gap=3e13)
    fake_run(root, "dc8", "dc-asgd", 8, 0, [0.9, 0.5, 0.4], gap=5.0)  # absurd, not diverged


def _labels(ax) -> list[str]:
    return ax.get_legend_handles_labels()[1]


def test_a_diverged_gap_of_3e13_is_clipped_and_marked(tmp_path):
    _gap_runs(tmp_path)
    results = load_results(tmp_path)
    fig = plots.gap_vs_workers_figure(results)
    ax = fig.axes[0]
    bottom, top = ax.get_ylim()
    # the limit: 100x the largest per-k median of the values without a diverged seed
    # (2e-4 at k=8); 3e13 and 5 lie above it, and the axis ends just above the rest
    series = plots._points(results, lambda g: g.gaps().mean())
    assert plots.robust_top(series, plots.GAP_CLIP_FACTOR, positive=True) == pytest.approx(0.02)
    assert 3e-4 < top < 0.02 and bottom < 1e-4
    assert "diverged seed (at the top edge: off scale or no value)" in _labels(ax)
    assert "off scale (at the top edge)" in _labels(ax)  # dc-asgd's gap of 5
    # every drawn point lies inside the axis
    ys = [y for line in ax.get_lines() for y in line.get_ydata() if math.isfinite(y)]
    assert max(ys) <= top


def test_the_error_plot_marks_a_cell_where_every_seed_diverged(tmp_path):
    _gap_runs(tmp_path)
    fig = plots.error_vs_workers_figure(load_results(tmp_path))
    ax = fig.axes[0]
    assert "diverged seed (at the top edge: off scale or no value)" in _labels(ax)
    assert "off scale (at the top edge)" not in _labels(ax)
    assert ax.get_ylim()[1] <= 100


def test_a_run_at_chance_is_off_scale_and_the_rest_stay_readable(tmp_path):
    """One k (as fashion-k64): a run at chance (90%) beside runs at 9-14% is marked off
    scale at the top edge, the axis ends below 20% so that the baseline (8.7%) and
    the others are told apart, and every jittered point lies inside the x axis."""
    _baseline(tmp_path, finals=(0.087, 0.087), first=0.6)
    for name, final in [
        ("dana-slim", 0.094),
        ("asgd", 0.096),
        ("multi-asgd", 0.141),
        ("nag-asgd", 0.90),
        ("dana-zero", 0.096),
        ("dana-ga", 0.095),
    ]:
        fake_run(tmp_path, name, name, 64, 0, [0.9, 0.5, final])
    ax = plots.error_vs_workers_figure(load_results(tmp_path)).axes[0]
    bottom, top = ax.get_ylim()
    assert bottom < 8.7 < 14.1 < top < 20
    assert "off scale (at the top edge)" in _labels(ax)
    left, right = ax.get_xlim()
    points = [line for line in ax.get_lines() if line.get_label() != "baseline k=1"]
    xs = [x for line in points for x in line.get_xdata()]
    assert xs and all(left < x < right for x in xs)


def test_the_speedup_plot_says_why_a_cell_is_missing(tmp_path):
    _baseline(tmp_path, first=0.6)
    # k=4: ssgd reaches 20% at time 50, dana-slim at 25, nag-asgd diverges, multi-asgd
    # ends at 40%; k=8: no ssgd; k=16: ssgd ends at 30%
    fake_run(tmp_path, "ssgd4", "ssgd", 4, 0, [0.9, 0.5, 0.2])
    fake_run(tmp_path, "slim4", "dana-slim", 4, 0, [0.9, 0.2, 0.1])
    fake_run(tmp_path, "nag4", "nag-asgd", 4, 0, [0.9, NAN], diverged=True)
    fake_run(tmp_path, "multi4", "multi-asgd", 4, 0, [0.9, 0.5, 0.4])
    fake_run(tmp_path, "slim8", "dana-slim", 8, 0, [0.9, 0.2, 0.1])
    fake_run(tmp_path, "ssgd16", "ssgd", 16, 0, [0.9, 0.5, 0.3])
    fake_run(tmp_path, "slim16", "dana-slim", 16, 0, [0.9, 0.2, 0.1])
    results = load_results(tmp_path)
    cells = speedup_cells(results, 0.2)
    assert cells[("dana-slim", 4)] == (pytest.approx(2.0), "")
    assert cells[("nag-asgd", 4)] == (None, DIVERGED)
    assert cells[("multi-asgd", 4)] == (None, NOT_REACHED)
    assert cells[("dana-slim", 8)] == (None, NO_SSGD)
    assert cells[("dana-slim", 16)] == (None, SSGD_NOT_REACHED)
    assert cells[("ssgd", 16)] == (None, NOT_REACHED)
    # ssgd's run at k=16 ends at time 12.5 above the target, dana-slim reached it at 6.25
    assert speedup_bounds(results, 0.2) == {("dana-slim", 16): pytest.approx(2.0)}
    targets = choose_targets(results, 0.2)
    fig = plots.speedups_figure(results, targets)
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    for reason in (DIVERGED, NOT_REACHED, NO_SSGD):
        assert reason in texts
    assert "2.00×" in texts and "> 2.00×" in texts
    assert "hollow: at least (ssgd not reached)" in _labels(fig.axes[0])
    assert "| 12.5 (no ssgd) |" in time_table(results, 0.2)


def test_thirteen_rows_are_told_apart_on_the_plot(tmp_path):
    """Past the ten default colours a row repeats a colour with a new line style: no two
    of the sweep's rows (13, as fashion-beyond has) share both."""
    _baseline(tmp_path, first=0.6)
    names = [f"algo{i:02d}" for i in range(13)]
    for i, name in enumerate(names):
        fake_run(tmp_path, f"r{i}", name, 4, 0, [0.9, 0.5, 0.3 + 0.01 * i])
    fig = plots.error_vs_workers_figure(load_results(tmp_path))
    ax = fig.axes[0]
    drawn = {
        line.get_label(): (line.get_color(), line.get_linestyle())
        for line in ax.get_lines()
        if line.get_label() in names
    }
    assert set(drawn) == set(names)
    assert len(set(drawn.values())) == 13
    assert drawn["algo00"][0] == drawn["algo10"][0] and drawn["algo00"][1] != drawn["algo10"][1]


def test_the_baseline_lies_inside_the_error_plot_and_no_empty_speedup_plot(tmp_path):
    """The baseline (10%, below every k > 1 row) is inside the axis; a sweep without an
    ssgd row gets a sentence, not an empty speed-up plot."""
    _baseline(tmp_path, finals=(0.10, 0.10), first=0.6)
    fake_run(tmp_path, "slim16", "dana-slim", 16, 0, [0.9, 0.2, 0.15])
    fake_run(tmp_path, "nag16", "nag-asgd", 16, 0, [0.9, 0.3, 0.19])
    fig = plots.error_vs_workers_figure(load_results(tmp_path))
    bottom, top = fig.axes[0].get_ylim()
    assert bottom < 10.0 < top
    report = build_report(tmp_path)
    assert not (tmp_path / "speedup_vs_workers.png").exists()
    assert "no SSGD row: no speed-up over SSGD, and no speed-up plot" in report.markdown
    assert "speedup_vs_workers.png" not in report.markdown


# -- which method first, on each cluster ------------------------------------------------------
def _cluster(name: str) -> dict:
    return {"name": name, "compute": {"model": "gamma"}, "network": {}, "availability": {}}


def _clusters_runs(root: Path) -> None:
    """Two clusters, two methods at k = 4: on `fast` asgd reaches the targets first and
    dana-slim ends lower; on `slow` (time x 3) dana-slim is first on both counts."""
    counts = {"applied_class_counts": [30, 10], "data_class_counts": [50, 50]}
    for name, scale, asgd, slim in (
        ("fast", 1.0, [0.9, 0.104, 0.103], [0.9, 0.5, 0.10]),
        ("slow", 3.0, [0.9, 0.5, 0.2], [0.9, 0.11, 0.09]),
    ):
        cluster = _cluster(name)
        for seed in (0, 1):
            fake_run(root, f"base_{name}_{seed}", "dana-slim", 1, seed, [0.9, 0.5, 0.3, 0.10],
                     cluster=cluster, time_scale=scale)  # fmt: skip
            fake_run(root, f"asgd_{name}_{seed}", "asgd", 4, seed, asgd, cluster=cluster,
                     time_scale=scale, summary_extra=counts)  # fmt: skip
            fake_run(root, f"slim_{name}_{seed}", "dana-slim", 4, seed, slim, cluster=cluster,
                     time_scale=scale)  # fmt: skip


def test_the_report_ranks_the_methods_on_each_cluster(tmp_path):
    _clusters_runs(tmp_path)
    results = load_results(tmp_path)
    assert results.panel_keys == ["cluster"]
    panels = results.panels()
    assert list(panels) == ["cluster fast", "cluster slow"]
    assert panels["cluster fast"].rows == ["asgd", "dana-slim"]  # no cluster in the label
    report = build_report(tmp_path, tmp_path / "out")
    text = report.markdown
    assert "## Which method first, on each cluster" in text
    # fast: asgd reaches 10.5% (baseline 10% + 0.5 pp) first and dana-slim ends lower
    fast = text.split("### Cluster fast")[1].split("###")[0]
    # the one-worker baseline's own times first, unranked: 12x asgd's here; then each
    # run's whole simulated length (300 ms over k = 1 and 4)
    assert "| 1 | — | dana-slim, one worker (baseline) | 0.2975 | 0.295 | 0.3 | 10.00 | — |" in fast
    rows = [line for line in fast.splitlines() if line.startswith("| 4 |")]
    assert rows[0].startswith("| 4 | 1 | asgd | 0.02497 |")
    assert rows[0].endswith("| 0.05 | 10.30 | 2 |")
    assert rows[1].startswith("| 4 | 2 | dana-slim |") and rows[1].endswith("| 10.00 | 1 |")
    slow = text.split("### Cluster slow")[1].split("###")[0]
    assert [line.split(" | ")[2] for line in slow.splitlines() if line.startswith("| 4 |")] == [
        "dana-slim",
        "asgd",
    ]
    assert "| asgd | 1 / 2 (k=4) | 2 / 2 (k=4) |" in text  # the overview across clusters
    assert "## Cluster fast" in text and "error_curves_fast.png" in text
    assert (tmp_path / "out" / "error_vs_time.png").is_file()
    # the bias meter: asgd's applied examples are 75% class 0, the data's 50%
    assert "| asgd | 4 | 25.00 | 0: +25.00 | 1: -25.00 |" in text
    assert (tmp_path / "out" / "class_shares.png").is_file()


def test_the_time_plot_is_logarithmic_and_shows_the_targets(tmp_path):
    """The one-worker baseline takes k times as long: simulated time is on a log axis
    (without the evaluation at time 0), the two targets are dotted lines, and the y axis
    ends at 3x the higher one (the first evaluations at 90% leave through the top)."""
    _clusters_runs(tmp_path)
    results = load_results(tmp_path)
    views = {label: (sub, choose_targets(sub)) for label, sub in results.panels().items()}
    fig = plots.error_vs_time_figure(views)
    ax = fig.axes[0]  # cluster fast, k = 4: the baseline ends at 10%, asgd at 10.3%
    assert ax.get_xscale() == "log"
    targets = [line for line in ax.get_lines() if line.get_label() == "targets (time to reach)"]
    curves = [line for line in ax.get_lines() if line not in targets]
    assert len(curves) == 3 and all(min(line.get_xdata()) > 0 for line in curves)
    assert sorted(round(line.get_ydata()[0], 6) for line in targets) == [10.5, 11.0]
    bottom, top = ax.get_ylim()
    assert bottom < 10.0 and top == pytest.approx(33.0)


def test_the_bias_plot_shares_its_axis_and_dashes_the_baseline(tmp_path):
    """Panels share the y axis (an IID split's tiny deviations stay flat beside another
    split's points); the one-worker baseline is the dashed black line, not a line in the
    colour of its own algorithm at k > 1."""
    _clusters_runs(tmp_path)
    even = {"applied_class_counts": [50, 50], "data_class_counts": [50, 50]}
    fake_run(tmp_path, "base_fast_counted", "dana-slim", 1, 2, [0.9, 0.5, 0.3, 0.10],
             cluster=_cluster("fast"), summary_extra=even)  # fmt: skip
    fig = plots.class_shares_figure(load_results(tmp_path).panels())
    fast, slow = fig.axes[:2]
    assert fast.get_shared_y_axes().joined(fast, slow)
    lines = {line.get_label(): line for line in fast.get_lines()}
    base = lines["dana-slim k=1 (baseline)"]
    assert base.get_linestyle() == "--" and base.get_color() == "k"
    assert list(lines["asgd k=4"].get_ydata()) == [25.0, -25.0]


def test_a_report_without_clusters_is_unchanged_by_them(tmp_path):
    _claim_runs(tmp_path)
    text = build_report(tmp_path, tmp_path / "out").markdown
    assert "Which method first" not in text and "class's share" not in text
    assert not (tmp_path / "out" / "error_vs_time.png").exists()


def test_a_budget_curve_gets_a_panel_and_a_baseline_per_budget(tmp_path):
    """A sweep that varies the epochs has a one-worker baseline at each: every budget is
    a panel compared with its own baseline; an algorithm's own setting (lr_scaling)
    splits rows, not panels."""
    for epochs, base_final, slim_final in ((40, 0.10, 0.14), (80, 0.09, 0.10)):
        decays = [epochs / 2, epochs * 3 / 4]
        kw = {"epochs": epochs, "lr_decay_epochs": decays}
        fake_run(tmp_path, f"b{epochs}", "dana-slim", 1, 0, [0.9, 0.5, base_final], **kw)
        fake_run(tmp_path, f"d{epochs}", "dana-slim", 64, 0, [0.9, 0.5, slim_final], **kw)
        fake_run(tmp_path, f"s{epochs}", "ssgd", 64, 0, [0.9, 0.5, 0.2], lr_scaling="linear",
                 **kw)  # fmt: skip
    results = load_results(tmp_path)
    assert results.panel_keys == ["epochs", "lr_decay_epochs"]
    panels = results.panels()
    assert list(panels) == [
        "epochs 40, lr_decay_epochs [20,30]",
        "epochs 80, lr_decay_epochs [40,60]",
    ]
    for panel, base in zip(panels.values(), (10.0, 9.0)):
        assert 100 * panel.baseline().finals().mean() == pytest.approx(base)
    markdown = build_report(tmp_path).markdown
    assert "No finished one-worker baseline" not in markdown
    assert "| 64 | 10.00 | +4.00 |" in markdown and "| 64 | 9.00 | +1.00 |" in markdown


def test_a_budget_study_gets_its_curve_of_final_error_against_updates_per_worker(tmp_path):
    for epochs, base, slim in ((2, 0.10, 0.20), (4, 0.10, 0.12)):
        for seed in (0, 1):
            pushes = {"pushes": 64 * 10 * epochs}
            fake_run(tmp_path, f"b{epochs}_{seed}", "dana-slim", 1, seed, [0.9, base],
                     epochs=epochs, summary_extra=pushes)  # fmt: skip
            fake_run(tmp_path, f"s{epochs}_{seed}", "dana-slim", 64, seed,
                     [0.9, slim + seed / 100], epochs=epochs, summary_extra=pushes)  # fmt: skip
    results = load_results(tmp_path)
    assert results.panel_keys == ["epochs"]
    assert [plots._per_worker(sub, 64) for sub in results.panels().values()] == [20.0, 40.0]
    figure = plots.budget_curve_figure(results.panels())
    (ax,) = [a for a in figure.axes if a.get_title()]
    assert ax.get_title() == f"{tmp_path.name}: final test error by budget, k = 64"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["20", "40"]
    report = build_report(tmp_path)
    assert (tmp_path / "budget_curve.png").is_file()
    assert "![budget curve](budget_curve.png)" in report.markdown


def test_dana_report_prints_the_verdict_and_the_targets_once(tmp_path, capsys):
    from dana.cli import main

    _claim_runs(tmp_path)
    assert main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("The claim at k=32: DANA-Slim +0.70 pp [-0.20, +1.60], 2 seeds") == 1
    assert out.count("Time-to-target targets: ") == 1


def test_a_loss_target_is_relative_to_the_baseline_whatever_its_scale(tmp_path):
    from dana.experiments.targets import choose_targets

    for scale in (1.0, 1000.0):  # (an MSE in other units: the same targets, scaled)
        root = tmp_path / f"x{scale:g}"
        nan = [math.nan] * 3
        for name, k in (("dana-slim", 1), ("asgd", 4)):
            fake_run(
                root, f"{name}{k}", name, k, 0, nan, summary_extra={"final_test_loss": 2 * scale}
            )
        results = load_results(root)
        assert not results.metric.is_error
        targets = choose_targets(results)
        assert [t.value for t in targets] == pytest.approx([2.02 * scale, 2.04 * scale])
        assert "+ 1% =" in targets[0].text


def test_a_target_no_run_reached_is_one_line_not_a_table_of_not_reached(tmp_path):
    for name, k in (("dana-slim", 1), ("asgd", 4)):
        fake_run(tmp_path, f"{name}{k}", name, k, 0, [0.9, 0.5, 0.3])
    text = build_report(tmp_path, target=0.01).markdown
    assert "No run reached it." in text and "not reached (" not in text
