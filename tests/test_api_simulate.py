"""``dana.simulate`` and the runnable examples in the core modules' docstrings."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest
import torch

import dana
import dana.algorithms

# Every module of dana.algorithms (a new rule's examples run without being listed here).
ALGORITHM_MODULES = sorted(
    f"dana.algorithms.{m.name}" for m in pkgutil.iter_modules(dana.algorithms.__path__)
)
DOCTEST_MODULES = [
    "dana.api",
    "dana.fitting",
    "dana.algorithms",
    *ALGORITHM_MODULES,
    "dana.sim.simulator",
    "dana.train.cluster.timing",
    "dana.train.rules.schedule",
    "dana.train.task.batches",
    "dana.train.task.flat",
    "dana.train.rules.gate",
    "dana.train.cluster.partition",
    "dana.train.cluster.classmeter",
    "dana.experiments.grid",
]

# The modules whose docstrings promise an example: it must be there, not only pass.
WITH_EXAMPLES = set(DOCTEST_MODULES) - {"dana.algorithms.base", "dana.train.cluster.timing"}


def test_the_listed_modules_include_the_old_list():
    assert {
        "dana.algorithms.asgd",
        "dana.algorithms.dana",
        "dana.algorithms.dc_asgd",
        "dana.algorithms.gap_aware",
        "dana.algorithms.ssgd",
        "dana.algorithms.functional",
    } <= set(ALGORITHM_MODULES)


@pytest.mark.parametrize("module", DOCTEST_MODULES)
def test_docstring_examples(module):
    mod = importlib.import_module(module)
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS, report=True, verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed"
    if module in WITH_EXAMPLES:
        assert result.attempted > 0


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 10, generator=g)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
    return x, y


def _model():
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))


def test_simulate_trains_and_leaves_the_master_params_in_the_model():
    x, y = _data()
    model = _model()
    before = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    result = dana.simulate(
        model, x, y, algorithm="dana-zero", workers=4, lr=0.05, epochs=2, batch_size=16,
        warmup_epochs=0, decay_epochs=[], weight_decay=0,
    )  # fmt: skip
    after = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    assert not torch.equal(before, after)
    assert torch.equal(after, result.simulator.params())
    assert len(result.log) == 2 * 256 // 16
    loss, error = result.evaluate(x, y)
    assert error < 0.2 and loss < 0.5


def test_simulate_is_deterministic():
    x, y = _data()
    a = dana.simulate(_model(), x, y, workers=3, lr=0.05, epochs=1, batch_size=16, seed=4)
    b = dana.simulate(_model(), x, y, workers=3, lr=0.05, epochs=1, batch_size=16, seed=4)
    assert torch.equal(a.simulator.params(), b.simulator.params())
    assert list(a.log.worker) == list(b.log.worker)


def test_simulate_passes_hyper_parameters():
    x, y = _data()
    # asgd takes no momentum: simulate does not pass one.
    r = dana.simulate(_model(), x, y, algorithm="asgd", workers=2, epochs=0.5, batch_size=16)
    assert r.simulator.algorithm.hparams() == {}
    r = dana.simulate(
        _model(), x, y, algorithm="ssgd", workers=2, epochs=0.5, batch_size=16, nesterov=True
    )
    assert r.simulator.algorithm.hparams() == {"momentum": 0.9, "nesterov": True}
    with pytest.raises(ValueError, match="'dana-fat'"):
        dana.simulate(_model(), x, y, algorithm="dana-fat")
    with pytest.raises(TypeError, match="'lc'"):
        dana.simulate(_model(), x, y, algorithm="dana-slim", lc=1.0)


def test_simulate_and_fit_take_dana_trains_defaults_and_checks():
    """One set of defaults for the three entries (TrainConfig's), and dana train's
    checks: a bad argument is a ConfigError (a ValueError) saying what it accepts."""
    import inspect

    from dana.errors import ConfigError
    from dana.train.config import TrainConfig
    from dana.train.training import build_schedule

    defaults = TrainConfig()
    for entry in (dana.simulate, dana.fit):
        params = inspect.signature(entry).parameters
        for name in ("algorithm", "workers", "lr", "momentum", "weight_decay", "epochs",
                     "batch_size", "timing", "seed", "cluster", "partition", "servers"):  # fmt: skip
            assert params[name].default == getattr(defaults, name), (entry.__name__, name)
        assert params["warmup_epochs"].default is None  # automatic, as dana train's
        assert params["decay_epochs"].default is None
    x, y = _data()
    r = dana.simulate(_model(), x, y, workers=4, epochs=2, batch_size=16)
    config = TrainConfig(workers=4, epochs=2, batch_size=16)
    want = build_schedule(config, 256 // 16)
    for epoch in (0.0, 0.3, 1.0, 1.9):
        assert r.simulator.lr_schedule(epoch) == want(epoch)
    assert r.simulator.weight_decay == 1e-4
    with pytest.raises(ConfigError, match="^workers must be an integer >= 1"):
        dana.simulate(_model(), x, y, workers=0)  # (named as the argument, not --workers)
    with pytest.raises(ConfigError, match="^decay_epochs must increase"):
        dana.fit(_model(), (x, y), decay_epochs=[2, 1])
    with pytest.raises(ConfigError, match="must be a number"):
        dana.simulate(_model(), x, y, lr=float("nan"))


def test_simulate_on_a_cluster_with_data_per_worker():
    """``dana.simulate`` takes a cluster preset and a partition, as ``dana train`` does:
    the network and the preemptions are in the clock, the classes are counted."""
    x, y = _data()
    model = torch.nn.Sequential(torch.nn.Linear(10, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    plain = dana.simulate(model, x, y, workers=4, lr=0.05, epochs=2, batch_size=16)
    result = dana.simulate(
        torch.nn.Sequential(torch.nn.Linear(10, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)),
        x, y, workers=4, lr=0.05, epochs=2, batch_size=16, cluster="geo",
        partition="shards:1",
    )  # fmt: skip
    sim = result.simulator
    assert sim.clock is not None and plain.simulator.clock is None
    # 50 ms each way: every push costs at least 100 ms more than its computation
    assert sim.sim_time > plain.simulator.sim_time + 100 * len(sim.log) / 4
    applied, data = sim.meter.shares()
    assert sum(applied) == pytest.approx(1.0) and len(data) == 2


def test_simulate_takes_fits_loss_so_a_token_model_trains_in_both():
    """A model of N x T x V outputs against N x T targets: fit's default loss reads the
    classes on the last dimension; simulate's is the same function."""
    import inspect

    import dana

    default = inspect.signature(dana.simulate).parameters["loss_fn"].default
    assert default is inspect.signature(dana.fit).parameters["loss_fn"].default
    out, target = torch.randn(4, 3, 7), torch.randint(0, 7, (4, 3))
    assert torch.isfinite(default(out, target))
