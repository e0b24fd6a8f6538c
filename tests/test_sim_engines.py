"""The simulator's batched and threaded gradient engines (dana/sim/compute.py) against the
sequential simulator: same events, batches, staleness and log; parameters equal within
float64 rounding (batched) or bit for bit (threaded); checkpoints resume exactly."""

from __future__ import annotations

import csv
import io
import json
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from clirun import kill_at_first_checkpoint, run_dana

import dana
from dana.errors import ConfigError
from dana.sim import Simulator
from dana.train.task.batches import BatchStream
from dana.train.task.flat import FlatModel
from dana.train.task.stacked import GradientSource

ALGORITHMS = ["dana-slim", "dana-zero", "nag-asgd", "asgd", "gap-aware"]


def _problem(dtype=torch.float64, bn=False, dropout=False, n=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 1, 8, 8, generator=g, dtype=dtype)
    y = (x.flatten(1)[:, :3].sum(1) > 0).long()
    torch.manual_seed(seed)
    layers = [torch.nn.Conv2d(1, 4, 3)]
    layers += [torch.nn.BatchNorm2d(4)] if bn else []
    layers += [torch.nn.ReLU(), torch.nn.Flatten()]
    layers += [torch.nn.Dropout(0.5)] if dropout else []
    layers += [torch.nn.Linear(144, 2)]
    flat = FlatModel(torch.nn.Sequential(*layers).to(dtype))

    def inputs(rows):
        return x[rows], y[rows]

    def gradient(p, rows):
        return flat.gradient(p, *inputs(rows), F.cross_entropy)

    return flat, gradient, GradientSource(flat, F.cross_entropy, inputs)


def _sim(algorithm="dana-slim", k=4, batch_workers=1, threads=1, *, bn=False, dtype=torch.float64,
         max_staleness=None, dropout=False, **hparams):  # fmt: skip
    flat, gradient, source = _problem(dtype, bn, dropout)
    sim = Simulator(
        dana.algorithms.build(algorithm, **hparams),
        flat.flat.clone(),
        gradient,
        BatchStream(256, 16, seed=1),
        k,
        lr=0.05,
        weight_decay=1e-4,
        timing="gamma",
        seed=2,
        max_staleness=max_staleness,
        batch_workers=batch_workers,
        threads=threads,
        source=source,
    )
    return sim, flat


def _log(sim):
    log = sim.log.numpy()
    return {k: log[k].tolist() for k in ("worker", "staleness", "sim_time")}


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("k", [1, 5, 12])
def test_batched_equals_sequential_in_float64(algorithm, k):
    seq, _ = _sim(algorithm, k)
    bat, _ = _sim(algorithm, k, batch_workers=4)
    seq.run(pushes=80)
    bat.run(pushes=80)
    assert _log(bat) == _log(seq)  # the same events, staleness and timings
    assert bat.engine.calls < bat.steps or k == 1  # it did batch
    assert torch.allclose(bat.params(), seq.params(), rtol=0, atol=1e-12)
    assert torch.allclose(torch.tensor(bat.log.loss), torch.tensor(seq.log.loss), atol=1e-12)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("k", [2, 7])
def test_threaded_is_bit_for_bit_sequential(algorithm, k):
    torch.set_num_threads(1)
    seq, _ = _sim(algorithm, k, dtype=torch.float32)
    par, _ = _sim(algorithm, k, threads=3, dtype=torch.float32)
    seq.run(pushes=60)
    par.run(pushes=60)
    assert _log(par) == _log(seq)
    assert par.log.loss == seq.log.loss
    assert torch.equal(par.params(), seq.params())
    par.engine.close()


def test_threaded_engine_keeps_the_next_gradients_computing():
    """Pipelined: after each push the threads hold ``N`` gradients of the next workers
    due (computing or done), so they need not wait for the main thread's push."""
    torch.set_num_threads(1)
    par, _ = _sim("dana-slim", 7, threads=3, dtype=torch.float32)
    for _ in range(20):
        par.step()
        assert len(par.engine.pending) == 3
        assert set(par.engine.pending) <= {j for _, j in par.schedule.queue}  # in flight only
    par.engine.close()


