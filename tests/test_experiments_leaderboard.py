"""`dana leaderboard` on hand-made studies: the interval, the ranks and their ties, the
baseline row, the time to target, the device column, the per-method summary, a language
model's loss; and that the committed docs/LEADERBOARD.md is what the command writes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from conftest import fake_run

from dana.cli import main
from dana.experiments.leaderboard import HEADER, build_leaderboard, interval, study_protocols

ROOT = Path(__file__).resolve().parents[1]
NAN = float("nan")


def _alpha(root: Path) -> None:
    """k = 4 against a baseline at 10% (target 10.5%): dana-slim and asgd overlap (=1),
    nag-asgd and the single seed of multi-asgd inside its range (=3), ssgd diverged."""
    for seed, final in enumerate((0.098, 0.102)):
        fake_run(root, f"base{seed}", "dana-slim", 1, seed, [0.9, 0.5, 0.3, final])
    for seed, final in enumerate((0.100, 0.104)):
        fake_run(root, f"slim{seed}", "dana-slim", 4, seed, [0.9, 0.2, final])
    for seed, (final, device) in enumerate(((0.103, "cuda"), (0.110, "cpu"))):
        fake_run(root, f"asgd{seed}", "asgd", 4, seed, [0.9, 0.2, final], device=device)
    for seed, final in enumerate((0.20, 0.21)):
        fake_run(root, f"nag{seed}", "nag-asgd", 4, seed, [0.9, 0.5, final])
    fake_run(root, "multi0", "multi-asgd", 4, 0, [0.9, 0.5, 0.207])
    for seed in (0, 1):
        fake_run(root, f"ssgd{seed}", "ssgd", 4, seed, [0.9, NAN], diverged=True)


def _beta(root: Path) -> None:
    """k = 8, no baseline: dana-slim alone first, asgd second."""
    fake_run(root, "slim", "dana-slim", 8, 0, [0.9, 0.5, 0.10])
    fake_run(root, "asgd", "asgd", 8, 0, [0.9, 0.5, 0.20])


def _rows(text: str, heading: str) -> list[list[str]]:
    """The cells of the table under ``heading`` (the heading's line goes on with the
    protocol's target)."""
    after = text.split(heading)[1].split("\n", 1)[1].lstrip("\n").split("\n\n")
    table = next(block for block in after if block.startswith("|"))
    return [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[2:]]


def test_the_interval_is_none_the_range_or_a_seeded_bootstrap():
    assert interval(np.array([0.1])) is None
    assert interval(np.array([0.3, 0.1, 0.2])) == (0.1, 0.3)
    values = np.array([0.10, 0.11, 0.12, 0.13, 0.20])
    low, high = interval(values)
    assert 0.10 < low < values.mean() < high < 0.20  # the mean's, narrower than the range
    assert interval(values) == (low, high)  # the same values, the same interval


def test_overlapping_intervals_share_a_rank_after_the_unranked_baseline(tmp_path):
    _alpha(tmp_path / "alpha")
    text = build_leaderboard(tmp_path, tmp_path / "LEADERBOARD.md")
    assert text.startswith(HEADER + "\n")
    heading = "### alpha: k=4, cluster none, partition iid"
    assert (
        f"{heading}; target 10.50% test error\n| rank | method | seeds | final test error (%)"
        in text
    )
    rows = _rows(text, heading)
    assert rows[0][:4] == ["—", "dana-slim, one worker (baseline)", "2/2", "10.00 [9.80..10.20]"]
    assert [(r[0], r[1]) for r in rows[1:]] == [
        ("=1", "dana-slim"),
        ("=1", "asgd"),  # 10.3..11.0 overlaps 10.0..10.4
        ("=3", "nag-asgd"),
        ("=3", "multi-asgd"),  # one seed, 20.70, inside nag-asgd's 20.00..21.00
        ("—", "ssgd"),  # every seed diverged: not ranked
    ]
    slim, asgd, nag, multi, ssgd = rows[1:]
    # simulated time 100 i / k ms: 10.5% reached between 20% (25 ms) and the final (50 ms)
    assert slim[2:] == ["2/2", "10.20 [10.00..10.40]", "0.04924 [0.04875..0.04974]", "0", "cpu"]
    assert asgd[2:4] == ["2/2", "10.65 [10.30..11.00]"] and asgd[4] == "not reached (1/2)"
    assert asgd[6] == "cpu, cuda"  # the device is a column, not part of the method
    assert multi[2:4] == ["1/1", "20.70"]  # a single seed: no interval
    assert ssgd[2:6] == ["0/2", "diverged", "not reached (0/2)", "2"]


def test_the_summary_counts_wins_ties_losses_and_divergences(tmp_path):
    _alpha(tmp_path / "alpha")
    _beta(tmp_path / "beta")
    text = build_leaderboard(tmp_path, tmp_path / "LEADERBOARD.md")
    assert "### beta: k=8, cluster none, partition iid" in text
    assert "partition iid; no one-worker baseline, no target\n" in text
    summary = {r[0]: r[1:] for r in _rows(text, "## Per method, across protocols")}
    # protocols, wins (alone at 1), ties at 1, losses, diverged
    assert summary["dana-slim"] == ["2", "1", "1", "0", "0"]
    assert summary["asgd"] == ["2", "0", "1", "1", "0"]
    assert summary["nag-asgd"] == ["1", "0", "0", "1", "0"]
    assert summary["ssgd"] == ["1", "0", "0", "0", "1"]
    assert list(summary)[0] == "dana-slim"  # most wins first
    assert text == build_leaderboard(tmp_path, tmp_path / "LEADERBOARD.md")  # deterministic


def test_a_cluster_and_a_data_split_are_protocols_of_their_own(tmp_path):
    cluster = {"name": "geo", "compute": {"model": "gamma"}, "network": {}, "availability": {}}
    for split in ("iid", "dirichlet:0.5"):
        for name, algorithm, k, final in (("b", "dana-slim", 1, 0.1), ("a", "asgd", 4, 0.2)):
            fake_run(tmp_path / "s", f"{name}_{split}", algorithm, k, 0, [0.9, 0.5, 0.3, final],
                     cluster=cluster, partition=split)  # fmt: skip
    titles = [p.title for p in study_protocols(tmp_path / "s")]
    assert sorted(titles) == [
        "k=4, cluster geo, partition dirichlet:0.5",
        "k=4, cluster geo, partition iid",
    ]
    assert all(p.baseline is not None for p in study_protocols(tmp_path / "s"))


def test_a_language_model_study_is_ranked_by_its_test_loss(tmp_path):
    base = {"final_test_loss": 3.0}
    fake_run(tmp_path / "lm", "base", "dana-slim", 1, 0, [0.9, 0.8], dataset="text",
             summary_extra=base)  # fmt: skip
    for name, loss in (("slim", 3.2), ("asgd", 3.1)):
        fake_run(tmp_path / "lm", name, name, 4, 0, [0.9, 0.8], dataset="text",
                 summary_extra={"final_test_loss": loss})  # fmt: skip
    text = build_leaderboard(tmp_path, tmp_path / "LEADERBOARD.md")
    assert "| rank | method | seeds | final test loss |" in text
    rows = _rows(text, "### lm: k=4, cluster none, partition iid")
    assert rows[0][2:4] == ["1/1", "3.0000"]
    assert [(r[0], r[1], r[3]) for r in rows[1:]] == [
        ("1", "asgd", "3.1000"),
        ("2", "slim", "3.2000"),
    ]


def test_the_command_writes_checks_and_refuses_a_missing_folder(tmp_path, capsys):
    _beta(tmp_path / "results" / "beta")
    out = tmp_path / "docs" / "LEADERBOARD.md"
    args = ["leaderboard", "--results", str(tmp_path / "results"), "--out", str(out)]
    assert main([*args, "--check"]) == 1  # no page yet
    assert "is missing" in capsys.readouterr().err
    assert main(args) == 0 and out.read_text().startswith(HEADER)
    assert main([*args, "--check"]) == 0
    out.write_text(out.read_text().replace("20.00", "19.00"))
    assert main([*args, "--check"]) == 1
    assert "is out of date: regenerate it with `dana leaderboard" in capsys.readouterr().err
    assert main(["leaderboard", "--results", str(tmp_path / "none"), "--out", str(out)]) == 2
    assert "no such results folder" in capsys.readouterr().err


def test_the_committed_leaderboard_is_what_the_command_writes(capsys):
    results, page = ROOT / "docs" / "results", ROOT / "docs" / "LEADERBOARD.md"
    assert main(["leaderboard", "--results", str(results), "--out", str(page), "--check"]) == 0, (
        capsys.readouterr().err
    )
