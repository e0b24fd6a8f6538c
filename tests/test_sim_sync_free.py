"""A push with no host synchronisation, and the gradient replayed as a CUDA graph.

On the CPU: the push log's deferred values (dana/train/records/pushlog.py) give the
records of a log that read each value at once; a simulator that keeps the loss and the
gap on the device (``sync_free``) makes the same run; a sync-free run that diverges
stops within SYNC_FREE_CHECK steps; the captured gradient's CPU form
(dana/train/task/captured.py) is ``FlatModel.gradient`` bit for bit, BatchNorm's warm-up
passes included. On a GPU (skipped here; ``bench/gpu_checks.py`` runs the same): the
graph's replay equals the pass, and a push makes no synchronisation.
"""

from __future__ import annotations

import functools
import json
import math

import pytest
import torch
import torch.nn.functional as F

import dana
import dana.sim.driver as driver
from dana.sim import Simulator
from dana.train.device import to_device
from dana.train.records.pushlog import Later, PushLog
from dana.train.task.batches import BatchStream
from dana.train.task.captured import captured_gradient
from dana.train.task.flat import FlatModel
from dana.train.task.stacked import GradientSource

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def _row(n, loss, gap):
    return dict(worker=n % 3, staleness=n, gap=gap, loss=loss, lr=0.1, sim_time=float(n))


def test_a_deferred_log_reads_its_values_once_and_gives_the_same_records():
    now, later = PushLog(), PushLog(defer=True)
    for n in range(7):
        loss = torch.tensor(0.1 * n, dtype=torch.float32 if n % 2 else torch.float64)
        gap = Later(torch.tensor(float(n * n)), math.sqrt) if n != 4 else math.nan
        now.append(**_row(n, loss, gap))
        later.append(**_row(n, loss, gap))
    assert (now.pending, later.pending, len(later)) == (0, 7, 7)
    assert later.state_dict().keys() == now.state_dict().keys() and later.pending == 0
    for name, column in now.numpy().items():
        assert column.tolist() == later.numpy()[name].tolist() or name == "gap"
    assert now.numpy()["gap"][:4].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert math.isnan(later.gap[4]) and later.loss[3] == float(
        torch.tensor(0.3, dtype=torch.float32)
    )
    later.append(**_row(7, torch.tensor(1.5), 0.0))  # (after a read: pending again)
    assert later.pending == 1 and later.loss[-1] == 1.5 and later.pending == 0


def _problem(bn=True, n=256, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 1, 8, 8, generator=g, dtype=dtype)
    y = (x.flatten(1)[:, :3].sum(1) > 0).long()
    torch.manual_seed(0)
    layers = [torch.nn.Conv2d(1, 4, 3)] + ([torch.nn.BatchNorm2d(4)] if bn else [])
    layers += [torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(144, 2)]
    return FlatModel(torch.nn.Sequential(*layers).to(dtype)), x, y


def _sim(sync_free, captured=False, algorithm="dana-slim", batch_workers=1, dtype=torch.float32):
    flat, x, y = _problem(dtype=dtype)
    call = captured_gradient(flat, F.cross_entropy) if captured else None

    def inputs(rows):
        return x[rows], y[rows]

    def gradient(p, rows):
        if call is not None:
            return call(p, *inputs(rows))
        return flat.gradient(p, *inputs(rows), F.cross_entropy)

    source = GradientSource(flat, F.cross_entropy, inputs, cuda_graph=captured)
    sim = Simulator(dana.algorithms.build(algorithm), flat.flat.clone(), gradient,
                    BatchStream(256, 16, seed=1), 6, lr=0.05, timing="gamma", seed=2,
                    sync_free=sync_free, batch_workers=batch_workers,
                    source=source if batch_workers > 1 else None)  # fmt: skip
    return sim, flat


@pytest.mark.parametrize("algorithm", ["dana-slim", "nag-asgd", "local-sgd"])
def test_a_sync_free_simulator_makes_the_same_run(algorithm):
    torch.set_num_threads(1)
    plain, flat_a = _sim(False, algorithm=algorithm)
    free, flat_b = _sim(True, algorithm=algorithm)
    plain.run(pushes=90)
    free.run(pushes=90)
    assert free.log.pending > 0 and plain.log.pending == 0
    for name, column in plain.log.numpy().items():
        assert column.tolist() == free.log.numpy()[name].tolist(), name
    assert torch.equal(plain.params(), free.params())
    for a, b in zip(flat_a.module.buffers(), flat_b.module.buffers()):
        assert torch.equal(a, b)


def test_the_captured_gradient_is_the_pass_bit_for_bit():
    torch.set_num_threads(1)
    plain, flat_a = _sim(False)
    captured, flat_b = _sim(False, captured=True)
    plain.run(pushes=60)
    captured.run(pushes=60)
    for name, column in plain.log.numpy().items():
        assert column.tolist() == captured.log.numpy()[name].tolist(), name
    assert torch.equal(plain.params(), captured.params())
    # The warm-up passes ran and were undone: BatchNorm saw each batch once.
    for a, b in zip(flat_a.module.buffers(), flat_b.module.buffers()):
        assert torch.equal(a, b)