@pytest.mark.parametrize("mode", [{"batch_workers": 3}, {"threads": 2}])
@pytest.mark.parametrize(
    "setting",
    [
        {"algorithm": "ssgd"},
        {"algorithm": "dana-slim", "max_staleness": 2},
        {"algorithm": "local-sgd", "local_steps": 3},
        {"algorithm": "easgd"},
    ],
)
def test_every_kind_of_run_matches_sequential(mode, setting):
    """Rounds, bounded staleness (held pushes), local steps: the same run."""
    setting = dict(setting)
    algorithm = setting.pop("algorithm")
    seq, _ = _sim(algorithm, 4, **setting)
    other, _ = _sim(algorithm, 4, **mode, **setting)
    seq.run(pushes=60)
    other.run(pushes=60)
    assert _log(other) == _log(seq)
    assert torch.allclose(other.params(), seq.params(), rtol=0, atol=1e-12)
    if "threads" in mode:
        assert torch.equal(other.params(), seq.params())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_batchnorm_running_statistics_follow_event_order(dtype):
    """Each worker normalises with its own batch; the shared running statistics are
    folded in push by push: the parameters match the sequential simulator's (float
    rounding), the statistics too; threads: parameters and statistics bit for bit."""
    torch.set_num_threads(1)
    seq, fs = _sim("dana-slim", 6, bn=True, dtype=dtype)
    bat, fb = _sim("dana-slim", 6, batch_workers=4, bn=True, dtype=dtype)
    par, fp = _sim("dana-slim", 6, threads=3, bn=True, dtype=dtype)
    for sim in (seq, bat, par):
        sim.run(pushes=70)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    assert torch.allclose(bat.params(), seq.params(), rtol=0, atol=tol)
    assert torch.equal(par.params(), seq.params())
    for (name, s), (_, b), (_, p) in zip(
        fs.module.named_buffers(), fb.module.named_buffers(), fp.module.named_buffers()
    ):
        assert torch.allclose(b.double(), s.double(), rtol=1e-5, atol=tol), name
        assert torch.equal(p, s), name
    assert int(dict(fb.module.named_buffers())["1.num_batches_tracked"]) == 70
    par.engine.close()


def test_threads_replay_batchnorm_without_a_momentum():
    """A cumulative average (momentum None): threads replay the kernel's update, bit for
    bit; the batched engine refuses it."""
    torch.set_num_threads(1)
    runs = []
    for threads in (1, 3):
        sim, flat = _sim("dana-zero", 5, threads=threads, bn=True, dtype=torch.float32)
        flat.module[1].momentum = None
        sim.run(pushes=40)
        runs.append((sim, flat))
    (seq, fs), (par, fp) = runs
    assert torch.equal(par.params(), seq.params())
    for a, b in zip(fs.module.buffers(), fp.module.buffers()):
        assert torch.equal(a, b)
    par.engine.close()
    flat, gradient, source = _problem(bn=True)
    flat.module[1].momentum = None
    with pytest.raises(ValueError, match="momentum=None"):
        Simulator(dana.algorithms.build("asgd"), flat.flat.clone(), gradient,
                  BatchStream(256, 16), 4, batch_workers=2, source=source,
                  weight_decay=0.0)  # fmt: skip


