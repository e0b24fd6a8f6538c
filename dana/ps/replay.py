"""``dana replay RUN_DIR``: a Ray run's final parameters rebuilt in one process, without Ray.

Every server shard runs the calls the head passed on, in the head's order, and nothing
else (:mod:`dana.ps.recovery`); the run records them (``replay.npz``,
:mod:`dana.ps.calls`): per call its method and worker, a pull's join and the worker's
incarnation, a push's number and its batch's place in its worker's stream. From these
and ``config.json`` the replay rebuilds the run: each shard a
:class:`~dana.ps.shard.ShardServer` built from the run's own arguments
(:func:`~dana.ps.settings.server_args`; shard 0 runs the calls as its standby does: the
head's gate and relay only decide which calls there are), each worker process a
:class:`ReplayedWorker` (its rule, codec and batch stream, fresh per incarnation, as a
restarted Ray worker's), and runs the calls in order, each through
:meth:`~dana.ps.shard.ShardServer.relayed`:

- a pull: every shard serves it; its worker keeps the parameters and the rate (a worker
  computes at its latest pull: one snapshot per worker process is all the replay keeps);
- a push: its worker takes the step its Ray process took (:meth:`ReplayedWorker.step`)
  and every shard applies its part (after a local step the worker's rate is the head's);
- a member call (a worker gone, a worker added) and a stop: every shard runs it.

The order is causal (a push follows its worker's pull), so the results are the run's bit
for bit on the same machine and dtype. :func:`replay_run` compares them with the run's
``model.safetensors``.

A resumed run is replayed part by part: each part up to the call that reached its
checkpoint (the book goes into every checkpoint), then every shard built again from its
own state, as the resumed run's were from the checkpoint, and every worker a new process.

Not replayed (:class:`~dana.errors.DanaError`, exit status 2, saying why): a run of
another backend, of a synchronous rule, on an emulated cluster (a departure loses the
step under way), resumed from a checkpoint without the record, of a user's problem
(``dana.fit``), or without ``replay.npz``.
"""

from __future__ import annotations

import inspect
import math
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from dana.algorithms.base import Algorithm
from dana.errors import DanaError
from dana.ps.calls import METHODS, REPLAY_FILE
from dana.ps.delay import worker_speed
from dana.ps.layout import Layout
from dana.ps.protocol import Call, Member, Method, Pull, Push, Status, split
from dana.ps.settings import server_args
from dana.ps.shard import ShardServer
from dana.ps.steps import PushMaker
from dana.train.config import TrainConfig
from dana.train.records.rundir import RunDir
from dana.train.task.batches import stream_seed
from dana.train.task.problem import Problem

__all__ = [
    "Replay",
    "Replayed",
    "ReplayedWorker",
    "Verdict",
    "replay",
    "replay_command",
    "replay_run",
]


class ReplayedWorker:
    """One process of worker ``index`` (its ``incarnation``-th), as
    :class:`~dana.ps.worker.Worker` sets it up: a fresh worker rule, its pushes'
    :class:`~dana.ps.steps.PushMaker` (codec residual from zero), its batch stream; the
    parameters and rate of its latest pull."""

    def __init__(
        self,
        config: TrainConfig,
        problem: Problem,
        algorithm: Algorithm,
        index: int,
        incarnation: int,
    ):
        rule = algorithm.worker(1, problem.flat.d, getattr(torch, config.dtype))
        if algorithm.uses_speed:
            rule.set_speed(0, worker_speed(config, index))
        self.index, self.incarnation = index, incarnation
        self.maker = PushMaker(config, index, problem, rule)
        self.stream = problem.batches(stream_seed(config.seed, index, incarnation), worker=index)
        self.drawn = 0
        self.params: Tensor | None = None
        self.lr = math.nan

    def pulled(self, params: Tensor, lr: float) -> None:
        self.params, self.lr = params, lr

    def step(self, seq: int, batch: int) -> Push:
        """The push numbered ``seq`` on the stream's batch ``batch``, at the latest pull,
        as :meth:`dana.ps.worker.Worker._step` makes it."""
        if self.params is None:
            raise DanaError(f"worker {self.index}: push {seq} before any pull in the record")
        if batch >= 0 and batch != self.drawn:
            raise DanaError(
                f"worker {self.index} (process {self.incarnation}): push {seq} is on batch "
                f"{batch} of its stream, the replay's next is {self.drawn}: a step under "
                "way was lost (an emulated departure), which the record cannot rebuild"
            )
        data = self.stream.next()
        self.drawn += 1
        return self.maker.push(self.params, data, self.lr, seq, batch)


