"""Any data through ``dana.fit``: a ``Dataset`` read per batch (its random transforms drawn
anew each epoch, from keys of (seed, worker, step) seeding each batch once: the same on
every engine, on Ray and with any number of reader processes), the test set read a
batch at a time, inputs that are tuples or dicts of tensors, an ``IterableDataset``,
and the refusals of what cannot be read."""

from __future__ import annotations

import io
import random
import sys

import numpy as np
import pytest
import torch
from torch import nn

import dana
from dana.errors import ConfigError
from dana.train.task.batches import BatchStream
from dana.train.task.reading import MapData, ReadBatches, collate, data_source, read_key

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


def same(a, b) -> bool:
    """Two read batches of Noisy are equal."""
    return torch.equal(a[0]["a"], b[0]["a"]) and torch.equal(a[1], b[1])


def same_draw(a, b) -> bool:
    """Two handed-out batches ``(rows, key)`` are equal."""
    return torch.equal(a[0], b[0]) and a[1] == b[1]


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
    drawn = simulator.next_for(2)
    assert same_draw(drawn, worker.next())  # (rows, key): what a checkpoint holds
    assert same(simulator.take(drawn), worker.take(drawn))
    assert read_key(3, 2, 0) != read_key(3, 1, 0) != read_key(3, 1, 1)
    # the rule: the generators seeded once by the key, the items read in the drawn order
    key, rows = read_key(3, 0, 0), torch.tensor([5, 2, 7])
    torch.manual_seed(key), random.seed(key), np.random.seed(key % 2**32)
    want = collate([data.dataset[i] for i in rows.tolist()], "train")
    got = data.read(rows, key)
    assert torch.equal(got[0]["a"], want[0]["a"]) and torch.equal(got[1], want[1])
    assert not torch.equal(data.read(rows.flip(0), key)[0]["a"], want[0]["a"].flip(0))


