"""The model a run keeps: model.safetensors in every run directory, dana.load_model, the
end state in the last checkpoint, MLflow's copy, sweeps with and without models."""

from __future__ import annotations

import json

import pytest
import torch

import dana
from dana.cli import main
from dana.errors import DanaError
from dana.train.config import TrainConfig
from dana.train.records.rundir import RunDir
from dana.train.task.evaluation import evaluate_module
from dana.train.task.problem import Problem
from dana.train.training import stop_points, train

#: The small BatchNorm CNN on synthetic images: parameters and buffers to keep.
TINY = dict(
    dataset="synthetic", model="cnn", train_size=256, test_size=64, batch_size=32,
    epochs=2.0, eval_every=1.0, lr=0.02, workers=3, algorithm="dana-slim",
)  # fmt: skip


def flat(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()])


def test_the_last_checkpoint_is_the_end_state():
    config = TrainConfig(epochs=2.0, checkpoint_every=1.0)
    points, evals, checkpoints = stop_points(config, 15)
    assert max(checkpoints) == max(points) == 30  # not 15 of 30
    assert stop_points(TrainConfig(epochs=2.0), 15)[2] == set()  # none unless asked


def test_load_model_gives_the_last_evaluated_model(tmp_path):
    config = TrainConfig(**TINY, checkpoint_every=1.0)
    out = tmp_path / "run"
    summary = train(config, out, progress=False)
    model = dana.load_model(out)
    assert isinstance(model, torch.nn.Module) and not model.training
    state = RunDir(out).load_checkpoint()  # the end state (the last checkpoint)
    assert state["sim"]["updates"] == summary["updates"]
    assert torch.equal(flat(model), state["sim"]["master"]["theta"])  # dana-slim: Theta
    buffers = dict(model.named_buffers())
    for name, value in state["problem"]["buffers"].items():  # BatchNorm's statistics
        assert torch.equal(buffers[name], value), name
    # evaluated again on the test set: the run's final test loss and error, exactly
    problem = Problem(config)
    found = evaluate_module(model, problem.dataset.test_x, problem.dataset.test_y, problem.loss_fn)
    assert found["loss"] == summary["final_test_loss"]
    assert found["error"] == summary["final_test_error"]
    # a factory (or an instance) of the same architecture receives the same weights
    again = dana.load_model(out, model=lambda: Problem(config).flat.module)
    assert torch.equal(flat(again), flat(model))
    with pytest.raises(DanaError, match="does not fit"):
        dana.load_model(out, model=torch.nn.Linear(3, 2))
    with pytest.raises(DanaError, match="no model file"):
        dana.load_model(tmp_path)


def test_the_model_file_is_safetensors_and_ties_weights_once(tmp_path):
    from safetensors import safe_open

    from dana.models import build_language_model
    from dana.train.records.modelfile import save_model

    torch.manual_seed(0)
    model = build_language_model("transformer-1-32-16", 256)
    info = {"model": "transformer-1-32-16", "kind": "tokens", "num_classes": 256}
    path = save_model(tmp_path / "m.safetensors", model, info)
    with safe_open(str(path), framework="pt") as f:
        keys = set(f.keys())
    assert "tok.weight" in keys and "head.weight" not in keys  # stored once
    loaded = dana.load_model(path)
    assert loaded.head.weight is loaded.tok.weight
    assert torch.equal(flat(loaded), flat(model))
    # The same module, the same bytes (a resumed run's file equals the uninterrupted one's):
    again = [save_model(tmp_path / f"m{i}.safetensors", model, info).read_bytes() for i in range(6)]
    assert all(b == path.read_bytes() for b in again)
    # A file of 0.1.0 (its ties in a second metadata entry) still loads, tied:
    import safetensors.torch

    old = tmp_path / "old.safetensors"
    tensors = {k: v for k, v in model.state_dict().items() if k != "head.weight"}
    meta = {"dana": json.dumps(info), "dana.tied": json.dumps({"head.weight": "tok.weight"})}
    safetensors.torch.save_file(tensors, str(old), metadata=meta)
    reloaded = dana.load_model(old)
    assert reloaded.head.weight is reloaded.tok.weight and torch.equal(flat(reloaded), flat(model))


