"""Bad input and other people's files: every case is the real command in a process of its
own (forked from a helper that has imported dana once: tests/clirun.py).

Each bad input exits with status 2, a message naming the problem, no traceback, and
nothing written. Run directories never take, overwrite or delete files the program did
not write; a kill inside a checkpoint write leaves a temporary file that --resume
removes; a full disk during a checkpoint keeps the previous one.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import torch
from clirun import run_dana

from dana.data import write_idx

SMALL = ["--dataset", "synthetic", "--model", "linear", "--train-size", "256", "--test-size", "64",
         "--batch-size", "32", "--workers", "2", "--quiet"]  # fmt: skip
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}

# Runs `dana` with os.fsync patched: at the N-th fsync of a checkpoint's temporary file
# it kills the process (kill) or raises ENOSPC (enospc), as a full disk would.
HOOK = """
import errno, os, signal, sys
from dana.cli import main
mode, at = sys.argv[1], int(sys.argv[2])
real, seen = os.fsync, [0]
def fsync(fd):
    if ".checkpoint.pt." in os.readlink(f"/proc/self/fd/{fd}"):
        seen[0] += 1
        if seen[0] >= at:
            if mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return real(fd)
os.fsync = fsync
sys.exit(main(sys.argv[3:]))
"""


def dana(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``dana ARGS`` in a process of its own (tests/clirun.py)."""
    return run_dana(*args, timeout=timeout)


