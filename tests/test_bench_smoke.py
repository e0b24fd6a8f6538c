"""Every benchmark runs, in its smoke mode (tiny sizes, seconds), so none breaks unseen.

Each script runs in a subprocess with ``--smoke`` and must exit 0 and print its last
line, the figure docs/BENCHMARKS.md records (the smoke run's number means nothing).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from dana.ps import netlab

BENCH = Path(__file__).resolve().parents[1] / "bench"

#: Each benchmark and the pattern of its last line.
LAST_LINES = {
    "master_update.py": r"dana-slim ratio [\d.]+, dana-zero ratio [\d.]+",
    "sim_memory.py": r"bytes per worker-parameter [\d.]+",
    "sim_overhead.py": r"overhead ratio [\d.]+",
    "sim_scale.py": r"parallel speed-up [\d.]+",
    "train_throughput.py": r"throughput ratio [\d.]+",
    "ps_throughput.py": r"throughput vs ray example [\d.]+",
    "ray_vs_sim.py": r"staleness mean error [\d.]+%",
    "threads_under_load.py": r"default slowdown [\d.]+x \((within|OVER) 2x\)",
    "gpu_checks.py": r"checks passed (\d+) of \1",
    "chaos_soak.py": r"chaos soak: (\d+) faults, \1 survived, lost 0, doubled 0",
    "relay_log_memory.py": r"relay log peak resident MB \d+ \(bound MB \d+\)",
    "read_speed.py": r"read speed ratio [\d.]+",
    "pack_throughput.py": r"pack speed-up [\d.]+",
    "gpu_updates.py": r"graph speed-up [\d.]+",
    "links_vs_sim.py": r"duration error [\d.]+%",
}
#: Arguments beside --smoke (bench/gpu.sh's GPU checks, run here on the CPU).
ARGS = {"gpu_checks.py": ["--device", "cpu"], "gpu_updates.py": ["--device", "cpu"]}
#: What the benchmarks import: no benchmark of its own.
HELPERS = {"common.py"}
NEEDS_RAY = {"ps_throughput.py", "ray_vs_sim.py", "chaos_soak.py", "links_vs_sim.py"}

pytestmark = pytest.mark.slow


def test_every_benchmark_is_listed():
    assert {p.name for p in BENCH.glob("*.py")} == set(LAST_LINES) | HELPERS


def test_gpu_sh_sim_scale_arguments_run_on_the_cpu():
    """bench/gpu.sh's sim_scale.py arguments, with --device cpu: a renamed option or
    model breaks here, not first on the GPU machine."""
    line = next(x for x in (BENCH / "gpu.sh").read_text().splitlines() if "SIM_SCALE_ARGS=(" in x)
    args = shlex.split(line.split("=(", 1)[1].rsplit(")", 1)[0])
    out = subprocess.run(
        [sys.executable, str(BENCH / "sim_scale.py"), "--device", "cpu", *args, "--smoke"],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert re.fullmatch(LAST_LINES["sim_scale.py"], out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "script",
    [
        pytest.param(name, marks=[pytest.mark.ray] if name in NEEDS_RAY else [])
        for name in sorted(LAST_LINES)
    ],
)
def test_benchmark_smoke_run(script):
    if script in NEEDS_RAY:
        pytest.importorskip("ray")
    if script == "links_vs_sim.py" and (why := netlab.unavailable()):
        pytest.skip(why)  # (network namespaces: root)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, str(BENCH / script), "--smoke", *ARGS.get(script, [])],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    last = out.stdout.strip().splitlines()[-1]
    assert re.fullmatch(LAST_LINES[script], last), last


def test_gpu_study_runs_a_smoke_grid_on_the_cpu_stops_and_continues(tmp_path):
    """bench/gpu_study.sh with DANA_DEVICE=cpu: a grid cut by its time limit leaves an
    archive with what was done, the same call from that archive finishes it, and
    `dana report` reads the records."""
    spec = tmp_path / "grid.yaml"
    spec.write_text(
        "dataset: synthetic\nmodel: mlp\ntrain_size: 512\ntest_size: 128\nbatch_size: 32\n"
        "epochs: 2\neval_every: 1\ncheckpoint_every: 0.5\n"
        "grid:\n  algorithm: [asgd]\n  workers: [2]\n  seed: [0, 1]\n"
    )
    results, archives = tmp_path / "results", tmp_path / "out"
    env = {**os.environ, "DANA_DEVICE": "cpu", "DANA_RESULTS": str(results)}

    def study(minutes: str) -> subprocess.CompletedProcess:
        args = [minutes, str(archives), "--config", str(spec), "--jobs", "1", "--threads", "1"]
        return subprocess.run(
            ["bash", str(BENCH / "gpu_study.sh"), "smoke", *args],
            capture_output=True, text=True, env=env, timeout=300, check=False,
        )  # fmt: skip

    # one second (the least it takes): the sweep is stopped before its two runs (each a
    # process of its own: more than a second to start), the archive still made
    cut = study("0.01")
    assert cut.returncode == 0, cut.stdout + cut.stderr
    assert "stopped after 0.01 minutes" in cut.stdout
    assert (archives / "smoke.tar.gz").is_file()
    subprocess.run(["rm", "-r", str(results / "smoke")], check=True)
    (archives / "smoke.tar.gz").rename(results / "smoke.tar.gz")
    done = study("5")  # continues from the archive
    assert done.returncode == 0, done.stdout + done.stderr
    assert "continuing from" in done.stdout and "0 failed" in done.stdout
    runs = results / "smoke" / "runs"
    assert sorted(p.name for p in runs.iterdir() if (p / "summary.json").is_file()) == [
        "asgd_k2_s0",
        "asgd_k2_s1",
    ]
    bad = subprocess.run(
        ["bash", str(BENCH / "gpu_study.sh"), "../x", "1", str(archives)],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    assert bad.returncode == 2 and "NAME must be a plain folder name" in bad.stderr
    report = subprocess.run(
        [sys.executable, "-m", "dana.cli", "report", str(results / "smoke")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert report.returncode == 0, report.stderr
