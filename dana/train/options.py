"""The options of a run, as the command line spells them: the one table both CLIs use.

``dana train`` takes them all; ``dana sweep`` takes them as the settings fixed for every
cell. Each option is a row of :data:`TRAIN_OPTIONS`, ``(flag, TrainConfig field, type,
help)`` and, where argparse needs more (a switch, a metavar, a default the help names),
its keywords; the defaults shown come from :class:`~dana.train.config.TrainConfig`. :func:`collect_options` turns the parsed
arguments (and a ``--config`` file) into :class:`TrainConfig` values.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from dana.train.backends import backends_help
from dana.train.config import TrainConfig


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, without breaking names like ``dana-slim`` at their hyphen."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        import textwrap

        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


def _defaults() -> dict[str, Any]:
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


class FlattenLists(argparse.Action):
    """A list option (``nargs="+"``, each value parsed to a list) given as ``1 2``,
    ``1,2`` or ``"1 2"``: every value's items, in order (``""``: an empty list)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, [x for value in values for x in value])


def _int_or_auto(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or auto, got {text!r}") from None


def _key_value(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.replace("-", "_"), yaml_value(value)


def yaml_value(text: str) -> Any:
    """``text`` read as one YAML value (a number, true/false, a string, ...); an
    ArgumentTypeError for what plain YAML cannot read (a ``!!python`` tag, say)."""
    import yaml

    from dana.textfile import NESTED, too_deep

    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as e:
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise argparse.ArgumentTypeError(
            f"cannot read {text!r}: {problem}; give a plain number, true/false or a string"
        ) from None
    except RecursionError:
        raise argparse.ArgumentTypeError(f"cannot read the value: {NESTED}") from None
    if too_deep(value):
        raise argparse.ArgumentTypeError(f"cannot read the value: {NESTED}")
    return value


#: Where a row's default text is TrainConfig's (or AUTO_DEFAULTS').
_FROM_CONFIG = object()

# (option, dest in TrainConfig, type, help[, argparse keywords]). The help ends with
# "(default: X)", X from TrainConfig; a row's keywords (``action``, ``metavar``) go to
# ``add_argument``, and its ``default_help`` names the default instead (None: the help
# says it, or the row is the "off" side of a switch). A ``type`` of None: a switch.
TRAIN_OPTIONS: list[tuple[Any, ...]] = [
    ("--algorithm", "algorithm", str, "algorithm name (see `dana algorithms`)"),
    ("--workers", "workers", int, "number of asynchronous workers k"),
    (
        "--dataset",
        "dataset",
        str,
        "fashion-mnist, mnist, cifar10, cifar100, synthetic, or your own files: folder "
        "(--data-dir DIR with train/<class>/ and test/<class>/ images), tensors (--data-dir "
        "holding train.pt and test.pt, or .npz) or text (--data-dir a text file, split 90/10, "
        "or a directory of train.txt and test.txt; byte tokens, for a --model transformer-...)",
    ),
    ("--data-dir", "data_dir", str, "directory holding the dataset's files"),
    ("--train-size", "train_size", int, "use only the first N training examples"),
    ("--test-size", "test_size", int, "use only the first N test examples"),
    (
        "--model",
        "model",
        str,
        "resnet20/32/44/56 (resnetN), wrn-16-4 (wrn-D-W), cnn, mlp, linear; for --dataset "
        "text: transformer-tiny, transformer-mini, transformer-small or transformer-L-W-T; "
        "auto: transformer-tiny for text, else cnn",
    ),
    ("--epochs", "epochs", float, "epochs of training data to consume"),
    ("--batch-size", "batch_size", int, "batch size per worker"),
    ("--lr", "lr", float, "learning rate (after warm-up, before decay)"),
    ("--momentum", "momentum", float, "momentum, for the algorithms that have one"),
    ("--weight-decay", "weight_decay", float, "weight decay, added to each gradient"),
    (
        "--lr-decay-epochs",
        "lr_decay_epochs",
        _floats,
        "epochs where lr is multiplied by --lr-decay-factor, e.g. 80 120",
        {"nargs": "+", "action": FlattenLists, "metavar": "EPOCH"},
    ),
    ("--lr-decay-factor", "lr_decay_factor", float, "learning-rate decay factor"),
    ("--warmup-epochs", "warmup_epochs", float, "linear warm-up from lr/k to lr over these epochs"),
    (
        "--lr-scaling",
        "lr_scaling",
        str,
        "none, or linear: the peak rate is lr*k, warmed up from lr (Goyal et al. 2017)",
    ),
    (
        "--timing",
        "timing",
        str,
        "timing model of each step, in ms: constant, gamma, lognormal, pareto, "
        "heterogeneous or trace",
    ),
    (
        "--cluster",
        "cluster",
        str,
        "the simulated cluster: a preset (datacenter, cloud, geo) or a YAML file of its "
        "compute, network and availability (docs/ALGORITHMS.md, 'The clock, exactly as "
        "simulated'); config.json keeps the model itself. Its compute model replaces --timing",
        {"metavar": "FILE_OR_PRESET", "default_help": "none: compute time only, free messages"},
    ),
    (
        "--partition",
        "partition",
        str,
        "data per worker: iid (one shared stream), dirichlet:ALPHA (each class split over "
        "the workers in Dirichlet(ALPHA) shares) or shards:N (N label-sorted shards per "
        "worker)",
    ),
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
    (
        "--device",
        "device",
        str,
        "where the simulator computes: cpu, cuda, or auto (cuda when torch sees a GPU); "
        "with --backend ray, each worker takes a GPU when the cluster has them",
    ),
    (
        "--batch-workers",
        "batch_workers",
        _int_or_auto,
        "the simulator computes the gradients of up to B in-flight workers in one "
        "vectorised call (torch.func.vmap); 1: one at a time; auto: as many as fit the "
        "device (1 on the CPU)",
    ),
    (
        "--cuda-graph",
        "cuda_graph",
        None,
        "on a GPU, record the gradient's forward and backward pass once as a CUDA graph "
        "and replay it for every worker: one launch instead of one per kernel, the same "
        "results (on the CPU the same pass, no speed-up)",
        {"action": "store_true", "default_help": "off"},
    ),
    ("--backend", "backend", str, backends_help()),
    ("--address", "address", str, "with --backend ray: the address of a running Ray cluster"),
    (
        "--servers",
        "servers",
        int,
        "parameter-server shards: with --backend ray the server actors; in the simulator "
        "with --cluster, the shards' links the messages are split over",
    ),
    (
        "--compress",
        "compress",
        str,
        "the codec of each push on the wire (docs/DISTRIBUTED.md, 'Compressed pushes'): "
        "none, fp16, bf16, int8 (blocks of 256 values, an absmax scale each) or topk:F "
        "(the fraction F of largest magnitudes, with error feedback: each worker keeps "
        "what it did not send and adds it to its next message); pulls are not compressed",
        {"metavar": "CODEC"},
    ),
    (
        "--no-standby",
        "standby",
        None,
        "with --backend ray: no standby replica of shard 0. A push costs less (a standby "
        "made it 1.4x to 1.8x slower with --servers 1, 1.2x to 1.4x with --servers 2, on 2 "
        "shared cores: docs/DISTRIBUTED.md), but the loss of shard 0 (with --servers 1 the "
        "only shard) "
        "ends the run with exit status 4: continue it with --resume from the last "
        "checkpoint (--checkpoint-every)",
        {"action": "store_false", "default_help": "a standby that takes over from a lost shard 0"},
    ),
    (
        "--server-timeout",
        "server_timeout",
        float,
        "with --backend ray: seconds the driver and shard 0 wait for a server's answer; "
        "a server past it (hung, paused) is treated as lost, as a dead one is",
    ),
    (
        "--relay-log-bytes",
        "relay_log_bytes",
        int,
        "with --backend ray: the bytes of relayed calls shard 0 (and its standby) keep in "
        "memory for rebuilding a lost shard or standby; beyond, they go to a temporary "
        "file on disk",
    ),
    (
        "--time-scale",
        "time_scale",
        float,
        "with --backend ray: emulate the --timing model, padding each step to its "
        "duration times this many seconds (0.001: the model's numbers are ms; 0: no delay); "
        "with --cluster, the cluster model's compute, transfers and departures",
    ),
    (
        "--max-workers",
        "max_workers",
        int,
        "with --backend ray: the most workers the run may hold (the rules are sized for "
        "them; default --workers); more are added with --grow-at or RUN/add-workers",
    ),
    (
        "--grow-at",
        "grow_at",
        str,
        "with --backend ray: add workers while the run goes on, STEP:N[,STEP:N...] (N "
        "workers once the run has taken STEP steps)",
    ),
    (
        "--augment",
        "augment",
        None,
        "augment training images",
        {"action": "store_true", "default_help": "on for CIFAR"},
    ),
    (
        "--no-augment",
        "augment",
        None,
        "do not augment training images",
        {"action": "store_false", "default_help": None},
    ),
    (
        "--threads",
        "threads",  # not a TrainConfig field: no part of the run's result (config.json)
        int,
        "the number of CPU threads the run uses (0: one per core): the simulator "
        "computes N in-flight workers' gradients at once, one thread each (with "
        "--batch-workers, N intra-op threads instead). A run's result "
        "does not depend on it, so it is not saved in config.json and may be given with "
        "--resume. The default, 1 (or OMP_NUM_THREADS where set), holds up when other "
        "processes keep cores busy: more threads spin-wait against them "
        "(docs/BENCHMARKS.md)",
        {"metavar": "N", "default_help": None},
    ),
    (
        "--tensorboard",
        "tensorboard",
        None,
        "also write TensorBoard logs to OUT/tensorboard",
        {"action": "store_true", "default_help": "off"},
    ),
    (
        "--mlflow",
        "mlflow",
        str,
        "also track the run in MLflow: a directory (its local file store) or a "
        "tracking URI; needs mlflow-skinny",
        {"metavar": "DIR_OR_URI", "default_help": "off"},
    ),
    (
        "--mlflow-experiment",
        "mlflow_experiment",
        str,
        "with --mlflow: the experiment",
        {"metavar": "NAME"},
    ),
    (
        "--wandb",
        "wandb",
        str,
        "also track the run in Weights & Biases, in the project PROJECT (default dana); "
        "offline unless WANDB_MODE is set; needs wandb",
        {"metavar": "PROJECT", "nargs": "?", "const": "dana", "default_help": "off"},
    ),
]

TIMING_OPTIONS = [
    ("--timing-shape", "shape", float, "gamma: shape (default 100)"),
    ("--timing-scale", "scale", float, "gamma: scale (default 1.28)"),
    (
        "--timing-mean",
        "mean",
        float,
        "heterogeneous, lognormal, pareto: mean step time (default 128)",
    ),
    ("--timing-cv", "cv", float, "lognormal: coefficient of variation (default 0.1)"),
    ("--timing-alpha", "alpha", float, "pareto: tail index > 1 (default 3)"),
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
    for flag, dest, type_, help_, *more in TRAIN_OPTIONS:
        keywords = dict(more[0]) if more else {}
        shown = keywords.pop("default_help", _FROM_CONFIG)
        if shown is _FROM_CONFIG:
            help_ = f"{help_} (default: {_default_text(dest, defaults[dest])})"
        elif shown is not None:
            help_ = f"{help_} (default: {shown})"
        if type_ is not None:
            keywords["type"] = type_
        parser.add_argument(flag, dest=dest, default=S, help=help_, **keywords)
    # The timing model's and the algorithm's parameters, and --config, are no TrainConfig
    # fields: they fill its timing_params and algorithm_params mappings (dests "timing.*",
    # "algo.*", read by collect_options) or name the file, in groups of their own.
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