def hooked(tmp_path: Path, mode: str, at: int, *args: str) -> subprocess.CompletedProcess:
    script = tmp_path / "hook.py"
    script.write_text(HOOK)
    return subprocess.run(
        [sys.executable, str(script), mode, str(at), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=ENV,
    )


def assert_bad_input(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    assert "error" in result.stderr, result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, (fragment, result.stderr)


def assert_train_refused(out: Path, *args: str, fragments: Sequence[str]) -> None:
    """``dana train ARGS --out OUT`` is bad input naming every fragment, and leaves no
    OUT behind."""
    assert_bad_input(dana("train", *args, "--out", str(out)), *fragments)
    assert not out.exists()


def snapshot(path: Path) -> dict[str, bytes]:
    """Every file under ``path`` (names relative to it) and its bytes."""
    return {str(p.relative_to(path)): p.read_bytes() for p in path.rglob("*") if p.is_file()}


# -- a run to resume: finished, then made resumable (its summary removed) -----------------
@pytest.fixture(scope="module")
def resumable_template(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("template") / "run"
    result = dana("train", *SMALL, "--epochs", "2", "--checkpoint-every", "1", "--out", str(out))
    assert result.returncode == 0, result.stderr
    (out / "summary.json").unlink()
    (out / "curves.png").unlink()
    assert (out / "checkpoint.pt").is_file()
    return out


@pytest.fixture
def resumable(resumable_template, tmp_path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(resumable_template, run)
    return run


# -- bad options and config files -----------------------------------------------------
@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--seed", str(2**70)], ["--seed", "4294967295"]),
        (["--algo-param", "nesterov=!!python/object/apply:os.system [ls]"], ["--algo-param"]),
        (["--algo-param", "x=!custom 1"], ["--algo-param"]),
        (
            ["--algo-param", "x=" + "[" * 5000 + "]" * 5000],
            ["--algo-param", "nested more than 100"],
        ),
        (["--epochs", "1e8"], ["--epochs", "1000000"]),
        (["--eval-every", "1e-8"], ["--eval-every", "100,000"]),
        (["--checkpoint-every", "1e-9", "--epochs", "1"], ["--checkpoint-every"]),
        (["--threads", "-1"], ["--threads"]),
        (["--algorithm", "ssgd", "--algo-param", "nesterov=yes please"], ["nesterov"]),
        (
            ["--algorithm", "local-dn", "--workers", "4", "--algo-param", "c=0.5"],
            ["--workers 4", "c must be at most 1/(N - 1)"],
        ),
        (["--cluster", "moon"], ["--cluster 'moon'", "datacenter"]),
        (["--cluster", "geo", "--backend", "ray"], ["emulates", "--time-scale S > 0"]),
        (["--cluster", "geo", "--timing", "constant"], ["both set the step times"]),
        (["--partition", "dirichlet:0"], ["dirichlet:ALPHA", "ALPHA > 0"]),
        (["--partition", "halves"], ["--partition 'halves'", "shards:N"]),
        (["--partition", "shards:2", "--backend", "ray"], ["its own shuffle", "--backend sim"]),
        (["--partition", "shards:200"], ["shards", "empty"]),
        (["--cluster", "datacenter", "--servers", "100000"], ["--servers 100000", "parameters"]),
    ],
    ids=[
        "seed-2**70",
        "yaml-python-tag",
        "yaml-custom-tag",
        "yaml-nested-5000",
        "epochs-1e8",
        "eval-every-1e-8",
        "checkpoint-every-1e-9",
        "threads-negative",
        "bool-hparam-string",
        "local-dn-c-past-its-k-bound",
        "no-such-preset",
        "cluster-on-ray",
        "timing-and-cluster",
        "dirichlet-zero",
        "unknown-partition",
        "partition-on-ray",
        "too-many-shards",
        "servers-beyond-d",
    ],  # fmt: skip
)
def test_bad_options(tmp_path, args, fragments):
    assert_train_refused(tmp_path / "run", *SMALL, *args, fragments=fragments)


@pytest.mark.parametrize(
    "name, text, fragments",
    [
        ("dataset.yaml", "dataset: 5\n", ["--dataset", "5"]),
        ("timing.yaml", "timing_params: [1, 2]\n", ["timing_params", "mapping"]),
        ("timing-cli.yaml", "timing_params: [1, 2]\n", ["timing_params"]),
        ("augment.yaml", 'augment: "no"\n', ["--augment", "true or false"]),
        ("tensorboard.json", '{"tensorboard": "false"}', ["--tensorboard", "true or false"]),
        ("epochs.json", '{"epochs": 1e300}', ["--epochs", "1000000"]),
        ("epochs.yaml", "epochs: 1.0e+300\n", ["--epochs"]),
        ("epochs-string.yaml", "epochs: 1e300\n", ["--epochs", "a string"]),
        ("hparam.yaml", "algorithm: ssgd\nalgorithm_params: {nesterov: 'false'}\n", ["nesterov"]),
    ],
)
def test_bad_config_values(tmp_path, name, text, fragments):
    config = tmp_path / name
    config.write_text(text)
    extra = ["--timing-shape", "50"] if name == "timing-cli.yaml" else []
    small = SMALL[2:] if name == "dataset.yaml" else SMALL  # the file gives the dataset
    args = [*small, "--config", str(config), *extra]
    assert_train_refused(tmp_path / "run", *args, fragments=fragments)


def test_empty_test_set_leaves_nothing(tmp_path):
    data = tmp_path / "idx"
    data.mkdir()
    rng = np.random.default_rng(0)
    for prefix, count in (("train", 64), ("t10k", 0)):
        write_idx(data / f"{prefix}-images-idx3-ubyte.gz",
                  torch.from_numpy(rng.integers(0, 256, (count, 8, 8), dtype=np.uint8)))  # fmt: skip
        write_idx(data / f"{prefix}-labels-idx1-ubyte.gz",
                  torch.from_numpy(rng.integers(0, 10, count, dtype=np.uint8)))  # fmt: skip
    args = ["--dataset", "mnist", "--data-dir", str(data), "--model", "linear",
            "--batch-size", "16", "--quiet"]  # fmt: skip
    assert_train_refused(tmp_path / "run", *args, fragments=["test set is empty"])


def test_trace_of_huge_durations(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("worker,duration\n0,1e308\n1,1e308\n")
    args = [*SMALL, "--timing", "trace", "--timing-trace", str(trace)]
    assert_train_refused(tmp_path / "run", *args, fragments=["trace.csv:2", "at most"])


def test_more_workers_than_memory_holds(tmp_path):
    from dana.train.config import TrainConfig
    from dana.train.resources import available_memory, state_bytes
    from dana.train.task.problem import Problem

    available = available_memory()
    if available is None:
        pytest.skip("this system does not say how much memory is available")
    config = TrainConfig(dataset="synthetic", model="mlp", train_size=256, test_size=64)
    d = Problem(config).flat.d
    per_worker = state_bytes(config.algorithm, config.algorithm_hparams(), 1000, d,
                             torch.float32) / 1000  # fmt: skip
    workers = int(1.5 * available / per_worker)
    args = ["--dataset", "synthetic", "--model", "mlp", "--train-size", "256",
            "--test-size", "64", "--workers", str(workers), "--quiet"]  # fmt: skip
    assert_train_refused(
        tmp_path / "run", *args, fragments=[f"--workers {workers} of mlp", "GiB", "available"]
    )


def test_memory_estimate_names_the_figure():
    from dana.errors import ConfigError
    from dana.train.config import TrainConfig
    from dana.train.resources import check_memory, state_bytes

    # The mlp on Fashion-MNIST: 235,146 parameters. asgd's master holds theta, the
    # simulator the parameters each worker computes at: k + 1 vectors.
    d = 235_146
    assert state_bytes("asgd", {}, 10, d, torch.float32) == 11 * d * 4
    slim = state_bytes("dana-slim", {"momentum": 0.9}, 10_000, d, torch.float32)
    assert slim > 6 * 2**30
    config = TrainConfig(model="mlp", workers=10_000)
    with pytest.raises(ConfigError, match=r"--workers 10000 of mlp .* need about .* GiB"):
        check_memory(config, d, available=6 * 2**30)
    assert check_memory(TrainConfig(model="mlp", workers=4), d, available=6 * 2**30) > 0


# -- resume --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "key, value",
    [
        ("workers", 3),
        ("model", "mlp"),
        ("algorithm", "asgd"),
        ("train_size", 128),
        ("lr", 0.5),
        ("epochs", 3.0),
    ],  # fmt: skip
)
def test_resume_refuses_an_edited_config(resumable, key, value):
    config = json.loads((resumable / "config.json").read_text())
    config[key] = value
    (resumable / "config.json").write_text(json.dumps(config))
    before = snapshot(resumable)
    result = dana("train", "--resume", str(resumable), "--quiet")
    assert_bad_input(result, "was edited", key, "--config")
    assert snapshot(resumable) == before


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--epochs", "5"], ["--epochs"]),
        (["--out", "elsewhere"], ["--out"]),
        (["--workers", "4", "--lr", "0.1"], ["--workers", "--lr"]),
    ],  # fmt: skip
)
def test_resume_refuses_options_it_would_ignore(resumable, tmp_path, args, fragments):
    before = snapshot(resumable)
    result = dana("train", "--resume", str(resumable), "--quiet", *args)
    assert_bad_input(result, "--resume", *fragments)
    assert snapshot(resumable) == before
    assert not (Path.cwd() / "elsewhere").exists()


