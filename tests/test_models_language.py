"""Language models: ``--dataset text`` (bytes), the causal Transformer, the loss over
every token, perplexity in metrics.csv, summary, curves and the report."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch
from clirun import run_dana

from dana.data import load_dataset, text
from dana.data.text import (
    fortune_files,
    read_fortunes,
    read_text,
    reference_losses,
    windows,
)
from dana.errors import ConfigError, DataError
from dana.experiments.presets import load_preset
from dana.experiments.results import load_results
from dana.models import build_language_model, build_model, context_length, count_parameters
from dana.train.config import TrainConfig
from dana.train.task.flat import FlatModel
from dana.train.task.problem import Problem, token_cross_entropy
from dana.train.task.stacked import StackedGradient
from dana.train.training import train

#: A Transformer small enough for seconds: 1 layer of width 32, a context of 16 tokens.
SMALL = "transformer-1-32-16"


def write_corpus(path: Path, sentences: int = 400, seed: int = 0) -> Path:
    """A small corpus of made-up English sentences (about 60 bytes each)."""
    rng = random.Random(seed)
    words = "the a cat dog sat ran on under mat tree and then quickly slowly home".split()
    lines = [
        " ".join(rng.choice(words) for _ in range(rng.randint(5, 12))) + "."
        for _ in range(sentences)
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("text") / "corpus.txt")


# -- the data -----------------------------------------------------------------------------
def test_one_file_is_split_90_10_into_windows_of_the_context(tmp_path):
    text = bytes(range(256)) * 4  # 1024 bytes
    (tmp_path / "t.txt").write_bytes(text)
    train_x, train_y, test_x, test_y = read_text(tmp_path / "t.txt", 16)
    cut = int(0.9 * len(text))  # 921: the training text
    assert train_x.shape == ((cut - 1) // 16, 16) and test_x.shape == (
        (len(text) - cut - 1) // 16,
        16,
    )
    assert train_x[0].tolist() == list(text[:16]) and train_y[0].tolist() == list(text[1:17])
    assert test_x[0].tolist() == list(text[cut : cut + 16])
    assert train_x.dtype == torch.int64
    x, y = windows(torch.tensor(list(b"abcdefg"), dtype=torch.uint8), 3)
    assert bytes(x.flatten().tolist()) == b"abcdef" and bytes(y.flatten().tolist()) == b"bcdefg"


def test_a_directory_gives_its_train_and_test_text(tmp_path):
    (tmp_path / "train.txt").write_text("héllo wörld, " * 20, encoding="utf-8")  # UTF-8: bytes
    (tmp_path / "val.txt").write_text("goodbye " * 10)
    ds = load_dataset("text", tmp_path, seq_len=8)
    assert ds.kind == "tokens" and ds.num_classes == 256 and ds.seq_len == 8
    assert ds.test_size == (80 - 1) // 8
    assert bytes(ds.test_x[0].tolist()) == b"goodbye "


def test_a_directory_of_fortunes_puts_every_tenth_fortune_in_the_test_text(tmp_path):
    fortunes = [f"fortune {n}: 50% of it\nends here\n".encode() for n in range(1, 26)]
    (tmp_path / "b").write_bytes(b"%\n".join(fortunes[:12]) + b"%\n")
    (tmp_path / "a").write_bytes(b"%\n".join(fortunes[12:]))  # (read first: file-name order)
    for name in ("a", "b"):
        (tmp_path / f"{name}.dat").write_bytes(b"index")
    (tmp_path / "c").write_bytes(b"no index beside it: not read\n")
    (tmp_path / "a.u8").write_bytes(b"not a fortune file\n")
    order = fortunes[12:] + fortunes[:12]
    train, test = read_fortunes(fortune_files(tmp_path))
    assert bytes(test.tolist()) == order[9] + b"%\n" + order[19] + b"%\n"
    held = [f for n, f in enumerate(order, 1) if n % 10]
    assert bytes(train.tolist()) == b"".join(f + b"%\n" for f in held)
    ds = load_dataset("text", tmp_path, seq_len=8)
    assert ds.test_size == (len(test) - 1) // 8


@pytest.mark.skipif(not Path(text.DEFAULT_TEXT_DIR).is_dir(), reason="fortunes not installed")
def test_without_a_data_dir_text_is_the_fortunes_corpus():
    ds = load_dataset("text", None, seq_len=64)
    assert ds.train_size == 2_313_989 // 64 and ds.test_size == (262_674 - 1) // 64


def test_bad_text_input_says_what_to_do(tmp_path, monkeypatch):
    (tmp_path / "short.txt").write_text("too short")
    with pytest.raises(DataError, match="fewer than one sequence of 16 tokens.*at least 170 bytes"):
        read_text(tmp_path / "short.txt", 16)
    with pytest.raises(DataError, match="no such file"):
        read_text(tmp_path / "missing.txt", 16)
    with pytest.raises(DataError, match="train.txt and test.txt"):
        read_text(tmp_path, 16)
    with monkeypatch.context() as m:
        m.setattr(text, "DEFAULT_TEXT_DIR", str(tmp_path / "absent"))
        with pytest.raises(DataError, match="without --data-dir.*apt-get install fortunes"):
            read_text(None, 16)
    write_corpus(tmp_path / "c.txt")
    with pytest.raises(ConfigError, match="--augment"):
        load_dataset("text", tmp_path / "c.txt", seq_len=16, augment=True)


# -- the model ----------------------------------------------------------------------------
def test_the_transformer_is_causal_with_tied_weights():
    torch.manual_seed(0)
    model = build_language_model("transformer-tiny", 256)
    assert model.head.weight is model.tok.weight  # weight tying: one tensor
    assert count_parameters(model) == 120_576 and context_length("transformer-tiny") == 64
    a = torch.randint(0, 256, (2, 64))
    b = a.clone()
    b[:, 40] = (b[:, 40] + 1) % 256
    model.eval()
    with torch.no_grad():
        out_a, out_b = model(a), model(b)
    assert out_a.shape == (2, 64, 256)
    assert torch.equal(out_a[:, :40], out_b[:, :40])  # no position sees a later token
    assert not torch.allclose(out_a[:, 40:], out_b[:, 40:])
    assert context_length("transformer-3-96-128") == 128
    assert len(build_language_model("transformer-3-96-128", 256).blocks) == 3


def test_model_names_and_data_must_agree():
    with pytest.raises(ConfigError, match="language model.*--dataset text"):
        build_model("transformer-tiny", 1, 28, 10)
    with pytest.raises(ConfigError, match="takes images"):
        build_language_model("cnn", 256)
    with pytest.raises(ConfigError, match="multiple of 32"):
        build_language_model("transformer-2-48-16", 256)
    with pytest.raises(ConfigError, match="unknown language model"):
        build_language_model("transformer-huge", 256)


def test_vmap_computes_several_workers_gradients_as_one_at_a_time():
    """The simulator's batched engine (torch.func.vmap) on the Transformer: the gradient of
    each of three workers equals the one computed alone (float64)."""
    torch.manual_seed(0)
    flat = FlatModel(build_language_model(SMALL, 256).double())
    from dana.train.task.stacked import GradientSource

    stacked = StackedGradient(GradientSource(flat, token_cross_entropy, None))
    params = flat.flat.repeat(3, 1) + 0.01 * torch.randn(3, flat.d, dtype=torch.float64)
    x, y = torch.randint(0, 256, (3, 4, 16)), torch.randint(0, 256, (3, 4, 16))
    grads, losses, _ = stacked(params, x, y)
    for i in range(3):
        grad, loss = flat.gradient(params[i].clone(), x[i], y[i], token_cross_entropy)
        torch.testing.assert_close(grads[i], grad, rtol=1e-10, atol=1e-12)
        assert losses[i].item() == pytest.approx(float(loss), rel=1e-12)


def test_the_evaluation_counts_every_token(corpus):
    config = TrainConfig(dataset="text", data_dir=str(corpus), model=SMALL, batch_size=8)
    problem = Problem(config)
    ds = problem.dataset
    found = problem.evaluate(problem.initial_params())
    loss, error = found["loss"], found["error"]
    module = problem.flat.module.eval()
    with torch.no_grad():
        out = module(ds.test_x)
    assert loss == pytest.approx(token_cross_entropy(out, ds.test_y).item(), rel=1e-5)
    assert error == pytest.approx((out.argmax(-1) != ds.test_y).double().mean().item())
    assert problem.derived["test_perplexity"]({"test_loss": loss}) == pytest.approx(math.exp(loss))


# -- dana train, dana report ----------------------------------------------------------------
def test_dana_train_a_language_model_end_to_end(corpus, tmp_path):
    out = tmp_path / "run"
    result = run_dana(
        "train", "--dataset", "text", "--data-dir", corpus, "--model", SMALL, "--workers", "2",
        "--epochs", "1", "--eval-every", "0.5", "--batch-size", "8", "--lr", "0.05",
        "--out", out, "--quiet",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "test_ppl" in result.stdout and "perplexity" in result.stdout.splitlines()[-1]
    assert "the byte bigram model: " in result.stdout.splitlines()[-1]  # its yardstick
    rows = [line.split(",") for line in (out / "metrics.csv").read_text().splitlines()]
    assert rows[0][-1] == "test_perplexity" and len(rows) == 4  # epochs 0, 0.5, 1
    for row in rows[1:]:
        values = dict(zip(rows[0], map(float, row)))
        assert values["test_perplexity"] == pytest.approx(math.exp(values["test_loss"]))
        assert 0 <= values["test_error"] <= 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["final_test_perplexity"] == pytest.approx(math.exp(summary["final_test_loss"]))
    assert summary["final_test_loss"] < math.log(256)  # it learned something
    assert (out / "curves.png").is_file() and (out / "model.safetensors").is_file()
    ds = load_dataset("text", corpus, seq_len=context_length(SMALL))
    assert summary["reference_losses"] == reference_losses(
        ds.train_x, ds.train_y, ds.test_x, ds.test_y
    )


def test_the_byte_yardsticks_are_laplace_counts_of_the_training_text():
    train = torch.tensor(list(b"abababab"), dtype=torch.uint8)
    x, y = windows(train, 7)  # pairs a->b x4, b->a x3; targets b x4, a x3
    test_x, test_y = torch.tensor([[ord("a")]]), torch.tensor([[ord("b")]])
    ref = reference_losses(x, y, test_x, test_y)
    assert ref["unigram"] == pytest.approx(-math.log((4 + 1) / (7 + 256)))
    assert ref["bigram"] == pytest.approx(-math.log((4 + 1) / (4 + 256)))


@pytest.mark.parametrize("algorithm", ["local-nesterov", "local-dn"])
def test_the_local_sgd_line_runs_on_language_models(corpus, tmp_path, algorithm):
    config = TrainConfig(
        algorithm=algorithm, workers=2, dataset="text", data_dir=str(corpus), model=SMALL,
        epochs=1.0, batch_size=8, lr=0.05, algorithm_params={"local_steps": 2},
    )  # fmt: skip
    summary = train(config, tmp_path / algorithm, progress=False)
    assert not summary["diverged"] and math.isfinite(summary["final_test_perplexity"])
    assert summary["pushes"] > 0


@pytest.mark.slow
def test_text_quick_through_dana_sweep_and_dana_report(corpus, tmp_path):
    spec = load_preset("text-quick")
    assert spec.fixed["dataset"] == "text" and spec.fixed["model"] == "transformer-tiny"
    assert "data_dir" not in spec.fixed  # the user's text
    out = tmp_path / "tq"
    result = run_dana(
        "sweep", "--preset", "text-quick", "--data-dir", corpus, "--model", SMALL,
        "--algorithms", "dana-slim,nag-asgd", "--workers", "1,2", "--epochs", "1",
        "--batch-size", "8", "--out", out, "--quiet", "--jobs", "2",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    result = run_dana("report", out)
    assert result.returncode == 0, result.stderr
    assert "Final test loss (perplexity)" in result.stdout
    assert "No verdict: these are language models" in result.stdout
    assert "The claim at No verdict" not in result.stdout  # (one sentence, said once)
    report = (out / "report.md").read_text()
    assert "perplexity" in report and "## Final test loss (perplexity)" in report
    # no nan verdict or cell (the divergence rule speaks of a "NaN or infinite" loss)
    assert "nan" not in report.replace("NaN or infinite", "").lower()
    assert "No verdict" in report
    assert "| byte bigram model of the training text |" in report  # the yardsticks
    results = load_results(out)
    assert set(results.references()) == {"unigram", "bigram"}
    assert results.metric.perplexity and results.metric.key == "test_loss"
    from dana.experiments.plots import error_vs_workers_figure, plot_error_curves

    fig = error_vs_workers_figure(results)
    assert any(len(line.get_xdata()) for line in fig.axes[0].lines)  # no empty panel
    assert plot_error_curves(results, tmp_path / "curves.png").stat().st_size > 10_000


def test_the_model_follows_the_dataset_by_default():
    """--model auto (the default): a language model for a dataset of tokens, the CNN for
    images; a model given is kept, and config.json keeps the model chosen."""
    assert TrainConfig().model == "cnn"
    assert TrainConfig(dataset="text").model == "transformer-tiny"
    assert TrainConfig(dataset="text", model="transformer-mini").model == "transformer-mini"
    assert TrainConfig.from_dict(TrainConfig(dataset="text").to_dict()).model == "transformer-tiny"
