"""Any task through ``dana.fit``: one evaluation for classification, token prediction and
regression (the loss always, the error rate only where defined, the perplexity of token
prediction), the metric hook's columns in metrics.csv, the summary, the curves and
``dana report``, on the simulator and on Ray."""

from __future__ import annotations

import math
import re
import sys

import pytest
import torch

import dana
from dana.experiments.report import build_report
from dana.models import build_language_model
from dana.train.records.rundir import RunDir
from dana.train.task.evaluation import check_metrics, evaluate_module, task_of

try:
    import ray
except ImportError:  # pragma: no cover
    ray = None

LM = "transformer-1-32-16"


def mae(out: torch.Tensor, y: torch.Tensor) -> float:
    return (out - y).abs().mean().item()


def top5(out: torch.Tensor, y: torch.Tensor) -> float:
    return (out.topk(5, -1).indices == y.unsqueeze(-1)).any(-1).double().mean().item()


def regression_data(n: int = 400):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 5, generator=g)
    return x, x @ torch.tensor([[1.0], [-2.0], [0.5], [0.0], [1.5]])


def regression_model() -> torch.nn.Module:
    return torch.nn.Linear(5, 1)


def token_data(n: int = 96, context: int = 16):
    """Windows of a counting sequence mod 16: each next token is the current one + 1."""
    g = torch.Generator().manual_seed(0)
    start = torch.randint(0, 16, (n, 1), generator=g)
    x = (start + torch.arange(context)) % 16
    return x, (x + 1) % 16


def language_model() -> torch.nn.Module:
    return build_language_model(LM, 256)


def test_the_error_rate_only_where_the_outputs_and_targets_define_one():
    n = torch.tensor
    assert task_of(torch.zeros(4, 3), n([0, 1, 2, 0])) == "classes"
    assert task_of(torch.zeros(4, 6, 9), torch.zeros(4, 6, dtype=torch.long)) == "tokens"
    assert task_of(torch.zeros(4, 1), torch.zeros(4, 1)) == "values"  # regression
    assert task_of(torch.zeros(4, 1), n([0, 1, 2, 0])) == "values"  # one output: no classes
    assert task_of(torch.zeros(4, 2), torch.zeros(4, 2)) == "values"  # float targets
    # integer regression targets against N x 1 outputs: no error rate broadcast from them
    module = torch.nn.Linear(3, 1)
    x, y = torch.randn(10, 3), torch.arange(10)
    found = evaluate_module(module, x, y.unsqueeze(1).float(), torch.nn.functional.mse_loss)
    assert math.isnan(found["error"]) and math.isfinite(found["loss"])
    found = evaluate_module(module, x, y, lambda o, t: (o.squeeze(1) - t).pow(2).mean())
    assert math.isnan(found["error"])
    # a metric is each batch's value weighted by its examples: the mean over the set
    out_y = (torch.randn(7, 2), torch.randn(7, 2))
    module = torch.nn.Identity()
    found = evaluate_module(module, out_y[0], out_y[1], torch.nn.functional.mse_loss,
                            batch_size=3, metrics={"mae": mae})  # fmt: skip
    assert found["mae"] == pytest.approx(mae(*out_y))
    with pytest.raises(ValueError, match="name 'test loss'"):
        check_metrics({"test loss": mae})
    with pytest.raises(ValueError, match="not loss, error or perplexity"):
        check_metrics({"loss": mae})
    with pytest.raises(TypeError, match=r"metrics\['mae'\] must be a function"):
        check_metrics({"mae": 3})


def _check_run(run_dir, columns: tuple[str, ...], error: bool) -> None:
    """metrics.csv has ``columns``, the summary their final values, the error rate is
    finite only where ``error``; the curves exist."""
    rows = RunDir(run_dir).read_metrics()
    summary = RunDir(run_dir).read_summary()
    for column in columns:
        assert all(math.isfinite(r[column]) for r in rows), column
        assert summary[f"final_{column}"] == pytest.approx(rows[-1][column])
    assert all(math.isfinite(r["test_error"]) == error for r in rows)
    assert (run_dir / "curves.png").stat().st_size > 0


