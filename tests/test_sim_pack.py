"""Runs packed into one process (dana/sim/compute.py's Pack, dana/sim/pack.py, ``dana
sweep --pack``) against each run alone: the same events, and parameters, losses,
metrics and summaries within float64 rounding (the batched engine's); checkpoints of
packed runs resume, packed or alone."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from clirun import run_dana

import dana
from dana.errors import Preempted
from dana.sim import Simulator
from dana.sim.compute import Pack
from dana.sim.pack import PackedRun, pack_key, train_pack
from dana.train.config import TrainConfig
from dana.train.records import preempt
from dana.train.task.batches import BatchStream
from dana.train.task.flat import FlatModel
from dana.train.task.stacked import GradientSource
from dana.train.training import train

TOL = 1e-10


def _sim(pack, algorithm, k, seed, *, bn=False, hidden=4, **options):
    """A run of a small convolutional model (BatchNorm: ``bn``) on its own data order."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 1, 8, 8, generator=g, dtype=torch.float64)
    y = (x.flatten(1)[:, :3].sum(1) > 0).long()
    torch.manual_seed(0)
    layers = [torch.nn.Conv2d(1, hidden, 3)] + ([torch.nn.BatchNorm2d(hidden)] if bn else [])
    layers += [torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(36 * hidden, 2)]
    flat = FlatModel(torch.nn.Sequential(*layers).double())

    def gradient(p, rows):
        return flat.gradient(p, x[rows], y[rows], F.cross_entropy)

    source = GradientSource(flat, F.cross_entropy, lambda rows: (x[rows], y[rows]))
    sim = Simulator(
        dana.algorithms.build(algorithm, **options.pop("hparams", {})),
        flat.flat.clone(),
        gradient,
        BatchStream(256, 16, seed=seed),
        k,
        lr=0.05,
        weight_decay=1e-4,
        timing="gamma",
        seed=seed,
        source=source,
        pack=pack,
        **options,
    )
    return sim, flat


def _events(sim):
    log = sim.log.numpy()
    return {k: log[k].tolist() for k in ("worker", "staleness", "sim_time")}


RUNS = [
    ("dana-slim", 5, 1, {}),
    ("ssgd", 3, 2, {}),
    ("asgd", 4, 3, {"max_staleness": 2}),
    ("local-sgd", 3, 4, {"hparams": {"local_steps": 3}}),
    ("easgd", 4, 5, {"batch_workers": 2}),
]


@pytest.mark.parametrize("bn", [False, True])
def test_packed_runs_equal_each_run_alone(bn):
    """Free, rounds, bounded staleness, local steps, a run looking ahead 2 workers of
    its own: each packed run is its run alone (one worker at a time)."""
    pack = Pack()
    packed = [_sim(pack, a, k, s, bn=bn, **dict(o)) for a, k, s, o in RUNS]
    for _ in range(50):
        for sim, _ in packed:
            sim.step()
    gradients = sum(sim.engine.computed for sim, _ in packed)
    assert pack.calls < gradients / 2  # the runs' gradients were computed together
    for (sim, flat), (algorithm, k, seed, options) in zip(packed, RUNS):
        options = {key: v for key, v in options.items() if key != "batch_workers"}
        alone, alone_flat = _sim(None, algorithm, k, seed, bn=bn, **options)
        assert alone.engine is None
        alone.run(pushes=sim.steps)
        assert _events(sim) == _events(alone), algorithm
        assert torch.allclose(sim.params(), alone.params(), rtol=0, atol=TOL), algorithm
        assert sim.log.loss == pytest.approx(alone.log.loss, rel=0, abs=TOL)
        for a, b in zip(flat.module.buffers(), alone_flat.module.buffers()):
            assert torch.allclose(a.double(), b.double(), rtol=0, atol=TOL), algorithm