#: The description of a linear model on 1x4x4 images in 3 classes (tensors 1.weight [3, 16]
#: and 1.bias [3]), and of a one-layer Transformer (its head tied to its embedding).
LINEAR = {"model": "linear", "kind": "images", "in_channels": 1, "image_size": 4, "num_classes": 3}
LM = {"model": "transformer-1-32-16", "kind": "tokens", "num_classes": 256}


def _crafted(kind: str, good: bytes) -> bytes:
    """A corrupt or hostile model file of each kind (``good``: a valid LINEAR file)."""
    import safetensors.torch

    from dana.models import build_model

    tensors = build_model("linear", 1, 4, 3).state_dict()

    def meta(info):
        return {"dana": info if isinstance(info, str) else json.dumps(info)}

    files = {
        "empty": lambda: b"",
        "truncated": lambda: good[:-7],
        "header-cut": lambda: good[:20],
        "header-length-huge": lambda: (2**60).to_bytes(8, "little") + good[8:],
        "metadata-not-json": lambda: safetensors.torch.save(tensors, meta("{not json")),
        "metadata-a-list": lambda: safetensors.torch.save(tensors, meta("[1, 2]")),
        "size-a-string": lambda: safetensors.torch.save(tensors, meta({**LINEAR, "num_classes": "3"})),
        "size-missing": lambda: safetensors.torch.save(tensors, meta({**LINEAR, "image_size": None})),
        "num-classes-1e12": lambda: safetensors.torch.save(tensors, meta({**LINEAR, "num_classes": 10**12})),
        "num-classes-1e30": lambda: safetensors.torch.save(tensors, meta({**LINEAR, "num_classes": 10**30})),
        "wrong-shape": lambda: safetensors.torch.save(
            {**tensors, "1.weight": torch.zeros(3, 15)}, meta(LINEAR)
        ),
        "tensor-missing": lambda: safetensors.torch.save({"1.weight": tensors["1.weight"]}, meta(LINEAR)),
        "transformer-96-12288-65536": lambda: safetensors.torch.save(
            tensors, meta({**LM, "model": "transformer-96-12288-65536", "num_classes": 65536})
        ),
        "tied-to-nothing": lambda: safetensors.torch.save(
            tensors, meta({**LINEAR, "tied": {"1.bias": "nothing"}})
        ),
    }  # fmt: skip
    return files[kind]()


MODEL_FILES = [
    ("empty", "not a readable model file"),
    ("truncated", "not a readable model file"),
    ("header-cut", "not a readable model file"),
    ("header-length-huge", "not a readable model file"),
    ("metadata-not-json", "metadata is not valid JSON"),
    ("metadata-a-list", "metadata is a list"),
    ("size-a-string", "num_classes '3'"),
    ("size-missing", "image_size None"),
    ("num-classes-1e12", "1.weight [3, 16] (the model's: [1000000000000, 16])"),
    ("num-classes-1e30", "a model torch cannot build"),
    ("wrong-shape", "of other shapes: 1.weight [3, 15] (the model's: [3, 16])"),
    ("tensor-missing", "missing: 1.bias"),
    ("transformer-96-12288-65536", "of 96 layers, and the file holds 2 tensors"),
    ("tied-to-nothing", "tied weights name tensors the file does not hold"),
]


@pytest.mark.parametrize("kind, fragment", MODEL_FILES, ids=[c[0] for c in MODEL_FILES])
def test_a_corrupt_or_hostile_model_file_is_refused_naming_it(tmp_path, kind, fragment):
    """A DanaError naming the file and what is wrong, whatever the file holds; the model its
    metadata describes is checked against the stored tensors' shapes before it is built
    (1e12 classes would be 1e13 floats to allocate, a 96-layer Transformer 175e9)."""
    from dana.models import build_model
    from dana.train.records.modelfile import save_model

    good = save_model(tmp_path / "good.safetensors", build_model("linear", 1, 4, 3), LINEAR)
    assert isinstance(dana.load_model(good), torch.nn.Module)
    path = tmp_path / "model.safetensors"
    path.write_bytes(_crafted(kind, good.read_bytes()))
    with pytest.raises(DanaError) as caught:
        dana.load_model(path)
    assert str(path) in str(caught.value)
    assert fragment in str(caught.value), str(caught.value)


