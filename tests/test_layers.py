"""The walls between dana's layers, read from the source (docs/ARCHITECTURE.md).

Every import in ``dana/`` counts: at module level, inside functions (lazy imports) and
under ``if TYPE_CHECKING``. A module is named by its dotted path; its layer ("package")
is its first part under ``dana`` (``dana.train.config`` -> ``train``, ``dana.cli`` ->
``cli``, the package ``dana`` itself -> ``dana``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from dana.train.backends import RUNNERS as BACKENDS

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dana"
#: The runners' layers, read from the floor's registry (dana.train.backends.RUNNERS).
RUNNERS = {_b.module.split(".")[1] for _b in BACKENDS.values()}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(path: Path, known: set[str]) -> set[str]:
    """The dana modules ``path`` imports (``from dana import x`` names the module
    ``dana.x`` when there is one, else the package ``dana``)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, up level - 1
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in known else base)
    return {m for m in found if m == "dana" or m.startswith("dana.")}


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "dana"


GRAPH = {name: imports(path, set(modules())) for name, path in modules().items()}


def importers(target: str) -> dict[str, set[str]]:
    """Which modules import a module of layer ``target``, and which."""
    return {
        m: {i for i in deps if layer(i) == target}
        for m, deps in GRAPH.items()
        if any(layer(i) == target for i in deps) and layer(m) != target
    }


def layer_imports(source: str) -> set[str]:
    """The layers the modules of ``source`` import (itself aside)."""
    return {layer(i) for m, deps in GRAPH.items() if layer(m) == source for i in deps} - {source}


def test_the_reader_sees_every_kind_of_import():
    """The parser finds module-level, lazy and TYPE_CHECKING imports (else the walls
    below would hold trivially)."""
    train = GRAPH["dana.train.training"]
    assert "dana.train.backends" in train and "dana.train.config" in train
    assert "dana.experiments.cli" in GRAPH["dana.cli"]  # a lazy import, inside a function
    assert "dana.errors" in GRAPH["dana.train.task.problem"]  # (only) inside a function
    assert "dana.experiments.grid" in GRAPH["dana.experiments.cli"]  # TYPE_CHECKING too
    assert "dana.algorithms" in GRAPH["dana.train.config"]  # from dana import algorithms
    assert len(GRAPH) > 60


def test_algorithms_import_no_runner_floor_experiments_or_cli():
    assert layer_imports("algorithms") <= {"errors"}, layer_imports("algorithms")


def test_the_simulator_and_the_ray_runtime_never_import_each_other():
    assert "ps" not in layer_imports("sim")
    assert "sim" not in layer_imports("ps")


def test_the_ray_workers_speak_the_protocol_not_the_servers():
    """dana.ps's worker side (the worker and its link to the servers) imports the protocol
    (dana.ps.protocol), never the servers' modules."""
    servers = {"dana.ps.shard", "dana.ps.head", "dana.ps.relay", "dana.ps.recovery"}
    for side in ("dana.ps.worker", "dana.ps.link"):
        assert "dana.ps.protocol" in GRAPH[side], side
        assert not GRAPH[side] & servers, (side, GRAPH[side] & servers)
    assert not GRAPH["dana.ps.protocol"] & servers


def test_the_floor_imports_no_runner():
    """The floor names its runners in its registry (by string) and never imports them."""
    assert not layer_imports("train") & (RUNNERS | {"experiments", "cli", "api", "fitting"})


def test_data_and_models_import_no_algorithm():
    for source in ("data", "models"):
        assert not layer_imports(source) & {"algorithms", "train", "sim", "ps"}, source


def test_nothing_but_the_entry_point_imports_the_cli():
    """``dana.cli`` is the ``dana`` command, reached through pyproject's entry point
    ``dana.launcher`` (which answers ``--version`` without torch); no other module
    imports it."""
    assert 'dana = "dana.launcher:main"' in (ROOT / "pyproject.toml").read_text()
    assert importers("cli") == {"dana.launcher": {"dana.cli"}}


