"""One set of defaults behind every door (dana train, dana.fit, dana.simulate, the
Simulator, dana.optim), read from one place (TrainConfig); every TrainConfig option
reachable from dana.fit."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch

import dana
import dana.fitting
from dana.cli import build_parser
from dana.optim import Master, Worker
from dana.sim import Simulator
from dana.train.config import PYTHON_NAMES, TrainConfig
from dana.train.options import collect_options

FIELDS = [f.name for f in dataclasses.fields(TrainConfig)]
#: Fields dana.fit takes from the user's data and model, not from an argument.
FROM_THE_DATA = {"dataset", "data_dir", "train_size", "test_size", "model", "augment"}
#: dana.fit's argument for a field, where the name differs.
ARGUMENT = {k: v for k, v in PYTHON_NAMES.items() if k != "algorithm_params"}


def _argument(field: str) -> str:
    return ARGUMENT.get(field, field)


@pytest.mark.parametrize(
    "door",
    [Simulator.__init__, dana.fit, dana.simulate, Worker.__init__, Master.__init__],
    ids=["Simulator", "fit", "simulate", "optim.Worker", "optim.Master"],
)
def test_every_door_reports_trainconfigs_defaults(door):
    params = inspect.signature(door).parameters
    shared = [f for f in FIELDS if _argument(f) in params]
    assert shared, door
    for field in shared:
        default = params[_argument(field)].default
        if default is inspect.Parameter.empty:  # (a required argument: no default to differ)
            continue
        if field in ("timing_params", "tensorboard") or (
            door is Worker.__init__ and field == "algorithm"
        ):
            assert default is None, field  # ({}; a path for on; the master's algorithm)
            continue
        assert default == getattr(TrainConfig, field), (door.__qualname__, field)


def test_dana_train_reports_trainconfigs_defaults():
    """`dana train` with no option is TrainConfig(), and its help names those defaults."""
    args = build_parser().parse_args(["train"])
    assert TrainConfig.from_dict(collect_options(args), "options") == TrainConfig()
    helptext = _train_help()
    for field in ("lr", "momentum", "weight_decay", "workers", "batch_size", "timing"):
        assert f"(default: {getattr(TrainConfig, field)})" in helptext, field


def _train_help() -> str:
    parser = build_parser()
    train = next(a for a in parser._actions if a.dest == "command").choices["train"]
    return " ".join(train.format_help().split())


def _factory():
    return torch.nn.Sequential(torch.nn.Linear(4, 3))


#: A value other than the default for every field dana.fit takes, in two calls: the
#: simulator's options and the processes' (Ray's) options.
SIM_VALUES = {
    "algorithm": "asgd", "workers": 3, "epochs": 2.0, "batch_size": 16, "lr": 0.01,
    "momentum": 0.8, "weight_decay": 0.001, "lr_decay_epochs": [1.5],
    "lr_decay_factor": 0.5, "warmup_epochs": 0.5, "lr_scaling": "linear",
    "timing": "constant", "timing_params": {"duration": 50.0}, "cluster": {"name": "doors", "network": {"latency_ms": 1.0}},
    "partition": "shards:1", "max_staleness": 2, "seed": 3, "eval_every": 0.5,
    "checkpoint_every": 1.0, "dtype": "float64", "compress": "fp16", "batch_workers": 2,
    "cuda_graph": True,
    "mlflow_experiment": "doors", "servers": 2, "wandb": "doors",
}  # fmt: skip
RAY_VALUES = {
    "backend": "ray", "address": "auto", "standby": False, "server_timeout": 30.0,
    "relay_log_bytes": 1024**3, "time_scale": 0.5, "max_workers": 10, "grow_at": "1:2",
}  # fmt: skip
#: Fields whose every valid value here is the default, or that another argument sets.
SPECIAL = {"device", "tensorboard", "algorithm_params"}


def test_every_trainconfig_field_is_reachable_from_fit(monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr(dana.fitting, "_run", lambda config, *a, **k: seen.append(config))
    x, y = torch.randn(200, 4), torch.randint(0, 3, (200,))
    pytest.importorskip("mlflow")
    pytest.importorskip("wandb")
    sim_values = {**SIM_VALUES, "mlflow": str(tmp_path / "mlruns")}
    for values in (sim_values, RAY_VALUES):
        dana.fit(_factory, (x, y), **{_argument(f): v for f, v in values.items()})
    covered = set(sim_values) | set(RAY_VALUES) | FROM_THE_DATA | SPECIAL
    assert covered == set(FIELDS), set(FIELDS) ^ covered
    for config, values in zip(seen, (sim_values, RAY_VALUES)):
        for field, value in values.items():
            got = getattr(config, field)
            if field == "cluster":  # (resolved: every section filled in)
                got = {"name": got["name"], "network": {"latency_ms": got["network"]["latency_ms"]}}
            assert got == value, field
    for field in SPECIAL - {"algorithm_params"}:
        assert _argument(field) in inspect.signature(dana.fit).parameters, field
    # The model's class: what config.json and the trackers show.
    assert (seen[0].dataset, seen[0].model, seen[0].augment) == ("user", "Sequential", False)
