"""The configuration of one training run: every option of ``dana train``.

A run's ``config.json`` holds a :class:`TrainConfig` (and the package version), and
``dana train --config config.json`` reruns it. Values are validated in
:meth:`TrainConfig.validate`, which raises :class:`~dana.errors.ConfigError` naming the
bad option and what it accepts.

Every option's type and range is in one place, :data:`SCHEMA` (one :class:`Rule` per
field; a check at import keeps it and the fields in step), with strict types: a
boolean is true or false, never the string "no"; an integer is not a float; a number
is finite. A small table rather than pydantic: the messages name the command-line flag
(``--workers must be an integer >= 1, got 0``) and the same rules serve a config file,
a sweep cell and the command line, with no new dependency.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dana import algorithms
from dana.algorithms.base import Algorithm
from dana.data.datasets import dataset_kind, reads_files
from dana.errors import ConfigError
from dana.textfile import is_number, parse_mapping, read_text
from dana.train.backends import check_name
from dana.train.cluster.model import check_cluster_option, timing_of
from dana.train.cluster.partition import check_partition_option
from dana.train.cluster.timing import TIMING_MODELS
from dana.train.rules.codecs import build_codec
from dana.train.rules.members import capacity, check_members

LR_SCALINGS = ("none", "linear")
#: The automatic warm-up gives each worker this many steps (the paper's protocol gives
#: ~61 at k = 32); see TrainConfig.warmup_epochs_for.
AUTO_WARMUP_STEPS = 60
#: The automatic decay (x lr_decay_factor) comes at this fraction of the run.
AUTO_DECAY_AT = 0.9
DTYPES = ("float32", "float64")
#: ``--model auto``: the model for a dataset of each kind (``dana.data.DatasetEntry.kind``).
AUTO_MODELS = {"images": "cnn", "tokens": "transformer-tiny"}
DEVICES = ("cpu", "cuda", "auto")


@dataclass
class TrainConfig:
    """Every option of a run. The defaults train the small BatchNorm CNN on Fashion-MNIST
    with the paper's batch size, momentum and weight decay, and a learning rate (0.005,
    not the paper's 0.1) at which this CNN trains with up to 64 asynchronous workers:
    it is far more sensitive to staleness than ResNet-20 (docs/RESULTS.md)."""

    algorithm: str = "dana-slim"
    workers: int = 8
    dataset: str = "fashion-mnist"
    data_dir: str | None = None
    train_size: int | None = None
    test_size: int | None = None
    augment: bool | None = None
    model: str = "auto"  # auto: AUTO_MODELS by the dataset's kind, set at construction
    epochs: float = 3.0
    batch_size: int = 128
    lr: float = 0.005
    momentum: float = 0.9
    weight_decay: float = 1e-4
    lr_decay_epochs: list[float] | None = None  # None: auto, see decay_epochs_for()
    lr_decay_factor: float = 0.1
    warmup_epochs: float | None = None  # None: auto, see warmup_epochs_for()
    lr_scaling: str = "none"
    timing: str = "gamma"
    timing_params: dict[str, Any] = field(default_factory=dict)
    # The cluster model (a preset name or a file, resolved by validate() into the model
    # itself, which config.json keeps: dana.train.cluster); None: compute time only.
    cluster: str | dict[str, Any] | None = None
    partition: str = "iid"
    max_staleness: int | None = None
    algorithm_params: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    eval_every: float = 1.0
    checkpoint_every: float = 0.0
    tensorboard: bool = False
    mlflow: str | None = None
    mlflow_experiment: str = "dana"
    wandb: str | None = None  # a W&B project (dana.train.records.tracking)
    dtype: str = "float32"
    backend: str = "sim"
    address: str | None = None
    servers: int = 1
    # The codec of the workers' messages on the wire (dana.train.rules.codecs): none, fp16,
    # bf16, int8, topk:F.
    compress: str = "none"
    standby: bool = True
    server_timeout: float = 60.0
    relay_log_bytes: int = 2 * 1024**3
    time_scale: float = 0.0
    # Elastic membership (dana.train.rules.members): the most workers the run may hold (its
    # rules' size; None: workers) and when it grows ("STEP:N,...").
    max_workers: int | None = None
    grow_at: str | None = None
    device: str = "cpu"
    batch_workers: int | str = 1
    # The gradient's forward and backward pass replayed as one CUDA graph
    # (dana.train.task.captured); on the CPU the same pass without a graph.
    cuda_graph: bool = False

    def __post_init__(self) -> None:
        if self.model == "auto" and isinstance(self.dataset, str):
            self.model = AUTO_MODELS[dataset_kind(self.dataset)]

    # -- construction -------------------------------------------------------------------
    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "config") -> TrainConfig:
        values = {k: v for k, v in values.items() if k != "dana_version"}
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ConfigError(
                f"{source}: unknown option(s) {', '.join(unknown)}; valid options: "
                f"{', '.join(sorted(names))}"
            )
        return cls(**values)

    @classmethod
    def from_file(cls, path: str | Path) -> dict[str, Any]:
        """The options in a YAML or JSON file, as a dict (not yet merged or validated)."""
        path = Path(path)
        text = read_text(path, "the config file")
        values = parse_mapping(
            text,
            str(path),
            "a config file must hold a mapping of option: value",
            path.suffix == ".json",
        )
        return {k.replace("-", "_"): v for k, v in values.items()}

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def warmup_epochs_for(self, batches_per_epoch: int) -> float:
        """The warm-up's length in epochs: ``warmup_epochs``, or when it is None (the
        default) enough updates for every worker to take :data:`AUTO_WARMUP_STEPS` steps
        during it (``AUTO_WARMUP_STEPS * workers`` updates), but at least 1/8 of the run
        and at most 2/3 of it (the long-schedule study's shape: docs/RESULTS.md)."""
        if self.warmup_epochs is not None:
            return float(self.warmup_epochs)
        epochs = AUTO_WARMUP_STEPS * self.workers / max(1, batches_per_epoch)
        return min(max(epochs, self.epochs / 8), 2 * self.epochs / 3)

    def decay_epochs_for(self) -> list[float]:
        """The epochs where the rate decays: ``lr_decay_epochs``, or when it is None (the
        default) once, at :data:`AUTO_DECAY_AT` of the run."""
        if self.lr_decay_epochs is not None:
            return [float(e) for e in self.lr_decay_epochs]
        return [AUTO_DECAY_AT * self.epochs]

    def peak_lr(self) -> float:
        """The rate after warm-up, before decay: ``lr``, or ``lr * workers`` with the
        linear-scaling rule (``lr_scaling: linear``; Goyal et al. 2017)."""
        return self.lr * self.workers if self.lr_scaling == "linear" else self.lr

    def algorithm_hparams(self) -> dict[str, Any]:
        """The hyper-parameters passed to the algorithm: momentum if it takes one, then
        ``algorithm_params``, then ``workers`` if it takes it (the elastic-averaging
        algorithms derive their coefficient from it): the most workers the run may hold,
        ``max_workers`` when it grows, whose size every rule is built for."""
        hparams: dict[str, Any] = {}
        names = algorithms.hparam_names(self.algorithm)
        if "momentum" in names:
            hparams["momentum"] = self.momentum
        hparams.update(self.algorithm_params)
        if "workers" in names:
            hparams["workers"] = capacity(self)
        return hparams

    # -- validation ---------------------------------------------------------------------
    def validate(self, names: Mapping[str, str] | None = None) -> TrainConfig:
        """The config, checked: every option against :data:`SCHEMA`, then the rules
        between options; a cluster given by name or file comes back resolved (with the
        timing of its compute model). ``self`` is left as it is.

        Raises :class:`ConfigError` naming the first bad option, what it accepts and
        what it got. ``names``: how the caller names the options (the Python entries:
        their arguments, ``{"lr_decay_epochs": "decay_epochs", ...}``; every other
        option by its field name); by default the command line's flags
        (``--lr-decay-epochs``)."""
        flag = Flags(names)
        for name, rule in SCHEMA.items():
            rule.check(name, getattr(self, name), None if names is None else flag(name))
        backend = check_name(self.backend, flag("backend"))
        if self.algorithm not in algorithms.ALGORITHMS:
            raise ConfigError(
                f"{flag('algorithm')} {self.algorithm!r} is unknown"
                f"{algorithms.did_you_mean(self.algorithm)}; choose one of: "
                f"{', '.join(algorithms.ALGORITHMS)} (see `dana algorithms`)"
            )
        if self.momentum >= 1:
            raise ConfigError(f"{flag('momentum')} must be in [0, 1), got {self.momentum!r}")
        if self.lr_decay_epochs is not None and self.lr_decay_epochs != sorted(
            self.lr_decay_epochs
        ):
            raise ConfigError(
                f"{flag('lr_decay_epochs')} must increase, got {self.lr_decay_epochs!r}"
            )
        for name, every in (
            ("eval_every", self.eval_every),
            ("checkpoint_every", self.checkpoint_every),
        ):
            if every > 0 and self.epochs / every > MAX_STOPS:
                what = "evaluation" if name == "eval_every" else "checkpoint"
                raise ConfigError(
                    f"{flag('epochs')} {self.epochs:g} with {flag(name)} {every:g} asks for "
                    f"{self.epochs / every:.3g} {what} points; at most {MAX_STOPS:,} are "
                    f"allowed: raise {flag(name)} to at least {self.epochs / MAX_STOPS:.3g}"
                )
        if self.servers > 1 and not algorithms.get(self.algorithm).elementwise:
            raise ConfigError(
                f"{flag('servers')} {self.servers}: {self.algorithm}'s master rule is not "
                "element-wise (its state depends on the whole vector), so it cannot be split "
                f"into shards; use {flag('servers')} 1"
            )
        _check_algorithm_params(self.algorithm, self.algorithm_params)
        self._check_dependent_options(backend.processes, flag)
        build_codec(self.compress, flag("compress"))
        algorithm = self._algorithm(flag)
        checked = self
        if self.cluster is not None:
            given = self.timing != TrainConfig.timing or bool(self.timing_params)
            cluster = check_cluster_option(self, backend, algorithm.synchronous, given, flag)
            timing, timing_params = timing_of(cluster)
            checked = dataclasses.replace(
                self, cluster=cluster, timing=timing, timing_params=timing_params
            )
        check_members(checked, backend.elastic, flag)
        check_partition_option(self, backend, flag)
        if self.device == "cuda":
            from dana.train.device import check_cuda

            check_cuda(f"{flag('device')} cuda")
        self._check_rule_at(algorithm, flag)
        if algorithm.uses_speed and backend.wall_clock and self.time_scale <= 0:
            raise ConfigError(
                f"{flag('algorithm')} {self.algorithm} with dynamic_steps sizes each worker's "
                f"local phase by its speed relative to the fastest worker's, which a worker "
                f"of {flag('backend')} {self.backend} knows only from the emulated step "
                f"times: pass {flag('time_scale')} S > 0 (with {flag('timing')} heterogeneous "
                "or trace), or set dynamic_steps to false"
            )
        return checked

    def _check_dependent_options(self, processes: bool, flag: Flags) -> None:
        """ConfigError for an option, set to other than its default, that means something
        only with another one, and would otherwise be accepted and ignored
        (:data:`DEPENDENT_OPTIONS`)."""
        backend = flag("backend")
        lacking = {
            "processes": not processes,
            "cluster": not processes and self.cluster is None,
            "mlflow": self.mlflow is None,
            "files": not reads_files(self.dataset),
        }
        fixes = {
            "processes": f"means something only for a backend whose workers and servers are "
            f"processes ({backend} ray); {backend} {self.backend} would ignore it: drop it, "
            f"or add {backend} ray",
            "cluster": f"means something in the simulator only with a simulated cluster, "
            f"whose links the shards split the messages over, and none is given: add {flag('cluster')} (datacenter, "
            f"cloud, geo or a file) or {backend} ray, or drop it",
            "mlflow": f"names the experiment of {flag('mlflow')}, which is not given: add "
            f"{flag('mlflow')} DIR_OR_URI, or drop it",
            "files": f"{flag('dataset')} {self.dataset} is generated and reads no files: "
            "drop it, or choose a dataset read from files",
        }
        for name, needs in DEPENDENT_OPTIONS.items():
            value = getattr(self, name)
            if value != getattr(TrainConfig, name) and lacking[needs]:
                given = "--no-standby" if flag(name) == "--standby" else f"{flag(name)} {value!r}"
                raise ConfigError(f"{given} {fixes[needs]}")

    def _check_rule_at(self, algorithm: Algorithm, flag: Flags) -> None:
        """The master rule built for the run's size (``max_workers`` when it grows: the
        servers build it so) on one parameter: a hyper-parameter whose valid range
        depends on k is refused here, before any run starts."""
        import torch

        k = capacity(self)
        try:
            algorithm.master(torch.zeros(1), k)
        except (ValueError, TypeError) as e:
            size = flag("max_workers") if k != self.workers else flag("workers")
            raise ConfigError(
                f"{flag('algorithm')} {self.algorithm} with {size} {k}: {e}"
            ) from None

    def build_algorithm(self) -> Algorithm:
        """The run's algorithm, built from ``algorithm`` and :meth:`algorithm_hparams`."""
        return self._algorithm(Flags(None))

    def _algorithm(self, flag: Flags) -> Algorithm:
        try:
            return algorithms.build(self.algorithm, **self.algorithm_hparams())
        except (ValueError, TypeError) as e:
            raise ConfigError(f"{flag('algorithm')} {self.algorithm}: {e}") from None


class Flags:
    """How the caller of :meth:`TrainConfig.validate` names each option: ``names`` (a
    Python entry's argument names) or, by default, the command line's flags."""

    def __init__(self, names: Mapping[str, str] | None = None):
        self.names = names

    def __call__(self, name: str) -> str:
        if self.names is None:
            return "--" + name.replace("_", "-")
        return self.names.get(name, name)


#: How the Python entries (dana.fit, dana.simulate) name the options they take under
#: another name than the option's (:meth:`TrainConfig.validate`'s ``names``).
PYTHON_NAMES: dict[str, str] = {
    "lr_decay_epochs": "decay_epochs",
    "lr_decay_factor": "decay_factor",
    "algorithm_params": "the algorithm's hyper-parameters",
}

#: The options that mean something only with another: the backend's processes
#: (``--backend ray``), a simulated cluster (or processes), ``--mlflow``, or a dataset
#: read from files. Set to other than its default without it, one is refused
#: (:meth:`TrainConfig._check_dependent_options`), never silently ignored.
DEPENDENT_OPTIONS: dict[str, str] = {
    "address": "processes",
    "standby": "processes",
    "server_timeout": "processes",
    "relay_log_bytes": "processes",
    "time_scale": "processes",
    "servers": "cluster",
    "mlflow_experiment": "mlflow",
    "data_dir": "files",
}

#: The most evaluation (or checkpoint) points one run may ask for: each is a row of
#: metrics.csv and a stop of the loop; 1e5 is far past any useful curve.
MAX_STOPS = 100_000
#: The longest run, in epochs: far past any protocol (the paper's longest is 200).
MAX_EPOCHS = 1_000_000
#: The largest integer an option may hold: torch's and numpy's int64.
MAX_INT = 2**63 - 1
#: Seeds go to torch, numpy and derived generators (seed + a constant): 32 bits suffice.
MAX_SEED = 2**32 - 1


@dataclass(frozen=True)
class Rule:
    """The type and range of one option: ``kind`` is int, float, bool, str, list or dict;
    numbers lie in ``[low, high]`` (``(low, high]`` when ``open_low``); ``choices``
    (a tuple) lists the accepted strings (for an int: the words accepted besides
    integers, as ``auto``); ``optional``: None is accepted too.

    Types are strict: a boolean is ``true`` or ``false`` (the string "no" is refused,
    not read as true), an integer is not a float or a boolean, a number is finite."""

    kind: type
    low: float | None = None
    high: float | None = None
    open_low: bool = False
    choices: tuple[str, ...] = ()
    optional: bool = False

    def check(self, name: str, value: Any, flag: str | None = None) -> None:
        """ConfigError unless ``value`` is a valid option ``name``; the message calls it
        ``flag`` (default: its command-line flag)."""
        if value is None and self.optional or self.kind is object:
            return
        given = flag
        flag = flag or "--" + name.replace("_", "-")
        if self.kind is bool:
            if not isinstance(value, bool):
                raise ConfigError(
                    f"{flag} must be true or false, got {value!r}"
                    + (
                        " (a string; write true or false without quotes)"
                        if isinstance(value, str)
                        else ""
                    )
                )
        elif self.kind is int:
            if isinstance(value, str) and value in self.choices:
                return
            if isinstance(value, bool) or not isinstance(value, int) or not self._in_range(value):
                also = "".join(f" or {c}" for c in self.choices)
                raise ConfigError(f"{flag} must be an integer {self._range()}{also}, got {value!r}")
            if abs(value) > MAX_INT:
                raise ConfigError(
                    f"{flag} {value} is too large for an integer of 64 bits (at most 2**63 - 1)"
                )
        elif self.kind is float:
            if not (is_number(value) and self._in_range(value)):
                hint = _number_hint(value)
                raise ConfigError(f"{flag} must be a number {self._range()}, got {value!r}{hint}")
        elif self.kind is str:
            if not isinstance(value, str):
                raise ConfigError(f"{flag} must be a string, got {value!r}")
            if self.choices and value not in self.choices:
                raise ConfigError(
                    f"{flag} {value!r} is unknown; choose one of: {', '.join(self.choices)}"
                )
        elif self.kind is list:
            if not isinstance(value, list) or any(
                not (is_number(e) and self._in_range(e)) for e in value
            ):
                raise ConfigError(f"{flag} must be positive numbers, got {value!r}")
        elif self.kind is dict:
            if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
                raise ConfigError(
                    f"{given or name} must be a mapping of name: value, got {value!r}"
                )

    def _in_range(self, value: float) -> bool:
        if self.low is not None and (value <= self.low if self.open_low else value < self.low):
            return False
        return self.high is None or value <= self.high

    def _range(self) -> str:
        if self.low is None:
            return ""
        low, op = _num(self.low), (">" if self.open_low else ">=")
        if self.high is None:
            return f"{op} {low}"
        return f"in {'(' if self.open_low else '['}{low}, {_num(self.high)}]"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e16 else f"{x:g}"


def _number_hint(value: Any) -> str:
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            return ""
        return " (a string: in YAML a number in exponent form needs a dot, e.g. 1.0e-4)"
    return ""


#: Every option's type and range, in one place (:meth:`TrainConfig.validate`).
SCHEMA: dict[str, Rule] = {
    "algorithm": Rule(str),
    "workers": Rule(int, low=1),
    "dataset": Rule(str),  # the name is checked where it loads (any case)
    "data_dir": Rule(str, optional=True),
    "train_size": Rule(int, low=1, optional=True),
    "test_size": Rule(int, low=1, optional=True),
    "augment": Rule(bool, optional=True),
    "model": Rule(str),
    "epochs": Rule(float, low=0, high=MAX_EPOCHS, open_low=True),
    "batch_size": Rule(int, low=1),
    "lr": Rule(float, low=0, open_low=True),
    "momentum": Rule(float, low=0),
    "weight_decay": Rule(float, low=0),
    "lr_decay_epochs": Rule(list, low=0, open_low=True, optional=True),
    "lr_decay_factor": Rule(float, low=0, high=1, open_low=True),
    "warmup_epochs": Rule(float, low=0, optional=True),
    "lr_scaling": Rule(str, choices=LR_SCALINGS),
    "timing": Rule(str, choices=tuple(TIMING_MODELS)),
    "timing_params": Rule(dict),
    "cluster": Rule(object, optional=True),  # resolved and checked by its own parser
    "partition": Rule(str),  # parsed in validate (iid, dirichlet:ALPHA, shards:N)
    "max_staleness": Rule(int, low=0, optional=True),
    "algorithm_params": Rule(dict),
    "seed": Rule(int, low=0, high=MAX_SEED),
    "eval_every": Rule(float, low=0, open_low=True),
    "checkpoint_every": Rule(float, low=0),
    "tensorboard": Rule(bool),
    "mlflow": Rule(str, optional=True),
    "mlflow_experiment": Rule(str),
    "wandb": Rule(str, optional=True),
    "dtype": Rule(str, choices=DTYPES),
    "backend": Rule(str),  # a registered runner: checked in validate (dana.train.backends)
    "address": Rule(str, optional=True),
    "servers": Rule(int, low=1),
    "compress": Rule(str),  # a codec: checked in validate (dana.train.rules.codecs)
    "standby": Rule(bool),
    "server_timeout": Rule(float, low=0, open_low=True),
    "relay_log_bytes": Rule(int, low=0),
    "time_scale": Rule(float, low=0),
    "max_workers": Rule(int, low=1, optional=True),
    "grow_at": Rule(str, optional=True),
    "device": Rule(str, choices=DEVICES),
    "batch_workers": Rule(int, low=1, choices=("auto",)),
    "cuda_graph": Rule(bool),
}


def _check_algorithm_params(name: str, params: dict[str, Any]) -> None:
    """A hyper-parameter declared ``bool`` must be a boolean, one declared ``float`` or
    ``int`` a finite number (the algorithm's dataclass fields say which)."""
    types = algorithms.hparam_types(name)
    for key, value in params.items():
        if key not in types:
            continue  # an unknown name: algorithms.build says which it takes
        kind = types[key]
        if kind is bool and not isinstance(value, bool):
            raise ConfigError(f"{name}: hyper-parameter {key} must be true or false, got {value!r}")
        if kind in (float, int) and not is_number(value):
            raise ConfigError(
                f"{name}: hyper-parameter {key} must be a number, got {value!r}"
                + _number_hint(value)
            )


_missing = {f.name for f in dataclasses.fields(TrainConfig)} ^ set(SCHEMA)
if _missing:  # a field added without its rule, or a rule without its field
    raise RuntimeError(f"SCHEMA and TrainConfig disagree on {sorted(_missing)}")