def test_no_import_cycle_between_dana_packages():
    edges: dict[str, set[str]] = {}
    for m, deps in GRAPH.items():
        edges.setdefault(layer(m), set()).update(layer(i) for i in deps if layer(i) != layer(m))
    # The package ``dana`` re-exports the public API (api, sim, algorithms): nothing
    # inside imports it but the command, for its version.
    assert {layer(m) for m, deps in GRAPH.items() if "dana" in deps} <= {"cli"}
    cycle = _find_cycle(edges)
    assert cycle is None, " -> ".join(cycle)


def test_no_import_cycle_between_dana_modules():
    edges = {m: deps - {m} for m, deps in GRAPH.items()}
    # A package's __init__ importing its own modules is no cycle: Python loads them in turn.
    for m in edges:
        if (PACKAGE.parent / m.replace(".", "/") / "__init__.py").exists():
            edges[m] = {d for d in edges[m] if not d.startswith(m + ".")}
    cycle = _find_cycle(edges)
    assert cycle is None, " -> ".join(cycle)


def test_the_runners_stand_on_the_floor_alone():
    """The simulator and the Ray runtime use the floor, the rules and the helpers."""
    for runner in RUNNERS:
        assert layer_imports(runner) <= {"train", "algorithms", "errors", "atomic"}, runner


def _find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


@pytest.mark.parametrize(
    "edges, cycle",
    [
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
        ({"a": {"b"}, "b": {"c"}, "c": set()}, None),
    ],
)
def test_the_cycle_finder_finds_cycles(edges, cycle):
    assert _find_cycle(edges) == cycle


def test_a_runner_from_the_recipe_works_from_dana_train_and_dana_fit(tmp_path, monkeypatch):
    """docs/ARCHITECTURE.md's recipe for a runner: a class on the floor (tests/toy_runner.py)
    and one entry in the registry, and both entries find it: `dana train --backend toy`
    and `dana.fit(backend="toy")`."""
    import json

    import torch

    import dana
    from dana.cli import main
    from dana.train.backends import RUNNERS, Backend
    from dana.train.records.rundir import RunDir

    monkeypatch.setitem(RUNNERS, "toy", Backend("toy_runner", "ToyRun", deterministic=True))
    out = tmp_path / "cli"
    args = ["train", "--backend", "toy", "--dataset", "synthetic", "--model", "mlp",
            "--train-size", "512", "--test-size", "128", "--batch-size", "32", "--workers",
            "3", "--epochs", "2", "--lr", "0.05", "--out", str(out), "--quiet"]  # fmt: skip
    assert main(args) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["pushes"] == 2 * 512 // 32
    assert json.loads((out / "config.json").read_text())["backend"] == "toy"
    # round robin is the simulator on constant timing: the same run
    sim_out = tmp_path / "sim"
    sim_args = [a if a != "toy" else "sim" for a in args]
    sim_args[sim_args.index(str(out))] = str(sim_out)
    assert main([*sim_args, "--timing", "constant"]) == 0
    rows = [(r["updates"], r["test_loss"], r["test_error"]) for r in RunDir(out).read_metrics()]
    assert rows == [
        (r["updates"], r["test_loss"], r["test_error"]) for r in RunDir(sim_out).read_metrics()
    ]
    assert rows[-1][2] < rows[0][2]

    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 6, generator=g)
    y = (x[:, 0] > 0).long()
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    result = dana.fit(model, (x, y), backend="toy", workers=2, epochs=2, batch_size=32, lr=0.05)
    assert result.backend == "toy" and len(result.log) == result.summary["pushes"] == 16
    assert result.summary["final_test_error"] < 0.3
    # the model holds the runner's final parameters
    flat = torch.nn.utils.parameters_to_vector(result.model.parameters())
    assert torch.equal(flat, result.problem.flat.flat)
    assert main(["train", "--backend", "nope", "--out", str(tmp_path / "x"), "--quiet"]) == 2
