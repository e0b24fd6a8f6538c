"""The ``dana`` command.

Exit status: 0 success; 2 bad input (the message says what and how to fix it; nothing
is left half-written); 3 the training diverged (a result: ``summary.json`` says where);
4 a fault the run could not survive (a lost server shard: ``--resume`` continues it);
75 preempted (SIGTERM or SIGINT: a checkpoint of that moment was written, ``--resume``
continues it exactly); 1 an unexpected internal error; 130 interrupted.
"""

from __future__ import annotations

import argparse
import math
import sys

from dana.errors import (
    EXIT_BAD_INPUT,
    EXIT_DIVERGED,
    EXIT_FAULT,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PREEMPTED,
)
from dana.train.options import HelpFormatter, add_train_options, collect_options

__all__ = ["build_parser", "collect_options", "main"]

#: Options that do not change a run's result: accepted with --resume.
RUNTIME_OPTIONS = {"command", "func", "resume", "quiet", "threads", "out"}
#: Where a run without --out goes: runs/<algorithm>-k<workers>-<date>-<time>[-n].
DEFAULT_OUT = "runs/ALGORITHM-kK-YYYYMMDD-HHMMSS"


def default_out(config, root: str = "runs") -> str:
    """A new run directory for a run without ``--out``: ``runs/dana-slim-k8-20250131-142501``,
    with ``-2``, ``-3``, ... added when that name is taken (two runs in one second)."""
    import time
    from pathlib import Path

    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(root) / f"{config.algorithm}-k{config.workers}-{stamp}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return str(path)


def resume_conflicts(args: argparse.Namespace) -> list[str]:
    """The options given with --resume that would change the run (and --out)."""
    given = [k for k in vars(args) if k not in RUNTIME_OPTIONS]
    if getattr(args, "out", None) is not None:
        given.append("out")
    names = {"config_file": "config", "algo_param": "algo-param"}
    flags = []
    for key in sorted(given):
        if key.startswith("timing."):
            key = "timing-" + key[7:]
        flags.append("--" + names.get(key, key.removeprefix("algo.")).replace("_", "-"))
    return flags


def cmd_train(args: argparse.Namespace) -> int:
    from dana.errors import DanaError
    from dana.train.config import TrainConfig
    from dana.train.records.progress import format_table
    from dana.train.records.rundir import RunDir
    from dana.train.resources import use_threads
    from dana.train.training import train
    from dana.version import __version__

    threads = use_threads(getattr(args, "threads", None))
    if args.resume:
        given = resume_conflicts(args)
        if given:
            raise DanaError(
                f"--resume continues the run in {args.resume} exactly as it was started, so "
                f"it takes no {', '.join(given)}; to change them, start a new run from its "
                f"settings: `dana train --config {args.resume}/config.json --out NEW ...`"
            )
        run = RunDir(args.resume)
        values = run.read_config()
        if run.finished():
            print(f"{run.path}: the run has already finished; see {run.summary}")
            return EXIT_DIVERGED if run.read_summary().get("diverged") else EXIT_OK
        config = TrainConfig.from_dict(values, str(run.config))
        out = run.path
    else:
        config = TrainConfig.from_dict(collect_options(args), "options").validate()
        out = default_out(config) if args.out is None else args.out
    summary = train(
        config,
        out,
        resume=bool(args.resume),
        progress=not args.quiet,
        version=__version__,
        threads=threads,
    )
    rows = RunDir(out).read_metrics()
    print(format_table(rows))
    if summary["diverged"]:
        print(
            f"DIVERGED: {config.algorithm} with {config.workers} workers diverged at update "
            f"{summary['diverged_at_update']} (loss became NaN or infinite). Results in {out}."
        )
        return EXIT_DIVERGED
    if "final_test_perplexity" in summary:  # a language model, beside its yardstick
        bigram = summary.get("reference_losses", {}).get("bigram")
        result = (
            f"final test loss {summary['final_test_loss']:.4f} (perplexity "
            f"{summary['final_test_perplexity']:.3f}, next-token error "
            f"{100 * summary['final_test_error']:.2f}%"
            + ("" if bigram is None else f"; the byte bigram model: {bigram:.4f}")
            + ")"
        )
    elif math.isfinite(summary["final_test_error"]):
        result = (
            f"final test error {100 * summary['final_test_error']:.2f}% (best "
            f"{100 * summary['best_test_error']:.2f}%)"
        )
    else:
        result = f"final test loss {summary['final_test_loss']:.4g}"
    wire = (
        f", {summary['push_bytes']:,} bytes a push ({config.compress})"
        if config.compress != "none" and "push_bytes" in summary
        else ""
    )
    if config.backend == "ray" and summary.get("sim_time", 0) > 0:  # (wall seconds there)
        wire += f", {summary['pushes'] / summary['sim_time']:.1f} pushes/s"
    grown = summary.get("workers_at_end", config.workers)
    size = f"{config.workers} workers" + (
        f" ({grown} at the end)" if grown != config.workers else ""
    )
    print(
        f"{config.algorithm}, {size}: {result}, mean gap "
        f"{summary['mean_gap']:.3g}, mean staleness {summary['mean_staleness']:.1f}{wire}. "
        f"Results in {out}."
    )
    return EXIT_OK