def _bad_checkpoints() -> dict[str, object]:
    return {
        "empty-dict": {},
        "a-tensor": torch.zeros(3),
        "a-list": [1, 2, 3],
        "no-sim": {"rows": [], "logged": 0, "wall_seconds": 0.0},
    }


@pytest.mark.parametrize("kind", [*_bad_checkpoints(), "wrong-shape", "missing-key"])
def test_malformed_checkpoints(resumable, kind):
    path = resumable / "checkpoint.pt"
    if kind in _bad_checkpoints():
        torch.save(_bad_checkpoints()[kind], path)
    else:
        state = torch.load(path, weights_only=True)
        if kind == "wrong-shape":
            state["sim"]["sent"] = torch.zeros(7, 5)
        else:
            del state["sim"]["timing"]
        torch.save(state, path)
    before = snapshot(resumable)
    result = dana("train", "--resume", str(resumable), "--quiet")
    assert_bad_input(result, "checkpoint.pt", "move it away")
    assert snapshot(resumable) == before


def test_checkpoint_that_is_a_directory(resumable):
    (resumable / "checkpoint.pt").unlink()
    (resumable / "checkpoint.pt").mkdir()
    before = snapshot(resumable)
    assert_bad_input(dana("train", "--resume", str(resumable), "--quiet"), "not a file")
    assert snapshot(resumable) == before


