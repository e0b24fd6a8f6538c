"""The contract every algorithm fulfils: a master rule and a worker rule over flat tensors.

An asynchronous algorithm is driven by three events (ALGORITHMS.md, "Master and worker
rules"), whoever drives it (the simulator or the Ray runtime):

1. pull: ``master.pull(i, lr, out)`` writes into ``out`` the parameters worker ``i``
   computes its next gradient at;
2. the worker computes ``g = grad f(p_i) + wd * p_i`` at ``p = workers.compute_at(i,
   pulled)`` and turns it into a message with ``workers.set_lr(lr)`` then
   ``workers.message(i, g)`` (``None``: a local step, nothing is pushed);
3. push: ``master.push(i, message, lr)`` applies it, and says whether the master's
   parameters moved (a synchronous master moves once every ``k`` pushes).

A rule sees no time. The one thing a runner tells it of the workers' speeds, when the
algorithm asks (``uses_speed``), is each worker's speed relative to the fastest
(``workers.set_speed(i, s_i)``, once, before the first event): Dynamic Local Updates
size a worker's local phase by it.

Membership (ALGORITHMS.md, "Workers that leave and join"): a worker may leave the run (a
preempted machine) and join it again later. The runner then calls
``master.leave(i, lr)`` and ``workers.leave(i)``: worker ``i``'s computation in flight
is lost (the master never receives that push) and its own state with it; the rules drop
or fold what they keep for it. When it comes back the runner calls ``master.join(i)``
and ``workers.join(i)``, and the worker pulls afresh, as at the start. The defaults do
nothing (a rule that keeps nothing per worker); a rule that keeps per-worker state
states its choice in its docstring.

An :class:`Algorithm` is a frozen dataclass of its hyper-parameters (typed fields with
defaults, validated in ``__post_init__``) that builds the two rules. A master rule holds
the master's state for a flat parameter vector (or a contiguous shard of one, when the
algorithm is ``elementwise``); a worker rule holds the state of ``n`` workers as one
``(n, d)`` tensor (the simulator builds one for all ``k`` workers, a Ray worker one for
itself).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

#: Elements per block for a rule that makes several element-wise passes over the same
#: vectors: a block of 64K float32 values (256 KiB per vector) stays in the L2 cache
#: between passes (docs/BENCHMARKS.md, section 1, measures what it saves).
BLOCK = 65536


def blocks(t: Tensor) -> tuple[Tensor, ...]:
    """``t`` in blocks of :data:`BLOCK` values on the CPU, where a block stays in the
    cache between passes; whole on a GPU, where each block would cost a kernel launch
    per pass (element-wise passes: the same result either way)."""
    return t.split(BLOCK) if t.device.type == "cpu" else (t,)


def move_tensors(rule: Any, device: torch.device) -> None:
    """Move every tensor attribute of ``rule`` (a master or worker rule) to ``device``
    (the rules build their state on their parameters' device, or the CPU)."""
    for key, value in vars(rule).items():
        if isinstance(value, torch.Tensor) and value.device != device:
            setattr(rule, key, value.to(device))


def per_worker_zeros(
    workers: int, d: int, dtype: torch.dtype = torch.float32, device: torch.device | None = None
) -> Tensor:
    """A ``(workers, d)`` tensor of zeros, the layout of all per-worker state, whose rows
    each start on a 64-byte boundary (a cache line).

    Row ``i`` of a packed ``(k, d)`` tensor starts ``i*d`` elements in: unless ``d`` is a
    multiple of 16 float32 values most rows are misaligned, and torch's vector kernels
    and the model's matrix products at a worker's row run slower (measured: 1% of a
    small CNN's step; docs/BENCHMARKS.md, section 1). Each row is contiguous; the
    tensor as a whole is not (rows are padded).
    """
    per_line = max(1, 64 // torch.empty((), dtype=dtype).element_size())
    padded = -(-d // per_line) * per_line
    return torch.zeros(workers, padded, dtype=dtype, device=device)[:, :d]


def check_momentum(momentum: float) -> float:
    if not 0.0 <= momentum < 1.0:
        raise ValueError(f"momentum must be in [0, 1), got {momentum!r}")
    return float(momentum)


def check_decay(name: str, value: float) -> float:
    """A decay (of a moving average, or an inner optimizer's momentum) in ``[0, 1)``."""
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {value!r}")
    return float(value)


def check_nonnegative(name: str, value: float) -> float:
    if not value >= 0.0:  # also rejects NaN
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return float(value)


def check_positive(name: str, value: float) -> float:
    if not value > 0.0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return float(value)


def check_count(name: str, value: int) -> int:
    """``value``, an integer >= 1 (workers, a step count, a period), or ValueError naming
    ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return value


def check_workers(workers: int) -> int:
    return check_count("workers", workers)


def check_params(params: Tensor) -> Tensor:
    if not isinstance(params, Tensor) or params.dim() != 1:
        raise ValueError("params must be a flat (1-D) tensor; flatten the model first")
    if not params.is_floating_point():
        raise ValueError(f"params must be a floating-point tensor, got {params.dtype}")
    return params


class MasterRule:
    """The master's side of an algorithm: its state and how it serves pulls and pushes."""

    #: Names of the attributes that make up the rule's state (tensors or numbers).
    state_keys: ClassVar[tuple[str, ...]] = ("theta",)

    def __init__(self, params: Tensor, workers: int):
        self.workers = check_workers(workers)
        self.theta = check_params(params).detach().clone()

    @property
    def d(self) -> int:
        return self.theta.numel()

    def per_worker_zeros(self) -> Tensor:
        """A ``(workers, d)`` state tensor of zeros, like ``theta`` (:func:`per_worker_zeros`)."""
        return per_worker_zeros(self.workers, self.d, self.theta.dtype, self.theta.device)

    def pull(self, worker: int, lr: float, out: Tensor) -> Tensor:
        """Write the parameters ``worker`` computes at into ``out`` and return it."""
        return out.copy_(self.theta)

    def push(self, worker: int, message: Tensor, lr: float) -> bool:
        """Apply ``worker``'s message; return True if the master's parameters moved."""
        raise NotImplementedError

    def leave(self, worker: int, lr: float) -> bool:
        """Worker ``worker`` has left the run: its push in flight will never come.

        Called once per departure, between events (never inside a pull or push), with
        the rate a push would have now. The rule drops or folds what it keeps for that
        worker (its docstring says how). Returns True when the master's parameters
        moved as an update (a synchronous master whose round the departure completes);
        False otherwise, also when a rule folds state into its parameters without
        applying a gradient. The default keeps nothing per worker: nothing to do.
        """
        return False

    def join(self, worker: int) -> None:
        """Worker ``worker``, which left, is back; its next event is a fresh pull.

        The default keeps nothing per worker: nothing to do.
        """

    def params(self) -> Tensor:
        """The parameters to evaluate (ALGORITHMS.md, column "evaluated params")."""
        return self.theta

    def gap_reference(self) -> Tensor:
        """The master's parameters as stored, before any worker-held correction.

        For every rule but ``dana-slim`` these are the true parameters ``theta``; the
        gap is measured against them (ALGORITHMS.md, "Measures of staleness").
        """
        return self.theta

    def state_dict(self) -> dict[str, Any]:
        """The state for a checkpoint: tensors and plain numbers, by name."""
        return _state_dict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _load_state_dict(self, state)


class RemembersPulls:
    """Mixin for a master that keeps, in ``sent`` (``(k, d)``), the parameters it last
    sent each worker (DC-ASGD's and Gap-Aware's ``p_i``). Put it before the master rule
    whose pull it extends: ``class M(RemembersPulls, SomeMaster)``."""

    sent: Tensor

    def pull(self, worker: int, lr: float, out: Tensor) -> Tensor:
        self.peek(worker, lr, out)
        self.sent[worker].copy_(out)
        return out

    def peek(self, worker: int, lr: float, out: Tensor) -> Tensor:
        """What a pull of ``worker`` would send now, without recording it."""
        return super().pull(worker, lr, out)  # type: ignore[misc]

    def leave(self, worker: int, lr: float) -> bool:
        """A departed worker has no pull outstanding: its ``p_i`` is zeroed (its next
        pull, after it joins, records a new one)."""
        self.sent[worker].zero_()
        return super().leave(worker, lr)  # type: ignore[misc]


class WorkerRule:
    """The workers' side: turns a gradient into the message pushed to the master.

    The default sends the gradient itself and keeps no state.
    """

    state_keys: ClassVar[tuple[str, ...]] = ()
    #: True when :meth:`message` may return ``None`` (a local step): a runner then learns
    #: whether a computation is pushed only by making its message.
    local_steps: ClassVar[bool] = False

    def __init__(self, workers: int, d: int, dtype: torch.dtype = torch.float32):
        self.workers = check_workers(workers)
        self.d = d
        self.dtype = dtype

    def compute_at(self, worker: int, pulled: Tensor) -> Tensor:
        """The parameters ``worker`` computes its next gradient at, given what it pulled.

        The default is the pulled parameters. A rule whose workers keep parameters of
        their own (local steps, as in EASGD) returns those.
        """
        return pulled

    def set_lr(self, lr: float) -> None:
        """Receive the learning rate of the step about to be turned into a message.

        Every runner calls it just before each :meth:`message`, with the ``lr`` it then
        passes to the master's push. Rules whose workers take steps of their own (EASGD's
        local steps) keep it; the default ignores it.
        """

    def set_speed(self, worker: int, speed: float) -> None:
        """Receive ``worker``'s speed relative to the fastest worker's, in ``(0, 1]``.

        Every runner calls it once per worker it holds, before the first computation,
        when the algorithm's :attr:`Algorithm.uses_speed` is True: the simulator from
        its timing model, a Ray worker from the same model with ``--time-scale``
        (:func:`dana.train.cluster.timing.relative_speeds`). Rules whose work per push depends
        on it (Dynamic Local Updates) keep it; the default ignores it.
        """

    def leave(self, worker: int) -> None:
        """Worker ``worker`` has left the run: its state is lost (a preempted machine's
        memory), and the rule resets it to the initial state. The default keeps no
        state: nothing to do."""

    def join(self, worker: int) -> None:
        """Worker ``worker`` is back, as a fresh worker (its state as at the start); its
        next event is a pull. The default: nothing to do."""

    def message(self, worker: int, grad: Tensor) -> Tensor | None:
        """Turn ``worker``'s gradient into the message it pushes.

        ``None`` means a local step: nothing is pushed, and the worker computes again
        without pulling. The default sends the gradient itself. A rule may write the
        message over ``grad`` and return it (no copy of ``d`` values): pass a gradient
        the caller no longer needs.
        """
        return grad

    def theta_offset(self, lr: float) -> Tensor | None:
        """What to add to the master's stored parameters to get the true ``theta``.

        ``None`` when the master's parameters are the true ones. Only defined when this
        rule holds every worker's state (in the simulator).
        """
        return None

    def true_params(self, stored: Tensor, lr: float, out: Tensor) -> Tensor:
        """The master's true ``theta``: ``stored`` (the master's parameters as stored)
        plus :meth:`theta_offset`, written into ``out`` when there is an offset."""
        offset = self.theta_offset(lr)
        return stored if offset is None else torch.add(stored, offset, out=out)

    def state_dict(self) -> dict[str, Any]:
        return _state_dict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _load_state_dict(self, state)


class LocalStepWorkers(WorkerRule):
    """Workers with parameters ``x_i`` of their own that take local steps (EASGD's, Zhang
    et al., NIPS 2015; asynchronous Local-SGD's, Liu et al. 2024): a worker whose step counter ``t_i`` is 0 starts again from what it pulls;
    :attr:`pulled` keeps the parameters it read at its last pull (EASGD's center, the
    start of a Local SGD cycle); a step takes the rate of :meth:`set_lr` (:meth:`step_lr`)."""

    local_steps = True

    def __init__(self, workers: int, d: int, dtype: torch.dtype = torch.float32):
        super().__init__(workers, d, dtype)
        self.x = per_worker_zeros(workers, d, dtype)
        self.t = torch.zeros(workers, dtype=torch.int64)  # local steps taken
        self.lr: float | None = None  # set by the runner before every message
        self.pulled: Tensor | None = None

    def set_lr(self, lr: float) -> None:
        self.lr = float(lr)

    def compute_at(self, worker: int, pulled: Tensor) -> Tensor:
        if int(self.t[worker]) == 0:
            self.x[worker].copy_(pulled)
        self.pulled = pulled
        return self.x[worker]

    def step_lr(self) -> float:
        """The rate of the step in hand; RuntimeError when the runner has set none."""
        if self.lr is None:
            raise RuntimeError(
                "the runner must call set_lr(lr) before message(): local steps need it"
            )
        return self.lr


@dataclass(frozen=True, kw_only=True)
class Algorithm:
    """Hyper-parameters of one algorithm, and a factory for its master and worker rules.

    An algorithm is a frozen dataclass: its fields are its hyper-parameters (type and
    default), which ``__post_init__`` validates (a ``ValueError`` that names the bad
    value) and normalises; its class attributes say what it is (``name``, ``summary``,
    ``master_rule``, ``worker_rule``, ...). A subclass that declares fields is itself
    decorated ``@dataclass(frozen=True, kw_only=True)``::

        @dataclass(frozen=True, kw_only=True)
        class DanaDc(MomentumAlgorithm):  # MomentumAlgorithm: the field momentum = 0.9
            name = "dana-dc"
            summary = "DANA-Zero plus DC-ASGD delay compensation"
            master_rule = DanaDcMaster

            lc: float = 2.0

            def __post_init__(self) -> None:
                super().__post_init__()
                self._set(lc=check_nonnegative("lc", self.lc))

    A variant subclasses the algorithm it varies and redeclares the field whose default
    it changes (``local-nesterov``'s ``outer_lr``); a subclass that adds no field needs
    no decorator.
    """

    name: ClassVar[str]
    summary: ClassVar[str]
    #: True when the master applies one update per round of ``k`` pushes computed at
    #: the same parameters (runners then drive rounds instead of a free-running queue).
    synchronous: ClassVar[bool] = False
    #: True when the master rule works per contiguous shard of the parameters unchanged
    #: (its state and arithmetic are per element), so that sharded parameter servers
    #: (``--servers S``) each run it on their slice; False when it needs the whole vector
    #: (global norms, dot products), which the configuration then refuses to shard (--servers 1).
    elementwise: ClassVar[bool] = True
    master_rule: ClassVar[type[MasterRule]]
    worker_rule: ClassVar[type[WorkerRule]] = WorkerRule
    #: True when the worker rule needs each worker's relative speed
    #: (:meth:`WorkerRule.set_speed`); runners then give it.
    uses_speed: ClassVar[bool] = False

    @property
    def round_steps(self) -> int:
        """A synchronous rule's gradient computations per worker in a round: 1 (``ssgd``),
        or its local steps and push (``diloco``'s ``local_steps``)."""
        return 1

    def __post_init__(self) -> None:
        """Validate the hyper-parameters: a subclass calls ``super().__post_init__()``,
        then checks its own fields and stores their normalised values with :meth:`_set`."""

    def _set(self, **values: Any) -> None:
        """Store validated values in ``__post_init__`` (the instance is frozen)."""
        for key, value in values.items():
            object.__setattr__(self, key, value)

    def hparams(self) -> dict[str, Any]:
        """The algorithm's hyper-parameters, by name (its dataclass fields)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def master(self, params: Tensor, workers: int) -> MasterRule:
        return self.master_rule(params, workers, **self._master_hparams())

    def _master_hparams(self) -> dict[str, Any]:
        """The hyper-parameters the master rule takes (all of them, unless a rule's
        master needs fewer: no rule takes one it does not use)."""
        return self.hparams()

    def worker(self, workers: int, d: int, dtype: torch.dtype = torch.float32) -> WorkerRule:
        return self.worker_rule(workers, d, dtype, **self._worker_hparams())

    def _worker_hparams(self) -> dict[str, Any]:
        """The hyper-parameters the worker rule takes (the default rule: none)."""
        return {}


@dataclass(frozen=True, kw_only=True)
class MomentumAlgorithm(Algorithm):
    """An algorithm with a momentum ``m`` in ``[0, 1)``, 0.9 by default as for every
    momentum method here (``dana train --momentum`` sets it)."""

    momentum: float = 0.9

    def __post_init__(self) -> None:
        super().__post_init__()
        self._set(momentum=check_momentum(self.momentum))


def _state_dict(rule: MasterRule | WorkerRule) -> dict[str, Any]:
    state = {}
    for key in rule.state_keys:
        value = getattr(rule, key)
        if value is not None:
            state[key] = value.clone() if isinstance(value, Tensor) else value
    return state


def _load_state_dict(rule: MasterRule | WorkerRule, state: dict[str, Any]) -> None:
    expected = {k for k in rule.state_keys if getattr(rule, k) is not None}
    if set(state) != expected:
        raise ValueError(
            f"{type(rule).__name__} state has keys {sorted(state)}, expected {sorted(expected)}"
        )
    for key, value in state.items():
        current = getattr(rule, key)
        if isinstance(current, Tensor):
            if tuple(current.shape) != tuple(value.shape):
                raise ValueError(
                    f"{type(rule).__name__} state {key!r} has shape {tuple(value.shape)}, "
                    f"expected {tuple(current.shape)}"
                )
            current.copy_(value)
        else:
            setattr(rule, key, type(current)(value))