def test_a_run_leaves_its_pack_and_the_others_go_on():
    pack = Pack()
    (one, _), (two, _) = _sim(pack, "dana-slim", 4, 1), _sim(pack, "asgd", 3, 2)
    one.step()
    assert two.engine.pending  # computed with one's
    one.engine.close()
    assert pack.members == [two.engine]
    two.run(pushes=20)
    alone, _ = _sim(None, "asgd", 3, 2)
    alone.run(pushes=20)
    assert torch.allclose(two.params(), alone.params(), rtol=0, atol=TOL)


def test_a_run_of_another_model_is_refused():
    pack = Pack()
    _sim(pack, "dana-slim", 4, 1)
    with pytest.raises(ValueError, match="same model"):
        _sim(pack, "dana-slim", 4, 1, hidden=5)


def test_the_pack_key_is_the_model_and_data():
    base = TrainConfig(dataset="synthetic", model="linear").to_dict()
    other = {**base, "seed": 3, "algorithm": "asgd", "workers": 7}
    assert pack_key(base) == pack_key(other) is not None
    assert pack_key({**base, "batch_size": 64}) != pack_key(base)
    assert pack_key({**base, "backend": "ray"}) is None


TINY = dict(
    dataset="synthetic", model="linear", train_size=256, test_size=64, batch_size=32,
    epochs=0.5, eval_every=0.25, warmup_epochs=0.25, dtype="float64",
)  # fmt: skip
CONFIGS = [
    TrainConfig(algorithm="dana-slim", workers=4, seed=0, **TINY),
    TrainConfig(algorithm="ssgd", workers=2, seed=1, **TINY),
    TrainConfig(algorithm="asgd", workers=3, seed=2, max_staleness=2, **TINY),
]


def _metrics(run: Path) -> list[dict[str, str]]:
    with (run / "metrics.csv").open() as f:
        return list(csv.DictReader(f))


def assert_same_records(packed: Path, alone: Path) -> None:
    """``summary.json`` and ``metrics.csv`` equal within TOL, but for wall times."""
    a, b = (json.loads((r / "summary.json").read_text()) for r in (packed, alone))
    assert a.keys() == b.keys()
    for key in a:
        if "wall" not in key:
            assert _close(a[key], b[key]), (packed.name, key, a[key], b[key])
    rows_a, rows_b = _metrics(packed), _metrics(alone)
    assert len(rows_a) == len(rows_b)
    for ra, rb in zip(rows_a, rows_b):
        assert ra.keys() == rb.keys()
        for key in ra:
            if "wall" not in key:
                assert _close(ra[key], rb[key]), (packed.name, key, ra[key], rb[key])


def _close(x, y) -> bool:
    try:
        fx, fy = float(x), float(y)
    except (TypeError, ValueError):
        return x == y
    return (math.isnan(fx) and math.isnan(fy)) or abs(fx - fy) <= TOL