def test_the_captured_batched_call_pads_to_powers_of_two_and_equals_the_plain_one():
    plain, _ = _sim(False, batch_workers=3, dtype=torch.float64)
    captured, _ = _sim(True, captured=True, batch_workers=3, dtype=torch.float64)
    plain.run(pushes=70)
    captured.run(pushes=70)
    for name in ("worker", "staleness", "sim_time"):
        assert plain.log.numpy()[name].tolist() == captured.log.numpy()[name].tolist()
    assert torch.allclose(plain.params(), captured.params(), rtol=0, atol=1e-12)
    shapes = sorted(key[2][0][0] for key in captured.engine.stacked.captured.recorded)
    assert 4 in shapes and set(shapes) <= {1, 2, 4}  # (calls of 3 padded to 4)


def test_the_captured_gradient_records_each_input_shape_once_and_takes_dict_inputs():
    flat, x, y = _problem(bn=False)

    class Named(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, image, scale):
            return self.inner(image) * scale

    named = FlatModel(Named(flat.module))
    call = captured_gradient(named, F.cross_entropy)
    for rows in (slice(0, 8), slice(8, 16), slice(0, 4)):
        inputs = {"image": x[rows], "scale": torch.full((len(x[rows]), 1), 2.0)}
        grad, loss = call(named.flat.clone(), inputs, y[rows])
        expect, expect_loss = named.gradient(named.flat.clone(), inputs, y[rows], F.cross_entropy)
        assert torch.equal(grad, expect) and torch.equal(loss, expect_loss)
    assert len(call.recorded) == 2


def test_a_sync_free_run_that_diverges_stops_within_the_check(tmp_path, monkeypatch):
    monkeypatch.setattr(driver, "Simulator", functools.partial(Simulator, sync_free=True))
    out = tmp_path / "run"
    args = ["train", "--dataset", "synthetic", "--model", "linear", "--train-size", "512",
            "--test-size", "256", "--batch-size", "8", "--quiet", "--algorithm", "multi-asgd",
            "--workers", "8", "--lr", "1e30", "--warmup-epochs", "0", "--epochs", "4",
            "--out", str(out)]  # fmt: skip
    from dana.cli import main

    assert main(args) == 3
    summary = json.loads((out / "summary.json").read_text())
    assert summary["diverged"] is True
    assert summary["diverged_at_update"] <= driver.SYNC_FREE_CHECK + 8  # (its first NaN: at once)
    assert summary["epochs"] < 4  # stopped, not run to the end


def test_cuda_graph_is_an_option_of_every_door_and_changes_no_result():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(128, 6, generator=g)
    y = (x[:, 0] > 0).long()

    def run(**kw):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
        return dana.simulate(model, x, y, workers=4, lr=0.05, epochs=1, batch_size=16, **kw)

    plain, captured = run(), run(cuda_graph=True)
    assert torch.equal(plain.simulator.params(), captured.simulator.params())
    assert plain.simulator.log.loss == captured.simulator.log.loss


@CUDA
def test_on_a_gpu_the_graph_equals_the_pass_and_a_push_waits_for_nothing():
    device = torch.device("cuda")
    flat, x, y = _problem()
    flat = FlatModel(flat.module.to(device))
    x, y = x.to(device), y.to(device)
    call = captured_gradient(flat, F.cross_entropy)
    p = flat.flat.clone()
    grad, loss = call(p, x[:16], y[:16])
    grad = grad.clone()
    expect, expect_loss = flat.gradient(p, x[:16], y[:16], F.cross_entropy)
    assert torch.allclose(grad, expect, atol=1e-6) and torch.allclose(loss, expect_loss)

    sim = Simulator(dana.algorithms.build("dana-slim"), flat.flat.clone(),
                    lambda q, rows: call(q, x[to_device(rows, device)], y[to_device(rows, device)]),
                    BatchStream(256, 16, seed=1), 6, lr=0.05, timing="gamma")  # fmt: skip
    assert sim.sync_free
    sim.run(pushes=20)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        sim.run(pushes=40)  # (the batch's rows: pinned, so the copy waits for nothing)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert sim.log.pending > 0 and math.isfinite(sim.log.loss[-1])


def test_dana_train_cuda_graph_writes_the_same_records(tmp_path):
    from dana.cli import main

    args = ["train", "--dataset", "synthetic", "--model", "cnn", "--train-size", "256",
            "--test-size", "64", "--batch-size", "16", "--workers", "4", "--epochs", "1",
            "--quiet"]  # fmt: skip
    assert main([*args, "--out", str(tmp_path / "plain")]) == 0
    assert main([*args, "--cuda-graph", "--out", str(tmp_path / "graph")]) == 0

    def rows(run):
        text = (tmp_path / run / "metrics.csv").read_text().splitlines()
        wall = text[0].split(",").index("wall_seconds")
        return [[v for n, v in enumerate(line.split(",")) if n != wall] for line in text]

    assert rows("plain") == rows("graph")
    assert json.loads((tmp_path / "graph" / "config.json").read_text())["cuda_graph"] is True
