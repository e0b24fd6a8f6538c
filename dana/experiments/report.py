"""``dana report DIR``: tables and plots of a results directory, put together in report.md.

Reads the runs' ``config.json``, ``metrics.csv`` and ``summary.json`` (no retraining) and
writes ``report.md`` and the PNGs of :mod:`dana.experiments.plots` into the output
directory (``DIR`` by default). The report opens, after the protocol, with the claim at a
glance (:mod:`dana.experiments.glance`), then the final-error and gap tables, then the
time to each target and the speed-up over SSGD (:mod:`dana.experiments.targets`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dana.atomic import write_text_atomic
from dana.errors import DanaError
from dana.experiments import plots
from dana.experiments.glance import glance_rule, glance_sentences, glance_table
from dana.experiments.results import TEST_ERROR, Metric, Results, load_results, sweep_record
from dana.experiments.table import (
    ERROR_RULE,
    error_table,
    gap_table,
    speedups,
    time_table,
)
from dana.experiments.targets import (
    FIRST_EVALUATION_RULE,
    REFERENCE_RULE,
    SCALED_REFERENCE_RULE,
    TARGET_RULE,
    Target,
    choose_targets,
    has_scaled_ssgd,
    speedup_bounds,
    speedup_cells,
)

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
    """The report's text, its main table, the targets (the first one used as ``target``,
    None when none is), and the files written."""

    markdown: str
    error_table: str
    target: float | None
    files: list[Path] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    metric: Metric = TEST_ERROR


def build_report(
    path: str | Path,
    out: str | Path | None = None,
    *,
    target: float | None = None,
    baseline: str | None = None,
    target_in_percent: bool = False,
) -> Report:
    """Read the results under ``path`` and write report.md and the plots into ``out``.

    Time to target: ``target`` if given (a test error as a fraction, or where the report
    compares the test loss, a loss; ``target_in_percent``: a test error given in percent,
    as ``--target`` gives it), else the baseline's final error + 0.5 pp and + 1 pp (a
    loss: + 0.01 and + 0.02; :func:`~dana.experiments.targets.choose_targets`)."""
    results = load_results(path, baseline)
    if target is not None and target_in_percent and results.metric.is_error:
        if not 0 < target <= 100:
            raise DanaError(f"--target is a test error in %, in (0, 100], got {target:g}")
        target = target / 100
    out = Path(out) if out is not None else Path(path)
    files = [
        plots.plot_error_curves(results, out / "error_curves.png"),
        plots.plot_error_vs_workers(results, out / "error_vs_workers.png"),
        plots.plot_gap_vs_workers(results, out / "gap_vs_workers.png"),
    ]
    targets = choose_targets(results, target)
    if speedup_plot_due(results, targets):
        files.append(plots.plot_speedups(results, targets, out / "speedup_vs_workers.png"))
    table = error_table(results)
    text = _markdown(results, table, targets)
    report_file = out / "report.md"
    write_text_atomic(report_file, text)
    used = next((t.value for t in targets if t.skip is None), None)
    return Report(text, table, used, [report_file, *files], targets, results.metric)


def _markdown(results: Results, table: str, targets: list[Target]) -> str:
    record = sweep_record(results.path)
    counts = {s: sum(1 for r in results.runs if r.status == s) for s in _STATUSES}
    scaled = has_scaled_ssgd(results)
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
    metric = results.metric
    if not metric.is_error:
        lines += [_metric_text(results), ""]
    lines += _glance(results)
    lines += [
        f"## Final {metric.title}",
        "",
        table,
        "",
        ERROR_RULE,
        _baseline_text(results),
        "",
        f"![final {metric.name.removeprefix('test ')} vs workers](error_vs_workers.png)",
        "",
        f"![{metric.name} vs epochs](error_curves.png)",
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
        f"{TARGET_RULE} {FIRST_EVALUATION_RULE} {REFERENCE_RULE}"
        + (f" {SCALED_REFERENCE_RULE}" if scaled else ""),
        "",
    ]
    if not targets:
        lines += ["No target: there is no finished one-worker baseline; pass --target.", ""]
    for number, t in enumerate(targets, 1):
        heading = f"### Target {number}: " if len(targets) > 1 else "Target: "
        lines += [heading + t.text + ("" if len(targets) > 1 else "."), ""]
        if t.skip is not None:
            lines += [t.skip, ""]
            continue
        lines += [
            "Simulated time to the target (mean over seeds), and in brackets the speed-up "
            "over ssgd at the same k (T_ssgd / T)"
            + (" and over ssgd with linear lr scaling (`vs linear`):" if scaled else ":"),
            "",
            time_table(results, t.value),
            "",
        ]
        ups = speedups(results, t.value)
        if not any(k > 1 and row != "ssgd" for row, by_k in ups.items() for k in by_k):
            lines += ["No algorithm and ssgd both reached the target at the same k.", ""]
    if speedup_plot_due(results, targets):
        lines += [
            "![speed-up vs workers](speedup_vs_workers.png)",
            "",
            "The speed-up plot has one panel per target; a hollow triangle is a lower bound "
            "(ssgd never reached the target in its run: the speed-up is at least its run's "
            "length over the row's time to it); the grid under each gives every cell's "
            "speed-up, its bound, or why it has none (`not reached`, `diverged`, `no ssgd`, "
            "`ssgd not reached`, `pending`).",
            "",
        ]
    elif targets:
        lines += [_no_speedup_plot(results), ""]
    return "\n".join(lines)


def speedup_plot_due(results: Results, targets: list[Target]) -> bool:
    """Whether some used target has a speed-up over SSGD, or a bound on one, to plot."""
    return any(
        plots.cells_to_plot(speedup_cells(results, t.value), speedup_bounds(results, t.value))
        for t in targets
        if t.skip is None
    )


def _no_speedup_plot(results: Results) -> str:
    if not any(row == "ssgd" or row.startswith("ssgd ") for row in results.rows):
        return "This sweep has no SSGD row: no speed-up over SSGD, and no speed-up plot."
    return (
        "No row has a speed-up over SSGD, or a bound on one, at these targets (no row "
        "reached a target at a k where ssgd ran): no speed-up plot."
    )


def _glance(results: Results) -> list[str]:
    """The section "The claim at a glance" (:mod:`dana.experiments.glance`)."""
    table = glance_table(results)
    lines = ["## The claim at a glance", ""]
    if not table:
        if results.baseline() is None or not len(results.baseline().finals()):
            return lines + ["No finished one-worker baseline to compare with.", ""]
        return lines + ["No runs with k > 1 to compare with the baseline.", ""]
    lines += [
        (
            "Final test error minus the one-worker baseline's, in percentage points "
            "(positive: worse than the baseline):"
            if results.metric.is_error
            else "Final test loss minus the one-worker baseline's (positive: worse than "
            "the baseline):"
        ),
        "",
        table,
        "",
        glance_rule(results.metric),
        "",
    ]
    return lines + [f"- {sentence}" for sentence in glance_sentences(results)] + [""]


def _metric_text(results: Results) -> str:
    """What a report on the test loss compares, and why."""
    if results.metric.perplexity:
        return (
            "These are language models: the report compares the test loss (the mean "
            "cross-entropy of every next token, in nats), each with its perplexity "
            "exp(loss) in brackets in the tables and on the plots' right axis; "
            "metrics.csv also holds the next-token error."
        )
    return (
        "These runs have no error rate (their targets are not classes): the report "
        "compares the test loss."
    )


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
