"""Runs packed into one process (``dana sweep --pack N``): several simulated runs of one
model shape advanced in turn, their next gradients computed in one vectorised call.

Each run is a whole ``dana train`` run (:func:`dana.train.training.training`): its own
simulator, schedule, rule, data order, run directory, metrics, checkpoints and summary,
exactly as if run alone but for float rounding (the batched engine's: a packed run's
records equal the run alone's within it, tested in float64). The runs share a
:class:`~dana.sim.compute.Pack`: when one needs a gradient not yet computed, one call
computes it with the other runs' next ones (:mod:`dana.sim.compute`). The runs are
advanced a step each in turn; a run that ends (finished, diverged, failed) leaves the
pack and the others go on. SIGTERM or SIGINT stops every run with a checkpoint of its
own (:mod:`dana.train.records.preempt`); each resumes alone or packed.

What packs: ``backend: sim`` runs of the same model, dataset, data settings, batch size,
dtype and device (:func:`pack_key`); seeds, algorithms, workers and schedules may differ.

``dana sweep`` runs a pack as one process: :mod:`dana.experiments.packed`. With
``--pack auto`` it packs as many runs as fit the device (:func:`auto_pack_size`).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dana.sim.compute import Pack
from dana.train.config import TrainConfig
from dana.train.records import preempt
from dana.train.training import training

#: The settings runs packed together share: the model, its data and the batch shape.
PACK_FIELDS = (
    "backend",
    "model",
    "dataset",
    "data_dir",
    "train_size",
    "test_size",
    "augment",
    "batch_size",
    "dtype",
    "device",
)


def pack_key(options: dict[str, Any]) -> str | None:
    """The settings that must be equal for runs to pack together (``options``: a run's
    config as a dict), or ``None`` when the run cannot pack (not the simulator)."""
    if options.get("backend", TrainConfig.backend) != "sim":
        return None
    defaults = TrainConfig().to_dict()
    return json.dumps({k: options.get(k, defaults[k]) for k in PACK_FIELDS}, sort_keys=True)


@dataclass
class PackedRun:
    """One run of a pack: ``config`` into ``out``, or ``out`` resumed (``config`` then
    read from its ``config.json``)."""

    out: Path
    config: TrainConfig | None = None

    def steps(
        self, pack: Pack, threads: int, version: str
    ) -> Generator[None, None, dict[str, Any]]:
        resume = self.config is None
        config = self.config
        if config is None:
            from dana.train.records.rundir import RunDir

            run = RunDir(self.out)
            config = TrainConfig.from_dict(run.read_config(), str(run.config))
        return training(
            config,
            self.out,
            resume=resume,
            progress=False,
            version=version,
            threads=threads,
            pack=pack,
        )


def train_pack(
    runs: list[PackedRun], *, threads: int = 1, version: str = ""
) -> list[dict[str, Any] | Exception]:
    """Run ``runs`` packed (the module docstring): each one's summary, or the exception
    that ended it (:class:`~dana.errors.Preempted` for a run stopped with a checkpoint).
    Every run is built before any steps; then each takes a step in turn."""
    pack = Pack()
    results: list[dict[str, Any] | Exception | None] = [None] * len(runs)
    with preempt.watching():  # (one watch for all: the runs' own nest inside it)
        live: dict[int, Generator[None, None, dict[str, Any]]] = {}
        for n, run in enumerate(runs):
            try:
                live[n] = run.steps(pack, threads, version)
            except Exception as e:
                results[n] = e
        while live:
            for n, steps in list(live.items()):
                try:
                    next(steps)
                except StopIteration as done:
                    results[n] = done.value
                    del live[n]
                except Exception as e:  # (this run fails; the others go on)
                    results[n] = e
                    del live[n]
    return results  # type: ignore[return-value]


def run_footprint(config: TrainConfig, steps: int = 4) -> int:
    """The peak CUDA memory, in bytes, of one packed run of ``config`` over its first
    ``steps`` steps (its parameters, the rule's and the workers' states and a gradient
    call), run in a scratch directory that is then removed.

    Raises:
        ValueError: when ``config`` does not compute on a CUDA device."""
    from dana.train.device import peak_bytes, resolve_device

    device = resolve_device(config.device)
    if device.type != "cuda":
        raise ValueError(f"a run's footprint is measured on a CUDA device, not {device}")
    with tempfile.TemporaryDirectory(prefix="dana-footprint-") as scratch:

        def first_steps() -> None:
            run = training(config, Path(scratch) / "run", progress=False, pack=Pack())
            try:
                for _ in range(steps):
                    next(run)
            except StopIteration:
                pass
            finally:
                run.close()

        return peak_bytes(device, first_steps)


def auto_pack_size(run_bytes: int, free_bytes: int, jobs: int = 1, share: float = 0.5) -> int:
    """``N`` for ``--pack auto`` on a GPU: the runs of ``run_bytes`` each
    (:func:`run_footprint`) that fit in ``share`` of ``free_bytes``, split among the
    sweep's ``jobs`` processes; at least 1."""
    return max(1, int(share * free_bytes) // (max(1, jobs) * max(1, run_bytes)))
