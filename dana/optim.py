"""DANA in your own training loop: a master object and ``torch.optim.Optimizer`` workers.

The rules of :mod:`dana.algorithms` (docs/ALGORITHMS.md) driven by your loop instead of
the simulator or the Ray runtime. One :class:`Master` holds the master rule over a flat
copy of the model's parameters; each :class:`Worker` is a ``torch.optim.Optimizer`` over
one replica of the model that, at every ``step()``, turns the replica's gradient into
its rule's message, pushes it to the master and pulls the parameters of its next step
into the replica:

1. ``g = grad + weight_decay * p`` (as ``torch.optim.SGD``; per parameter group);
2. ``message = rule.message(g)`` at the group's learning rate (``rule.set_lr(lr)``);
   ``None`` is a local step (Local-SGD, EASGD): nothing is pushed;
3. ``master.push(rank, message, lr)``, then ``master.pull(rank, lr)`` and the replica
   computes its next gradient at ``rule.compute_at(pulled)``.

The simulator pulls at the rate of the *next* update
(:func:`~dana.train.rules.schedule.next_rate`), which a ``torch.optim.lr_scheduler`` sets
only after ``step()``: :meth:`Worker.repull` after ``scheduler.step()`` makes the pull
again at that rate (it changes what the look-ahead rules pull, ``nag-asgd``,
``dana-zero``, ...; nothing with a constant rate). A rule whose worker rule depends on
the number of workers ``k`` (EASGD's ``alpha = beta/k``) is built for the
:class:`Master`'s ``k``, as ``dana train`` builds it; fed the simulator's gradients in
its order, every asynchronous rule then gives the simulator's parameters bit for bit
(tests/test_api_optim.py).

With DANA-Slim (Hakimi, Barkai, Gabel, Schuster, "Taming Momentum in a Distributed
Asynchronous Environment", arXiv 1907.11612) each worker keeps its momentum ``v_i`` and
sends ``u = g + m*v_i`` after ``v_i = m*v_i + g``; the master does ``Theta -= lr*u``.
With one worker that is exactly ``torch.optim.SGD(momentum=m, nesterov=True)`` (tested:
weight decay and an ``lr_scheduler`` included); with ``k`` workers each gradient is
computed where the master will be when it lands.

One process, one worker per thread::

    >>> import copy, torch, dana.optim
    >>> model = torch.nn.Linear(4, 1)
    >>> master = dana.optim.Master(model.parameters(), algorithm="dana-slim", workers=2, momentum=0.9)
    >>> replica = copy.deepcopy(model)
    >>> worker = dana.optim.Worker(replica.parameters(), master, rank=0, lr=0.1)
    >>> replica(torch.ones(8, 4)).pow(2).mean().backward()
    >>> worker.step(); worker.zero_grad()
    >>> master.load_into(model.parameters())  # the master's parameters, to evaluate

Across processes, give each :class:`Worker` any object with the master's two methods,
``pull(rank, lr, out)`` and ``push(rank, message, lr)`` (a proxy to a :class:`Master`
in a server process, for instance), instead of the master itself.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable
from typing import Any, Protocol

import torch
from torch import Tensor

from dana import algorithms
from dana.algorithms.base import Algorithm, WorkerRule, move_tensors
from dana.train.config import TrainConfig

__all__ = ["Link", "Master", "Worker"]

#: A worker rule's state entry shown under torch's own name in ``state_dict()``:
#: DANA-Slim's ``v`` is ``torch.optim.SGD``'s momentum buffer.
TORCH_NAMES = {"v": "momentum_buffer"}
#: The entries of ``Worker.state_dict()`` beside the rule's: the parameters the worker
#: pulled (per parameter; the simulator's ``sent``) and the rate of that pull (in the
#: first parameter's entry; None after a local step).
PULLED, PULL_LR = "pulled", "pull_lr"


class Link(Protocol):
    """What a :class:`Worker` needs of its master (a :class:`Master`, or a proxy to one)."""

    def pull(self, rank: int, lr: float, out: Tensor) -> Tensor: ...

    def push(self, rank: int, message: Tensor, lr: float) -> bool: ...


def _tensors(params: Iterable[Any] | Tensor) -> list[Tensor]:
    if isinstance(params, Tensor):
        return [params]
    found: list[Tensor] = []
    for p in params:
        if isinstance(p, dict):  # a parameter group
            found += _tensors(p["params"])
        else:
            found.append(p)
    return found


def _for_workers(algorithm: Algorithm, workers: int) -> Algorithm:
    """``algorithm`` built for a run of ``workers`` workers, as ``dana train`` builds it
    (:meth:`~dana.train.config.TrainConfig.algorithm_hparams`): an algorithm whose worker
    rule depends on ``k`` (the elastic-averaging rules' ``alpha = beta/k``) takes it as
    its hyper-parameter ``workers``, since each :class:`Worker` builds the rule of one
    worker only; any other is returned as it is (its master rule takes ``k`` itself)."""
    if _unbound(algorithm):
        return dataclasses.replace(algorithm, workers=workers)
    return algorithm


def _unbound(algorithm: Algorithm) -> bool:
    """Whether ``algorithm`` takes the hyper-parameter ``workers`` and was given none."""
    hparams = algorithm.hparams()
    return "workers" in hparams and hparams["workers"] is None


class Master:
    """The master of one asynchronous run: the master rule of ``algorithm`` over a flat
    copy of ``params``, serving :meth:`pull` and :meth:`push` one at a time (a lock makes
    it safe for worker threads). The defaults are ``dana train``'s
    (:class:`~dana.train.config.TrainConfig`).

    Args:
        params: the model's parameters (or one flat tensor), copied: the master's
            parameters are its own.
        algorithm: a name of ``dana algorithms`` (default ``dana-slim``), or an
            :class:`~dana.algorithms.base.Algorithm`. A synchronous one (``ssgd``) needs
            rounds that threads pushing freely do not make: refused with several workers.
        workers: how many workers will push (``k``; default 8). Every ``k``-dependent
            default of the rule is taken for it, as in the simulator: EASGD's ``alpha =
            beta/k``, Local-SGD's weight ``sqrt(k)/k``, Delayed Nesterov's ``N``,
            SMEGA2's cycle, the concurrency ``C``, Ringmaster's ``R``.
        **hparams: the algorithm's hyper-parameters (``momentum=0.9``).
    """

    def __init__(
        self,
        params: Iterable[Any] | Tensor,
        algorithm: str | Algorithm = TrainConfig.algorithm,
        workers: int = TrainConfig.workers,
        **hparams: Any,
    ):
        if isinstance(algorithm, Algorithm):
            if hparams:
                raise ValueError("give the hyper-parameters to the Algorithm, not to Master")
            self.algorithm = algorithm
        else:
            self.algorithm = algorithms.build(algorithm, **hparams)
        self.algorithm = _for_workers(self.algorithm, workers)
        if self.algorithm.synchronous and workers > 1:
            raise ValueError(
                f"{self.algorithm.name} is synchronous (rounds of k pushes at the same "
                "parameters), which free-running workers do not make; use one worker, or "
                "torch.nn.parallel.DistributedDataParallel for synchronous training"
            )
        tensors = _tensors(params)
        if not tensors:
            raise ValueError("Master got no parameters")
        self.shapes = [tuple(t.shape) for t in tensors]
        with torch.no_grad():
            flat = torch.cat([t.detach().reshape(-1) for t in tensors])
        self.rule = self.algorithm.master(flat, workers)
        self.workers = self.rule.workers
        self._lock = threading.Lock()

    @property
    def d(self) -> int:
        """The number of parameters."""
        return self.rule.d

    def pull(self, rank: int, lr: float, out: Tensor) -> Tensor:
        """Write the parameters worker ``rank`` computes its next gradient at into ``out``."""
        self._check_rank(rank)
        with self._lock:
            return self.rule.pull(rank, lr, out)

    def push(self, rank: int, message: Tensor, lr: float) -> bool:
        """Apply worker ``rank``'s message at learning rate ``lr``; whether the master's
        parameters moved."""
        self._check_rank(rank)
        if message.shape != (self.d,):
            raise ValueError(f"a message must be a flat vector of {self.d}, got {message.shape}")
        with self._lock:
            return self.rule.push(rank, message, lr)

    def params(self) -> Tensor:
        """A copy of the parameters to evaluate, flat (docs/ALGORITHMS.md, "evaluated")."""
        with self._lock:
            return self.rule.params().clone()

    @torch.no_grad()
    def load_into(self, params: Iterable[Any] | Tensor) -> None:
        """Copy the parameters to evaluate into ``params`` (a model's, in the master's order)."""
        tensors = _tensors(params)
        if [tuple(t.shape) for t in tensors] != self.shapes:
            raise ValueError("load_into: the tensors do not match the master's parameters")
        flat = self.params()
        for t, view in zip(tensors, flat.split([t.numel() for t in tensors])):
            t.copy_(view.view_as(t))

    def state_dict(self) -> dict[str, Any]:
        """The algorithm's name and hyper-parameters and the master rule's state."""
        with self._lock:
            return {
                "algorithm": self.algorithm.name,
                "hparams": self.algorithm.hparams(),
                "workers": self.workers,
                "rule": self.rule.state_dict(),
            }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load a state of :meth:`state_dict`, after the Workers are built: a Worker's
        construction pulls, and many master rules record a pull (what they sent, the
        update count: DC-ASGD, the delay-aware rules, ...)."""
        if state.get("algorithm") != self.algorithm.name or state.get("workers") != self.workers:
            raise ValueError(
                f"the state is of {state.get('algorithm')!r} with {state.get('workers')} "
                f"workers; this master runs {self.algorithm.name!r} with {self.workers}"
            )
        with self._lock:
            self.rule.load_state_dict(state["rule"])

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.workers:
            raise ValueError(f"rank must be in 0..{self.workers - 1}, got {rank!r}")


class Worker(torch.optim.Optimizer):
    """One asynchronous worker as a ``torch.optim.Optimizer``: ``loss.backward();
    worker.step()`` pushes this replica's message to the master and pulls its next
    parameters (the module docstring gives the rule). ``state_dict()`` is in torch's
    format, each rule state per parameter (DANA-Slim's ``v`` as ``momentum_buffer``, as
    in ``torch.optim.SGD``), with the parameters the worker pulled (``pulled``): loaded,
    the worker resumes where it was, in the middle of a cycle of local steps too.
    Its parameters are fixed at construction (the master holds as many):
    ``add_param_group`` is refused.

    Args:
        params: the replica's parameters or parameter groups (torch's format); they
            become views of one flat vector (loading the pulled parameters is one copy).
        master: a :class:`Master` (or a :class:`Link` to one); at construction the
            replica takes the master's parameters.
        rank: this worker's number, ``0 .. workers-1``.
        lr: the learning rate (default ``dana train``'s, 0.005; a scheduler sets the
            groups' ``lr``, which must be equal: a message is applied at one rate).
        weight_decay: as ``torch.optim.SGD``'s (default ``dana train``'s, 1e-4). The
            momentum is the algorithm's, given to the :class:`Master`.
        algorithm: only with a :class:`Link` that is not a :class:`Master`, and then
            built for the run's ``k`` (``workers=k`` for the rules that take it).
        speed: this worker's speed over the fastest worker's, for Dynamic Local
            Updates (``dynamic_steps``).
    """

    def __init__(
        self,
        params: Iterable[Any],
        master: Master | Link,
        rank: int = 0,
        lr: float = TrainConfig.lr,
        weight_decay: float = TrainConfig.weight_decay,
        *,
        algorithm: Algorithm | None = None,
        speed: float | None = None,
    ):
        if not lr >= 0.0:
            raise ValueError(f"lr must be >= 0, got {lr!r}")
        if not weight_decay >= 0.0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay!r}")
        self._constructed = False
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay})
        self._constructed = True
        if algorithm is None:
            if not isinstance(master, Master):
                raise ValueError("give algorithm= when the master is a link, not a Master")
            algorithm = master.algorithm
        elif _unbound(algorithm):
            raise ValueError(
                f"{algorithm.name}'s worker rule depends on the number of workers: build "
                f"it for the run's k, algorithms.build({algorithm.name!r}, ..., workers=k)"
            )
        self.master, self.rank, self.algorithm = master, int(rank), algorithm
        tensors = [p for group in self.param_groups for p in group["params"]]
        if len({id(p) for p in tensors}) != len(tensors):
            raise ValueError("a parameter appears twice in the parameter groups")
        if any(not p.is_floating_point() for p in tensors):
            raise ValueError("every parameter must be a floating-point tensor")
        if len({(p.dtype, p.device) for p in tensors}) != 1:
            raise ValueError("every parameter must have one dtype and device")
        self._tensors = tensors
        self._sizes = [p.numel() for p in tensors]
        first = tensors[0]
        d = sum(self._sizes)
        if isinstance(master, Master) and master.d != d:
            raise ValueError(f"the replica has {d} parameters, the master {master.d}")
        with torch.no_grad():
            self._flat = torch.cat([p.detach().reshape(-1) for p in tensors])
            self._grad = torch.zeros_like(self._flat)
        self._message = torch.empty_like(self._flat)
        for p, view, grad in zip(tensors, self._views(self._flat), self._views(self._grad)):
            p.data = view  # the replica's parameters are views of the flat vector
            p.grad = grad
        self.rule: WorkerRule = algorithm.worker(1, d, first.dtype)
        move_tensors(self.rule, first.device)
        if speed is not None:
            self.rule.set_speed(0, speed)
        # A rule that computes at what it pulled: pull straight into the replica.
        self._direct = type(self.rule).compute_at is WorkerRule.compute_at
        self._pulled = self._flat if self._direct else torch.empty_like(self._flat)
        #: the rate of the pull the next computation starts from (None: a local step)
        self._pull_lr: float | None = None
        self._pull()

    # -- flat vectors ------------------------------------------------------------------
    def _views(self, flat: Tensor) -> list[Tensor]:
        return [v.view_as(p) for p, v in zip(self._tensors, flat.split(self._sizes))]

    def _group_slices(self) -> list[tuple[int, int, dict[str, Any]]]:
        out, start = [], 0
        for group in self.param_groups:
            n = sum(p.numel() for p in group["params"])
            out.append((start, start + n, group))
            start += n
        return out

    def _lr(self) -> float:
        rates = {float(g["lr"]) for g in self.param_groups}
        if len(rates) != 1:
            raise ValueError(
                f"the parameter groups have learning rates {sorted(rates)}; a worker's "
                "message is applied at one rate: give every group the same lr"
            )
        return rates.pop()

    @torch.no_grad()
    def _gather_grads(self) -> None:
        """Make ``_grad`` hold every parameter's gradient (a copy only for a gradient
        that is no longer this worker's view: set to None, or replaced)."""
        for p, view in zip(self._tensors, self._views(self._grad)):
            g = p.grad
            if g is None:
                view.zero_()
            elif g.data_ptr() != view.data_ptr() or g.shape != view.shape:
                view.copy_(g)
            p.grad = view

    def _pull(self) -> None:
        lr = self._lr()
        with torch.no_grad():
            self.master.pull(self.rank, lr, self._pulled)
            self._compute_at()
        self._pull_lr = lr

    def _compute_at(self) -> None:
        p = self.rule.compute_at(0, self._pulled)
        if p is not self._flat:
            self._flat.copy_(p)

    # -- torch.optim.Optimizer ---------------------------------------------------------
    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """Push this replica's message and pull its next parameters (a local step, for
        the rules that take them, pushes nothing and keeps the worker's own)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        lr = self._lr()
        self._gather_grads()
        message = self._message
        for start, end, group in self._group_slices():
            g, p, out = self._grad[start:end], self._flat[start:end], message[start:end]
            if group["weight_decay"]:
                torch.add(g, p, alpha=group["weight_decay"], out=out)
            else:
                out.copy_(g)
        self.rule.set_lr(lr)
        sent = self.rule.message(0, message)
        if sent is None:  # a local step: compute again from the worker's own parameters
            self._compute_at()
            self._pull_lr = None
            return loss
        self.master.push(self.rank, sent, lr)
        self._pull()
        return loss

    def repull(self) -> bool:
        """Make the last pull again at the groups' rate now, if it changed since: call it
        after ``scheduler.step()`` (before the next forward pass) to pull at the rate of
        the next step, as the simulator does
        (:func:`~dana.train.rules.schedule.next_rate`). The look-ahead rules' pulls depend
        on the rate (``nag-asgd``, ``dana-zero``, ``dana-dc``, ``dana-ga``, ``gap-aware``,
        ``lwp-asgd``); with one master and the workers stepped in turn the pull is the
        simulator's exactly. After a local step the worker pulled nothing (it computes
        from its own parameters): nothing to redo. Returns whether it pulled."""
        if self._pull_lr is None or self._pull_lr == self._lr():
            return False
        self._pull()
        return True

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Torch's, while the constructor takes the groups; refused afterwards: the
        parameters are views of one flat vector, and the master holds as many."""
        if self._constructed:
            raise ValueError(
                "a dana.optim.Worker's parameters are fixed at construction (the Master "
                "holds as many): give every parameter group to Worker(...), and the same "
                "parameters to Master(...), when you build them"
            )
        super().add_param_group(param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the gradients (in the flat buffer the parameters' ``.grad`` view; torch's
        ``set_to_none`` would break that view, so it zeroes instead)."""
        with torch.no_grad():
            self._grad.zero_()
        for p, view in zip(self._tensors, self._views(self._grad)):
            p.grad = view

    # -- state in torch's format -------------------------------------------------------
    def _rule_entries(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        """The rule's state: per-element tensors (one value per parameter, by name) and
        the rest (counters)."""
        d = self._flat.numel()
        per_element, rest = {}, {}
        for key, value in self.rule.state_dict().items():
            if isinstance(value, Tensor) and value.is_floating_point() and value.shape[-1] == d:
                per_element[key] = value.reshape(-1, d)[0]
            else:
                rest[key] = value
        return per_element, rest

    def state_dict(self) -> dict[str, Any]:
        per_element, rest = self._rule_entries()
        pulled = self._pulled.clone().split(self._sizes)
        self.state.clear()
        for i, p in enumerate(self._tensors):
            entry: dict[str, Any] = {}
            for key, value in per_element.items():
                entry[TORCH_NAMES.get(key, key)] = value.split(self._sizes)[i].view_as(p)
            entry[PULLED] = pulled[i].view_as(p)
            if i == 0:
                entry.update({f"rule.{key}": value for key, value in rest.items()})
                entry[PULL_LR] = self._pull_lr
            self.state[p] = entry
        try:
            return super().state_dict()
        finally:
            self.state.clear()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        per_element, rest = self._rule_entries()
        loaded: dict[str, Any] = {}
        for key, current in per_element.items():
            name = TORCH_NAMES.get(key, key)
            parts = [self.state[p][name].reshape(-1) for p in self._tensors]
            loaded[key] = torch.cat(parts).reshape(current.shape).to(current)
        for key in rest:
            loaded[key] = self.state[self._tensors[0]][f"rule.{key}"]
        held = self.rule.state_dict()
        for key, value in loaded.items():
            if isinstance(held[key], Tensor):
                loaded[key] = value.reshape(held[key].shape).to(held[key])
        self.rule.load_state_dict(loaded)
        first = self.state[self._tensors[0]]
        if PULLED in first:  # (a torch.optim.SGD state has none: keep this worker's pull)
            with torch.no_grad():
                parts = [self.state[p][PULLED].reshape(-1) for p in self._tensors]
                torch.cat(parts, out=self._pulled)
                self._compute_at()
            self._pull_lr = first[PULL_LR]
        self.state.clear()