def _state(sim, flat):
    buffer = io.BytesIO()
    torch.save({"sim": sim.state_dict(), "buffers": flat.buffers_state()}, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


@pytest.mark.parametrize("mode", [{"batch_workers": 4}, {"threads": 3}])
def test_stop_and_resume_equals_an_uninterrupted_run(mode):
    """The pending gradients are part of the state: a run stopped with gradients in
    flight and resumed in a fresh simulator is the uninterrupted run, bit for bit."""
    torch.set_num_threads(1)
    whole, wf = _sim("dana-slim", 6, **mode, bn=True)
    whole.run(pushes=90)
    first, ff = _sim("dana-slim", 6, **mode, bn=True)
    first.run(pushes=37)
    assert first.engine.pending  # stopped with gradients computed ahead (threads: dropped)
    saved = _state(first, ff)
    resumed, rf = _sim("dana-slim", 6, **mode, bn=True)
    resumed.load_state_dict(saved["sim"])
    rf.load_buffers_state(saved["buffers"])
    resumed.run(pushes=90)
    assert torch.equal(resumed.params(), whole.params())
    assert resumed.log.numpy()["loss"].tolist() == whole.log.numpy()["loss"].tolist()
    assert _log(resumed) == _log(whole)
    for a, b in zip(rf.module.buffers(), wf.module.buffers()):
        assert torch.equal(a, b)


def test_random_draws_inside_the_model_are_refused():
    bat, _ = _sim("asgd", 4, batch_workers=3, dropout=True)
    with pytest.raises(RuntimeError, match="random"):
        bat.run(pushes=5)
    par, _ = _sim("asgd", 4, threads=2, dropout=True)
    with pytest.raises(RuntimeError, match="random"):
        par.run(pushes=5)
    par.engine.close()


def test_an_engine_needs_the_source():
    flat, gradient, _ = _problem()
    with pytest.raises(ValueError, match="source"):
        Simulator(dana.algorithms.build("asgd"), flat.flat.clone(), gradient,
                  BatchStream(256, 16), 4, batch_workers=2,
                  weight_decay=0.0)  # fmt: skip


def test_simulate_with_batch_workers_and_threads():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 6, generator=g, dtype=torch.float64)
    y = (x[:, 0] > 0).long()

    def run(**kw):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
        return dana.simulate(model.double(), x, y, workers=6, lr=0.05, epochs=2, batch_size=16,
                             dtype="float64", **kw).simulator  # fmt: skip

    seq, bat, par = run(), run(batch_workers=4), run(threads=2)
    assert bat.engine is not None and par.engine is not None and seq.engine is None
    assert torch.allclose(bat.params(), seq.params(), rtol=0, atol=1e-12)
    assert torch.equal(par.params(), seq.params())
    with pytest.raises(ValueError, match="batch.workers"):
        run(batch_workers=0)


# -- the device --------------------------------------------------------------------------


def test_an_explicit_cpu_device_passes_through_every_layer(tmp_path):
    """device="cpu" and torch.device("cpu") give the default run, bit for bit."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 6, generator=g)
    y = (x[:, 0] > 0).long()

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))

    runs = [
        dana.simulate(model(), x, y, workers=4, epochs=1, batch_size=16, **kw).simulator
        for kw in ({}, {"device": "cpu"}, {"device": torch.device("cpu")}, {"device": "auto"})
    ]
    if torch.cuda.is_available():
        runs.pop()  # ("auto" took the GPU)
    for sim in runs[1:]:
        assert torch.equal(sim.params(), runs[0].params())
        assert sim.params().device.type == "cpu"
    fits = [
        dana.fit(model(), (x, y), workers=4, epochs=1, batch_size=16, **kw).summary
        for kw in ({}, {"device": torch.device("cpu")})
    ]
    assert fits[0]["final_test_loss"] == fits[1]["final_test_loss"]


def test_the_device_option_is_validated():
    from dana.train.config import TrainConfig

    with pytest.raises(ConfigError, match="--device 'tpu' is unknown"):
        TrainConfig(device="tpu").validate()
    with pytest.raises(ConfigError, match="--batch-workers must be an integer >= 1 or auto"):
        TrainConfig(batch_workers=0).validate()
    TrainConfig(batch_workers="auto", device="auto").validate()
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="sees no CUDA device"):
            TrainConfig(device="cuda").validate()
        with pytest.raises(ConfigError, match="sees no CUDA device"):
            dana.simulate(torch.nn.Linear(2, 2), torch.zeros(4, 2), torch.zeros(4).long(),
                          batch_size=2, device="cuda")  # fmt: skip


def test_augmented_batches_are_the_same_in_any_order_and_on_any_thread():
    """A batch's augmentation is drawn from its key (seeded by the stream and the
    batch's number), so it does not depend on when its gradient is computed."""
    from concurrent.futures import ThreadPoolExecutor

    from dana.train.config import TrainConfig
    from dana.train.task.batches import KeyedBatchStream
    from dana.train.task.problem import Problem

    config = TrainConfig(dataset="synthetic", model="cnn", train_size=256, test_size=64,
                         batch_size=32, augment=True)  # fmt: skip
    problem = Problem(config)
    stream = problem.batches(5)
    assert isinstance(stream, KeyedBatchStream)
    batches = [stream.next() for _ in range(12)]  # (past an epoch: 8 per epoch)
    first = [problem.inputs(b)[0] for b in batches]
    with ThreadPoolExecutor(3) as pool:
        again = list(pool.map(lambda b: problem.inputs(b)[0], reversed(batches)))[::-1]
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    plain = problem.dataset.train_x[batches[0][0]]
    assert not torch.equal(first[0], plain)  # it does augment
    assert len({b[1] for b in batches}) == len(batches)  # a key per batch
    resumed = problem.batches(5)
    resumed.load_state_dict(stream.state_dict())
    stream_next, resumed_next = stream.next(), resumed.next()
    assert stream_next[1] == resumed_next[1] and torch.equal(stream_next[0], resumed_next[0])
    config.augment = False
    assert type(Problem(config).batches(5)) is BatchStream


