"""The conventions every algorithm keeps (docs/ARCHITECTURE.md, "Recipes": an algorithm).

- Its hyper-parameters are data: the fields of a frozen dataclass (type and default),
  validated in ``__post_init__``; everything that lists or types them reads the fields.
- Each master and worker rule has a docstring that states its rule and its reference.
- The arithmetic the functional core (``dana/algorithms/functional.py``) writes once is
  not written again in a rule module: the momentum update ``v.mul_(m).add_(g)``, the
  look-ahead pull ``torch.add(self.theta, v, alpha=..., out=...)`` and DANA's sum
  update ``S.add_(v, alpha=m - 1).add_(g)``.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import dana.algorithms as A
from dana.algorithms.base import Algorithm, MasterRule, WorkerRule
from dana.errors import ConfigError
from dana.train.config import TrainConfig

RULE_MODULES = sorted(
    Path(A.__file__).parent / f"{m.name}.py"
    for m in pkgutil.iter_modules(A.__path__)
    if m.name not in ("functional", "base")
)
#: A reference names its year (a paper's, or an arXiv number's, which starts with it).
REFERENCE = re.compile(r"\b(19|20)\d\d\b")


# -- hyper-parameters as data ---------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(A.ALGORITHMS))
def test_hparams_are_the_fields_of_a_frozen_dataclass(name):
    cls = A.get(name)
    assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen
    fields = {f.name: f for f in dataclasses.fields(cls)}
    assert A.hparam_names(name) == list(fields)
    assert A.hparam_defaults(name) == A.build(name).hparams()
    assert set(A.hparam_types(name)) == set(fields)
    # No class attribute of Algorithm (name, elementwise, ...) was made a field, and no
    # field was declared without the decorator (it would be a plain class attribute).
    assert not set(fields) & set(Algorithm.__annotations__)
    for klass in cls.__mro__:
        declared = {
            key
            for key, kind in vars(klass).get("__annotations__", {}).items()
            if "ClassVar" not in str(kind)
        }
        assert declared <= set(fields), (klass.__name__, declared - set(fields))
    algorithm = A.build(name)
    for key in fields:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(algorithm, key, getattr(algorithm, key))
    assert A.build(name) == algorithm and hash(A.build(name)) == hash(algorithm)


def test_a_variant_redeclares_one_default():
    from dana.algorithms.local_sgd import OuterMomentumAlgorithm

    base = {f.name: f.default for f in dataclasses.fields(OuterMomentumAlgorithm)}
    nesterov = A.hparam_defaults("local-nesterov")
    assert {k for k in nesterov if nesterov[k] != base[k]} == {"outer_lr"}
    assert A.build("local-nesterov").outer_lr == 0.07
    assert repr(A.build("dana-slim", momentum=0)) == "DanaSlim(momentum=0.0)"  # normalised


def test_the_config_types_hparams_from_the_fields():
    assert A.hparam_types("ssgd") == {"momentum": float, "nesterov": bool}
    assert A.hparam_types("local-dn")["period"] == int | None

    def check(name, **params):
        TrainConfig(algorithm=name, algorithm_params=params).validate()

    with pytest.raises(ConfigError, match="smega2: hyper-parameter advanced must be true or"):
        check("smega2", advanced="yes")
    with pytest.raises(ConfigError, match="hyper-parameter local_steps must be a number"):
        check("local-sgd", local_steps="4")
    with pytest.raises(ConfigError, match="hyper-parameter lc must be a number"):
        check("dc-asgd", lc=float("nan"))
    with pytest.raises(ConfigError, match=r"period must be an integer >= 1 .*'2'"):
        check("local-dn", period="2")  # int | None: the algorithm's own check says it
    check("local-dn", period=2, c=1, dynamic_steps=True)


# -- rules: their docstrings, and the functional core ---------------------------------------
def _rules() -> list[type]:
    for module in RULE_MODULES:
        importlib.import_module(f"dana.algorithms.{module.stem}")
    found, todo = set(), [MasterRule, WorkerRule]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub.__module__.startswith("dana.algorithms.") and sub not in found:
                found.add(sub)
                todo.append(sub)
    return sorted(found, key=lambda c: (c.__module__, c.__name__))


def test_every_rule_states_its_rule_and_reference():
    rules = _rules()
    registered = {c.master_rule for c in A.ALGORITHMS.values()}
    registered |= {c.worker_rule for c in A.ALGORITHMS.values()} - {WorkerRule}
    assert registered <= set(rules)
    for rule in rules:
        doc = rule.__dict__.get("__doc__") or ""  # its own, not inherited
        assert len(doc.split()) >= 12, f"{rule.__qualname__} has no docstring stating its rule"
        assert REFERENCE.search(doc), f"{rule.__qualname__}'s docstring names no reference"


def _rewrites_of_the_core(source: str) -> list[tuple[int, str]]:
    """``(line, what)`` for each place that writes one of the core's expressions."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        method, receiver = node.func.attr, node.func.value
        keywords = {k.arg: k.value for k in node.keywords}
        inner = receiver.func if isinstance(receiver, ast.Call) else None
        # v.mul_(m).add_(g): momentum_update
        if (
            method == "add_"
            and isinstance(inner, ast.Attribute)
            and inner.attr == "mul_"
            and isinstance(inner.value, ast.Name | ast.Attribute)
        ):
            found.append((node.lineno, "momentum_update"))
        # S.add_(v, alpha=m - 1).add_(g): momentum_sum
        alpha = keywords.get("alpha")
        if (
            method == "add_"
            and isinstance(alpha, ast.BinOp)
            and isinstance(alpha.op, ast.Sub)
            and isinstance(alpha.right, ast.Constant)
            and alpha.right.value == 1
        ):
            found.append((node.lineno, "momentum_sum"))
        # torch.add(self.theta, v, alpha=..., out=...): nesterov_pull
        if (
            method == "add"
            and isinstance(receiver, ast.Name)
            and receiver.id == "torch"
            and {"alpha", "out"} <= set(keywords)
            and node.args
            and ast.unparse(node.args[0]) == "self.theta"
        ):
            found.append((node.lineno, "nesterov_pull"))
    return sorted(found)


def test_rule_modules_call_the_functional_core():
    rewrites = [
        f"{module.name}:{line} writes {what} again (call dana.algorithms.functional.{what})"
        for module in RULE_MODULES
        for line, what in _rewrites_of_the_core(module.read_text())
    ]
    assert not rewrites, "\n".join(rewrites)


def test_the_scan_finds_a_rewrite():
    """The scan can fail: the expressions as they stood before the rules called the core."""
    source = (
        "def push(self, message, lr):\n"
        "    self.v.mul_(self.momentum).add_(message)\n"
        "    self.S.add_(v, alpha=self.mu - 1.0).add_(message)\n"
        "    return torch.add(self.theta, self.S, alpha=-lr * self.mu, out=out)\n"
    )
    assert [what for _, what in _rewrites_of_the_core(source)] == [
        "momentum_update",
        "momentum_sum",
        "nesterov_pull",
    ]