@pytest.fixture(scope="module")
def alone(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("alone")
    for n, config in enumerate(CONFIGS):
        train(config.validate(), root / f"r{n}", progress=False)
    return [root / f"r{n}" for n in range(len(CONFIGS))]


def test_packed_training_writes_what_each_run_alone_writes(tmp_path, alone):
    outs = [tmp_path / f"r{n}" for n in range(len(CONFIGS))]
    results = train_pack([PackedRun(o, c.validate()) for o, c in zip(outs, CONFIGS)])
    assert all(isinstance(r, dict) for r in results), results
    for packed, run in zip(outs, alone):
        assert_same_records(packed, run)


def test_packed_runs_stopped_by_a_signal_resume_packed(tmp_path, alone, monkeypatch):
    """SIGTERM: every packed run checkpoints its own directory; resumed together they
    finish as each run alone."""
    asked = [0]

    def requested():
        asked[0] += 1
        return "SIGTERM" if asked[0] > 3 else None  # (after a step of each run)

    monkeypatch.setattr(preempt, "requested", requested)
    outs = [tmp_path / f"r{n}" for n in range(len(CONFIGS))]
    results = train_pack([PackedRun(o, c.validate()) for o, c in zip(outs, CONFIGS)])
    stopped = [o for o, r in zip(outs, results) if isinstance(r, Preempted)]
    assert len(stopped) == 2  # (ssgd's rounds step past the stop points: it finished)
    assert all(
        (o / "checkpoint.pt").is_file() and not (o / "summary.json").exists() for o in stopped
    )
    monkeypatch.undo()
    results = train_pack([PackedRun(o) for o in stopped])
    assert all(isinstance(r, dict) for r in results), results
    for packed, run in zip(outs, alone):
        assert_same_records(packed, run)


@pytest.mark.slow
def test_sweep_pack_2_equals_the_sweep_unpacked(tmp_path):
    tiny = ["--dataset", "synthetic", "--model", "linear", "--train-size", "256",
            "--test-size", "64", "--batch-size", "32", "--epochs", "0.5", "--eval-every",
            "0.25", "--warmup-epochs", "0.25", "--dtype", "float64",
            "--algorithms", "ssgd,dana-slim", "--workers", "1,2", "--quiet"]  # fmt: skip
    for name, extra in (("packed", ["--pack", "2"]), ("alone", [])):
        result = run_dana("sweep", *tiny, "--out", str(tmp_path / name), *extra, timeout=300)
        assert result.returncode == 0, result.stdout + result.stderr
    runs = sorted(p.name for p in (tmp_path / "alone" / "runs").iterdir())
    assert len(runs) == 3
    for name in runs:
        assert_same_records(tmp_path / "packed" / "runs" / name, tmp_path / "alone" / "runs" / name)
    log = (tmp_path / "packed" / "sweep.log").read_text()
    assert "a pack of" in log and log.count("finished ") == 3


def test_pack_auto_fits_half_the_free_memory_shared_by_the_jobs():
    from dana.sim.pack import auto_pack_size

    assert auto_pack_size(100, 1_000) == 5
    assert auto_pack_size(100, 1_000, jobs=2) == 2
    assert auto_pack_size(10**9, 1_000) == 1  # (one run always: it may still fit alone)


@pytest.mark.slow
def test_sweep_pack_auto_on_the_cpu_runs_each_alone_and_says_why(tmp_path):
    tiny = ["--dataset", "synthetic", "--model", "linear", "--train-size", "128",
            "--test-size", "64", "--batch-size", "32", "--epochs", "0.5",
            "--algorithms", "dana-slim", "--workers", "1,2", "--quiet"]  # fmt: skip
    result = run_dana("sweep", *tiny, "--out", str(tmp_path / "s"), "--pack", "auto", timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "--pack auto: 1 run(s) of linear per process: on the CPU" in result.stderr
    log = (tmp_path / "s" / "sweep.log").read_text()
    assert "--pack auto: 1 run(s)" in log and "a pack of" not in log
    assert log.count("finished ") == 2


@pytest.mark.parametrize("size", ["0", "two", "-1"])
def test_sweep_pack_refuses_what_is_not_a_size(tmp_path, size):
    result = run_dana("sweep", "--preset", "fashion-quick", "--out", str(tmp_path), "--pack", size)
    assert result.returncode == 2
    assert f"--pack must be a whole number >= 1 or auto, got '{size}'" in result.stderr


def test_a_footprint_is_measured_on_a_gpu_only(tmp_path, capsys):
    from dana.experiments.packed import main

    cell = tmp_path / "cell.json"
    cell.write_text(json.dumps(TrainConfig(dataset="synthetic", model="linear").to_dict()))
    assert main(["--footprint", str(cell)]) == 2
    assert "computes on cpu; a footprint is a GPU's" in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_runs_footprint_on_the_gpu_is_its_peak_memory():
    from dana.sim.pack import auto_pack_size, run_footprint

    config = TrainConfig(dataset="synthetic", model="cnn", train_size=256, test_size=64,
                         batch_size=32, workers=4, epochs=1, device="cuda").validate()  # fmt: skip
    run_bytes = run_footprint(config)
    assert run_bytes > 4 * sum(p.numel() for p in config.build_model().parameters())
    assert auto_pack_size(run_bytes, torch.cuda.mem_get_info()[0]) >= 2