def test_augmented_data_takes_both_engines(tmp_path):
    """With augmentation, threads give the sequential run bit for bit and batched
    workers the same run within float rounding, through the real command."""
    small = ["--dataset", "synthetic", "--model", "cnn", "--train-size", "512", "--test-size",
             "256", "--batch-size", "32", "--quiet", "--algorithm", "dana-zero", "--workers", "6",
             "--epochs", "4", "--eval-every", "2", "--augment"]  # fmt: skip
    runs = {}
    for name, mode in [("seq", []), ("threads", ["--threads", "2"]),
                       ("batched", ["--batch-workers", "3"])]:  # fmt: skip
        result = _dana("train", *small, *mode, "--out", str(tmp_path / name))
        assert result.returncode == 0, result.stderr
        runs[name] = _metrics(tmp_path / name)
    assert runs["threads"] == runs["seq"]
    assert len(runs["batched"]) == len(runs["seq"]) == 3
    for a, b in zip(runs["batched"][1:], runs["seq"][1:]):  # (row 0: no train loss yet)
        assert abs(float(a["train_loss"]) - float(b["train_loss"])) < 1e-4
        assert abs(float(a["test_loss"]) - float(b["test_loss"])) < 1e-4


# -- CUDA (where a GPU is lent) ----------------------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
@pytest.mark.parametrize("algorithm", ["dana-slim", "asgd"])
def test_cuda_batched_equals_sequential_in_float64(algorithm):
    def run(**kw):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(256, 1, 8, 8, generator=g, dtype=torch.float64)
        y = (x.flatten(1)[:, :3].sum(1) > 0).long()
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(),
                                    torch.nn.Flatten(), torch.nn.Linear(144, 2)).double()  # fmt: skip
        return dana.simulate(model, x, y, algorithm=algorithm, workers=8, lr=0.05, epochs=2,
                             batch_size=16, device="cuda", **kw).simulator  # fmt: skip

    seq, bat = run(), run(batch_workers=8)
    assert seq.params().device.type == "cuda"
    assert _log(bat) == _log(seq)
    assert torch.allclose(bat.params(), seq.params(), rtol=0, atol=1e-10)


@cuda
def test_cuda_train_end_to_end(tmp_path):
    from dana.train.config import TrainConfig
    from dana.train.training import train

    config = TrainConfig(dataset="synthetic", model="cnn", train_size=512, test_size=128,
                         batch_size=32, workers=8, epochs=1, device="cuda",
                         batch_workers="auto")  # fmt: skip
    summary = train(config, tmp_path / "run", progress=False)
    assert summary["pushes"] > 0 and summary["final_test_error"] < 1


