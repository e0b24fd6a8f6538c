"""``dana sweep``, ``dana report``, ``dana presets`` and ``dana leaderboard``: registered by
``dana.cli``."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from dana.errors import EXIT_ERROR, EXIT_OK
from dana.train.options import FlattenLists, add_train_options, collect_options, yaml_value

if TYPE_CHECKING:
    from dana.experiments.grid import SweepSpec

S = argparse.SUPPRESS


def _list_of(type_):
    def parse(text: str) -> list[Any]:
        items = [x for x in text.replace(",", " ").split() if x]
        if not items:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
        try:
            return [type_(x) for x in items]
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad value in list {text!r}") from None

    return parse


def _grid_axis(text: str) -> tuple[str, list[Any]]:
    """``lr=0.05,0.1`` -> ("lr", [0.05, 0.1]); each value is read as YAML."""
    from dana.experiments.grid import canonical_key

    key, sep, values = text.partition("=")
    if not sep or not key or not values:
        raise argparse.ArgumentTypeError(f"expected OPTION=V1,V2,..., got {text!r}")
    return canonical_key(key), [yaml_value(v) for v in values.split(",")]


def _target(text: str) -> float:
    """A test error in percent (``12.5`` or ``12.5%``), or a test loss for a report that
    compares losses; the report checks it against its metric."""
    try:
        value = float(text.rstrip("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a test error in percent (or a test loss), got {text!r}"
        ) from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"--target must be positive, got {value}")
    return value


# -- dana sweep ---------------------------------------------------------------------------
#: The grid's axes given as lists: (option, dest, item type, metavar, help).
GRID_LISTS = [
    ("--algorithms", "grid_algorithm", str, "A", "algorithms, e.g. ssgd nag-asgd dana-slim"),
    (
        "--workers",
        "grid_workers",
        int,
        "K",
        "worker counts, e.g. 1 4 16 (1: the one-worker baseline)",
    ),
    ("--seeds", "grid_seed", int, "S", "seeds, e.g. 0 1"),
    (
        "--clusters",
        "grid_cluster",
        str,
        "C",
        "clusters (presets or files), e.g. datacenter cloud geo: a grid axis; the "
        "report ranks the methods on each",
    ),
]


def add_sweep_parser(sub) -> None:
    p = sub.add_parser(
        "sweep",
        conflict_handler="resolve",
        help="run a grid of training runs (algorithms x workers x seeds x options)",
        description="Run every cell of a grid (algorithms x worker counts x seeds x any "
        "option) into one results directory, one run directory per cell. Finished runs are "
        "skipped on a rerun; interrupted runs continue from their checkpoint (or restart); "
        "a failing or diverging run never stops the others. Any `dana train` option is a "
        "fixed setting for every run. Worker count 1 runs only the one-worker baseline "
        "(--baseline). Precedence: --preset, then --config, then the command line.",
    )
    add_train_options(p)
    grid = p.add_argument_group("the grid")
    grid.add_argument("--preset", default=None, help="a shipped sweep (see `dana presets`)")
    grid.add_argument(
        "--config",
        dest="config_file",
        default=S,
        metavar="FILE",
        help="YAML sweep file: a `grid:` section (option: [values]), `baseline:`, and any "
        "`dana train` option as a fixed setting",
    )
    for flag, dest, item, metavar, help_ in GRID_LISTS:
        grid.add_argument(
            flag,
            dest=dest,
            type=_list_of(item),
            nargs="+",
            action=FlattenLists,
            default=S,
            metavar=metavar,
            help=help_,
        )
    grid.add_argument(
        "--grid",
        dest="grid_extra",
        type=_grid_axis,
        action="append",
        default=S,
        metavar="OPTION=V1,V2",
        help="vary any other option, e.g. lr=0.05,0.1 (repeatable)",
    )
    grid.add_argument(
        "--baseline",
        default=None,
        help="algorithm run at k=1 (default dana-slim = Nesterov SGD; 'all': every algorithm)",
    )
    run = p.add_argument_group("running")
    run.add_argument("--out", default=None, help="results directory (default results/PRESET)")
    run.add_argument(
        "--resume",
        metavar="DIR",
        default=None,
        help="continue the sweep recorded in DIR/sweep.json (same as rerunning its command)",
    )
    run.add_argument("--jobs", type=int, default=1, help="runs at once (default 1)")
    run.add_argument(
        "--pack",
        default="1",
        metavar="N",
        help="advance up to N simulator runs of one model and dataset in one process, "
        "their gradients computed together (each writes its own run directory); "
        "--jobs counts such processes (default 1: each run alone; auto: as many as fit "
        "the GPU, 1 on the CPU)",
    )
    run.add_argument(
        "--threads",
        dest="threads",
        type=int,
        default=None,
        metavar="N",
        help="the number of CPU threads each run uses, as `dana train --threads` (default: "
        "the cores divided by --jobs, or OMP_NUM_THREADS where set; 0: one per core)",
    )
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.add_argument(
        "--keep-checkpoints",
        action="store_true",
        help="keep finished runs' checkpoint.pt (default: delete them once summary.json exists)",
    )
    run.add_argument(
        "--no-models",
        dest="keep_models",
        action="store_false",
        help="delete finished runs' final model.safetensors (default: every run keeps it)",
    )
    run.add_argument(
        "--reuse",
        action="append",
        default=[],
        metavar="DIR",
        help="copy, instead of running, a cell whose settings equal those of a finished "
        "simulator run in DIR (another sweep's results directory); may be repeated",
    )
    run.add_argument("--dry-run", action="store_true", help="list the runs and their state")
    run.add_argument(
        "--report", action="store_true", help="write the report and print its table at the end"
    )
    run.add_argument(
        "--target",
        type=_target,
        default=None,
        help="with --report: target test error in %% (a test loss for language models)",
    )
    p.set_defaults(func=cmd_sweep)


def sweep_spec(args: argparse.Namespace) -> SweepSpec:
    """The SweepSpec the arguments describe (preset < --config < --resume < command line)."""
    from dana.experiments.grid import SweepSpec
    from dana.experiments.layout import SweepDir
    from dana.experiments.presets import load_preset, load_spec_file

    spec = load_preset(args.preset) if args.preset else SweepSpec()
    given = vars(args)
    if "config_file" in given:
        layer = load_spec_file(given["config_file"])
        spec = spec.override(layer.fixed, layer.grid)
        spec.baseline = layer.baseline
        spec.description = layer.description or spec.description
        spec.also = layer.also or spec.also
        spec.more_seeds = layer.more_seeds or spec.more_seeds
    if args.resume:
        stored = SweepSpec.from_dict(SweepDir(args.resume).read_spec()["spec"], args.resume)
        spec = spec.override(stored.fixed, stored.grid)
        spec.baseline, spec.description = stored.baseline, stored.description
        spec.also, spec.more_seeds = stored.also, stored.more_seeds
    fixed = collect_options(
        argparse.Namespace(**{k: v for k, v in given.items() if k != "config_file"})
    )
    for key in ("timing_params", "algorithm_params"):
        if key in fixed and isinstance(spec.fixed.get(key), dict):
            fixed[key] = {**spec.fixed[key], **fixed[key]}
    axes = {
        key[5:]: value
        for key, value in given.items()
        if key.startswith("grid_") and key != "grid_extra"
    }
    axes.update(dict(given.get("grid_extra", [])))
    spec = spec.override(fixed, axes)
    if args.baseline:
        spec.baseline = args.baseline
    spec.check("command line")
    return spec


def cmd_sweep(args: argparse.Namespace) -> int:
    from dana.errors import ConfigError
    from dana.experiments.layout import SweepDir
    from dana.experiments.sweep import plan, run_sweep
    from dana.train.resources import check_threads

    if args.jobs < 1:
        raise ConfigError(f"--jobs must be at least 1, got {args.jobs}")
    if args.pack != "auto":
        given = args.pack
        args.pack = int(given) if given.isdigit() else 0
        if args.pack < 1:
            raise ConfigError(f"--pack must be a whole number >= 1 or auto, got {given!r}")
    if args.threads is not None:
        check_threads(args.threads)
    spec = sweep_spec(args)
    from dana.train.records.tracking import require_trackers

    require_trackers(spec.fixed)  # every run would fail without its library: say so once, now
    from dana.train.records.rundir import check_directory

    flag, out = ("--out", args.out) if args.out is not None else ("--resume", args.resume)
    if out is None:
        out = f"results/{args.preset or 'sweep'}"
    check_directory(out, flag)
    if args.dry_run:
        from dana.experiments.layout import NEW
        from dana.experiments.reuse import ReusableRuns

        sweep = SweepDir(out)
        cells = plan(spec, sweep)
        reusable = ReusableRuns(args.reuse) if args.reuse else None
        for cell in cells:
            state = sweep.state(cell)
            source = reusable.find(cell.config().to_dict()) if reusable and state == NEW else None
            print(f"{cell.name:40s} {state}" + (f" (reuse {source})" if source else ""))
        print(f"{len(cells)} runs into {out}")
        return EXIT_OK
    result = run_sweep(
        spec,
        out,
        jobs=args.jobs,
        progress=not args.quiet,
        keep_checkpoints=args.keep_checkpoints,
        threads=args.threads,
        reuse=args.reuse,
        keep_models=args.keep_models,
        pack=args.pack,
    )
    reused = f"{result.count('reused')} reused, " if args.reuse else ""
    print(
        f"dana sweep: {len(result.status)} runs in {out}: {result.count('finished')} finished, "
        f"{result.count('diverged')} diverged, {result.count('skipped')} skipped (done before), "
        f"{reused}{len(result.failed)} failed. Log: {SweepDir(out).log_file}"
    )
    if args.report:
        _print_report(out, None, args.target, None)
    if result.failed:
        sweep = SweepDir(out)
        logs = [sweep.output_file(name) for name in result.failed]
        shown = ", ".join(str(log) for log in logs if log.is_file()) or "none"
        print(
            f"dana sweep: failed: {', '.join(result.failed)}; why: {sweep.log_file}; "
            f"their output: {shown}",
            file=sys.stderr,
        )
        return EXIT_ERROR
    return EXIT_OK


# -- dana report --------------------------------------------------------------------------
def add_report_parser(sub) -> None:
    p = sub.add_parser(
        "report",
        help="tables and plots of a results directory",
        description="Read the runs under DIR (a `dana sweep` results directory, or any "
        "directory of `dana train` runs) without retraining; write report.md and PNG plots "
        "(error vs epochs, final error vs workers, gap vs workers, speed-up over ssgd) and "
        "print the final-error table.",
    )
    p.add_argument("dir", metavar="DIR", help="results directory")
    p.add_argument("--out", default=None, help="where to write report.md and plots (default DIR)")
    p.add_argument(
        "--target",
        type=_target,
        default=None,
        help="test error in %% for time-to-target (default: two targets, the one-worker "
        "baseline's final error + 0.5 and + 1 percentage points); for language models, "
        "and runs without an error rate, a test loss (default: the baseline's + 1% and "
        "+ 2% of it)",
    )
    p.add_argument("--baseline", default=None, help="algorithm whose k=1 runs are the baseline")
    p.add_argument(
        "--export",
        metavar="DEST",
        default=None,
        help="first copy the finished runs' config.json, metrics.csv and summary.json (no "
        "checkpoints) into DEST, then write the report there (e.g. under docs/)",
    )
    p.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from dana.train.records.rundir import check_directory, check_local

    check_local(args.dir, "DIR")
    for flag, value in (("--out", args.out), ("--export", args.export)):
        if value is not None:
            check_directory(value, flag)
    path = args.dir
    if args.export is not None:
        from dana.experiments.export import export_results

        count = export_results(args.dir, args.export)
        print(f"Copied the small files of {count} runs into {args.export}")
        path = args.export
    _print_report(path, args.out, args.target, args.baseline)
    return EXIT_OK


def _print_report(path: str, out: str | None, target: float | None, baseline: str | None) -> None:
    from dana.experiments.report import build_report

    report = build_report(path, out, target=target, baseline=baseline, target_in_percent=True)
    print(f"Final {report.metric.title}, mean ± std over seeds:")
    print(report.error_table)
    for verdict in report.verdicts:  # (a loss: the one sentence why there is none)
        print(f"The claim at {verdict}" if report.metric.is_error else verdict)
    if report.targets:
        shown = [
            report.metric.show(t.value)
            + (" (not used: the baseline reaches it at its first evaluation)" if t.skip else "")
            for t in report.targets
        ]
        # (each panel's own: the same ones when the panels share their baseline's value)
        print(f"Time-to-target targets: {'; '.join(dict.fromkeys(shown))}")
    print("Wrote " + ", ".join(str(f) for f in report.files))


# -- dana presets -------------------------------------------------------------------------
def add_presets_parser(sub) -> None:
    p = sub.add_parser(
        "presets",
        help="list the shipped sweeps and clusters",
        description="List the presets of `dana sweep`, then the clusters of `--cluster`.",
    )
    p.set_defaults(func=cmd_presets)


def cmd_presets(args: argparse.Namespace) -> int:
    from dana.experiments.presets import load_preset, preset_names
    from dana.train.cluster.model import preset_names as cluster_names
    from dana.train.cluster.model import resolve_cluster

    for name in preset_names():
        description = load_preset(name).description.strip().splitlines()
        print(f"{name:24s} {description[0] if description else ''}")
    print("\nclusters (dana train --cluster NAME, or a grid axis of dana sweep):")
    for name in cluster_names():
        print(f"{name:24s} {resolve_cluster(name)['description']}")
    return EXIT_OK


# -- dana leaderboard ---------------------------------------------------------------------
def add_leaderboard_parser(sub) -> None:
    p = sub.add_parser(
        "leaderboard",
        help="every study's methods ranked on one page",
        description="Read every study (folder of runs) under --results and write one "
        "markdown page ranking the methods of each protocol (study, k, cluster, data split) "
        "by final test error, with a summary per method (docs/LEADERBOARD.md).",
    )
    p.add_argument("--results", default="docs/results", help="the studies (default docs/results)")
    p.add_argument("--out", default="docs/LEADERBOARD.md", help="the page (default %(default)s)")
    p.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if --out differs from what would be written",
    )
    p.set_defaults(func=cmd_leaderboard)


def cmd_leaderboard(args: argparse.Namespace) -> int:
    from dana.experiments.leaderboard import run_leaderboard

    return run_leaderboard(args.results, args.out, check=args.check)


def register_commands(sub) -> None:
    """Add ``sweep``, ``report``, ``presets`` and ``leaderboard`` to ``dana``'s subcommands."""
    add_sweep_parser(sub)
    add_report_parser(sub)
    add_presets_parser(sub)
    add_leaderboard_parser(sub)
