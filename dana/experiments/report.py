"""``dana report DIR``: tables and plots of a results directory, put together in report.md.

Reads the runs' ``config.json``, ``metrics.csv`` and ``summary.json`` (no retraining) and
writes ``report.md`` and the PNGs of :mod:`dana.experiments.plots` into the output
directory (``DIR`` by default).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dana.atomic import write_text_atomic
from dana.experiments import plots
from dana.experiments.results import Results, load_results, sweep_record
from dana.experiments.table import (
    ERROR_RULE,
    error_table,
    gap_table,
    speedups,
    time_table,
)
from dana.experiments.targets import TARGET_RULE

#: Settings listed in the report's protocol line, in this order, when shared by all runs.
PROTOCOL_KEYS = (
    "dataset",
    "train_size",
    "test_size",
    "model",
    "epochs",
    "batch_size",
    "lr",
    "momentum",
    "weight_decay",
    "warmup_epochs",
    "lr_decay_epochs",
    "lr_decay_factor",
    "timing",
    "eval_every",
    "dtype",
)


@dataclass
class Report:
    """The report's text, its main table, the target used, and the files written."""

    markdown: str
    error_table: str
    target: float | None
    files: list[Path] = field(default_factory=list)


def choose_target(results: Results, target: float | None) -> tuple[float | None, str]:
    """The target error (a fraction) and how it was chosen: ``target`` if given, else
    the one-worker baseline's mean final error."""
    if target is not None:
        return target, f"the stated target {100 * target:.2f}% test error"
    base = results.baseline()
    if base is not None and len(base.errors()):
        value = float(base.errors().mean())
        return value, f"the one-worker baseline's final test error, {100 * value:.2f}%"
    return None, "no target: there is no finished one-worker baseline; pass --target"


def build_report(
    path: str | Path,
    out: str | Path | None = None,
    *,
    target: float | None = None,
    baseline: str | None = None,
) -> Report:
    """Read the results under ``path`` and write report.md and the plots into ``out``."""
    results = load_results(path, baseline)
    out = Path(out) if out is not None else Path(path)
    files = [
        plots.plot_error_curves(results, out / "error_curves.png"),
        plots.plot_error_vs_workers(results, out / "error_vs_workers.png"),
        plots.plot_gap_vs_workers(results, out / "gap_vs_workers.png"),
    ]
    target, target_text = choose_target(results, target)
    ups = speedups(results, target) if target is not None else {}
    if target is not None:
        files.append(plots.plot_speedups(results, ups, target, out / "speedup_vs_workers.png"))
    table = error_table(results)
    text = _markdown(results, table, target, target_text, ups)
    report_file = out / "report.md"
    write_text_atomic(report_file, text)
    return Report(text, table, target, [report_file, *files])


def _markdown(
    results: Results,
    table: str,
    target: float | None,
    target_text: str,
    ups: dict[str, dict[int, float]],
) -> str:
    record = sweep_record(results.path)
    counts = {s: sum(1 for r in results.runs if r.status == s) for s in _STATUSES}
    lines = [f"# Report: {results.path.name}", ""]
    if record.get("spec", {}).get("description"):
        lines += [str(record["spec"]["description"]).strip(), ""]
    lines += [
        f"Protocol: {_protocol(results.common_settings())}.",
        "",
        f"Runs: {len(results.runs)} ("
        + ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        + f"); seeds {', '.join(map(str, results.seeds()))}.",
        "",
    ]
    if results.row_keys:
        lines += [
            f"Settings that vary besides algorithm, k and seed: {', '.join(results.row_keys)}.",
            "",
        ]
    lines += [
        "## Final test error (%)",
        "",
        table,
        "",
        ERROR_RULE,
        _baseline_text(results),
        "",
        "![final error vs workers](error_vs_workers.png)",
        "",
        "![test error vs epochs](error_curves.png)",
        "",
        "## Mean gap",
        "",
        "The gap of a push is RMS(theta - p_i), theta the master's true parameters just "
        "before the push; the table gives its mean over all pushes of a run, averaged "
        "over seeds.",
        "",
        gap_table(results),
        "",
        "![gap vs workers](gap_vs_workers.png)",
        "",
        "## Time to target and speed-up over SSGD",
        "",
        f"Target: {target_text}. {TARGET_RULE}",
        "",
    ]
    if target is not None:
        lines += [
            "Simulated time to the target (mean over seeds), and in brackets the speed-up "
            "over ssgd at the same k (T_ssgd / T):",
            "",
            time_table(results, target),
            "",
            "![speed-up vs workers](speedup_vs_workers.png)",
            "",
        ]
        if not any(k > 1 and row != "ssgd" for row, by_k in ups.items() for k in by_k):
            lines += ["No algorithm and ssgd both reached the target at the same k.", ""]
    return "\n".join(lines)


def _baseline_text(results: Results) -> str:
    base = results.baseline()
    if base is None:
        return "There is no one-worker baseline in these results."
    text = f"The one-worker baseline is {base.row} run with k=1"
    if base.row.startswith("dana-slim"):
        text += ", which is exactly Nesterov SGD (torch.optim.SGD(momentum=m, nesterov=True))"
    return (
        text
        + "; with one worker there is no staleness, and every algorithm reduces to plain, momentum or Nesterov SGD."
    )


_STATUSES = ("finished", "diverged", "failed", "incomplete")


def _protocol(settings: dict[str, Any]) -> str:
    parts = []
    for key in PROTOCOL_KEYS:
        if key in settings and settings[key] not in (None, [], {}):
            parts.append(f"{key.replace('_', '-')} {_show(settings[key])}")
    return ", ".join(parts) or "(runs differ in every setting)"


def _show(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(_show(v) for v in value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