def test_resume_accepts_threads(resumable):
    result = dana("train", "--resume", str(resumable), "--quiet", "--threads", "1")
    assert result.returncode == 0, result.stderr
    assert (resumable / "summary.json").is_file()


# -- the disk and the kill -----------------------------------------------------------------
def test_full_disk_during_a_checkpoint_keeps_the_previous_one(tmp_path):
    out = tmp_path / "run"
    result = hooked(tmp_path, "enospc", 2, "train", *SMALL, "--epochs", "3",
                    "--checkpoint-every", "1", "--out", str(out))  # fmt: skip
    assert_bad_input(result, "checkpoint.pt", "No space left on device", "previous file is kept")
    state = torch.load(out / "checkpoint.pt", weights_only=True)
    assert state["sim"]["steps"] == 256 // 32  # the first checkpoint, at epoch 1
    assert not [p for p in out.iterdir() if p.name.startswith(".")]
    assert "--resume" in result.stderr
    resumed = dana("train", "--resume", str(out), "--quiet")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((out / "summary.json").read_text())["epochs"] == 3


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/fd")
def test_kill_inside_a_checkpoint_write_then_resume_cleans_up(tmp_path):
    out = tmp_path / "run"
    args = [*SMALL, "--epochs", "3", "--checkpoint-every", "1"]
    killed = hooked(tmp_path, "kill", 2, "train", *args, "--out", str(out))
    assert killed.returncode == -9
    left = [p for p in out.iterdir() if p.name.startswith(".checkpoint.pt.")]
    assert len(left) == 1 and left[0].stat().st_size > 0  # the write cut short
    mine = out / ".checkpoint.pt.notes"  # a user's file, not our pattern: it stays
    mine.write_text("keep me")

    result = dana("train", "--resume", str(out), "--quiet")
    assert result.returncode == 0, result.stderr
    assert not left[0].exists() and mine.read_text() == "keep me"

    whole = tmp_path / "whole"
    assert dana("train", *args, "--out", str(whole)).returncode == 0
    assert without_wall(out / "metrics.csv") == without_wall(whole / "metrics.csv")


