"""``dana report DIR``: tables and plots of a results directory, put together in report.md.

Reads the runs' ``config.json``, ``metrics.csv`` and ``summary.json`` (no retraining) and
writes ``report.md`` and the PNGs of :mod:`dana.experiments.plots` into the output
directory (``DIR`` by default). The report opens, after the protocol, with the claim at a
glance (:mod:`dana.experiments.glance`), then the final-error and gap tables, then the
time to each target and the speed-up over SSGD (:mod:`dana.experiments.targets`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dana.atomic import write_text_atomic
from dana.errors import DanaError
from dana.experiments import plots
from dana.experiments.glance import glance_cells, glance_rule, glance_sentences, glance_table
from dana.experiments.measured import measured_columns
from dana.experiments.measured import view as measured_view
from dana.experiments.ranking import (
    BIAS_RULE,
    RANKING_RULE,
    bias_table,
    has_class_counts,
    overview_table,
    ranking_table,
)
from dana.experiments.results import (
    TEST_ERROR,
    Metric,
    Results,
    load_results,
    perplexity_text,
    setting_text,
    sweep_record,
)
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
    group_time,
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
    "cluster",
    "partition",
    "eval_every",
    "dtype",
)


@dataclass
class Report:
    """The report's text, its main table, the targets (the first one used as ``target``,
    None when none is), the files written, and the claim's verdicts (one per k; none
    where the runs form panels)."""

    markdown: str
    error_table: str
    target: float | None
    files: list[Path] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    metric: Metric = TEST_ERROR
    verdicts: list[str] = field(default_factory=list)


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
    loss: + 1% and + 2%; :func:`~dana.experiments.targets.choose_targets`). Where the
    runs differ in a panel setting (a cluster, the data per worker:
    :meth:`~dana.experiments.results.Results.panels`), the methods are ranked on each
    panel first (:mod:`dana.experiments.ranking`), then each panel is reported on its
    own, with its own baseline and targets; runs on a cluster also get the plot of the
    metric against simulated time, and runs that counted their classes the bias meter."""
    results = load_results(path, baseline)
    if target is not None and target_in_percent and results.metric.is_error:
        if not 0 < target <= 100:
            raise DanaError(f"--target is a test error in %, in (0, 100], got {target:g}")
        target = target / 100
    out = Path(out) if out is not None else Path(path)
    lines = _header(results)
    panels = results.panels()
    if not panels:
        body, files, table, targets = _section(results, out, target, 2, "")
        lines += body
        views = {"": (results, targets)}
    else:
        views = {label: (sub, choose_targets(sub, target)) for label, sub in panels.items()}
        lines += [
            f"The runs differ in {' and '.join(results.panel_keys)}: the methods are ranked "
            "on each panel first, then each is reported on its own, against its own "
            "one-worker baseline.",
            "",
        ]
        files, tables, targets = [], [], []
    on_cluster = any(r.config.get("cluster") is not None for r in results.runs)
    if on_cluster or panels:
        lines += _which_first(views, level=2)
        files.append(plots.plot_error_vs_time(views, out / "error_vs_time.png"))
    if "epochs" in results.panel_keys:  # a budget study: each method's error by budget
        files.append(plots.plot_budget_curve(panels, out / "budget_curve.png"))
        lines += [
            "## Final error against the budget",
            "",
            "Each method's final error against updates per worker, one point per budget "
            "(mean over the seeds; bars: the lowest and highest seed), the one-worker "
            "baseline of each budget dashed:",
            "",
            "![budget curve](budget_curve.png)",
            "",
        ]
    if has_class_counts(results):
        lines += _bias(views, level=2)
        files.append(
            plots.plot_class_shares({k: v[0] for k, v in views.items()}, out / "class_shares.png")
        )
    for label, (sub, _) in views.items() if panels else ():
        body, more, table, sub_targets = _section(sub, out, target, 3, "_" + _slug(label))
        lines += [f"## {label[0].upper()}{label[1:]}", "", *body]
        files += more
        tables.append(f"{label}:\n{table}")
        targets += sub_targets
    if panels:
        table = "\n\n".join(tables)
    text = "\n".join(lines)
    report_file = out / "report.md"
    write_text_atomic(report_file, text)
    used = next((t.value for t in targets if t.skip is None), None)
    verdicts = [] if panels else glance_sentences(results)
    return Report(text, table, used, [report_file, *files], targets, results.metric, verdicts)


