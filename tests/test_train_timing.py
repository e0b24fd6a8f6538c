"""Timing models: their distributions, determinism, state, and trace files."""

from __future__ import annotations

import numpy as np
import pytest

from dana.errors import ConfigError, DataError
from dana.train.cluster.timing import TIMING_MODELS, build_timing, read_trace, write_trace


def _draw(model, n, order=None):
    """``n`` samples, cycling over workers in ``order`` (default 0..k-1)."""
    order = order or list(range(model.workers))
    return [(w, model.sample(w)) for w in (order[j % len(order)] for j in range(n))]


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "step_times.csv"
    path.write_text("worker,duration\n0,1.5\n1,4\n0,2.5\n1,5\n0,3.5\n")
    return path


@pytest.mark.parametrize("name", ["constant", "gamma", "heterogeneous", "trace"])
def test_same_seed_same_durations(name, trace):
    params = {"path": str(trace)} if name == "trace" else {}
    order = [0, 2, 2, 1, 0, 1, 2]
    a = build_timing(name, 3, seed=7, **params)
    b = build_timing(name, 3, seed=7, **params)
    assert _draw(a, 300, order) == _draw(b, 300, order)


@pytest.mark.parametrize("name", ["gamma", "heterogeneous"])
def test_other_seed_other_durations(name):
    a, b = build_timing(name, 3, seed=1), build_timing(name, 3, seed=2)
    assert _draw(a, 30) != _draw(b, 30)


@pytest.mark.parametrize("name", ["constant", "gamma", "heterogeneous", "trace"])
def test_state_round_trip_continues_the_sequence(name, trace):
    params = {"path": str(trace)} if name == "trace" else {}
    a = build_timing(name, 4, seed=3, **params)
    _draw(a, 17)
    state = a.state_dict()
    expected = _draw(a, 50)
    b = build_timing(name, 4, seed=99, **params)
    b.load_state_dict(state)
    assert _draw(b, 50) == expected


def test_constant():
    model = build_timing("constant", 2)
    assert {d for _, d in _draw(model, 10)} == {1.0}
    assert build_timing("constant", 2, duration=2.5).sample(1) == 2.5


def test_gamma_defaults_are_the_authors():
    model = build_timing("gamma", 4, seed=0)
    assert model.params() == {"shape": 100.0, "scale": 1.28}
    x = np.array([d for _, d in _draw(model, 20000)])
    assert x.mean() == pytest.approx(128, rel=0.01)
    assert x.std() / x.mean() == pytest.approx(0.1, rel=0.05)


def test_heterogeneous_workers_have_their_own_speed():
    k = 16
    model = build_timing("heterogeneous", k, seed=0)
    means = model.worker_means
    assert means.shape == (k,) and len(set(means)) == k
    # machine_cv = 0.3 by default: the workers' means spread about 30% around 128.
    assert 0.15 < means.std() / means.mean() < 0.45
    assert 90 < means.mean() < 170
    x = np.array([[model.sample(w) for w in range(k)] for _ in range(2000)])
    np.testing.assert_allclose(x.mean(0), means, rtol=0.01)  # task_cv 0.1: 0.2% noise
    np.testing.assert_allclose(x.std(0) / x.mean(0), 0.1, rtol=0.1)


def test_trace_replays_per_worker_in_order_and_cycles(trace):
    model = build_timing("trace", 3, path=str(trace))
    # Trace workers 0 and 1; worker 2 replays trace worker 0 from its own position.
    assert [model.sample(0) for _ in range(4)] == [1.5, 2.5, 3.5, 1.5]
    assert [model.sample(1) for _ in range(3)] == [4.0, 5.0, 4.0]
    assert [model.sample(2) for _ in range(2)] == [1.5, 2.5]
    assert model.params() == {"path": str(trace)}


def test_trace_renumbers_workers(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("worker,duration\n10,1\n2,2\n10,3\n")
    assert read_trace(path) == [[2.0], [1.0, 3.0]]  # workers sorted as numbers


def test_write_trace_round_trip(tmp_path):
    rows = [(0, 1.25), (1, 0.1), (0, 1e-3), (2, 7.0)]
    write_trace(tmp_path / "t.csv", rows)
    assert read_trace(tmp_path / "t.csv") == [[1.25, 1e-3], [0.1], [7.0]]


BAD_TRACES = {
    "empty": b"",
    "no-header": b"0,1.0\n1,2.0\n",
    "other-header": b"rank,seconds\n0,1.0\n",
    "header-only": b"worker,duration\n",
    "not-a-number": b"worker,duration\n0,fast\n",
    "missing-column": b"worker,duration\n0\n",
    "zero": b"worker,duration\n0,0\n",
    "negative": b"worker,duration\n0,1\n1,-2\n",
    "nan": b"worker,duration\n0,nan\n",
    "inf": b"worker,duration\n0,inf\n",
    "binary": b"worker,duration\n0,1\n\xff\xfe\x00\x81\n",
}


@pytest.mark.parametrize("content", BAD_TRACES.values(), ids=BAD_TRACES.keys())
def test_bad_trace_raises_data_error_naming_the_file(tmp_path, content):
    path = tmp_path / "bad_trace.csv"
    path.write_bytes(content)
    with pytest.raises(DataError, match="bad_trace.csv"):
        read_trace(path)
    with pytest.raises(DataError, match="bad_trace.csv"):
        build_timing("trace", 2, path=str(path))


def test_missing_trace_file(tmp_path):
    path = tmp_path / "nowhere.csv"
    with pytest.raises(DataError, match="nowhere.csv"):
        build_timing("trace", 2, path=str(path))
    with pytest.raises(DataError, match=str(tmp_path.name)):
        build_timing("trace", 2, path=str(tmp_path))  # a directory


def test_timing_config_errors():
    with pytest.raises(ConfigError, match="trace"):
        build_timing("trace", 2)  # no file
    with pytest.raises(ConfigError, match="'poisson'"):
        build_timing("poisson", 2)
    with pytest.raises(ConfigError, match="rate"):
        build_timing("gamma", 2, rate=3)
    for name, bad in [("shape", 0), ("scale", -1.0), ("shape", float("nan"))]:
        with pytest.raises(ConfigError, match=name):
            build_timing("gamma", 2, **{name: bad})
    with pytest.raises(ConfigError, match="machine_cv"):
        build_timing("heterogeneous", 2, machine_cv=0)
    with pytest.raises(ConfigError, match="duration"):
        build_timing("constant", 2, duration=-1)
    assert set(TIMING_MODELS) == {
        "constant",
        "gamma",
        "lognormal",
        "pareto",
        "heterogeneous",
        "trace",
    }