def without_wall(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return [{k: v for k, v in row.items() if k != "wall_seconds"} for row in csv.DictReader(f)]


# -- other people's files --------------------------------------------------------------
@pytest.mark.parametrize("name", ["notes.txt", "metrics.csv", "summary.json", "curves.png"])
def test_out_with_files_it_did_not_write_is_refused(tmp_path, name):
    out = tmp_path / "mine"
    out.mkdir()
    (out / name).write_text("my own file")
    result = dana("train", *SMALL, "--epochs", "0.5", "--out", str(out))
    assert_bad_input(result, "not empty", name)
    assert snapshot(out) == {name: b"my own file"}


def test_out_that_is_empty_is_taken(tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    assert dana("train", *SMALL, "--epochs", "0.5", "--out", str(out)).returncode == 0
    assert (out / "summary.json").is_file()


def test_out_under_a_regular_file(tmp_path):
    (tmp_path / "file").write_text("x")
    result = dana("train", *SMALL, "--out", str(tmp_path / "file" / "run"))
    assert_bad_input(result, "is a file, not a directory")
    assert (tmp_path / "file").read_text() == "x"


def test_failed_start_leaves_nothing(tmp_path, monkeypatch, capsys):
    """A failure once the run has started (an unreachable cluster, say) removes what it
    wrote: the rerun is not told the directory already holds a run."""
    from dana.cli import main
    from dana.errors import DanaError
    from dana.sim.driver import SimRun

    def unreachable(self, progress):
        raise DanaError("cannot reach the Ray cluster at --address 10.0.0.1:6379")

    monkeypatch.setattr(SimRun, "execute_steps", unreachable)
    out = tmp_path / "run"
    assert main(["train", *SMALL, "--out", str(out)]) == 2
    assert "cannot reach" in capsys.readouterr().err
    assert not out.exists()
    existing = tmp_path / "made-by-user"
    existing.mkdir()
    assert main(["train", *SMALL, "--out", str(existing)]) == 2
    assert existing.is_dir() and not list(existing.iterdir())


@pytest.mark.ray
def test_unreachable_cluster_leaves_nothing(tmp_path):
    pytest.importorskip("ray")
    out = tmp_path / "run"
    result = dana("train", *SMALL, "--backend", "ray", "--address", "127.0.0.1:9",
                  "--out", str(out), timeout=120)  # fmt: skip
    assert_bad_input(result)
    assert not out.exists()


def test_run_files_have_one_mode(tmp_path):
    out = tmp_path / "run"
    result = dana("train", *SMALL, "--epochs", "2", "--checkpoint-every", "1", "--out", str(out))
    assert result.returncode == 0, result.stderr
    umask = os.umask(0)
    os.umask(umask)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()}
    assert {"config.json", "metrics.csv", "summary.json", "curves.png", "checkpoint.pt"} <= set(
        modes
    )
    assert set(modes.values()) == {0o666 & ~umask}, modes


def test_sweep_never_deletes_a_file_it_did_not_write(tmp_path):
    out = tmp_path / "sweep"
    run = out / "runs" / "dana-slim_k2_s0"
    run.mkdir(parents=True)
    (run / "metrics.csv").write_text("epoch\n0\n")  # an interrupted run's own file
    (run / "notes.txt").write_text("mine")
    args = ["sweep", "--algorithms", "dana-slim", "--workers", "2", "--seeds", "0",
            *[a for a in SMALL if a not in ("--workers", "2")], "--epochs", "0.5",
            "--out", str(out)]  # fmt: skip
    result = dana(*args)
    assert (run / "notes.txt").read_text() == "mine"
    assert "did not write" in (out / "sweep.log").read_text()
    assert not (run / "summary.json").exists()
    assert result.returncode != 0 or "1 failed" in result.stdout

    (run / "notes.txt").unlink()  # now only its own file is there: it restarts the run
    result = dana(*args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (run / "summary.json").is_file()
    log = (out / "logs" / "dana-slim_k2_s0.log").read_text()
    assert "Traceback" not in log


def test_simulate_takes_threads_and_restores_the_setting():
    import dana
    from dana.errors import ConfigError

    torch.manual_seed(0)
    x, y = torch.randn(64, 5), torch.randint(0, 2, (64,))
    model = torch.nn.Linear(5, 2)
    before = torch.get_num_threads()
    result = dana.simulate(model, x, y, workers=2, epochs=1, batch_size=16, threads=1)
    assert result.log.numpy()["staleness"].size == 4
    assert torch.get_num_threads() == before
    with pytest.raises(ConfigError, match="--threads"):
        dana.simulate(model, x, y, workers=2, epochs=1, batch_size=16, threads=-1)
    assert torch.get_num_threads() == before


def test_sweep_grid_value_with_a_yaml_tag(tmp_path):
    result = dana("sweep", "--grid", "lr=!!python/name:os.system", "--out", str(tmp_path / "s"))
    assert_bad_input(result, "--grid")
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize(
    "text, fragments",
    [
        ("network:\n  latency: 5\n", ["network", "no field latency", "latency_ms"]),
        ("network:\n  bandwidth_gbps: fast\n", ["network.bandwidth_gbps", "a number"]),
        ("compute:\n  model: gamma\n  mean: 5\n", ["compute", "mean", "shape, scale"]),
        (
            "availability:\n  preemptions:\n    - {worker: 7, leave_ms: 10}\n",
            ["preemptions[0].worker is 7", "2 workers", "--workers"],
        ),
        (
            "availability:\n  preemptions:\n    - {worker: 0, leave_ms: 10}\n"
            "    - {worker: 1, leave_ms: 20}\n",
            ["every worker away for good", "rejoin_ms"],
        ),
        ("- 1\n- 2\n", ["a cluster file holds a mapping"]),
        ("network: [\n", ["not valid YAML"]),
        (f"network:\n  latency_ms: {10**400}\n", ["network.latency_ms must be a number"]),
        (f"compute:\n  model: gamma\n  shape: {10**400}\n", ["shape must be a positive number"]),
        ("network: " + "[" * 5000 + "]" * 5000 + "\n", ["nested more than 100 levels"]),
    ],
    ids=[
        "unknown-field",
        "bad-bandwidth",
        "model-param",
        "worker-beyond-k",
        "all-gone",
        "not-a-mapping",
        "bad-yaml",
        "latency-401-digits",
        "timing-401-digits",
        "nested-5000",
    ],  # fmt: skip
)
def test_bad_cluster_file(tmp_path, text, fragments):
    """A bad cluster file: exit 2, the field and the fix named, nothing written."""
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(text)
    assert_train_refused(tmp_path / "run", *SMALL, "--cluster", str(cluster), fragments=fragments)


def test_output_paths_that_cannot_be_directories(tmp_path):
    """An empty --out (it would mean a default folder), or a --out or --export that is
    a file or lies under one: exit 2, the option named, nothing written anywhere."""
    from conftest import fake_run

    results = tmp_path / "results"
    fake_run(results, "dana-slim_k2_s0", "dana-slim", 2, 0, [0.5, 0.4])
    mine = tmp_path / "notes.txt"
    mine.write_text("mine")
    sweep = ["sweep", "--algorithms", "dana-slim", "--workers", "2", "--seeds", "0", "--quiet"]
    cases = [
        (["train", *SMALL, "--out", ""], ["--out is empty"]),
        ([*sweep, "--out", ""], ["--out is empty"]),
        ([*sweep, "--out", str(mine)], [f"--out {mine} exists and is not a directory"]),
        (["report", str(results), "--export", str(mine)], ["--export", "not a directory"]),
        (["report", str(results), "--export", str(mine / "copy")], [f"{mine} is a file"]),
        (["report", str(results), "--export", ""], ["--export is empty"]),
        (["report", str(results), "--out", str(mine)], ["--out", "not a directory"]),
    ]
    before = snapshot(tmp_path)
    for args, fragments in cases:
        assert_bad_input(run_dana(*args, cwd=tmp_path), *fragments)
        assert snapshot(tmp_path) == before, args
        assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "results"], args


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="writes under /proc")
def test_report_export_into_a_place_it_cannot_write(tmp_path):
    """An --export no file can be written in (/proc: even root cannot): exit 2, the file
    named, no traceback."""
    from conftest import fake_run

    fake_run(tmp_path, "dana-slim_k2_s0", "dana-slim", 2, 0, [0.5, 0.4])
    result = dana("report", str(tmp_path), "--export", "/proc/dana-export")
    assert_bad_input(result, "cannot write /proc/dana-export/")


def test_an_error_raised_in_a_ray_actor_is_printed_as_dana_raised_it(monkeypatch, capsys):
    # Ray hands the driver a subclass of the actor's error whose text is the actor's
    # traceback, and the error itself as `cause`
    from dana import cli
    from dana.errors import WriteError

    class FromActor(WriteError):
        def __str__(self):
            return "ray::Head.relay() (pid=1)\nTraceback (most recent call last): ..."

    raised = FromActor("x")
    raised.cause = WriteError("the disk is full: free space")
    monkeypatch.setattr(cli, "cmd_train", lambda args: (_ for _ in ()).throw(raised))
    assert cli.main(["train", "--dataset", "synthetic"]) == 2
    err = capsys.readouterr().err
    assert err == "dana: error: the disk is full: free space\n"