def _section(
    results: Results, out: Path, target: float | None, level: int, suffix: str
) -> tuple[list[str], list[Path], str, list[Target]]:
    """The report of one set of runs (all, or one panel's): its plots, written with
    ``suffix`` in their names, and its sections at heading ``level``."""
    files = [
        plots.plot_error_curves(results, out / f"error_curves{suffix}.png"),
        plots.plot_error_vs_workers(results, out / f"error_vs_workers{suffix}.png"),
        plots.plot_gap_vs_workers(results, out / f"gap_vs_workers{suffix}.png"),
    ]
    if results.metric.is_error and glance_cells(results):
        files.append(plots.plot_differences(results, out / f"differences{suffix}.png"))
    targets = choose_targets(results, target)
    if speedup_plot_due(results, targets):
        files.append(plots.plot_speedups(results, targets, out / f"speedup_vs_workers{suffix}.png"))
    table = error_table(results)
    body = _body(results, table, targets, level, suffix)
    for column in measured_columns(results):
        more = measured_view(results, column)
        name = f"{column}_curves{suffix}.png"
        files.append(plots.plot_error_curves(more, out / name))
        body += [
            f"{'#' * level} Final {more.metric.name}",
            "",
            f"Measured at each evaluation by the run's metric hook (`{column}` in "
            "metrics.csv): its final value, mean ± standard deviation over seeds.",
            "",
            error_table(more),
            "",
            f"![{more.metric.name} vs epochs]({name})",
            "",
        ]
    return body, files, table, targets


def _slug(label: str) -> str:
    """A panel's label as a file-name suffix: ``cluster geo, partition dirichlet:0.3``
    -> ``geo_dirichlet-0.3``."""
    parts = [part.split(" ", 1)[1].strip("[]").replace(",", "-") for part in label.split(", ")]
    return re.sub(r"[^A-Za-z0-9._+-]", "-", "_".join(parts))


def _which_first(views: dict[str, tuple[Results, list[Target]]], level: int) -> list[str]:
    """The section "Which method first": the ranks on every panel, then each panel's
    ranking, then the plot of the metric against simulated time."""
    h = "#" * level
    on_cluster = any(
        r.config.get("cluster") is not None for results, _ in views.values() for r in results.runs
    )
    if on_cluster:
        where = "on this cluster" if len(views) == 1 else "on each cluster"
    else:
        where = "on each panel"
    lines = [f"{h} Which method first, {where}", "", RANKING_RULE, ""]
    if len(views) > 1:
        lines += [
            "Each method's rank by time / rank by its final value, on each panel (at its "
            "largest k):",
            "",
            overview_table(views),
            "",
        ]
    for label, (results, targets) in views.items():
        if len(views) > 1:
            lines += [f"{h}# {label[0].upper()}{label[1:]}", ""]
        used = [t for t in targets if t.skip is None]
        if not used:
            why = targets[0].skip if targets else "there is no finished one-worker baseline."
            lines += [f"No target to rank by time: {why}", ""]
        else:
            lines += ["Targets: " + "; ".join(t.text for t in used) + ".", ""]
        lines += [ranking_table(results, targets), ""]
    metric = next(iter(views.values()))[0].metric
    lines += [f"![{metric.name} vs simulated time](error_vs_time.png)", ""]
    return lines


def _bias(views: dict[str, tuple[Results, list[Target]]], level: int) -> list[str]:
    """The section "Each class's share of the applied updates" (the bias meter)."""
    h = "#" * level
    lines = [f"{h} Each class's share of the applied updates", "", BIAS_RULE, ""]
    for label, (results, _) in views.items():
        if len(views) > 1:
            lines += [f"{h}# {label[0].upper()}{label[1:]}", ""]
        lines += [bias_table(results), ""]
    return lines + ["![class shares](class_shares.png)", ""]


def _header(results: Results) -> list[str]:
    record = sweep_record(results.path)
    counts = {s: sum(1 for r in results.runs if r.status == s) for s in _STATUSES}
    lines = [f"# Report: {results.path.name}", ""]
    if record.get("spec", {}).get("description"):
        lines += [str(record["spec"]["description"]).strip(), ""]
    return lines + [
        f"Protocol: {_protocol(results.common_settings())}.",
        "",
        f"Runs: {len(results.runs)} ("
        + ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        + f"); seeds {', '.join(map(str, results.seeds()))}.",
        "",
        *_devices(results),
    ]