def saved_and_loaded(value):
    buf = io.BytesIO()
    torch.save(value, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def test_reader_processes_read_the_same_batches_and_the_test_set_a_batch_at_a_time():
    dataset = Noisy(64)
    here, readers = MapData(dataset, "train"), MapData(dataset, "train", num_workers=2)

    def stream(data, worker=None):
        return ReadBatches(data, 8, seed=3, rows=BatchStream(64, 8, seed=0), worker=worker)

    try:
        shared = [stream(here), stream(readers)]  # the simulator's: read while it computes
        for worker in (0, 1, 0):
            drawn = shared[1].next_for(worker)
            assert same_draw(drawn, shared[0].next_for(worker))
            assert same(shared[1].take(drawn), shared[0].take(drawn))
        own = [stream(here, 2), stream(readers, 2)]  # a Ray worker's, read ahead
        for _ in range(10):  # (past an epoch)
            drawn = own[1].next()
            assert same_draw(drawn, own[0].next())
            assert same(own[1].take(drawn), own[0].take(drawn))
        # a checkpoint holds (rows, key), loaded without unpickling code; after a resume
        # the batch is read again, the same
        drawn = shared[1].next_for(1)
        loaded = saved_and_loaded(drawn)
        resumed = stream(readers)
        resumed.load_state_dict(shared[1].state_dict())
        assert same(resumed.take(loaded), shared[1].take(drawn))
        # a batch handed out and never taken (its worker left) is dropped at the next
        shared[1].next_for(3), shared[1].next_for(3)
        assert len(shared[1]._held) == 1
        # the test set: in order, `size` items a batch, batch j keyed j, the same each time
        for data in (here, readers):
            batches = list(data.batches(24))
            assert [len(y) for _, y in batches] == [24, 24, 16]
            assert same(batches[1], here.read(torch.arange(24, 48), 1))
            assert same(list(data.batches(24))[2], batches[2])
        # the readers read in their own processes: here only the reads of `here`, and
        # the resumed batch's, read again in process
        assert dataset.reads == 8 * (3 + 10 + 1) + 2 * 64 + 2 * 24
        processes = list(readers._readers._processes.values())
        assert len(processes) == 2
    finally:
        readers.close()
    assert readers._readers is None and not any(p.is_alive() for p in processes)
    with pytest.raises(ConfigError, match="num_workers must be an integer >= 0"):
        data_source(dataset, "train", num_workers=-1)


def test_fit_reads_a_dataset_per_batch_the_same_on_every_engine():
    a, b, y = pairs(128, seed=1)
    test = ({"a": a, "b": b}, y)
    runs = {}
    engines = {
        "one": {},
        "threads": {"threads": 2},
        "vmap": {"batch_workers": 3},
        "readers": {"num_workers": 2},
    }
    for name, options in engines.items():
        dataset = Noisy()
        torch.manual_seed(0)
        runs[name] = dana.fit(TwoInputs(), dataset, test, **RUN, **options)
        # read per batch, when drawn: each push's, and the k still in flight at the end;
        # no pass over the whole set up front (the readers read in their own processes)
        drawn = runs[name].summary["pushes"] + RUN["workers"]
        assert dataset.reads == (0 if "num_workers" in options else drawn * RUN["batch_size"])
    assert learned(runs["one"])
    for other in ("threads", "readers"):
        for r, t in zip(runs["one"].metrics, runs[other].metrics, strict=True):
            assert r["test_loss"] == t["test_loss"]  # bit for bit
    for r, t in zip(runs["one"].metrics, runs["vmap"].metrics):
        assert r["test_loss"] == pytest.approx(t["test_loss"], rel=1e-4)


class Labelled(Noisy):
    """Noisy with its class labels as ``targets`` (torchvision's convention)."""

    @property
    def targets(self) -> torch.Tensor:
        return self.y


def test_the_test_set_is_read_a_batch_at_a_time_at_each_evaluation():
    """Batches of 1000 (the evaluation's), batch j keyed j: the same draws at every
    evaluation, and the same figures as the tensors of those reads."""
    test = Noisy(2500)
    torch.manual_seed(0)
    streamed = dana.fit(TwoInputs(), Noisy(), test, **RUN)
    evaluations = len(streamed.metrics)
    assert test.reads == 2 + evaluations * 2500  # (2: the probe of the task)
    read = list(MapData(Noisy(2500), "test").batches(1000))
    assert [len(y) for _, y in read] == [1000, 1000, 500]
    held = ({"a": torch.cat([x["a"] for x, _ in read]), "b": test.b}, test.y)
    torch.manual_seed(0)
    in_memory = dana.fit(TwoInputs(), Noisy(), held, **RUN)
    for r, t in zip(streamed.metrics, in_memory.metrics, strict=True):
        assert r["test_loss"] == t["test_loss"] and r["test_error"] == t["test_error"]
    # an iterable test set, the same at each evaluation; a Dataset's `targets` for
    # partition= and the class meter (of the batches' rows)
    torch.manual_seed(0)
    iterable = dana.fit(TwoInputs(), Labelled(), Stream(), **RUN, partition="shards:2")
    assert learned(iterable)
    applied = iterable.summary["applied_class_counts"]
    assert sum(applied) == iterable.summary["pushes"] * RUN["batch_size"]
    for problem in (streamed.problem, iterable.problem):
        assert problem.evaluate(problem.flat.flat) == problem.evaluate(problem.flat.flat)


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
    """One worker, one batch an epoch of 256 copies of one example (each runner shuffles
    the rows in its own order, and a batch's draws go to its items in the order read:
    copies make the order moot), a constant rate: the two runs follow one path, push by
    push, when every batch's draws are the same (on Ray read by two reader processes),
    and the draws differ from epoch to epoch."""
    a, b, y = pairs(64, seed=1)
    test = ({"a": a, "b": b}, y)
    run = dict(workers=1, lr=0.05, epochs=6, batch_size=256, warmup_epochs=0.0, decay_epochs=[])
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        results = {}
        for backend in ("sim", "ray"):
            torch.manual_seed(0)
            copies = Noisy()
            copies.a[:], copies.b[:], copies.y[:] = copies.a[0], copies.b[0], copies.y[0]
            readers = 2 if backend == "ray" else 0
            results[backend] = dana.fit(
                TwoInputs(), copies, test, backend=backend, num_workers=readers, **run
            )
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