def cmd_algorithms(args: argparse.Namespace) -> int:
    from dana import algorithms

    width = max(map(len, algorithms.ALGORITHMS))
    for name, cls in algorithms.ALGORITHMS.items():
        defaults = algorithms.hparam_defaults(name)
        params = ", ".join(f"{key}={value!r}" for key, value in defaults.items()) or "-"
        print(f"{name:<{width}}  {cls.summary}  [{params}]")
    return EXIT_OK


def cmd_fit_cluster(args: argparse.Namespace) -> int:
    import yaml

    from dana.atomic import write_text_atomic
    from dana.errors import DanaError
    from dana.train.cluster.fit import GAP_FACTOR, fit_cluster

    gap = GAP_FACTOR if args.gap_factor is None else args.gap_factor
    if not (gap > 1 and math.isfinite(gap)):
        raise DanaError(f"--gap-factor must be a number above 1, got {gap:g}")
    text = yaml.safe_dump(fit_cluster(args.run, gap), sort_keys=False)
    if args.out is None:
        print(text, end="")
    else:
        write_text_atomic(args.out, text)
        print(f"wrote {args.out}: replay it with `dana train --cluster {args.out}`")
    return EXIT_OK


def cmd_replay(args: argparse.Namespace) -> int:
    from dana.ps.replay import replay_command

    return replay_command(args.run)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dana",
        formatter_class=HelpFormatter,
        description="Asynchronous distributed training with momentum: DANA, its baselines, "
        "an exact simulator of k workers, and a Ray runtime.",
    )
    from dana.version import __version__

    parser.add_argument("--version", action="version", version=f"dana {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "train",
        formatter_class=HelpFormatter,
        help="train a model with k asynchronous workers",
        description="Train a model with k simulated (or Ray) asynchronous workers; writes a run directory.",
    )
    add_train_options(p)
    p.add_argument(
        "--out",
        default=None,
        help="run directory to write: new, or empty; a local path (default: a new "
        f"{DEFAULT_OUT}, -2, -3, ... added if taken)",
    )
    p.add_argument(
        "--resume",
        metavar="DIR",
        default=None,
        help="continue the run in DIR from its last checkpoint",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser(
        "algorithms",
        help="list the algorithms",
        description="List the algorithms, one line each, with their hyper-parameters and defaults.",
    )
    p.set_defaults(func=cmd_algorithms)

    p = sub.add_parser(
        "fit-cluster",
        formatter_class=HelpFormatter,
        help="a cluster model fitted to a Ray run's records",
        description="Fit a cluster model (compute times per worker, link latencies, "
        "absences) to a finished `dana train --backend ray` run's step_times.csv, for the "
        "simulator to replay with `dana train --cluster FILE` (docs/USAGE.md).",
    )
    p.add_argument("run", metavar="RUN_DIR", help="the Ray run's directory")
    p.add_argument("--out", default=None, help="the YAML file to write (default: print it)")
    p.add_argument(
        "--gap-factor",
        type=float,
        default=None,
        help="a cycle this many times its worker's median is an absence (default: 10)",
    )
    p.set_defaults(func=cmd_fit_cluster)

    p = sub.add_parser(
        "replay",
        help="rebuild a Ray run's final parameters from its records, without Ray",
        description="Replay a finished `dana train --backend ray` run in one process from "
        "its replay.npz (the order of the calls its servers ran, each push's worker, "
        "version and batch) and compare with its model.safetensors: exit status 0 if "
        "identical, 1 if not, 2 if the run cannot be replayed (docs/DISTRIBUTED.md).",
    )
    p.add_argument("run", metavar="RUN_DIR", help="the Ray run's directory")
    p.set_defaults(func=cmd_replay)

    from dana.experiments.cli import register_commands  # sweep, report, leaderboard

    register_commands(sub)
    return parser


def _own(error: Exception) -> Exception:
    """The error as dana raised it: an error raised in a Ray actor reaches the driver as
    Ray's subclass of it, whose text is the actor's traceback; its ``cause`` is ours."""
    from dana.errors import DanaError, FaultError

    cause = getattr(error, "cause", None)
    return cause if isinstance(cause, DanaError | FaultError) else error


def main(argv: list[str] | None = None) -> int:
    from dana.errors import DanaError, FaultError, Preempted

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except DanaError as e:
        print(f"dana: error: {_own(e)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except FaultError as e:
        print(f"dana: fault: {_own(e)}", file=sys.stderr)
        return EXIT_FAULT
    except Preempted as e:
        print(f"dana: {e}", file=sys.stderr)
        return EXIT_PREEMPTED
    except KeyboardInterrupt:
        print("dana: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