def test_mlflow_keeps_the_model_as_an_artifact(tmp_path):
    pytest.importorskip("mlflow", reason="MLflow not installed: pip install mlflow-skinny")
    from mlflow.tracking import MlflowClient

    from dana.train.records.tracking import tracking_uri

    out, store = tmp_path / "run", tmp_path / "mlruns"
    args = ["--dataset", "synthetic", "--model", "linear", "--train-size", "256",
            "--test-size", "64", "--epochs", "1", "--batch-size", "32", "--quiet"]  # fmt: skip
    assert main(["train", *args, "--mlflow", str(store), "--out", str(out)]) == 0
    client = MlflowClient(tracking_uri=tracking_uri(str(store)))
    run_id = json.loads((out / "mlflow_run.json").read_text())["run_id"]
    assert "model.safetensors" in {a.path for a in client.list_artifacts(run_id)}
    local = client.download_artifacts(run_id, "model.safetensors", str(tmp_path))
    assert torch.equal(flat(dana.load_model(local)), flat(dana.load_model(out)))


@pytest.mark.slow
def test_sweeps_keep_models_unless_told_not_to(tmp_path):
    args = ["sweep", "--dataset", "synthetic", "--model", "linear", "--train-size", "128",
            "--test-size", "32", "--epochs", "0.5", "--batch-size", "32", "--algorithms",
            "dana-slim", "--workers", "2", "--quiet"]  # fmt: skip
    assert main([*args, "--out", str(tmp_path / "kept")]) == 0
    assert [p.name for p in (tmp_path / "kept").glob("runs/*/model.safetensors")]
    assert main([*args, "--out", str(tmp_path / "dropped"), "--no-models"]) == 0
    assert not list((tmp_path / "dropped").glob("runs/*/model.safetensors"))
    assert list((tmp_path / "dropped").glob("runs/*/summary.json"))


@pytest.mark.ray
def test_a_ray_run_keeps_its_last_evaluated_model(tmp_path, local_ray):
    config = TrainConfig(
        **{**TINY, "model": "mlp", "workers": 2, "epochs": 1.0},
        backend="ray", checkpoint_every=1.0,
    )  # fmt: skip
    out = tmp_path / "run"
    summary = train(config, out, progress=False)
    model = dana.load_model(out)
    problem = Problem(config)
    found = evaluate_module(model, problem.dataset.test_x, problem.dataset.test_y, problem.loss_fn)
    assert found["loss"] == summary["final_test_loss"]
    assert found["error"] == summary["final_test_error"]
    assert RunDir(out).checkpoint.is_file()


def test_fit_keeps_its_final_model_in_the_run_directory_and_in_mlflow(tmp_path):
    pytest.importorskip("mlflow", reason="MLflow not installed: pip install mlflow-skinny")
    from mlflow.tracking import MlflowClient

    from dana.train.records.tracking import tracking_uri

    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 6, generator=g)
    y = (x[:, 0] > 0).long()

    def make() -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8),
                                   torch.nn.ReLU(), torch.nn.Linear(8, 2))  # fmt: skip

    store, out = tmp_path / "mlruns", tmp_path / "run"

    def hits(out: torch.Tensor, y: torch.Tensor) -> float:
        return (out.argmax(1) == y).double().mean().item()

    result = dana.fit(make, (x, y), workers=2, lr=0.05, epochs=1, batch_size=16,
                      out=out, mlflow=str(store), metrics={"hits": hits})  # fmt: skip
    last = result.model.state_dict()  # the run's last parameters and buffers
    kept = dana.load_model(out, model=make)
    client = MlflowClient(tracking_uri=tracking_uri(str(store)))
    run_id = json.loads((out / "mlflow_run.json").read_text())["run_id"]
    # the metric hook's column reaches the tracker with the others
    history = client.get_metric_history(run_id, "test_hits")
    assert [m.value for m in history] == [r["test_hits"] for r in result.metrics]
    artifact = client.download_artifacts(run_id, "model.safetensors", str(tmp_path))
    tracked = dana.load_model(artifact, model=make)
    for model in (kept, tracked):
        for name, value in model.state_dict().items():
            assert torch.equal(value, last[name]), name
    found = evaluate_module(kept, x, y, torch.nn.functional.cross_entropy)
    assert found["loss"] == pytest.approx(result.summary["final_test_loss"], rel=1e-6)
    with pytest.raises(DanaError, match="pass model= your factory"):
        dana.load_model(out)  # a model of the user's: built by the user's factory
