"""A runner written from docs/ARCHITECTURE.md's recipe for a runner, on the floor alone:
``k`` workers in turn (round robin, one step each), no clock, no checkpoints. The tests
register it under ``--backend toy`` and run it from ``dana train`` and ``dana.fit``."""

from __future__ import annotations

import math
import time
from typing import Any

import torch
from torch import Tensor

from dana.algorithms.base import Algorithm
from dana.errors import ConfigError
from dana.train.config import TrainConfig
from dana.train.records.metrics import Position, metrics_row, summarize
from dana.train.records.progress import Progress
from dana.train.records.pushlog import PushLog
from dana.train.records.rundir import RunDir
from dana.train.rules.step import WorkerStep
from dana.train.task.problem import Problem
from dana.train.training import build_schedule, stop_points


class ToyRun:
    def __init__(
        self,
        config: TrainConfig,
        run: RunDir,
        problem: Problem,
        algorithm: Algorithm | None = None,
        *,
        threads: int = 1,
    ):
        self.config, self.run, self.problem = config, run, problem
        algorithm = algorithm if algorithm is not None else config.build_algorithm()
        self.batches = problem.batches(config.seed)
        self.schedule = build_schedule(config, self.batches.batches_per_epoch)
        params = problem.initial_params()
        self.master = algorithm.master(params, config.workers)
        rule = algorithm.worker(config.workers, params.numel(), params.dtype)
        self.step = WorkerStep(rule, problem.gradient, config.weight_decay)
        self.sent = params.repeat(config.workers, 1)
        self.pulled_at = [0] * config.workers
        self.steps = self.updates = self.pushes = 0
        self.rows: list[dict[str, float]] = []
        self._log = PushLog()

    @classmethod
    def check(cls, config: TrainConfig, problem: Problem) -> None:
        if config.build_algorithm().synchronous:
            raise ConfigError("--backend toy runs asynchronous algorithms only")

    @property
    def log(self) -> PushLog:
        return self._log

    def final_params(self) -> Tensor:
        return self.master.params()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise ConfigError("--backend toy keeps no checkpoints")

    def lr(self) -> float:
        return self.schedule(self.steps / self.batches.batches_per_epoch)

    def position(self) -> Position:
        epoch = self.steps / self.batches.batches_per_epoch
        return Position(epoch, self.updates, self.pushes, float(self.steps), self.lr())

    def one_step(self) -> None:
        i = self.steps % self.config.workers
        grad, loss = self.step.gradient(i, self.sent[i], self.batches.next())
        lr = self.lr()
        message = self.step.message(i, grad, lr)
        self.steps += 1
        if message is None:
            return
        staleness = self.updates - self.pulled_at[i]
        self.updates += int(self.master.push(i, message, lr))
        self.pushes += 1
        self._log.append(worker=i, staleness=staleness, gap=math.nan, loss=loss, lr=lr,
                         sim_time=float(self.steps))  # fmt: skip
        self.master.pull(i, self.lr(), self.sent[i])
        self.pulled_at[i] = self.updates

    def execute(self, progress: Progress) -> dict[str, Any]:
        points, evals, _ = stop_points(self.config, self.batches.batches_per_epoch)
        start, logged = time.perf_counter(), 0
        for point in points:
            while self.steps < point:
                self.one_step()
            if point in evals:
                with torch.no_grad():
                    test = self.problem.evaluate(self.master.params())
                wall = time.perf_counter() - start
                log = self._log.numpy(logged)
                logged = len(self._log)
                self.rows.append(metrics_row(self.position(), wall, log, test))
                self.run.write_metrics(self.rows)
        return summarize(self.config, self.rows, self._log.numpy(), None,
                         time.perf_counter() - start, self.position())  # fmt: skip
