"""Any data through ``dana.fit``: a ``Dataset`` read per batch (its random transforms drawn
anew each epoch, from keys of (seed, worker, step): the same on every engine and on
Ray), inputs that are tuples or dicts of tensors, an ``IterableDataset``, and the
refusals of what cannot be read."""

from __future__ import annotations

import random
import sys

import numpy as np
import pytest
import torch
from torch import nn

import dana
from dana.errors import ConfigError
from dana.train.task.batches import BatchStream
from dana.train.task.reading import MapData, ReadBatches, read_key

try:
    import ray
except ImportError:  # pragma: no cover
    ray = None


def pairs(n: int = 256, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(n, 4, generator=g), torch.randn(n, 3, generator=g)
    return a, b, (a[:, 0] + b[:, 0] > 0).long()


class TwoInputs(nn.Module):
    """A model of two inputs, ``model(a, b)``."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.out = nn.Linear(4, 8), nn.Linear(3, 8), nn.Linear(8, 2)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.a(a) + self.b(b)))


class Noisy(torch.utils.data.Dataset):
    """Items ``({"a": a + noise, "b": b}, y)``: a random transform (torch, NumPy and
    Python draws) in ``__getitem__``; counts its reads."""

    def __init__(self, n: int = 256) -> None:
        self.a, self.b, self.y = pairs(n)
        self.reads = 0

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        self.reads += 1
        noise = 0.1 * torch.randn(4) + float(np.random.rand() - 0.5) * 0.01 + random.random() * 0.01
        return {"a": self.a[i] + noise, "b": self.b[i]}, self.y[i]


class Stream(torch.utils.data.IterableDataset):
    """The same examples as tuples ``((a, b), y)``, in a fixed order; a length."""

    def __init__(self, n: int = 256, length: bool = True) -> None:
        self.a, self.b, self.y = pairs(n)
        self.length = length

    def __iter__(self):
        for i in range(len(self.y)):
            yield (self.a[i] + 0.1 * torch.randn(4), self.b[i]), self.y[i]

    def __len__(self) -> int:
        if not self.length:
            raise TypeError("no length")
        return len(self.y)


def learned(result) -> bool:
    return result.metrics[-1]["test_loss"] < 0.8 * result.metrics[0]["test_loss"]


RUN = dict(workers=4, lr=0.05, epochs=2, batch_size=16, warmup_epochs=0.0, decay_epochs=[])


def test_a_dataset_is_read_per_batch_with_fresh_draws_each_epoch_and_the_rng_put_back():
    data = MapData(Noisy(64), "train")
    rows = torch.arange(8)
    first, again = data.read(rows, read_key(3, 0, 0)), data.read(rows, read_key(3, 0, 0))
    later = data.read(rows, read_key(3, 0, 8))  # the same rows in a later epoch
    assert torch.equal(first[0]["a"], again[0]["a"])
    assert not torch.allclose(first[0]["a"], later[0]["a"])
    assert torch.equal(first[0]["b"], later[0]["b"])  # (not transformed)
    # reading leaves torch's, NumPy's and Python's generators as they were
    torch.manual_seed(5), np.random.seed(5), random.seed(5)
    data.read(rows, 123)
    drawn = torch.rand(3), np.random.rand(), random.random()
    torch.manual_seed(5), np.random.seed(5), random.seed(5)
    assert torch.equal(torch.rand(3), drawn[0])
    assert (np.random.rand(), random.random()) == drawn[1:]
    # worker w's s-th batch has the key (seed, w, s): the stream of the simulator
    # (every worker) and of one Ray worker read the same
    simulator = ReadBatches(data, 8, seed=3, rows=BatchStream(64, 8, seed=0))
    worker = ReadBatches(data, 8, seed=3, rows=BatchStream(64, 8, seed=0), worker=2)
    assert simulator.batches_per_epoch == worker.batches_per_epoch == 8
    (x, y), (x2, y2) = simulator.next_for(2), worker.next()
    assert torch.equal(x["a"], x2["a"]) and torch.equal(y, y2)
    assert read_key(3, 2, 0) != read_key(3, 1, 0) != read_key(3, 1, 1)


def test_fit_reads_a_dataset_per_batch_the_same_on_every_engine():
    a, b, y = pairs(128, seed=1)
    test = ({"a": a, "b": b}, y)
    runs = {}
    engines = {"one": {}, "threads": {"threads": 2}, "vmap": {"batch_workers": 3}}
    for name, options in engines.items():
        dataset = Noisy()
        torch.manual_seed(0)
        runs[name] = dana.fit(TwoInputs(), dataset, test, **RUN, **options)
        # read per batch, when drawn: each push's, and the k still in flight at the end;
        # no pass over the whole set up front
        drawn = runs[name].summary["pushes"] + RUN["workers"]
        assert dataset.reads == drawn * RUN["batch_size"]
    assert learned(runs["one"])
    for r, t in zip(runs["one"].metrics, runs["threads"].metrics):
        assert r["test_loss"] == t["test_loss"]  # bit for bit
    for r, t in zip(runs["one"].metrics, runs["vmap"].metrics):
        assert r["test_loss"] == pytest.approx(t["test_loss"], rel=1e-4)


def test_tuple_and_dict_inputs_in_tensors():
    a, b, y = pairs()
    torch.manual_seed(0)
    as_tuple = dana.fit(TwoInputs(), ((a, b), y), **RUN)
    torch.manual_seed(0)
    as_dict = dana.fit(TwoInputs(), ({"a": a, "b": b}, y), **RUN, batch_workers=2)
    assert learned(as_tuple)
    assert as_dict.metrics[-1]["test_loss"] == pytest.approx(
        as_tuple.metrics[-1]["test_loss"], rel=1e-4
    )
    assert as_tuple.evaluate((a, b), y) == as_tuple.evaluate({"a": a, "b": b}, y)
    with pytest.raises(ConfigError, match="one row per example"):
        dana.fit(TwoInputs(), ((a, b[:10]), y), **RUN)


def test_an_iterable_dataset_is_read_in_its_order_and_what_cannot_be_read_is_refused():
    a, b, y = pairs(128, seed=1)
    results = []
    for _ in range(2):
        torch.manual_seed(0)
        results.append(dana.fit(TwoInputs(), Stream(), ((a, b), y), **RUN))
    assert learned(results[0])
    assert results[0].metrics[-1]["test_loss"] == results[1].metrics[-1]["test_loss"]
    assert results[0].summary["pushes"] == 2 * 256 // 16
    with pytest.raises(ConfigError, match="IterableDataset needs __len__"):
        dana.fit(TwoInputs(), Stream(length=False), **RUN)
    loader = torch.utils.data.DataLoader(Noisy(), batch_size=16)
    with pytest.raises(ConfigError, match=r"pass its dataset \(train=loader.dataset\)"):
        dana.fit(TwoInputs(), loader, **RUN)
    with pytest.raises(ConfigError, match="needs the labels"):
        dana.fit(TwoInputs(), Noisy(), **{**RUN, "partition": "shards:1"})


@pytest.mark.ray
@pytest.mark.skipif(ray is None, reason="needs Ray: pip install 'ray>=2.9'")
def test_a_dataset_reads_the_same_batches_on_the_simulator_and_on_ray(local_ray, tmp_path):
    """One worker, one batch an epoch (every example; its order does not change the
    mean), a constant rate: the two runs follow one path, push by push, when every
    batch's draws are the same, and the draws differ from epoch to epoch."""
    a, b, y = pairs(64, seed=1)
    test = ({"a": a, "b": b}, y)
    run = dict(workers=1, lr=0.05, epochs=6, batch_size=256, warmup_epochs=0.0, decay_epochs=[])
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        results = {}
        for backend in ("sim", "ray"):
            torch.manual_seed(0)
            results[backend] = dana.fit(TwoInputs(), Noisy(), test, backend=backend, **run)
        # an IterableDataset: each Ray worker iterates its own copy, shipped unstarted
        torch.manual_seed(0)
        stream = dana.fit(TwoInputs(), Stream(), ((a, b), y), backend="ray", **RUN)
    finally:
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    sim, on_ray = (results[k].log.numpy()["loss"] for k in ("sim", "ray"))
    assert len(sim) == len(on_ray) == 6
    np.testing.assert_allclose(on_ray, sim, rtol=1e-5)
    for r, s in zip(results["ray"].metrics, results["sim"].metrics):
        assert r["test_loss"] == pytest.approx(s["test_loss"], rel=1e-5)
    assert stream.summary["pushes"] == 2 * 256 // 16 and learned(stream)
    # the draws differ across epochs: the same parameters on two epochs' batches
    data = MapData(Noisy(), "train")
    rows = torch.arange(256)
    x0, y0 = data.read(rows, read_key(0, 0, 0))
    x1, _ = data.read(rows, read_key(0, 0, 1))
    assert not torch.allclose(x0["a"], x1["a"])
