"""Run a sweep: every cell of a grid as a ``dana train`` subprocess, ``jobs`` at a time.

Each cell runs ``python -m dana.cli train --config OUT/cells/NAME.json --out
OUT/runs/NAME --quiet`` (or ``train --resume OUT/runs/NAME`` when it left a checkpoint),
with ``--threads T``, ``T = cores // jobs`` (or the value ``OMP_NUM_THREADS`` already
sets, or the sweep's own ``--threads``). Its output goes to ``OUT/logs/NAME.log``.

- A finished cell (``summary.json`` present) is skipped: rerunning a sweep only runs
  what is missing, and adding seeds or worker counts to a grid only runs the new cells.
  A run that finishes has its checkpoint deleted, unless ``keep_checkpoints``, and
  keeps its final model (``model.safetensors``), unless ``keep_models`` is false.
- An interrupted cell continues from its checkpoint, or restarts when it has none: its
  run directory's files (those ``dana train`` writes) are removed first, and nothing
  else is: a cell whose directory holds files the program did not write fails, naming
  them, and they stay.
- A cell that fails (exit 1 or 2) or diverges (exit 3) is recorded in ``sweep.log`` and
  ``sweep.json``; the others run on.
- ``reuse``: a cell that never started, of the same settings as a finished run of
  another sweep, gets a copy of that run instead of running
  (:mod:`dana.experiments.reuse`).
- ``pack`` (``--pack N``): up to ``N`` pending cells that can pack (simulator runs of
  one model, dataset, data settings, batch size, dtype and device:
  :func:`dana.sim.pack.pack_key`) run in one process (:mod:`dana.experiments.packed`),
  their gradients computed together; each writes its own run directory as if run
  alone (float rounding apart). Other cells run alone, and ``sweep.log`` says so. The
  pack's output goes to its first cell's log. ``1`` (the default): every cell alone.
  ``"auto"``: on a GPU as many as fit half its free memory among the ``jobs`` processes,
  from one run's measured peak (:func:`dana.sim.pack.auto_pack_size`, measured once per
  model in a process of its own); on the CPU 1, where packing is slower
  (docs/BENCHMARKS.md). ``sweep.log`` and stderr say the choice.
- SIGINT/SIGTERM are passed on to the running cells as SIGTERM: each writes a checkpoint
  of that moment and exits 75 (:mod:`dana.train.records.preempt`); the sweep then raises
  :class:`~dana.errors.Preempted` (``dana sweep`` exits 75: rerun the same command to
  continue). If the sweep itself is killed, its runs get SIGTERM from the kernel (Linux).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import IO, Any

from tqdm.auto import tqdm

from dana.atomic import write_text_atomic
from dana.errors import EXIT_PREEMPTED, Preempted
from dana.experiments.grid import Cell, SweepSpec, expand
from dana.experiments.layout import FINISHED, NEW, RESTART, RESUMABLE, SweepDir
from dana.experiments.reuse import ReusableRuns, copy_run, remove_leftovers
from dana.train.config import TrainConfig
from dana.train.records.modelfile import MODEL_FILE
from dana.train.records.rundir import RunDir
from dana.train.resources import check_threads

#: ``dana train``'s exit statuses, as a sweep records them.
OUTCOMES = {
    0: "finished",
    3: "diverged",
    2: "bad-input",
    1: "error",
    4: "fault",
    EXIT_PREEMPTED: "preempted",
    130: "interrupted",
}
POLL_SECONDS = 0.5
#: The signals that stop a sweep (passed on to its runs as SIGTERM).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: Seconds a stopped run has to write its checkpoint before it is killed.
STOP_SECONDS = 60
#: ``--pack auto``: the longest a footprint probe (one run's first steps) may take.
FOOTPRINT_SECONDS = 600
#: Where a run can be tied to the sweep's life (``PR_SET_PDEATHSIG``).
LINUX = sys.platform.startswith("linux")


@dataclass
class SweepResult:
    """What became of each cell: its status (finished, diverged, skipped, failed, ...)."""

    status: dict[str, str] = field(default_factory=dict)

    def count(self, *statuses: str) -> int:
        return sum(1 for s in self.status.values() if s in statuses)

    @property
    def failed(self) -> list[str]:
        return [n for n, s in self.status.items() if s == "failed"]


@dataclass
class _Job:
    cells: list[Cell]  # (one, or the runs of a pack)
    process: subprocess.Popen
    output: IO[bytes]
    started: float


class _Stop(Exception):
    """SIGTERM or SIGINT (its name), turned into an exception so that the running cells
    are stopped cleanly."""


def threads_per_job(jobs: int, cores: int | None = None) -> int:
    """Torch threads for each of ``jobs`` concurrent runs: ``max(1, cores // jobs)``, or
    ``OMP_NUM_THREADS`` where the environment sets it (and ``cores`` is not given)."""
    if cores is None and os.environ.get("OMP_NUM_THREADS", "").isdigit():
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        cores = cores or os.cpu_count() or 1
    return max(1, cores // max(1, jobs))


def plan(spec: SweepSpec, out: SweepDir) -> list[Cell]:
    """The cells of ``spec``, validated, and checked against the runs ``out`` holds.

    Raises ConfigError (before anything runs) for a bad option in any cell, or a run
    directory of the same name holding a run of other settings.
    """
    cells = expand(spec)
    for cell in cells:
        out.check_matches(cell, cell.config().to_dict())
    return cells


def more_seeds(spec: SweepSpec, out: SweepDir, cells: list[Cell]) -> list[Cell]:
    """The cells of ``spec.more_seeds`` now due: for every group of cells that differ
    only in the seed and whose seeds have all finished, the extra seeds when their final
    test errors spread by more than ``above_spread`` percentage points (max - min), or
    when one diverged and another did not. Cells already in ``cells`` are not repeated.
    """
    if not spec.more_seeds:
        return []
    spread = float(spec.more_seeds["above_spread"]) / 100.0
    groups: dict[str, list[Cell]] = {}
    for cell in cells:
        key = json.dumps({k: v for k, v in cell.options.items() if k != "seed"}, sort_keys=True)
        groups.setdefault(key, []).append(cell)
    names = {c.name for c in cells}
    due: list[Cell] = []
    for group in groups.values():
        if len(group) < 2 or any(out.state(c) != FINISHED for c in group):
            continue
        summaries = [out.run_dir(c).read_summary() for c in group]
        diverged = [bool(s.get("diverged")) for s in summaries]
        errors = [
            float(s["final_test_error"])
            for s, d in zip(summaries, diverged)
            if not d and isinstance(s.get("final_test_error"), int | float)
        ]
        wide = (any(diverged) and not all(diverged)) or (
            len(errors) > 1 and max(errors) - min(errors) > spread
        )
        if not wide:
            continue
        first = group[0]
        for seed in spec.more_seeds["seeds"]:
            name = re.sub(r"_s\d+(?=_|$)", f"_s{seed}", first.name, count=1)
            if name not in names:
                names.add(name)
                due.append(Cell(name, {**first.options, "seed": seed}))
    return due


def run_sweep(
    spec: SweepSpec,
    out: str | Path,
    *,
    jobs: int = 1,
    progress: bool = True,
    keep_checkpoints: bool = False,
    threads: int | None = None,
    reuse: list[str | Path] | tuple[str | Path, ...] = (),
    keep_models: bool = True,
    pack: int | str = 1,
) -> SweepResult:
    """Run every cell of ``spec`` into the results directory ``out`` (see the module doc).

    A finished run's ``checkpoint.pt`` is deleted unless ``keep_checkpoints``, its
    ``model.safetensors`` unless ``keep_models``. Each run
    uses ``threads`` CPU threads (default :func:`threads_per_job`). ``reuse``: results
    directories whose finished runs of a cell's settings are copied, not run again."""
    sweep = SweepDir(out)
    cells = plan(spec, sweep)
    reusable = ReusableRuns(list(reuse)) if reuse else None
    sweep.acquire()
    result = SweepResult()
    try:
        remove_leftovers(sweep.runs)
        _Runner(
            spec,
            sweep,
            cells,
            jobs,
            progress,
            result,
            keep_checkpoints,
            threads,
            reusable,
            keep_models,
            pack,
        ).run()
    finally:
        sweep.release()
    return result


class _Runner:
    """The scheduling loop of one sweep invocation."""

    def __init__(
        self,
        spec: SweepSpec,
        sweep: SweepDir,
        cells: list[Cell],
        jobs: int,
        progress: bool,
        result: SweepResult,
        keep_checkpoints: bool = False,
        threads: int | None = None,
        reusable: ReusableRuns | None = None,
        keep_models: bool = True,
        pack: int | str = 1,
    ):
        self.spec, self.sweep, self.cells, self.result = spec, sweep, cells, result
        self.pack: int | str = pack if pack == "auto" else max(1, int(pack))
        self.pack_sizes: dict[str, int] = {}  # --pack auto: the size chosen per pack_key
        self.keep_checkpoints, self.keep_models = keep_checkpoints, keep_models
        self.reusable = reusable
        self.jobs = max(1, jobs)
        self.threads = threads_per_job(self.jobs) if threads is None else check_threads(threads)
        self.running: dict[str, _Job] = {}
        self.bar = (
            tqdm(total=len(cells), desc="sweep", unit="run", file=sys.stderr, dynamic_ncols=True)
            if progress
            else None
        )

    # -- the loop -----------------------------------------------------------------------
    def run(self) -> None:
        self.sweep.log(
            f"sweep of {len(self.cells)} runs, {self.jobs} at a time, "
            f"{self.threads} torch thread(s) each"
            + (f", up to {self.pack} runs packed in one" if self.pack != 1 else "")
        )
        pending: list[Cell] = []
        self._more_seeds()
        for cell in self.cells:
            if self.sweep.state(cell) == FINISHED:
                self.result.status[cell.name] = "skipped"
                self.sweep.log(f"skip {cell.name} (finished before)")
            else:
                self.result.status[cell.name] = "pending"
                pending.append(cell)
        self._record()
        previous = {sig: signal.signal(sig, _raise_stop) for sig in STOP_SIGNALS}
        try:
            while pending or self.running:
                while pending and len(self.running) < self.jobs:
                    self._start(self._take(pending))
                if self._reap():
                    pending += self._more_seeds()
                self._show()
                if self.running:
                    time.sleep(POLL_SECONDS)
        except (KeyboardInterrupt, _Stop) as e:
            for sig in STOP_SIGNALS:  # (a second signal must not cut the checkpoints short)
                signal.signal(sig, signal.SIG_IGN)
            stopped = self._stop_all()
            name = e.args[0] if isinstance(e, _Stop) and e.args else "SIGINT"
            raise Preempted(
                f"sweep preempted by {name}: {stopped} running run(s) stopped with a "
                f"checkpoint; rerun the same command to continue ({self.sweep.path})"
            ) from None
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if self.bar is not None:
                self.bar.close()
        self.sweep.log(
            f"sweep done: {self.result.count('finished')} finished, "
            f"{self.result.count('diverged')} diverged, {self.result.count('skipped')} skipped, "
            f"{self.result.count('reused')} reused, {len(self.result.failed)} failed"
        )

    def _take(self, pending: list[Cell]) -> list[Cell]:
        """The next cells to start in one process: the first pending one, and with
        ``--pack N`` up to ``N - 1`` more that pack with it (the same
        :func:`~dana.sim.pack.pack_key`); a cell that cannot pack is logged."""
        cell = pending.pop(0)
        if self.pack == 1:
            return [cell]
        from dana.sim.pack import pack_key  # (torch: only a packing sweep needs it here)

        key = pack_key(cell.config().to_dict())
        if key is None:
            self.sweep.log(f"alone {cell.name}: only simulator runs pack")
            return [cell]
        size = self._auto_size(cell, key) if self.pack == "auto" else int(self.pack)
        same = [c for c in pending if pack_key(c.config().to_dict()) == key][: size - 1]
        for c in same:
            pending.remove(c)
        return [cell, *same]

    def _auto_size(self, cell: Cell, key: str) -> int:
        """``--pack auto``'s size for the runs of ``cell``'s ``key``, chosen once
        (:func:`~dana.sim.pack.auto_pack_size`) and said in the log and on stderr."""
        if key in self.pack_sizes:
            return self.pack_sizes[key]
        from dana.sim.pack import auto_pack_size
        from dana.train.device import resolve_device

        config = cell.config()
        if resolve_device(config.device).type != "cuda":
            size, why = 1, "on the CPU one run at a time is faster (docs/BENCHMARKS.md)"
        else:
            probe = self.sweep.cell_file(cell)
            probe.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(probe, _json(config.to_dict()))
            try:
                done = subprocess.run(
                    [sys.executable, "-m", "dana.experiments.packed", "--footprint", str(probe)],
                    capture_output=True,
                    text=True,
                    timeout=FOOTPRINT_SECONDS,
                )
                measured = json.loads(done.stdout.strip().splitlines()[-1])
                run_bytes, free = int(measured["run_bytes"]), int(measured["free_bytes"])
            except subprocess.TimeoutExpired:
                size, why = 1, f"its footprint probe took over {FOOTPRINT_SECONDS} s"
            except (IndexError, KeyError, TypeError, ValueError):
                size = 1
                why = f"its footprint could not be measured ({done.stderr.strip()[-300:]})"
            else:
                size = auto_pack_size(run_bytes, free, self.jobs)
                why = (
                    f"one run's peak {run_bytes / 2**20:.0f} MiB, {free / 2**30:.1f} GiB free, "
                    f"half of it shared by {self.jobs} process(es)"
                )
        self.pack_sizes[key] = size
        line = f"--pack auto: {size} run(s) of {config.model} per process: {why}"
        self.sweep.log(line)
        print(f"dana sweep {line}", file=sys.stderr, flush=True)
        return size

    def _launch(self, cell: Cell) -> tuple[list[str], str] | None:
        """How ``cell`` starts (its run's arguments and the word for the log), having
        written its config; ``None`` when it does not run (reused, or refused)."""
        state = self.sweep.state(cell)
        run = self.sweep.run_dir(cell)
        if state == NEW and self._reuse(cell, run):
            return None
        if state == RESUMABLE:
            return ["--resume", str(run.path)], "resume from checkpoint"
        if state == RESTART:
            left = run.remove_own()  # an interrupted run without a checkpoint
            if left:
                self._refuse(cell, left)
                return None
        cell_file = self.sweep.cell_file(cell)
        write_text_atomic(cell_file, _json(cell.config().to_dict()))
        return ["--config", str(cell_file), "--out", str(run.path)], (
            "restart" if state == RESTART else "start"
        )

    def _start(self, cells: list[Cell]) -> None:
        """Start ``cells`` in one process: one ``dana train``, or a pack of several
        (``python -m dana.experiments.packed``)."""
        launches = [(c, how) for c in cells if (how := self._launch(c)) is not None]
        if not launches:
            return
        cell = launches[0][0]
        threads = ["--threads", str(self.threads)]
        if len(launches) == 1:
            args = ["dana.cli", "train", *launches[0][1][0], "--quiet", *threads]
        else:
            args = [
                "dana.experiments.packed",
                *threads,
                *(a for _, (run, _) in launches for a in run),
            ]
        self.sweep.logs.mkdir(parents=True, exist_ok=True)
        output = self.sweep.output_file(cell.name).open("ab")
        env = {
            **os.environ,
            "OMP_NUM_THREADS": str(self.threads),
            "MKL_NUM_THREADS": str(self.threads),
        }
        process = subprocess.Popen(
            [sys.executable, "-m", *args],
            stdout=output,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            preexec_fn=partial(_die_with_parent, os.getpid()) if LINUX else None,
        )
        self.running[cell.name] = _Job([c for c, _ in launches], process, output, time.monotonic())
        names = ", ".join(c.name for c, _ in launches)
        packed = f", a pack of {names}" if len(launches) > 1 else ""
        for c, (_, mode) in launches:
            self.result.status[c.name] = "running"
            self.sweep.log(f"{mode} {c.name} (pid {process.pid}{packed})")
            if c is not cell:
                with self.sweep.output_file(c.name).open("a") as f:
                    f.write(f"packed with {cell.name}: see {self.sweep.output_file(cell.name)}\n")
        self._record()

    def _reuse(self, cell: Cell, run: RunDir) -> bool:
        """Copy into ``run`` a finished run of ``cell``'s settings from ``--reuse``, if
        there is one; whether it did."""
        if not self.reusable:
            return False
        options = cell.config().to_dict()
        source = self.reusable.find(options)
        if source is None:
            return False
        write_text_atomic(self.sweep.cell_file(cell), _json(options))
        copy_run(source, run)
        self.result.status[cell.name] = "reused"
        self.sweep.log(f"reuse {cell.name}: a copy of {source} (the same settings)")
        self._record()
        return True

    def _refuse(self, cell: Cell, left: list[Path]) -> None:
        """Fail ``cell`` without running it: its run directory holds others' files."""
        names = ", ".join(p.name for p in left[:5]) + (" ..." if len(left) > 5 else "")
        message = (
            f"failed {cell.name}: {self.sweep.run_dir(cell).path} holds files dana did not "
            f"write ({names}); they are kept: move them away and rerun the sweep"
        )
        self.result.status[cell.name] = "failed"
        self.sweep.log(message)
        if self.bar is not None:
            self.bar.write(f"dana sweep: {message}", file=sys.stderr)
        self._record()

    def _more_seeds(self) -> list[Cell]:
        """Cells of further seeds that finished runs have made due (``more_seeds``)."""
        due = more_seeds(self.spec, self.sweep, self.cells)
        for cell in due:
            self.sweep.check_matches(cell, cell.config().to_dict())
            self.cells.append(cell)
            self.result.status[cell.name] = "pending"
            self.sweep.log(f"add {cell.name}: its seeds' final errors differ widely")
        if due and self.bar is not None:
            self.bar.total = len(self.cells)
        return due

    def _reap(self) -> bool:
        """Collect the cells that ended; True if any did."""
        ended = False
        for name, job in list(self.running.items()):
            rc = job.process.poll()
            if rc is None:
                continue
            ended = True
            job.output.close()
            del self.running[name]
            seconds = time.monotonic() - job.started
            for cell in job.cells:
                self._ended(cell, rc, seconds, job)
        return ended

    def _ended(self, cell: Cell, rc: int, seconds: float, job: _Job) -> None:
        """Record how ``cell`` ended (its process exited ``rc``): alone, by ``rc``; in a
        pack, by its run directory (a summary: finished or diverged)."""
        run = self.sweep.run_dir(cell)
        outcome = OUTCOMES.get(rc, f"exit {rc}")
        if len(job.cells) > 1 and run.finished():
            outcome = "diverged" if run.read_summary().get("diverged") else "finished"
        if rc in (0, 3) and not run.finished():  # a success without a summary is none
            outcome = "error"  # (in a pack, the pack's output says why)
        name = cell.name
        self.result.status[name] = outcome if outcome in ("finished", "diverged") else "failed"
        if outcome in ("finished", "diverged") and not self.keep_checkpoints:
            run.checkpoint.unlink(missing_ok=True)
        if outcome in ("finished", "diverged") and not self.keep_models:
            (run.path / MODEL_FILE).unlink(missing_ok=True)
        message = f"{outcome} {name} (exit {rc}, {seconds:.1f} s)"
        if self.result.status[name] == "failed":
            message += (
                f"; see {self.sweep.output_file(job.cells[0].name)}: {_tail(job.output.name)}"
            )
        self.sweep.log(message)
        if self.bar is not None:
            self.bar.write(f"dana sweep: {message}", file=sys.stderr)
        self._record()

    def _stop_all(self) -> int:
        """SIGTERM every running cell (each checkpoints and exits 75) and wait for them
        (``STOP_SECONDS`` at most, then SIGKILL); how many there were."""
        for job in self.running.values():
            if job.process.poll() is None:
                job.process.terminate()
        stopped = sum(len(job.cells) for job in self.running.values())
        for job in self.running.values():
            try:
                rc = job.process.wait(timeout=STOP_SECONDS)
            except subprocess.TimeoutExpired:
                job.process.kill()
                rc = job.process.wait()
            job.output.close()
            for cell in job.cells:
                self.result.status[cell.name] = "interrupted"
                self.sweep.log(f"{OUTCOMES.get(rc, f'exit {rc}')} {cell.name} (exit {rc})")
        self.running.clear()
        self.sweep.log("sweep preempted; rerun the same command to continue")
        self._record()
        return stopped

    # -- reporting ----------------------------------------------------------------------
    def _record(self) -> None:
        self.sweep.write_spec(
            {
                "spec": self.spec.to_dict(),
                "cells": [
                    {
                        "name": c.name,
                        "algorithm": c.algorithm,
                        "workers": c.workers,
                        "seed": c.seed,
                        "status": self.result.status.get(c.name, "pending"),
                    }
                    for c in self.cells
                ],
            }
        )

    def _show(self) -> None:
        if self.bar is None:
            return
        done = sum(
            1 for s in self.result.status.values() if s not in ("pending", "running", "interrupted")
        )
        partial = sum(
            _fraction_done(self.sweep, cell) for job in self.running.values() for cell in job.cells
        )
        self.bar.n = round(done + partial, 2)
        self.bar.set_postfix(
            running=len(self.running), failed=len(self.result.failed), refresh=False
        )
        self.bar.refresh()


def _fraction_done(sweep: SweepDir, cell: Cell) -> float:
    """How far a running cell is, from the last epoch in its metrics.csv (0 to 1)."""
    metrics = sweep.run_dir(cell).metrics
    try:
        with metrics.open() as f:
            last = f.read().rstrip("\n").rsplit("\n", 1)[-1]
        epoch = float(last.split(",", 1)[0])
    except (OSError, ValueError):
        return 0.0
    return min(0.99, max(0.0, epoch / float(cell.options.get("epochs", TrainConfig.epochs))))


def _tail(path: str, lines: int = 1) -> str:
    try:
        text = Path(path).read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])[-300:]


def _json(values: dict[str, Any]) -> str:
    return json.dumps(values, indent=2) + "\n"


def _raise_stop(signum: int, frame: Any) -> None:
    raise _Stop(signal.Signals(signum).name)


def _die_with_parent(parent: int) -> None:
    """In the child (Linux): get SIGTERM when the sweep (pid ``parent``) dies, even by
    SIGKILL, and at once if it died between the fork and this call (else the run would
    live on unseen and race the sweep that resumes it)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass
    if os.getppid() != parent:  # (not os.kill: the sweep's own SIGTERM handler is still here)
        os._exit(128 + signal.SIGTERM)
