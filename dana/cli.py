"""The ``dana`` command.

Exit status: 0 success; 2 bad input (the message says what and how to fix it; nothing
is left half-written); 3 the training diverged (a result: ``summary.json`` says where);
1 an unexpected internal error; 130 interrupted.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

EXIT_OK, EXIT_ERROR, EXIT_BAD_INPUT, EXIT_DIVERGED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
EXIT_FAULT = 4  # a fault the run could not survive (a lost server shard): --resume


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, without breaking names like ``dana-slim`` at their hyphen."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        import textwrap

        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


def _defaults() -> dict[str, Any]:
    from dana.train.config import TrainConfig

    return {f.name: getattr(TrainConfig(), f.name) for f in dataclasses.fields(TrainConfig)}


#: What an unset option means, for the options whose default is computed.
AUTO_DEFAULTS = {
    "warmup_epochs": "auto: 60 steps per worker (60*k updates), within 1/8 and 2/3 of the run",
    "lr_decay_epochs": "auto: once, at 9/10 of the run",
}


def _default_text(dest: str, value: Any) -> Any:
    return AUTO_DEFAULTS[dest] if value is None and dest in AUTO_DEFAULTS else value


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.replace(",", " ").split()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like '80,120', got {text!r}") from None


def _key_value(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.replace("-", "_"), yaml_value(value)


def yaml_value(text: str) -> Any:
    """``text`` read as one YAML value (a number, true/false, a string, ...); an
    ArgumentTypeError for what plain YAML cannot read (a ``!!python`` tag, say)."""
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise argparse.ArgumentTypeError(
            f"cannot read {text!r}: {problem}; give a plain number, true/false or a string"
        ) from None


# (option, dest in TrainConfig, type, help); defaults come from TrainConfig.
TRAIN_OPTIONS: list[tuple[str, str, Any, str]] = [
    ("--algorithm", "algorithm", str, "algorithm name (see `dana algorithms`)"),
    ("--workers", "workers", int, "number of asynchronous workers k"),
    (
        "--dataset",
        "dataset",
        str,
        "fashion-mnist, mnist, cifar10, cifar100, synthetic, or your own files: folder "
        "(--data-dir DIR with train/<class>/ and test/<class>/ images) or tensors (--data-dir "
        "holding train.pt and test.pt, or .npz)",
    ),
    ("--data-dir", "data_dir", str, "directory holding the dataset's files"),
    ("--train-size", "train_size", int, "use only the first N training examples"),
    ("--test-size", "test_size", int, "use only the first N test examples"),
    ("--model", "model", str, "resnet20/32/44/56 (resnetN), wrn-16-4 (wrn-D-W), cnn, mlp, linear"),
    ("--epochs", "epochs", float, "epochs of training data to consume"),
    ("--batch-size", "batch_size", int, "batch size per worker"),
    ("--lr", "lr", float, "learning rate (after warm-up, before decay)"),
    ("--momentum", "momentum", float, "momentum, for the algorithms that have one"),
    ("--weight-decay", "weight_decay", float, "weight decay, added to each gradient"),
    (
        "--lr-decay-epochs",
        "lr_decay_epochs",
        _floats,
        "epochs where lr is multiplied by --lr-decay-factor, e.g. 80,120",
    ),
    ("--lr-decay-factor", "lr_decay_factor", float, "learning-rate decay factor"),
    ("--warmup-epochs", "warmup_epochs", float, "linear warm-up from lr/k to lr over these epochs"),
    (
        "--lr-scaling",
        "lr_scaling",
        str,
        "none, or linear: the peak rate is lr*k, warmed up from lr (Goyal et al. 2017)",
    ),
    ("--timing", "timing", str, "timing model: constant, gamma, heterogeneous or trace"),
    (
        "--max-staleness",
        "max_staleness",
        int,
        "bounded staleness: workers wait so that no push is more than this many updates stale",
    ),
    ("--seed", "seed", int, "random seed (data order, init, timing)"),
    ("--eval-every", "eval_every", float, "evaluate every this many epochs"),
    (
        "--checkpoint-every",
        "checkpoint_every",
        float,
        "checkpoint every this many epochs (0: never)",
    ),
    ("--dtype", "dtype", str, "float32 or float64"),
    ("--backend", "backend", str, "sim (the simulator) or ray (real workers on Ray)"),
    ("--address", "address", str, "with --backend ray: the address of a running Ray cluster"),
    ("--servers", "servers", int, "with --backend ray: parameter-server shards"),
    (
        "--time-scale",
        "time_scale",
        float,
        "with --backend ray: emulate the --timing model, padding each step to its "
        "duration times this many seconds (0.001: the model's numbers are ms; 0: no delay)",
    ),
]

TIMING_OPTIONS = [
    ("--timing-shape", "shape", float, "gamma: shape (default 100)"),
    ("--timing-scale", "scale", float, "gamma: scale (default 1.28)"),
    ("--timing-mean", "mean", float, "heterogeneous: mean step time (default 128)"),
    (
        "--timing-machine-cv",
        "machine_cv",
        float,
        "heterogeneous: spread of worker speeds (default 0.3)",
    ),
    (
        "--timing-task-cv",
        "task_cv",
        float,
        "heterogeneous: spread of one worker's steps (default 0.1)",
    ),
    ("--timing-duration", "duration", float, "constant: step time (default 1)"),
    ("--timing-trace", "path", str, "trace: CSV file of worker,duration rows"),
]


def add_train_options(parser: argparse.ArgumentParser) -> None:
    """The options of `dana train` (also accepted by `dana sweep` as fixed settings)."""
    defaults = _defaults()
    S = argparse.SUPPRESS
    for flag, dest, type_, help_ in TRAIN_OPTIONS:
        parser.add_argument(
            flag,
            dest=dest,
            type=type_,
            default=S,
            help=f"{help_} (default: {_default_text(dest, defaults[dest])})",
        )
    parser.add_argument(
        "--augment",
        dest="augment",
        action="store_true",
        default=S,
        help="augment training images (default: on for CIFAR)",
    )
    parser.add_argument(
        "--no-augment",
        dest="augment",
        action="store_false",
        default=S,
        help="do not augment training images",
    )
    parser.add_argument(
        "--threads",
        dest="threads",
        type=int,
        default=S,
        metavar="N",
        help="the number of CPU threads the run uses (torch's intra-op threads; 0: one per "
        "core). A run's result does not depend on it, so it is not saved in config.json and "
        "may be given with --resume. The default, 1 (or OMP_NUM_THREADS where set), holds "
        "up when other processes keep cores busy: more threads spin-wait against them "
        "(docs/BENCHMARKS.md)",
    )
    parser.add_argument(
        "--tensorboard",
        dest="tensorboard",
        action="store_true",
        default=S,
        help="also write TensorBoard logs to OUT/tensorboard (default: off)",
    )
    parser.add_argument(
        "--mlflow",
        dest="mlflow",
        default=S,
        metavar="DIR_OR_URI",
        help="also track the run in MLflow: a directory (its local file store) or a "
        "tracking URI; needs mlflow-skinny (default: off)",
    )
    parser.add_argument(
        "--mlflow-experiment",
        dest="mlflow_experiment",
        default=S,
        metavar="NAME",
        help="with --mlflow: the experiment (default: dana)",
    )
    group = parser.add_argument_group("timing model parameters")
    for flag, key, type_, help_ in TIMING_OPTIONS:
        group.add_argument(flag, dest=f"timing.{key}", type=type_, default=S, help=help_)
    algo = parser.add_argument_group("algorithm hyper-parameters")
    algo.add_argument(
        "--lc",
        dest="algo.lc",
        type=float,
        default=S,
        help="dc-asgd / dana-dc: delay-compensation coefficient (defaults 0.04 / 2)",
    )
    algo.add_argument(
        "--algo-param",
        dest="algo_param",
        type=_key_value,
        action="append",
        default=S,
        metavar="KEY=VALUE",
        help="any other hyper-parameter of the algorithm, e.g. nesterov=true (repeatable)",
    )
    parser.add_argument(
        "--config",
        dest="config_file",
        default=S,
        metavar="FILE",
        help="YAML or JSON file of options; options given on the command line override it (a run's config.json reruns it)",
    )


def collect_options(args: argparse.Namespace) -> dict[str, Any]:
    """The TrainConfig values given: from --config, overridden by the command line."""
    from dana.train.config import TrainConfig

    given = vars(args)
    values: dict[str, Any] = {}
    if "config_file" in given:
        values.update(TrainConfig.from_file(given["config_file"]))
    timing: dict[str, Any] = {}
    algo: dict[str, Any] = {}
    for key, value in given.items():
        if key.startswith("timing."):
            timing[key[7:]] = value
        elif key.startswith("algo."):
            algo[key[5:]] = value
        elif key == "algo_param":
            algo.update(dict(value))
        elif key in {f.name for f in dataclasses.fields(TrainConfig)}:
            values[key] = value
    if timing:
        values["timing_params"] = _merged(values, "timing_params", timing)
    if algo:
        values["algorithm_params"] = _merged(values, "algorithm_params", algo)
    return values


def _merged(values: dict[str, Any], name: str, given: dict[str, Any]) -> Any:
    """The file's ``name`` mapping updated with the command line's; a file's value that
    is no mapping is kept as it is, for validation to name."""
    held = values.get(name)
    if held is None:
        return given
    return {**held, **given} if isinstance(held, dict) else held


#: Options that do not change a run's result: accepted with --resume.
RUNTIME_OPTIONS = {"command", "func", "resume", "quiet", "threads", "out"}
DEFAULT_OUT = "runs/latest"


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
    from dana import __version__
    from dana.errors import DanaError
    from dana.train.config import TrainConfig
    from dana.train.progress import format_table
    from dana.train.resources import use_threads
    from dana.train.rundir import RunDir
    from dana.train.runner import train

    use_threads(getattr(args, "threads", None))
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
        config = TrainConfig.from_dict(collect_options(args), "options")
        out = args.out or DEFAULT_OUT
    summary = train(
        config, out, resume=bool(args.resume), progress=not args.quiet, version=__version__
    )
    rows = RunDir(out).read_metrics()
    print(format_table(rows))
    if summary["diverged"]:
        print(
            f"DIVERGED: {config.algorithm} with {config.workers} workers diverged at update "
            f"{summary['diverged_at_update']} (loss became NaN or infinite). Results in {out}."
        )
        return EXIT_DIVERGED
    print(
        f"{config.algorithm}, {config.workers} workers: final test error "
        f"{100 * summary['final_test_error']:.2f}% (best {100 * summary['best_test_error']:.2f}%), "
        f"mean gap {summary['mean_gap']:.3g}, mean staleness {summary['mean_staleness']:.1f}. "
        f"Results in {out}."
    )
    return EXIT_OK


def cmd_algorithms(args: argparse.Namespace) -> int:
    from dana import algorithms

    width = max(map(len, algorithms.ALGORITHMS))
    for name, cls in algorithms.ALGORITHMS.items():
        params = ", ".join(algorithms.hparam_names(name)) or "-"
        print(f"{name:<{width}}  {cls.summary}  [{params}]")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dana",
        formatter_class=HelpFormatter,
        description="Asynchronous distributed training with momentum: DANA, its baselines, "
        "an exact simulator of k workers, and a Ray runtime.",
    )
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
        help=f"run directory to write: new, or empty (default: {DEFAULT_OUT})",
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
        description="List the algorithms with one line each and their hyper-parameters.",
    )
    p.set_defaults(func=cmd_algorithms)

    for register in _extra_commands():
        register(sub)
    return parser


def _extra_commands() -> list:
    """Subcommands defined in other modules (sweep, report)."""
    commands = []
    try:
        from dana.experiments.cli import register_commands

        commands.append(register_commands)
    except ImportError:
        pass
    return commands


def main(argv: list[str] | None = None) -> int:
    from dana.errors import DanaError, FaultError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except DanaError as e:
        print(f"dana: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except FaultError as e:
        print(f"dana: fault: {e}", file=sys.stderr)
        return EXIT_FAULT
    except KeyboardInterrupt:
        print("dana: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