# -- dana train: kill and resume ---------------------------------------------------------

SMALL = ["--dataset", "synthetic", "--model", "mlp", "--train-size", "512", "--test-size", "256",
         "--batch-size", "32", "--quiet", "--algorithm", "dana-zero", "--workers", "6",
         "--epochs", "40", "--eval-every", "5", "--checkpoint-every", "5"]  # fmt: skip


def _dana(*args: str) -> subprocess.CompletedProcess:
    """``dana ARGS`` in a process of its own, one OpenMP thread (tests/clirun.py)."""
    return run_dana(*args)


def _metrics(path: Path) -> list[dict[str, str]]:
    with (path / "metrics.csv").open() as f:
        return [{k: v for k, v in r.items() if k != "wall_seconds"} for r in csv.DictReader(f)]


@pytest.mark.slow
@pytest.mark.parametrize(
    "whole_mode, run_mode",
    [
        (["--batch-workers", "3"], ["--batch-workers", "3"]),
        (["--threads", "1"], ["--threads", "2"]),  # threads: the sequential run, bit for bit
    ],
)
def test_kill_and_resume_equals_an_uninterrupted_run(tmp_path, whole_mode, run_mode):
    whole = tmp_path / "whole"
    result = _dana("train", *SMALL, *whole_mode, "--out", str(whole))
    assert result.returncode == 0, result.stderr
    killed = tmp_path / "killed"
    kill_at_first_checkpoint(*SMALL, *run_mode, out=killed)
    resume_mode = [a for a in run_mode if "batch" not in a and a != "3"]  # (saved in config)
    result = _dana("train", "--resume", str(killed), "--quiet", *resume_mode)
    assert result.returncode == 0, result.stderr
    assert _metrics(killed) == _metrics(whole)
    if "--batch-workers" in run_mode:
        assert json.loads((killed / "config.json").read_text())["batch_workers"] == 3


def test_the_command_line_takes_the_options(tmp_path):
    for command in ("train", "sweep"):
        result = _dana(command, "--help")
        assert "--device" in result.stdout and "--batch-workers" in result.stdout, command
    if not torch.cuda.is_available():
        out = tmp_path / "run"
        result = _dana("train", *SMALL[:10], "--device", "cuda", "--out", str(out))
        assert result.returncode == 2 and "sees no CUDA device" in result.stderr
        assert not out.exists()
    result = _dana("train", *SMALL[:10], "--batch-workers", "many")
    assert result.returncode == 2 and "expected an integer or auto" in result.stderr


def test_the_memory_check_counts_the_stacked_copies():
    from dana.train.config import TrainConfig
    from dana.train.resources import check_memory

    one = check_memory(TrainConfig(model="mlp", workers=8), 10_000, available=2**40)
    eight = check_memory(TrainConfig(model="mlp", workers=8, batch_workers=8), 10_000,
                         available=2**40)  # fmt: skip
    assert eight - one == 2 * 8 * 10_000 * 4


def test_ray_workers_take_a_share_of_the_gpus():
    from dana.ps.cluster import worker_gpus, worker_options

    class Cluster:
        def __init__(self, gpus):
            self.gpus = gpus

        def cluster_resources(self):
            return {"CPU": 16.0, **({"GPU": self.gpus} if self.gpus else {})}

    assert worker_gpus(Cluster(2.0), "cuda", 8) == 0.25
    assert worker_gpus(Cluster(2.0), "auto", 1) == 1.0  # at most one each
    assert worker_gpus(Cluster(2.0), "cpu", 8) == 0.0
    assert worker_gpus(Cluster(0), "cuda", 8) == 0.0
    assert worker_options(1.0, 0.25)["num_gpus"] == 0.25
    assert "num_gpus" not in worker_options(1.0)
