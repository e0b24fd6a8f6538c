"""``dana ARGS`` in a process of its own, without paying for Python and PyTorch each time.

The end-to-end tests run the real command dozens of times, and each fresh
``python -m dana.cli`` spends seconds importing PyTorch before it looks at its
arguments (most of a bad-input case's time), and a run seconds more importing
matplotlib for its curves. :func:`run_dana` asks a helper process that has imported
``dana.cli``, the simulator and matplotlib once (a "zygote": the pattern of Python's
own ``multiprocessing`` forkserver) to fork a child per command: the child is a new
process, with the interpreter state the imports left and nothing else, that runs
``dana.cli.main(ARGS)`` with its own working directory, its stdout and stderr in
files, and exits with main's status, as ``sys.exit(main())`` does; an uncaught
exception prints its traceback and exits 1, a signal ends it as it would any process.
The result is a :class:`subprocess.CompletedProcess`, as ``subprocess.run`` returns.

Where fork is not available (not POSIX) it falls back to ``python -m dana.cli``.
Tests that signal a run midway start it in a real interpreter (:func:`start`) and wait
for what they signal after (:func:`wait_for`, :func:`wait_rows`); those that need
another environment start the command themselves.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

#: The environment of every command: the tests' own, one OpenMP thread.
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}

ZYGOTE = r"""
import json, os, signal, sys, tempfile, time, traceback

import dana.cli
import dana.experiments.cli  # noqa: F401  (what `dana sweep` and `dana report` import)
import dana.sim.driver  # noqa: F401  (the simulator, which `dana train` runs)
import matplotlib

matplotlib.use("Agg")  # as dana.train.records.rundir.RunDir.write_plot does, before its pyplot import
import matplotlib.pyplot  # noqa: F401,E402  (curves.png: seconds to import)

protocol_in, protocol_out = sys.stdin, sys.stdout


def child(argv, cwd, out, err):
    os.chdir(cwd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(err, 2)
    sys.stdin = open(0, closefd=False)
    sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", closefd=False)
    sys.argv = ["dana", *argv]
    try:
        code = dana.cli.main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int | None):
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    try:  # what the interpreter does at exit: join threads, run the atexit hooks
        import atexit, threading

        threading._shutdown()
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code or 0)


for line in protocol_in:
    job = json.loads(line)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        protocol_out.flush()
        pid = os.fork()
        if pid == 0:
            child(job["argv"], job["cwd"], out.fileno(), err.fileno())
        deadline = time.monotonic() + job["timeout"]
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                status, job["timed_out"] = -1, True
                break
            time.sleep(0.01)
        code = -1 if status == -1 else os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        reply = {"returncode": code, "timed_out": job.get("timed_out", False),
                 "stdout": out.read().decode(errors="replace"),
                 "stderr": err.read().decode(errors="replace")}
    protocol_out.write(json.dumps(reply) + "\n")
    protocol_out.flush()
"""


class _Zygote:
    """The helper process (started at first use, stopped at exit)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None

    def start(self) -> subprocess.Popen:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", ZYGOTE],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=ENV,
            )
        return self.proc

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def run(self, argv: list[str], cwd: str, timeout: float) -> dict:
        proc = self.start()
        proc.stdin.write(json.dumps({"argv": argv, "cwd": cwd, "timeout": timeout}) + "\n")
        proc.stdin.flush()
        ready, _, _ = select.select([proc.stdout], [], [], timeout + 60)
        line = proc.stdout.readline() if ready else ""
        if not line:
            proc.kill()
            raise RuntimeError(f"the dana test helper process gave no answer for {argv}")
        return json.loads(line)


_ZYGOTE = _Zygote()
atexit.register(_ZYGOTE.stop)


def run_dana(
    *args: str | Path, timeout: float = 300, cwd: str | Path | None = None
) -> subprocess.CompletedProcess:
    """``dana ARGS`` in a new process (forked from the helper); the finished process.

    Raises :class:`subprocess.TimeoutExpired` past ``timeout`` seconds, as
    ``subprocess.run`` does."""
    argv = [str(a) for a in args]
    if not hasattr(os, "fork"):
        return subprocess.run(
            [sys.executable, "-m", "dana.cli", *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=ENV,
            cwd=cwd,
        )
    reply = _ZYGOTE.run(argv, str(Path(cwd or os.getcwd()).resolve()), timeout)
    if reply["timed_out"]:
        raise subprocess.TimeoutExpired(["dana", *argv], timeout, reply["stdout"], reply["stderr"])
    return subprocess.CompletedProcess(
        ["dana", *argv], reply["returncode"], reply["stdout"], reply["stderr"]
    )


def kill_at_first_checkpoint(*args: str | Path, out: Path, timeout: float = 120) -> None:
    """Start ``dana train ARGS --out OUT`` in a real interpreter (a kill must hit a real
    process, not a fork of the helper), SIGKILL it once ``OUT/checkpoint.pt`` exists, and
    check the kill came before the run finished."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "dana.cli", "train", *map(str, args), "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=ENV,
    )
    deadline = time.time() + timeout
    while not (out / "checkpoint.pt").exists() and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (out / "checkpoint.pt").exists()
    assert not (out / "summary.json").exists(), "the run finished before it could be killed"


def start(*args: str) -> subprocess.Popen:
    """``dana ARGS`` in a real interpreter (a signal must hit a real process, not a fork
    of the helper), in a session of its own, its output piped."""
    return subprocess.Popen(
        [sys.executable, "-m", "dana.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=ENV,
        text=True,
        start_new_session=True,
    )


def wait_for(
    done: Callable[[], bool], proc: subprocess.Popen, what: str, timeout: float = 240
) -> None:
    """Return once ``done()`` holds while ``proc`` runs; else kill ``proc`` and fail,
    naming ``what`` (what was awaited)."""
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if done():
            return
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"no {what} within {timeout} s: {proc.communicate()}")


def wait_rows(out: Path, rows: int, proc: subprocess.Popen, timeout: float = 240) -> None:
    """:func:`wait_for` more than ``rows`` lines in ``OUT/metrics.csv`` (its header and
    ``rows`` evaluations)."""
    metrics = out / "metrics.csv"

    def written() -> bool:
        return metrics.exists() and len(metrics.read_text().splitlines()) > rows

    wait_for(written, proc, f"{rows} metrics rows", timeout)