def _check_model(result, make) -> None:
    """The run directory keeps the final model: the parameters the result holds."""
    kept = dana.load_model(result.run_dir, model=make).state_dict()
    for name, value in result.model.state_dict().items():
        assert torch.equal(kept[name], value), name


def _check_report(results, column: str, compared: str) -> None:
    """``dana report``: compares ``compared``, and gives the measured ``column`` its
    table and plot, with no NaN."""
    report = build_report(results)
    assert report.metric.key == compared
    text = (results / "report.md").read_text()
    name = column.replace("_", " ")
    assert f"Final {name}" in text and f"({column}_curves.png)" in text
    assert (results / f"{column}_curves.png").stat().st_size > 0
    rule = "the loss became nan"  # (the table's rule says what a divergence is)
    assert not re.search(r"\bnan\b", text.lower().replace(rule, ""))


def test_a_regression_and_a_language_model_through_fit(tmp_path):
    x, y = regression_data()
    for k in (1, 2):
        result = dana.fit(regression_model, (x[:300], y[:300]), (x[300:], y[300:]),
                          loss_fn=torch.nn.functional.mse_loss, metrics={"mae": mae},
                          algorithm="asgd", workers=k, lr=0.05, epochs=3, batch_size=20,
                          out=tmp_path / "regression" / f"k{k}")  # fmt: skip
        losses = [r["test_loss"] for r in result.metrics]
        assert losses[-1] < 0.05 * losses[0]
        assert result.measure(x[300:], y[300:])["mae"] == pytest.approx(
            result.metrics[-1]["test_mae"], rel=1e-5
        )
        _check_run(result.run_dir, ("test_mae",), error=False)
        _check_model(result, regression_model)
    _check_report(tmp_path / "regression", "test_mae", "test_loss")

    x, y = token_data()
    for k in (1, 2):
        result = dana.fit(language_model, (x[:64], y[:64]), (x[64:], y[64:]),
                          metrics={"top5": top5}, workers=k, lr=0.05, epochs=4, batch_size=8,
                          out=tmp_path / "language" / f"k{k}")  # fmt: skip
        first, last = result.metrics[0], result.metrics[-1]
        assert last["test_loss"] < first["test_loss"] - 0.5  # the default loss: per token
        assert last["test_perplexity"] == pytest.approx(math.exp(last["test_loss"]))
        assert last["test_top5"] >= 1 - last["test_error"]  # top-5 holds the argmax
        _check_run(result.run_dir, ("test_top5", "test_perplexity"), error=True)
    _check_report(tmp_path / "language", "test_top5", "test_loss")
    assert "perplexity" in (tmp_path / "language" / "report.md").read_text()


@pytest.mark.ray
@pytest.mark.skipif(ray is None, reason="needs Ray: pip install 'ray>=2.9'")
def test_a_regression_and_a_language_model_on_ray(local_ray, tmp_path):
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        x, y = regression_data()
        regression = dana.fit(regression_model, (x[:300], y[:300]), (x[300:], y[300:]),
                              loss_fn=torch.nn.functional.mse_loss, metrics={"mae": mae},
                              backend="ray", algorithm="asgd", workers=2, lr=0.05, epochs=3,
                              batch_size=20, out=tmp_path / "regression" / "k2")  # fmt: skip
        x, y = token_data()
        language = dana.fit(language_model, (x[:64], y[:64]), (x[64:], y[64:]),
                            metrics={"top5": top5}, backend="ray", workers=2, lr=0.05,
                            epochs=4, batch_size=8, out=tmp_path / "language" / "k2")  # fmt: skip
    finally:
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    losses = [r["test_loss"] for r in regression.metrics]
    assert losses[-1] < 0.05 * losses[0]
    _check_run(regression.run_dir, ("test_mae",), error=False)
    _check_model(regression, regression_model)
    _check_report(tmp_path / "regression", "test_mae", "test_loss")
    assert language.metrics[-1]["test_loss"] < language.metrics[0]["test_loss"] - 0.5
    _check_run(language.run_dir, ("test_top5", "test_perplexity"), error=True)
    _check_model(language, language_model)
    _check_report(tmp_path / "language", "test_top5", "test_loss")