def _devices(results: Results) -> list[str]:
    """Which device made which runs, where any run was not made on the CPU."""
    made: dict[str, list[str]] = {}
    for run in results.runs:
        made.setdefault(str(run.config.get("device") or "cpu"), []).append(run.path.name)
    if set(made) <= {"cpu"}:
        return []
    parts = [
        f"{device}: {len(names)} run{'s' if len(names) > 1 else ''}"
        + ("" if device == "cpu" else f" ({', '.join(sorted(names))})")
        for device, names in sorted(made.items())
    ]
    return [f"Devices: {'; '.join(parts)}.", ""]


def _body(
    results: Results, table: str, targets: list[Target], level: int = 2, suffix: str = ""
) -> list[str]:
    """The sections of one set of runs: settings that vary, the claim at a glance, the
    final metric, gap, time to target and speed-up (headings at ``level``, plots
    ``suffix``ed)."""
    h = "#" * level
    scaled = has_scaled_ssgd(results)
    lines: list[str] = []
    if results.row_keys:
        lines += [
            f"Settings that vary besides algorithm, k and seed: {', '.join(results.row_keys)}.",
            "",
        ]
    metric = results.metric
    if not metric.is_error:
        lines += [_metric_text(results), ""]
    lines += _glance(results, h, suffix)
    lines += [
        f"{h} Final {metric.title}",
        "",
        table,
        "",
        ERROR_RULE,
        _baseline_text(results),
        "",
        f"![final {metric.name.removeprefix('test ')} vs workers](error_vs_workers{suffix}.png)",
        "",
        f"![{metric.name} vs epochs](error_curves{suffix}.png)",
        "",
        f"{h} Mean gap",
        "",
        "The gap of a push is RMS(theta - p_i), theta the master's true parameters just "
        "before the push; the table gives its mean over all pushes of a run, averaged "
        "over seeds.",
        "",
        gap_table(results),
        "",
        f"![gap vs workers](gap_vs_workers{suffix}.png)",
        "",
        f"{h} Time to target and speed-up over SSGD",
        "",
        f"{TARGET_RULE} {FIRST_EVALUATION_RULE} {REFERENCE_RULE}"
        + (f" {SCALED_REFERENCE_RULE}" if scaled else ""),
        "",
    ]
    if not targets:
        lines += ["No target: there is no finished one-worker baseline; pass --target.", ""]
    for number, t in enumerate(targets, 1):
        heading = f"{h}# Target {number}: " if len(targets) > 1 else "Target: "
        lines += [heading + t.text + ("" if len(targets) > 1 else "."), ""]
        if t.skip is not None:
            lines += [t.skip, ""]
            continue
        if not any(group_time(g, t.value)[1] for g in results.groups.values()):
            lines += ["No run reached it.", ""]
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
            f"![speed-up vs workers](speedup_vs_workers{suffix}.png)",
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
    return lines


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


def _glance(results: Results, h: str = "##", suffix: str = "") -> list[str]:
    """The section "The claim at a glance" (:mod:`dana.experiments.glance`)."""
    table = glance_table(results)
    lines = [f"{h} The claim at a glance", ""]
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
    lines += [f"- {sentence}" for sentence in glance_sentences(results)] + [""]
    if results.metric.is_error:
        lines += [
            "Seed by seed (dots; bars: their mean), against the baseline (dashed) and the "
            "line (dotted):",
            "",
            f"![differences from the baseline](differences{suffix}.png)",
            "",
        ]
    return lines


def _metric_text(results: Results) -> str:
    """What a report on the test loss compares, and why (a language model: with the
    yardsticks it must beat)."""
    if results.metric.perplexity:
        text = (
            "These are language models: the report compares the test loss (the mean "
            "cross-entropy of every next token, in nats), each with its perplexity "
            "exp(loss) in brackets in the tables and on the plots' right axis; "
            "metrics.csv also holds the next-token error."
        )
        references = results.references()
        if references:
            rows = "\n".join(
                f"| byte {name} model of the training text | {loss:.4f} ({perplexity_text(loss)}) |"
                for name, loss in references.items()
            )
            text += (
                " A model that learned ends below the test loss of these counts of the "
                "training text (each count plus one; dotted on the curves):\n\n"
                f"| yardstick | test loss (perplexity) |\n|---|---|\n{rows}"
            )
        return text
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
            if key == "partition" and settings[key] == "iid":
                continue  # (the shared stream, as every run before partitions)
            text = setting_text(key, settings[key]) if key == "cluster" else _show(settings[key])
            parts.append(f"{key.replace('_', '-')} {text}")
    return ", ".join(parts) or "(runs differ in every setting)"


def _show(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(_show(v) for v in value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