class Replayed(NamedTuple):
    """What :func:`replay` rebuilt: the final parameters, and counts of the calls run,
    the pushes applied and the worker processes."""

    params: Tensor
    calls: int
    pushes: int
    processes: int


def replay(config: TrainConfig, calls: dict[str, np.ndarray]) -> Replayed:
    """Run the recorded ``calls`` (:meth:`dana.ps.calls.CallBook.arrays`) on fresh shards
    and workers of ``config``'s run (the module docstring), part by part (a resumed
    run: each part up to the checkpoint the next one resumed from). DanaError if the
    record and the replay part ways."""
    run = Replay(config)
    columns = [calls[name].tolist() for name in ("number", "method", "worker", "arg", "more")]
    starts = [int(x) for x in calls["segments"]]
    cuts = [int(x) for x in calls["cuts"]]
    for part, (start, stop) in enumerate(zip(starts, [*starts[1:], len(columns[0])])):
        if part:
            run.resume()
        run.part(zip(*(column[start:stop] for column in columns)), cuts[part])
    params = torch.cat([s.master.params() for s in run.servers])
    return Replayed(params, run.calls, run.pushes, run.processes)


class Replay:
    """The shards and worker processes of ``config``'s run, rebuilt, and the calls run on
    them so far."""

    def __init__(self, config: TrainConfig):
        self.config = config
        self.problem = problem = Problem(config)
        self.algorithm = config.build_algorithm()
        self.initial = problem.initial_params().cpu().numpy()
        self.layout = Layout(len(self.initial), config.servers, config.seed)
        self.workers: dict[int, ReplayedWorker] = {}
        self.calls = self.pushes = self.processes = 0
        self.servers = self._servers(None)

    def _servers(self, states: list[dict] | None) -> list[ShardServer]:
        """The shards as the run built them (shard 0 as a receiver of the head's calls),
        from ``states`` (a resume) or from the start."""
        config = self.config
        bpe = self.problem.dataset.train_size // config.batch_size
        built = server_args(
            config, self.algorithm, self.initial, bpe,
            end=None, evals=set(), checkpoints=set(), states=states,
        )  # fmt: skip
        shard = set(inspect.signature(ShardServer.__init__).parameters)
        return [
            ShardServer(*args, **{k: v for k, v in kw.items() if k in shard}) for args, kw in built
        ]

    def resume(self) -> None:
        """A resume: every shard built again from its state (as the resumed run's were,
        from the checkpoint), every worker a new process."""
        self.servers = self._servers([server.state() for server in self.servers])
        self.workers = {}

    def part(self, rows: Any, cut: int) -> None:
        """Run a part's ``rows``; with ``cut >= 0`` only up to the call that reached
        ``cut`` steps (its checkpoint's state)."""
        for row in rows:
            if 0 <= cut <= self.servers[0].steps:
                break
            self.call(*row)
        if cut >= 0 and self.servers[0].steps != cut:
            raise DanaError(
                f"the record's calls end at step {self.servers[0].steps}, before the "
                f"checkpoint of step {cut} that the run resumed from: it is incomplete"
            )

    def call(self, number: int, code: int, w: int, arg: int, more: int) -> None:
        """Run call ``number`` (a row of the record) on every shard."""
        method, servers = METHODS[code], self.servers
        self.calls += 1
        if method is Method.PULL:
            replies = [s.relayed(Call(number, method, Pull(w, bool(arg), more))) for s in servers]
            if any(r is None or r.status is not Status.PARAMS for r in replies):
                raise DanaError(f"call {number}: worker {w}'s pull was not served in the replay")
            worker = self.workers.get(w)
            if worker is None or worker.incarnation != more:
                worker = ReplayedWorker(self.config, self.problem, self.algorithm, w, more)
                self.workers[w] = worker
                self.processes += 1
            params = torch.cat([torch.from_numpy(np.array(r.params)) for r in replies])
            worker.pulled(params, replies[0].lr)
        elif method is Method.PUSH:
            if w not in self.workers:
                raise DanaError(f"call {number}: a push of worker {w}, which never pulled")
            push = self.workers[w].step(arg, more)
            parts = split(push, self.layout)
            done = [s.relayed(Call(number, method, p.copy())) for s, p in zip(servers, parts)]
            if done[0] not in (Status.APPLIED, Status.LOCAL):
                raise DanaError(f"call {number}: worker {w}'s push {arg} was {done[0]} here")
            self.pushes += done[0] is Status.APPLIED
            if push.message is None:  # (the head answers a local step with its next rate)
                self.workers[w].lr = servers[0].lr()
        else:
            member = Member(w, bool(arg)) if method is Method.MEMBER else None
            for s in servers:
                s.relayed(Call(number, method, member))


