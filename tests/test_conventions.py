"""The conventions every algorithm keeps (docs/ARCHITECTURE.md, "A new algorithm").

- Each master and worker rule has a docstring that states its rule and its reference.
- The arithmetic the functional core (``dana/algorithms/functional.py``) writes once is
  not written again in a rule module: the momentum update ``v.mul_(m).add_(g)``, the
  look-ahead pull ``torch.add(self.theta, v, alpha=..., out=...)`` and DANA's sum
  update ``S.add_(v, alpha=m - 1).add_(g)``.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from pathlib import Path

import dana.algorithms as A
from dana.algorithms.base import MasterRule, WorkerRule

RULE_MODULES = sorted(
    Path(A.__file__).parent / f"{m.name}.py"
    for m in pkgutil.iter_modules(A.__path__)
    if m.name not in ("functional", "base")
)
#: A reference names its year (a paper's, or an arXiv number's, which starts with it).
REFERENCE = re.compile(r"\b(19|20)\d\d\b")


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
