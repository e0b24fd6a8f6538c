"""``dana.fit``: the user's model, data and loss on the simulator and on a real local Ray."""

from __future__ import annotations

import json
import math
import sys

import pytest
import torch

import dana
from dana.errors import ConfigError
from dana.train.records.rundir import RunDir

try:
    import ray
except ImportError:  # pragma: no cover
    ray = None


def _data(n: int = 600, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    y = (x[:, 0] - 0.5 * x[:, 1] > 0).long()
    return x, y


def _factory() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))


def test_fit_on_a_dataset_writes_the_run_and_leaves_the_final_params_in_the_model(tmp_path):
    x, y = _data()
    train = torch.utils.data.TensorDataset(x[:500], y[:500])
    torch.manual_seed(1)
    model = _factory()
    before = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    result = dana.fit(
        model,
        train,
        (x[500:], y[500:]),
        workers=4,
        lr=0.05,
        epochs=2,
        batch_size=25,
        out=tmp_path / "run",
    )
    assert result.model is model and result.backend == "sim"
    after = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    assert not torch.equal(before, after)
    # The metrics are those of metrics.csv, the summary that of summary.json.
    run = RunDir(result.run_dir)
    assert [r["test_error"] for r in run.read_metrics()] == [
        r["test_error"] for r in result.metrics
    ]
    assert run.read_summary()["pushes"] == result.summary["pushes"] == len(result.log)
    assert [round(r["epoch"]) for r in result.metrics] == [0, 1, 2]
    # The model holds the parameters the last evaluation measured.
    loss, error = result.evaluate(x[500:], y[500:])
    assert error == result.summary["final_test_error"] < 0.15
    assert math.isclose(loss, result.summary["final_test_loss"], rel_tol=1e-6)
    with torch.no_grad():
        assert (model(x[500:]).argmax(1) != y[500:]).double().mean().item() == pytest.approx(error)
    assert result.log.numpy()["staleness"].mean() > 1  # 4 workers: pushes land stale


def test_fit_takes_any_loss_and_a_factory():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(400, 5, generator=g)
    y = x @ torch.arange(1.0, 6.0).unsqueeze(1)
    result = dana.fit(
        lambda: torch.nn.Linear(5, 1),
        (x, y),
        loss_fn=torch.nn.functional.mse_loss,
        algorithm="asgd",
        workers=2,
        lr=0.02,
        epochs=4,
        batch_size=20,
    )
    errors = [r["test_error"] for r in result.metrics]
    losses = [r["test_loss"] for r in result.metrics]
    assert all(math.isnan(e) for e in errors)  # not a classification: no error rate
    assert losses[-1] < 0.01 * losses[0]
    assert result.run_dir is None


def test_fit_evaluates_a_batchnorm_model_in_eval_mode():
    x, y = _data(300)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16),
                                torch.nn.ReLU(), torch.nn.Linear(16, 2))  # fmt: skip
    result = dana.fit(model, (x, y), workers=2, lr=0.05, epochs=1, batch_size=20)
    stats = model[1].running_mean.clone()
    loss, error = result.evaluate(x[:1], y[:1])  # one example: only eval mode allows it
    assert torch.equal(model[1].running_mean, stats)  # evaluation leaves the statistics
    assert result.summary["final_test_error"] < 0.3


def test_fit_rejects_bad_input():
    x, y = _data(100)
    with pytest.raises(ConfigError, match="one row per example"):
        dana.fit(_factory(), (x, y[:50]), batch_size=10)
    with pytest.raises(ConfigError, match="backend"):
        dana.fit(_factory(), (x, y), backend="spark")
    with pytest.raises(ConfigError, match="larger than the 100"):
        dana.fit(_factory(), (x, y), batch_size=128)
    with pytest.raises(TypeError, match="expected \\(x, y\\)"):
        dana.fit(_factory(), 3)
    with pytest.raises(ConfigError, match="device 'gpu0'"):
        dana.fit(_factory(), (x, y), batch_size=10, device="gpu0")
    if not torch.cuda.is_available():  # (Ray workers take GPUs where there are some)
        with pytest.raises(ConfigError, match="sees no CUDA device"):
            dana.fit(_factory(), (x, y), batch_size=10, backend="ray", device="cuda")


@pytest.mark.ray
@pytest.mark.skipif(ray is None, reason="needs Ray: pip install 'ray>=2.9'")
def test_fit_runs_the_same_problem_on_both_backends(local_ray, tmp_path):
    x, y = _data()
    train, test = torch.utils.data.TensorDataset(x[:500], y[:500]), (x[500:], y[500:])
    # The workers cannot import this test module: ship its factory by value, as a user
    # does for a module that is not on the cluster (docs/DISTRIBUTED.md).
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        results = {
            backend: dana.fit(
                _factory,
                train,
                test,
                backend=backend,
                workers=2,
                lr=0.05,
                epochs=2,
                batch_size=25,
                out=tmp_path / backend,
            )
            for backend in ("sim", "ray")
        }
        # without shard 0's standby (docs/DISTRIBUTED.md): the same run, one actor fewer
        bare = dana.fit(_factory, train, test, backend="ray", standby=False, workers=2,
                        lr=0.05, epochs=2, batch_size=25, out=tmp_path / "bare")  # fmt: skip
    finally:
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    for backend, result in results.items():
        assert result.backend == backend and result.run_dir == tmp_path / backend
        assert [round(r["epoch"]) for r in result.metrics] == [0, 1, 2]
        assert result.summary["pushes"] == len(result.log) == 2 * 500 // 25
        assert result.summary["final_test_error"] < 0.15
        # The model holds what was evaluated last.
        assert result.evaluate(*test)[1] == result.summary["final_test_error"]
    assert (tmp_path / "ray" / "dist.json").is_file()  # written by the Ray runtime
    assert json.loads((tmp_path / "ray" / "dist.json").read_text())["with_standby"] is True
    assert json.loads((tmp_path / "bare" / "dist.json").read_text())["with_standby"] is False
    assert bare.summary["pushes"] == len(bare.log) == 2 * 500 // 25
    assert bare.summary["final_test_error"] < 0.15
    # Both start from the same factory under the same seed.
    assert results["sim"].metrics[0]["test_loss"] == pytest.approx(
        results["ray"].metrics[0]["test_loss"], rel=1e-6
    )


def test_fit_builds_a_factory_model_without_touching_the_callers_generator():
    from dana.fitting import seeded_model

    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    a = seeded_model(lambda: torch.nn.Linear(3, 2), 7)
    assert torch.equal(torch.random.get_rng_state(), before)  # restored
    torch.manual_seed(7)
    assert torch.equal(a.weight, torch.nn.Linear(3, 2).weight)  # built under seed 7