class Verdict(NamedTuple):
    """:func:`replay_run`'s outcome: what was replayed and the largest ``|difference|``
    from the saved model (0: identical)."""

    replayed: Replayed
    max_diff: float

    @property
    def identical(self) -> bool:
        return self.max_diff == 0.0


def replay_run(path: str | Path) -> Verdict:
    """Replay the Ray run in ``path`` (:func:`replay`) and compare its final parameters
    with the run's ``model.safetensors``. DanaError naming the problem for a run that
    cannot be replayed (the module docstring)."""
    from dana.train.records.modelfile import load_model

    run = RunDir(path)
    config = TrainConfig.from_dict(run.read_config(), str(run.config)).validate()
    why = _not_replayable(config)
    if why:
        raise DanaError(f"{run.path}: cannot be replayed: {why}")
    record = run.path / REPLAY_FILE
    if not record.is_file():
        raise DanaError(
            f"{run.path}: no {REPLAY_FILE}: the run did not finish, or a dana without "
            "replay records ran it; replay a run that dana train --backend ray finished"
        )
    if not (run.path / "model.safetensors").is_file():
        raise DanaError(f"{run.path}: no model.safetensors to compare with: the run did not finish")
    if run.summary.is_file() and run.read_summary().get("diverged"):
        raise DanaError(
            f"{run.path}: cannot be replayed: it diverged, and its saved model is that of "
            "an evaluation, not the end of its recorded calls"
        )
    try:
        with np.load(record) as saved:
            calls = {name: saved[name] for name in saved.files}
        missing = {"number", "segments", "cuts", "complete", "missing"} - set(calls)
    except (OSError, ValueError, KeyError) as e:
        raise DanaError(f"{record}: unreadable ({e}); the file is corrupt") from None
    if missing:
        raise DanaError(f"{record}: lacks {', '.join(sorted(missing))}; the file is corrupt")
    if not bool(calls["complete"]):
        raise DanaError(
            f"{run.path}: cannot be replayed: it was resumed from a checkpoint that a dana "
            f"without replay records wrote, so {REPLAY_FILE} lacks the calls before it"
        )
    if int(calls["missing"]):
        raise DanaError(
            f"{record}: the calls from number {int(calls['missing'])} on are incomplete "
            "(a call no server reported): cannot be replayed"
        )
    module = load_model(run.path)
    model = torch.cat([p.detach().reshape(-1) for p in module.parameters() if p.requires_grad])
    replayed = replay(config, calls)
    if model.shape != replayed.params.shape:
        raise DanaError(
            f"{run.path}: model.safetensors holds {model.numel()} parameters, the replay "
            f"{replayed.params.numel()}: not this run's model"
        )
    diff = (replayed.params.double() - model.double()).abs().max()
    return Verdict(replayed, float(diff))


def _not_replayable(config: TrainConfig) -> str:
    """Why ``config``'s run cannot be replayed ("" if it can)."""
    if config.backend != "ray":
        return f"it ran on --backend {config.backend}; only a Ray run records its calls"
    if config.build_algorithm().synchronous:
        return f"{config.algorithm} is synchronous (rounds); replay supports the asynchronous rules"
    if config.cluster is not None and config.time_scale > 0:
        return "it emulated a cluster (--cluster with --time-scale), whose departures lose steps"
    if config.dataset == "user":
        return "it trained a user's problem (dana.fit), which config.json cannot rebuild"
    return ""


def replay_command(path: str) -> int:
    """``dana replay RUN_DIR``: replay, print the verdict; 0 if identical, 1 if not."""
    verdict = replay_run(path)
    r = verdict.replayed
    print(
        f"{path}: replayed {r.calls} calls ({r.pushes} pushes, {r.processes} worker "
        f"processes) without Ray"
    )
    if verdict.identical:
        print("max |diff| from model.safetensors: 0: identical")
        return 0
    print(f"max |diff| from model.safetensors: {verdict.max_diff:.6g}: MISMATCH")
    return 1
